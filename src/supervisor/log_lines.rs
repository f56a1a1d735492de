//! `log`: the lines supd keeps of its services (the ring of each, `logs::Output`), merged
//! by time and filtered (`since_ms`, `grep`, `stderr`), the followers of `log -f`; and
//! the marker lines at each start and exit of a run, which take the way captured output
//! takes: the ring, the followers, the log writer.

use super::Supervisor;
use crate::config::{LogMode, LogStderr};
use crate::control::Follow;
use crate::logs::{self, Output};
use crate::protocol::{Error, ErrorKind};
use crate::service::{signal_label, Exit};
use crate::time::Mono;
use serde_json::{json, Value};

/// A `log` request, its names resolved.
pub(super) struct LogQuery {
    /// The services asked for, in order (every service when none was named).
    pub names: Vec<String>,
    /// Services were named (not "every service").
    pub named: bool,
    /// The old form (`"service": NAME`): answered in the old shape.
    pub old_form: bool,
    pub lines: usize,
    pub since_ms: Option<u64>,
    pub grep: Option<String>,
    pub follow: bool,
    pub stderr: bool,
}

impl Supervisor {
    /// Answers `log`: the last lines of the services kept in memory, merged by their
    /// stamps and filtered; with `follow`, the client receives their lines from now on.
    /// A service whose output is not captured (or whose stderr is not kept apart, with
    /// `stderr`) is an error when it is the only one named, else skipped and said.
    pub(super) fn log_answer(&mut self, client: u64, q: LogQuery) -> Result<Value, Error> {
        let re = match q.grep.as_deref() {
            Some(p) => Some(crate::sys::Regex::new(p).map_err(|why| {
                Error::new(
                    ErrorKind::BadRequest,
                    format!("bad regular expression '{p}': {why}"),
                )
            })?),
            None => None,
        };
        let alone = q.named && q.names.len() == 1;
        let mut kept: Vec<&str> = Vec::new();
        let mut skipped: Vec<Value> = Vec::new();
        for name in &q.names {
            let Some(slot) = self.slots.get(name) else {
                continue;
            };
            let why = if slot.cfg.log == LogMode::Null {
                Some(format!(
                    "the output of '{name}' is not captured (its log is \"null\")"
                ))
            } else if q.stderr && slot.cfg.log_stderr != LogStderr::Marked {
                Some(format!(
                    "the stderr of '{name}' is not kept apart (its log_stderr is \"merged\")"
                ))
            } else {
                None
            };
            match why {
                Some(why) if alone => return Err(Error::new(ErrorKind::Failed, why)),
                Some(why) if q.named => skipped.push(json!({"service": name, "why": why})),
                Some(_) => {}
                None => kept.push(name),
            }
        }
        if q.named && kept.is_empty() && !skipped.is_empty() {
            let whys: Vec<&str> = skipped.iter().filter_map(|s| s["why"].as_str()).collect();
            return Err(Error::new(ErrorKind::Failed, whys.join("; ")));
        }
        let since = q.since_ms.map(|ms| {
            let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
            crate::time::utc_stamp(at)
        });
        let (since, re_ref, stderr) = (since.as_deref(), re.as_ref(), q.stderr);
        let takes = move |l: &&String| {
            let (text, err) = logs::text_of(l);
            since.is_none_or(|s| logs::stamp_of(l) >= s)
                && (!stderr || err)
                && re_ref.is_none_or(|re| re.is_match(text))
        };
        let sources: Vec<(&str, Box<dyn Iterator<Item = &String> + '_>)> = kept
            .iter()
            .filter_map(|n| {
                let out: &Output = self.slots.get(*n)?.output.as_deref()?;
                Some((
                    *n,
                    Box::new(out.kept().rev().filter(takes)) as Box<dyn Iterator<Item = &String>>,
                ))
            })
            .collect();
        let merged = logs::last_merged(sources, q.lines);
        let answer = if q.old_form {
            let lines: Vec<&String> = merged.iter().map(|(_, l)| *l).collect();
            json!({"service": q.names.first(), "lines": lines})
        } else {
            let lines: Vec<Value> = merged
                .iter()
                .map(|(s, l)| json!({"service": s, "line": l, "marker": logs::is_marker(l)}))
                .collect();
            json!({"lines": lines, "skipped": skipped})
        };
        if q.follow {
            // Every service, those a reload adds too, unless named (or only those whose
            // stderr is kept apart are wanted).
            let services =
                (q.named || q.stderr).then(|| kept.iter().map(|n| n.to_string()).collect());
            let follow = Follow {
                services,
                stderr: q.stderr,
                grep: re,
            };
            self.control.follow(client, follow);
        }
        Ok(answer)
    }

    /// Writes a marker line into `name`'s output: its ring, its followers and its log
    /// (a file, or supd's stdout with `log = "inherit"`), as a line it said would go.
    fn mark(&mut self, name: &str, text: &str) {
        let Some(out) = self.slots.get_mut(name).and_then(|s| s.output.as_mut()) else {
            return;
        };
        let lines = [out.note(text)];
        self.deliver(name, &lines, false);
    }

    /// The marker of a run's start: its version (a versioned service) and pid.
    pub(super) fn mark_started(&mut self, name: &str, pid: i32) {
        let version = self.slots.get(name).and_then(|s| s.version.clone());
        self.mark(name, &logs::started_marker(version.as_deref(), pid));
    }

    /// The marker of the exit of a run's main process `pid`: how it ended and after
    /// how long. What it wrote before it exited is read first, so the marker follows it.
    pub(super) fn mark_exited(&mut self, name: &str, pid: i32, exit: Exit, now: Mono) {
        self.on_output(name, false);
        self.on_output(name, true);
        let ran = self
            .slots
            .get(name)
            .and_then(|s| s.svc.started_at)
            .map(|t| now.since(t))
            .unwrap_or_default();
        let oom = (self.slots.get(name))
            .and_then(|s| s.instance.as_ref())
            .and_then(|i| i.out_of_memory.clone());
        let how = match exit {
            _ if oom.is_some() => oom.unwrap_or_default(),
            Exit::Code(c) => format!("code {c}"),
            Exit::Signal(s) => format!("killed by signal {}", signal_label(s)),
        };
        self.mark(name, &logs::exited_marker(&how, ran, pid));
    }
}
