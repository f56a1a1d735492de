//! sup-lease's connection to supd: requests and their answers (supd's refusals kept
//! apart, with their stable kind), and a step-down's `lease-release`, whose answer (the
//! services exited) is awaited beside the node's ticks.

use crate::protocol::ErrorKind;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

/// Why a request to supd failed: supd refused it (with its stable error kind, which
/// callers decide on, and its message, which they only show), or it did not get there
/// or its answer did not come back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SupdError {
    /// `kind` is `None` for a kind this build does not know (a newer supd's); `name` is
    /// the kind as supd named it, shown.
    Refused {
        kind: Option<ErrorKind>,
        name: String,
        message: String,
    },
    Unreachable(String),
}

impl std::fmt::Display for SupdError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SupdError::Refused { name, message, .. } => write!(f, "{name}: {message}"),
            SupdError::Unreachable(why) => f.write_str(why),
        }
    }
}

/// A failed exchange: the connection broke before the request was read (`Gone`: sent
/// again on a new one), another I/O failure, or supd's refusal.
enum Fail {
    Gone(String),
    Io(String),
    Refused { name: String, message: String },
}

/// A connection to supd, opened again when it breaks.
pub struct Supd {
    path: PathBuf,
    conn: Option<(BufReader<UnixStream>, UnixStream)>,
}

impl Supd {
    pub fn new(path: PathBuf) -> Supd {
        Supd { path, conn: None }
    }

    /// One request; the answer's data, or why not. A kept connection that supd closed
    /// meanwhile (it closes connections idle for 10s), before it read the request, is
    /// opened again once.
    pub fn call(&mut self, req: Value, timeout: Duration) -> Result<Value, String> {
        self.call_typed(req, timeout).map_err(|e| e.to_string())
    }

    /// The same, with supd's refusal apart (its kind read from the answer).
    pub fn call_typed(&mut self, req: Value, timeout: Duration) -> Result<Value, SupdError> {
        if self.conn.is_some() {
            match self.exchange(req.clone(), timeout) {
                Err(Fail::Gone(_)) => self.conn = None,
                done => return done.map_err(|e| self.failed(e)),
            }
        }
        if self.conn.is_none() {
            let s = UnixStream::connect(&self.path).map_err(|e| {
                SupdError::Unreachable(format!("cannot reach supd at {}: {e}", self.path.display()))
            })?;
            let w = s
                .try_clone()
                .map_err(|e| SupdError::Unreachable(e.to_string()))?;
            self.conn = Some((BufReader::new(s), w));
        }
        let result = self.exchange(req, timeout);
        result.map_err(|e| self.failed(e))
    }

    /// What a failed exchange tells the caller; a broken connection is dropped.
    fn failed(&mut self, e: Fail) -> SupdError {
        match e {
            Fail::Io(why) | Fail::Gone(why) => {
                self.conn = None;
                SupdError::Unreachable(why)
            }
            Fail::Refused { name, message } => SupdError::Refused {
                kind: ErrorKind::from_name(&name),
                name,
                message,
            },
        }
    }

    fn exchange(&mut self, req: Value, timeout: Duration) -> Result<Value, Fail> {
        let (r, w) = (self.conn.as_mut()).ok_or_else(|| Fail::Io("not connected".into()))?;
        r.get_ref()
            .set_read_timeout(Some(timeout))
            .map_err(|e| Fail::Io(e.to_string()))?;
        let mut line = req.to_string();
        line.push('\n');
        w.write_all(line.as_bytes()).map_err(|e| match e.kind() {
            std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset => {
                Fail::Gone(e.to_string())
            }
            _ => Fail::Io(e.to_string()),
        })?;
        let mut answer = String::new();
        match r.read_line(&mut answer) {
            Ok(0) => return Err(Fail::Gone("supd closed the connection".into())),
            Ok(_) => {}
            Err(e) => return Err(Fail::Io(e.to_string())),
        }
        let v: Value = serde_json::from_str(&answer)
            .map_err(|e| Fail::Io(format!("bad answer from supd: {e}")))?;
        if v["ok"] == true {
            Ok(v["data"].clone())
        } else {
            Err(Fail::Refused {
                name: v["error"]["kind"].as_str().unwrap_or("error").to_string(),
                message: v["error"]["message"].as_str().unwrap_or("").to_string(),
            })
        }
    }
}

/// A `lease-release` sent to supd on a connection of its own, whose answer (the
/// services have exited) is looked for at every tick, so that the store lease and the
/// leader key stay renewed meanwhile: the key is given up only after.
pub struct Release {
    pub(super) conn: UnixStream,
    pub(super) answer: Vec<u8>,
}

impl Release {
    pub(super) fn start(path: &std::path::Path, lease: &str) -> Result<Release, String> {
        let mut conn = UnixStream::connect(path)
            .map_err(|e| format!("cannot reach supd at {}: {e}", path.display()))?;
        let line = format!("{}\n", json!({"cmd": "lease-release", "lease": lease}));
        conn.write_all(line.as_bytes()).map_err(|e| e.to_string())?;
        conn.set_nonblocking(true).map_err(|e| e.to_string())?;
        Ok(Release {
            conn,
            answer: Vec::new(),
        })
    }

    /// `Some(Ok)` once supd answered that the services exited; `None` while waiting.
    pub(super) fn poll(&mut self) -> Option<Result<(), String>> {
        use std::io::Read;
        let mut buf = [0u8; 1024];
        loop {
            match self.conn.read(&mut buf) {
                Ok(0) => return Some(Err("supd closed the connection".into())),
                Ok(n) => self.answer.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => return Some(Err(e.to_string())),
            }
        }
        let nl = self.answer.iter().position(|b| *b == b'\n')?;
        let v: Value = serde_json::from_slice(&self.answer[..nl]).unwrap_or(Value::Null);
        Some(if v["ok"] == true {
            Ok(())
        } else {
            Err(format!("release refused: {v}"))
        })
    }
}
