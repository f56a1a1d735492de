//! The check before a service of a tool starts: a version the tool switched to by
//! itself gets an upgrade with probation, a bad one is switched back, and a start waits
//! while a change of supd's own waits for its record.

use crate::supervisor::Supervisor;
use crate::time::{Clocks, Mono};
use crate::tool_state::{Op, StartGo};
use crate::upgrade::{self, Change, StartCheck};
use crate::versions;

impl Supervisor {
    /// A service of `tool` is about to start on `version`: a tool that switched its own
    /// `current` gets an upgrade with probation; one that switched to a bad version is
    /// switched back before anything of it runs. While a change of supd's own waits for
    /// its record, a start goes on only on the version that change names; a version it
    /// cannot vouch for waits with it (the service is held, `Failed` with the reason,
    /// and started once the change is made).
    pub fn check_start(&mut self, tool: &str, name: &str, version: &str, now: Mono) -> StartGo {
        self.ensure_tool(tool, now);
        if let Some(go) = self.tools.start_while_pending(tool, name, version) {
            return go;
        }
        let held = self.tools[tool].record.clone();
        let mut switch = upgrade::SelfSwitch {
            probation: self.probation_of(tool),
            manifest_irreversible: false,
        };
        let clocks = Clocks::now();
        let (mut new, check) = upgrade::on_start(&held, version, &switch, &clocks);
        if check == StartCheck::SelfUpgrade {
            // Only a self-switch reads the version's manifest (not every start).
            let vdir = versions::tool_dir(&self.cfg.supd.tools_dir, tool).join(version);
            switch.manifest_irreversible = versions::irreversible(&vdir).unwrap_or_else(|e| {
                // Unreadable: taken as irreversible (the safe side: never rolled back).
                log::warn!("{tool}: {e}: {version} is taken as not revertible");
                true
            });
            if switch.manifest_irreversible {
                new = upgrade::on_start(&held, version, &switch, &clocks).0;
            }
        }
        match check {
            StartCheck::Expected => {
                if new != held {
                    self.change_or_retry(tool, Change::record(new), Op::Load, now);
                }
                StartGo::AsPlanned
            }
            StartCheck::SwitchedBack => {
                log::warn!(
                    "{tool}: {}",
                    new.reason.as_deref().unwrap_or("switched back by the tool")
                );
                if self.change_or_retry(tool, Change::record(new), Op::Load, now) {
                    self.emit_upgrade(tool);
                }
                StartGo::AsPlanned
            }
            StartCheck::SelfUpgrade => {
                let change = Change {
                    record: new,
                    switch: None,
                    restart: true,
                    except: Some(name.to_string()),
                };
                let op = Op::SelfUpgrade {
                    version: version.to_string(),
                };
                if self.change_or_retry(tool, change, op, now) {
                    // A new version owes nothing to the old one's crashes: the service
                    // starting it is left out of `restart_tool`'s reset, so it is here.
                    if let Some(slot) = self.slots.get_mut(name) {
                        slot.svc.history.reset();
                    }
                    StartGo::AsPlanned
                } else {
                    // Its probation could not be recorded: it does not run unrecorded.
                    let why = self.tools.pending_error(tool);
                    self.tools.hold_start(
                        tool,
                        name,
                        format!("tool {tool}: the probation of {version} cannot be recorded ({why}); it does not run meanwhile"),
                    )
                }
            }
            StartCheck::SwitchBack(to) => {
                let change = Change {
                    record: new,
                    switch: Some(to.clone()),
                    restart: false,
                    except: None,
                };
                let op = Op::SwitchBack {
                    version: version.to_string(),
                    to: to.clone(),
                };
                if self.change_or_retry(tool, change, op, now) {
                    StartGo::Replan
                } else {
                    let why = self.tools.pending_error(tool);
                    self.tools.hold_start(
                        tool,
                        name,
                        format!("tool {tool}: current names {version}, which is marked bad, and cannot be switched back to {to} ({why}); nothing of {tool} runs until it can"),
                    )
                }
            }
        }
    }
}
