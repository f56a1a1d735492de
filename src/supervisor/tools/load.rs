//! A tool's record loaded at start (or at its first use) and put right: a record where
//! an older supd kept it moved, an interrupted switch finished, the probation a `reexec`
//! handed over taken up, all carried out as any other change.

use crate::supervisor::Supervisor;
use crate::time::{Clocks, Mono};
use crate::tool_state::{errno_text, Op, ToolState};
use crate::upgrade::{self, Change, Fix, Record};
use crate::versions;
use std::collections::BTreeSet;

impl Supervisor {
    /// Loads and puts right the record of every tool a service names. `handed_over`:
    /// this image took over from another by `reexec`, which wrote its probations just
    /// before the exec; they go on as they were, the exec's moment not lost.
    pub fn load_tools(&mut self, now: Mono, handed_over: bool) {
        let tools: BTreeSet<String> = self
            .slots
            .values()
            .filter_map(|s| s.cfg.tool.clone())
            .collect();
        // Records where older supds kept them move first: every configured or installed
        // tool's (one installed later is moved at its first use, in `load_tool`).
        let installed = versions::installed_tools(&self.cfg.supd.tools_dir);
        for t in tools.iter().chain(&installed) {
            self.migrate_record(t);
        }
        for t in tools {
            self.load_tool(&t, handed_over, now);
        }
    }

    /// The tool's state, loaded on first use: the record as it is on disk is held, then
    /// what `reconcile` and `resume` decide is carried out like any other change (the
    /// record written before the link is touched).
    pub fn ensure_tool(&mut self, tool: &str, now: Mono) {
        self.load_tool(tool, false, now)
    }

    fn load_tool(&mut self, tool: &str, handed_over: bool, now: Mono) {
        if self.tools.is_loaded(tool) {
            return;
        }
        let configured = self
            .slots
            .values()
            .any(|s| s.cfg.tool.as_deref() == Some(tool));
        if configured || versions::tool_dir(&self.cfg.supd.tools_dir, tool).is_dir() {
            self.migrate_record(tool);
        }
        let (tools_dir, state_dir) = (&self.cfg.supd.tools_dir, &self.cfg.supd.state_dir);
        let (record, record_error) = match versions::load_record(state_dir, tool) {
            Ok(r) => (r.unwrap_or_default(), None),
            Err(e) => {
                log::error!(
                    "{tool}: {e}; it is kept aside, and supd goes on from what `current` names"
                );
                versions::set_aside(state_dir, tool);
                (Record::default(), Some(e))
            }
        };
        let clocks = Clocks::now();
        let link = versions::current(tools_dir, tool);
        let (fixed, fix) = upgrade::reconcile(&record, link.as_deref(), &clocks);
        let fixed = if handed_over {
            upgrade::resume_handed_over(&fixed, &clocks)
        } else {
            upgrade::resume(&fixed, &clocks)
        };
        let switch = match fix {
            Fix::SwitchTo(v) => {
                log::warn!("{tool}: finishing an interrupted switch of current to {v}");
                Some(v)
            }
            Fix::Nothing => None,
        };
        // A probation (or a regression window) of this boot goes on with the crashes
        // counted before: its services' histories are taken up where they were.
        if upgrade::watched(&fixed, &clocks) {
            for (name, h) in &fixed.histories {
                if let Some(slot) = self.slots.get_mut(name) {
                    if slot.cfg.tool.as_deref() == Some(tool) && slot.svc.history.recent.is_empty()
                    {
                        slot.svc.history = h.clone();
                    }
                }
            }
        }
        self.tools.insert(
            tool,
            ToolState {
                record,
                record_error,
                ..ToolState::default()
            },
        );
        let change = Change {
            record: fixed,
            switch,
            restart: false,
            except: None,
        };
        self.change_or_retry(tool, change, Op::Load, now);
    }

    /// Moves the tool's record from where an older supd kept it, saying so.
    fn migrate_record(&self, tool: &str) {
        let dir = &self.cfg.supd.state_dir;
        match versions::migrate_record(dir, tool) {
            Ok(true) => log::info!(
                "{tool}: its record moved to {}",
                versions::record_path(dir, tool).display()
            ),
            Ok(false) => {}
            Err(e) => log::error!(
                "{tool}: cannot move its record to {}: {}; the old one is left where it is",
                versions::record_path(dir, tool).display(),
                errno_text(&e)
            ),
        }
    }
}
