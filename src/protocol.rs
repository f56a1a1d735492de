//! The control protocol: newline-delimited JSON over a Unix stream socket.
//!
//! A request is `{"id": ..., "cmd": "...", ...}`; the answer echoes the id with either
//! `"ok": true, "data": ...` or `"ok": false, "error": {"kind", "message"}`. Error kinds
//! are stable names: never rename one, only add. Pure: decoding and encoding only.

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

/// The protocol's version, answered by `hello`.
pub const PROTOCOL_VERSION: u32 = 1;
/// The longest request line accepted, newline included.
pub const MAX_REQUEST: usize = 64 * 1024;

/// Stable error kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// Not JSON, not an object, a missing or mistyped argument, a line too long.
    BadRequest,
    /// `cmd` names no command.
    UnknownCommand,
    /// No service of that name.
    UnknownService,
    /// The peer may not use this command.
    PermissionDenied,
    /// The command was understood but could not be carried out.
    Failed,
    /// The new config has errors; nothing was changed.
    InvalidConfig,
    /// No tool of that name.
    UnknownTool,
    /// No `[lease.NAME]` of that name.
    UnknownLease,
    /// Refused for now: something under way must end first (a reload being read, a
    /// change waiting for its record, a probation); the message says what, and the same
    /// request may succeed later. Nothing was changed.
    Busy,
}

impl ErrorKind {
    /// Every kind, for reading a name back ([`ErrorKind::from_name`]).
    const ALL: [ErrorKind; 9] = [
        ErrorKind::BadRequest,
        ErrorKind::UnknownCommand,
        ErrorKind::UnknownService,
        ErrorKind::PermissionDenied,
        ErrorKind::Failed,
        ErrorKind::InvalidConfig,
        ErrorKind::UnknownTool,
        ErrorKind::UnknownLease,
        ErrorKind::Busy,
    ];

    /// The kind an answer names; `None` for a name this build does not know (a newer
    /// supd's), which a client decides nothing on.
    pub fn from_name(name: &str) -> Option<ErrorKind> {
        ErrorKind::ALL.into_iter().find(|k| k.as_str() == name)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::BadRequest => "bad-request",
            ErrorKind::UnknownCommand => "unknown-command",
            ErrorKind::UnknownService => "unknown-service",
            ErrorKind::PermissionDenied => "permission-denied",
            ErrorKind::Failed => "failed",
            ErrorKind::InvalidConfig => "invalid-config",
            ErrorKind::UnknownTool => "unknown-tool",
            ErrorKind::UnknownLease => "unknown-lease",
            ErrorKind::Busy => "busy",
        }
    }
}

/// An error answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub kind: ErrorKind,
    pub message: String,
}

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error {
            kind,
            message: message.into(),
        }
    }
}

/// A signal named in a request: "TERM" or 15.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum SignalArg {
    Name(String),
    Number(i32),
}

/// Every command, with its arguments.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(tag = "cmd", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Command {
    Hello {},
    Status {
        #[serde(default)]
        service: Option<String>,
        #[serde(default)]
        services: Vec<String>,
    },
    /// `service`, or `services` (several; `all` names every service).
    Start {
        #[serde(default)]
        service: Option<String>,
        #[serde(default)]
        services: Vec<String>,
    },
    /// `service`, or `services` (several; `all` names every service).
    Stop {
        #[serde(default)]
        service: Option<String>,
        #[serde(default)]
        services: Vec<String>,
    },
    /// `service`, or `services` (several; `all` names every service).
    Restart {
        #[serde(default)]
        service: Option<String>,
        #[serde(default)]
        services: Vec<String>,
    },
    Signal {
        service: String,
        signal: SignalArg,
    },
    /// The old form names one `service` and is answered `{"service", "lines": [LINE]}`;
    /// the new one names `services` (none: every service) and is answered `{"lines":
    /// [{"service", "line", "marker"}], "skipped": [NAME]}`, merged by time.
    Log {
        #[serde(default)]
        service: Option<String>,
        #[serde(default)]
        services: Option<Vec<String>>,
        #[serde(default)]
        lines: Option<usize>,
        /// Only lines stamped at or after this instant (Unix milliseconds).
        #[serde(default)]
        since_ms: Option<u64>,
        /// Only lines whose text matches this POSIX extended regular expression.
        #[serde(default)]
        grep: Option<String>,
        #[serde(default)]
        follow: bool,
        /// Only the lines of stderr kept apart (`log_stderr = "marked"`).
        #[serde(default)]
        stderr: bool,
    },
    Watch {},
    /// The metrics in Prometheus' text format 0.0.4, answered as `{"text": TEXT}`.
    Metrics {},
    /// The effective settings of a service, each with where it was set.
    Show {
        service: String,
    },
    /// Without a service: re-read supd's config. With one: send it its `reload_signal`.
    Reload {
        #[serde(default)]
        service: Option<String>,
    },
    Shutdown {},
    Install {
        tool: String,
        version: String,
        /// An absolute path: supd's working directory is not the client's.
        dir: String,
        /// Set-user-ID and set-group-ID files, device nodes, FIFOs and sockets are
        /// copied (with their own modes) rather than refused. Absent (older clients):
        /// refused.
        #[serde(default)]
        allow_special: bool,
    },
    Versions {
        tool: String,
    },
    Upgrade {
        tool: String,
        version: String,
        #[serde(default)]
        force: bool,
        #[serde(default)]
        irreversible: bool,
        /// Answer when the probation is over, not at once.
        #[serde(default)]
        wait: bool,
    },
    Rollback {
        tool: String,
        #[serde(default)]
        version: Option<String>,
        #[serde(default)]
        force: bool,
    },
    Prune {
        tool: String,
        #[serde(default)]
        keep: Option<usize>,
    },
    LeaseCandidacy {
        lease: String,
    },
    LeaseGrant {
        lease: String,
        holder: String,
        term: u64,
        /// A duration: "10s", "6667ms"; counted from receipt when `until_boot_ms` is
        /// absent (an older sup-lease).
        valid_for: String,
        /// The grant's end: milliseconds of CLOCK_BOOTTIME (sup-lease runs on this host).
        #[serde(default)]
        until_boot_ms: Option<u64>,
        /// How long a stop may take once the grant ran out (then SIGKILL).
        #[serde(default)]
        kill_grace: Option<String>,
        /// Time to stop, not to lead: the holder stepped down (`lease-release`) and
        /// keeps its key and store lease while the services stop; this moves their
        /// guards' end and starts nothing.
        #[serde(default)]
        stopping: bool,
    },
    LeaseRelease {
        lease: String,
    },
    Poweroff {},
    Reboot {},
    Halt {},
    Reexec {
        /// The program to become; by default the one supd was started as.
        #[serde(default)]
        binary: Option<String>,
    },
}

/// The names `cmd` may take, to tell an unknown command from a bad argument.
const COMMANDS: &[&str] = &[
    "hello",
    "status",
    "start",
    "stop",
    "restart",
    "signal",
    "log",
    "watch",
    "metrics",
    "show",
    "reload",
    "shutdown",
    "install",
    "versions",
    "upgrade",
    "rollback",
    "prune",
    "lease-candidacy",
    "lease-grant",
    "lease-release",
    "reexec",
    "poweroff",
    "reboot",
    "halt",
];

impl Command {
    /// Whether members of `socket_group` may use it.
    pub fn read_only(&self) -> bool {
        match self {
            Command::Hello {}
            | Command::Status { .. }
            | Command::Log { .. }
            | Command::Watch {}
            | Command::Metrics {}
            | Command::Show { .. }
            | Command::Versions { .. }
            | Command::LeaseCandidacy { .. } => true,
            Command::Start { .. }
            | Command::Stop { .. }
            | Command::Restart { .. }
            | Command::Signal { .. }
            | Command::Reload { .. }
            | Command::Shutdown {}
            | Command::Install { .. }
            | Command::Upgrade { .. }
            | Command::Rollback { .. }
            | Command::Prune { .. }
            | Command::LeaseGrant { .. }
            | Command::LeaseRelease { .. }
            | Command::Reexec { .. }
            | Command::Poweroff {}
            | Command::Reboot {}
            | Command::Halt {} => false,
        }
    }

    /// Whether members of `control_group` may use it: what members of `socket_group`
    /// may (`read_only`), and start, stop, restart and signal services, and reload one
    /// (its own reload, not supd's config). Never installs, upgrades, rollbacks,
    /// prunes, `reexec`, shutdowns or the lease commands that act.
    pub fn operates(&self) -> bool {
        // `read_only` matches every command by name, so a new one is classified there;
        // operating adds these alone.
        self.read_only()
            || matches!(
                self,
                Command::Start { .. }
                    | Command::Stop { .. }
                    | Command::Restart { .. }
                    | Command::Signal { .. }
                    | Command::Reload { service: Some(_) }
            )
    }

    /// The name of the command, for logs.
    pub fn name(&self) -> &'static str {
        match self {
            Command::Hello {} => "hello",
            Command::Status { .. } => "status",
            Command::Start { .. } => "start",
            Command::Stop { .. } => "stop",
            Command::Restart { .. } => "restart",
            Command::Signal { .. } => "signal",
            Command::Log { .. } => "log",
            Command::Watch {} => "watch",
            Command::Metrics {} => "metrics",
            Command::Show { .. } => "show",
            Command::Reload { .. } => "reload",
            Command::Shutdown {} => "shutdown",
            Command::Install { .. } => "install",
            Command::Versions { .. } => "versions",
            Command::Upgrade { .. } => "upgrade",
            Command::Rollback { .. } => "rollback",
            Command::Prune { .. } => "prune",
            Command::LeaseCandidacy { .. } => "lease-candidacy",
            Command::LeaseGrant { .. } => "lease-grant",
            Command::LeaseRelease { .. } => "lease-release",
            Command::Reexec { .. } => "reexec",
            Command::Poweroff {} => "poweroff",
            Command::Reboot {} => "reboot",
            Command::Halt {} => "halt",
        }
    }
}

/// A decoded request: its id (any JSON value, `null` if absent) and its command.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    pub id: Value,
    pub command: Command,
}

/// Decodes one request line (without its newline). On error, the id is returned too when
/// it could be read, so the error answer carries it.
pub fn decode(line: &[u8]) -> Result<Request, (Value, Error)> {
    let bad = |id: Value, msg: String| (id, Error::new(ErrorKind::BadRequest, msg));
    let value: Value =
        serde_json::from_slice(line).map_err(|e| bad(Value::Null, format!("not JSON: {e}")))?;
    let Value::Object(mut obj) = value else {
        return Err(bad(Value::Null, "a request is a JSON object".into()));
    };
    let id = obj.remove("id").unwrap_or(Value::Null);
    let cmd = match obj.get("cmd") {
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(bad(id, "\"cmd\" must be a string".into())),
        None => return Err(bad(id, "missing \"cmd\"".into())),
    };
    if !COMMANDS.contains(&cmd.as_str()) {
        let e = Error::new(
            ErrorKind::UnknownCommand,
            format!("no command '{cmd}' (known: {})", COMMANDS.join(", ")),
        );
        return Err((id, e));
    }
    match serde_json::from_value::<Command>(Value::Object(obj)) {
        Ok(
            Command::Start {
                service: None,
                services,
            }
            | Command::Stop {
                service: None,
                services,
            }
            | Command::Restart {
                service: None,
                services,
            },
        ) if services.is_empty() => Err(bad(
            id,
            format!("{cmd}: name a service: \"service\": NAME, or \"services\": [NAME, ...] (\"all\" for every service)"),
        )),
        Ok(command) => Ok(Request { id, command }),
        Err(e) => Err(bad(id, format!("{cmd}: {e}"))),
    }
}

/// Encodes a success answer, newline included.
pub fn encode_ok(id: &Value, data: Value) -> Vec<u8> {
    line(json!({"id": id, "ok": true, "data": data}))
}

/// Encodes a success answer written straight from `data` (no `Value` tree: `status` of
/// 10,000 services made one of 10,000 objects), newline included. Its keys come in the
/// order `encode_ok`'s do (sorted): `data`'s own must be declared in that order.
pub fn encode_ok_with<T: Serialize + ?Sized>(id: &Value, data: &T) -> Vec<u8> {
    #[derive(Serialize)]
    struct Ok<'a, T: ?Sized> {
        data: &'a T,
        id: &'a Value,
        ok: bool,
    }
    let mut out = Vec::with_capacity(256);
    if serde_json::to_writer(&mut out, &Ok { data, id, ok: true }).is_err() {
        out.clear();
        out.extend_from_slice(b"{}");
    }
    out.push(b'\n');
    out
}

/// Encodes an error answer, newline included.
pub fn encode_err(id: &Value, e: &Error) -> Vec<u8> {
    line(json!({"id": id, "ok": false, "error": {"kind": e.kind.as_str(), "message": e.message}}))
}

/// Encodes an event (or any object), newline included.
pub fn line(v: Value) -> Vec<u8> {
    let mut out = serde_json::to_vec(&v).unwrap_or_else(|_| b"{}".to_vec());
    out.push(b'\n');
    out
}

/// How a process ended, as `status` shows it: `{"code": N}` or `{"signal": "KILL"}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LastExit {
    Code(i32),
    Signal(String),
}

/// One service in `status` data. Its fields are in the order of their names: `status`
/// writes its answer straight from these structs, and the keys come out sorted as they
/// always did from a `serde_json::Value` (whose objects sort their keys), byte for byte.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ServiceStatus {
    /// "healthy", "unhealthy" or "unknown" for a service with a `health` check or a
    /// `watchdog`; `None` for one with neither.
    #[serde(default)]
    pub health: Option<String>,
    /// Consecutive failures of its check.
    #[serde(default)]
    pub health_failures: Option<u32>,
    /// Its last failure of a check or the watchdog: why, and when.
    #[serde(default)]
    pub health_last_failure: Option<HealthFailure>,
    /// A process of a run that is killed and not gone yet (it cannot die now: an
    /// uninterruptible sleep, a frozen cgroup), which holds the service back: no new run
    /// starts while it lives.
    #[serde(default)]
    pub held_by: Option<HeldBy>,
    pub last_exit: Option<LastExit>,
    /// The sockets of its `listen` supd holds for it (bound once, kept between runs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub listening: Vec<String>,
    /// Output lines lost to a full log or a failing disk.
    #[serde(default)]
    pub log_dropped: u64,
    pub name: String,
    /// Time left until the service's next timer (restart, kill, ready timeout, cooldown).
    #[serde(default)]
    pub next_ms: Option<u64>,
    /// Its processes killed by the kernel for want of memory (under `memory_max`) since
    /// supd started, of ended runs and of the run that goes on.
    #[serde(default)]
    pub oom_kills: u32,
    pub pid: Option<i32>,
    pub reason: Option<String>,
    /// What its cgroup uses now, where cgroups exist and a run is there.
    #[serde(default)]
    pub resources: Option<Resources>,
    pub restarts: u32,
    /// Automatic restarts since supd started (`restarts` counts those of the current
    /// run of the current version).
    #[serde(default)]
    pub restarts_total: u32,
    pub state: String,
    /// The last `STATUS=` a notify service sent.
    #[serde(default)]
    pub status: Option<String>,
    /// The fds it stored in supd (`FDSTORE=1`), in the order its next run gets them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stored_fds: Vec<StoredFd>,
    /// When it last became unhealthy (Unix milliseconds).
    #[serde(default)]
    pub unhealthy_since_ms: Option<u64>,
    /// Up, as `supctl status` counts it: running, or exited for a one-shot whose ready
    /// is "exited".
    #[serde(default)]
    pub up: bool,
    pub uptime_ms: Option<u64>,
    pub version: Option<String>,
    /// "up" or "down": what the operator asked for.
    #[serde(default)]
    pub want: String,
}

/// What a service's cgroup uses, in `status` (fields in the order of their names; base
/// units). A field is `None` where no hierarchy has its controller.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resources {
    /// CPU time of its processes, in microseconds (cpu.stat's usage_usec, or cpuacct.usage).
    #[serde(default)]
    pub cpu_usec: Option<u64>,
    /// Memory charged to it now, in bytes (memory.current, or memory.usage_in_bytes).
    #[serde(default)]
    pub memory_bytes: Option<u64>,
    /// The most it was charged, in bytes (memory.peak, or memory.max_usage_in_bytes).
    #[serde(default)]
    pub memory_peak_bytes: Option<u64>,
    /// Its processes and threads (pids.current).
    #[serde(default)]
    pub tasks: Option<u64>,
}

/// One fd of a service's fd store, in `status`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredFd {
    /// Its `FDNAME=`.
    pub name: String,
    /// What it is: a socket's addresses, else the file /proc names.
    pub what: String,
}

/// A failed health check or watchdog, in `status` (fields in the order of their names).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthFailure {
    pub reason: String,
    pub time_ms: u64,
}

/// What holds a service back, in `status` (fields in the order of their names).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldBy {
    /// How long supd has waited for it: since it began ending what a previous supd
    /// left, or since it sent SIGKILL to the service's last run.
    pub for_ms: u64,
    /// A cgroup freezer holds it (its SIGKILL lands once it is thawed).
    pub frozen: bool,
    /// Other processes of that run still there.
    pub more: usize,
    pub pid: i32,
    /// "previous" (left by a previous supd, which was killed) or "last" (the service's
    /// own last run, stopped).
    pub run: String,
    /// Its state letter in /proc/PID/stat ("D": uninterruptible sleep).
    pub state: String,
}

/// Builds an object from pairs, skipping nothing; for event payloads.
pub fn object(pairs: Vec<(&str, Value)>) -> Value {
    let mut m = Map::new();
    for (k, v) in pairs {
        m.insert(k.to_string(), v);
    }
    Value::Object(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_written_straight_is_byte_for_byte_what_a_value_gave() {
        let st = ServiceStatus {
            health: Some("unhealthy".into()),
            health_failures: Some(3),
            health_last_failure: Some(HealthFailure {
                reason: "connect: refused \"x\"".into(),
                time_ms: 17,
            }),
            held_by: Some(HeldBy {
                for_ms: 40_000,
                frozen: true,
                more: 1,
                pid: 7,
                run: "previous".into(),
                state: "D".into(),
            }),
            last_exit: Some(LastExit::Signal("KILL".into())),
            listening: vec!["tcp:127.0.0.1:80".into(), "unix:/run/a.sock".into()],
            log_dropped: 4,
            name: "web@1".into(),
            next_ms: Some(250),
            oom_kills: 2,
            pid: Some(42),
            reason: Some("why".into()),
            resources: Some(Resources {
                cpu_usec: Some(1500),
                memory_bytes: Some(4096),
                memory_peak_bytes: None,
                tasks: Some(3),
            }),
            restarts: 5,
            restarts_total: 7,
            state: "running".into(),
            status: Some("serving".into()),
            stored_fds: vec![StoredFd {
                name: "conn".into(),
                what: "socket 127.0.0.1:80 <- 127.0.0.1:5000".into(),
            }],
            unhealthy_since_ms: Some(9),
            up: true,
            uptime_ms: Some(1000),
            version: Some("1.2.3".into()),
            want: "up".into(),
        };
        let plain = ServiceStatus {
            health: None,
            health_failures: None,
            health_last_failure: None,
            held_by: None,
            last_exit: Some(LastExit::Code(1)),
            pid: None,
            resources: None,
            listening: Vec::new(),
            stored_fds: Vec::new(),
            ..st.clone()
        };
        let id = json!({"n": 1});
        for data in [vec![st.clone()], vec![st, plain], vec![]] {
            let answer = json!({"services": data});
            assert_eq!(
                String::from_utf8_lossy(&encode_ok_with(&id, &answer)),
                String::from_utf8_lossy(&encode_ok(&id, answer.clone())),
            );
            #[derive(Serialize)]
            struct Typed {
                services: Vec<ServiceStatus>,
            }
            assert_eq!(
                String::from_utf8_lossy(&encode_ok_with(&id, &Typed { services: data })),
                String::from_utf8_lossy(&encode_ok(&id, answer)),
                "the typed answer's keys come in the order a Value's did"
            );
        }
    }

    /// Each kind's name reads back as that kind. The match has no `_` arm: a new kind
    /// does not compile here until it is named, and so added to `ALL` as well.
    #[test]
    fn every_error_kind_reads_back_from_its_name() {
        for k in ErrorKind::ALL {
            assert_eq!(ErrorKind::from_name(k.as_str()), Some(k));
        }
        let in_all = |k: ErrorKind| match k {
            ErrorKind::BadRequest
            | ErrorKind::UnknownCommand
            | ErrorKind::UnknownService
            | ErrorKind::PermissionDenied
            | ErrorKind::Failed
            | ErrorKind::InvalidConfig
            | ErrorKind::UnknownTool
            | ErrorKind::UnknownLease
            | ErrorKind::Busy => ErrorKind::ALL.contains(&k),
        };
        assert!(ErrorKind::ALL.into_iter().all(in_all));
        assert_eq!(ErrorKind::from_name("error"), None);
    }

    #[test]
    fn decode_table() {
        let ok: &[(&str, Command)] = &[
            (r#"{"id":1,"cmd":"hello"}"#, Command::Hello {}),
            (
                r#"{"cmd":"status","service":"agent"}"#,
                Command::Status {
                    service: Some("agent".into()),
                    services: vec![],
                },
            ),
            (
                r#"{"cmd":"status"}"#,
                Command::Status {
                    service: None,
                    services: vec![],
                },
            ),
            (
                r#"{"cmd":"stop","service":"a"}"#,
                Command::Stop {
                    service: Some("a".into()),
                    services: vec![],
                },
            ),
            (
                r#"{"cmd":"signal","service":"a","signal":"HUP"}"#,
                Command::Signal {
                    service: "a".into(),
                    signal: SignalArg::Name("HUP".into()),
                },
            ),
            (
                r#"{"cmd":"signal","service":"a","signal":10}"#,
                Command::Signal {
                    service: "a".into(),
                    signal: SignalArg::Number(10),
                },
            ),
            (
                r#"{"cmd":"log","service":"a","lines":5,"follow":true}"#,
                Command::Log {
                    service: Some("a".into()),
                    services: None,
                    lines: Some(5),
                    since_ms: None,
                    grep: None,
                    follow: true,
                    stderr: false,
                },
            ),
            (
                r#"{"cmd":"log","services":["a","b"],"since_ms":7,"grep":"x|y"}"#,
                Command::Log {
                    service: None,
                    services: Some(vec!["a".into(), "b".into()]),
                    lines: None,
                    since_ms: Some(7),
                    grep: Some("x|y".into()),
                    follow: false,
                    stderr: false,
                },
            ),
            (
                r#"{"cmd":"log","service":"a","stderr":true}"#,
                Command::Log {
                    service: Some("a".into()),
                    services: None,
                    lines: None,
                    since_ms: None,
                    grep: None,
                    follow: false,
                    stderr: true,
                },
            ),
            (r#"{"id":"x","cmd":"watch"}"#, Command::Watch {}),
            (r#"{"cmd":"reload"}"#, Command::Reload { service: None }),
            (
                r#"{"cmd":"reload","service":"a"}"#,
                Command::Reload {
                    service: Some("a".into()),
                },
            ),
        ];
        for (text, want) in ok {
            let r = decode(text.as_bytes()).unwrap_or_else(|e| panic!("{text}: {e:?}"));
            assert_eq!(&r.command, want, "{text}");
        }
        let bad: &[(&str, Value, ErrorKind)] = &[
            ("{not json", Value::Null, ErrorKind::BadRequest),
            ("[1,2]", Value::Null, ErrorKind::BadRequest),
            (r#"{"id":3}"#, json!(3), ErrorKind::BadRequest),
            (r#"{"id":4,"cmd":7}"#, json!(4), ErrorKind::BadRequest),
            (
                r#"{"id":5,"cmd":"explode"}"#,
                json!(5),
                ErrorKind::UnknownCommand,
            ),
            (r#"{"id":6,"cmd":"stop"}"#, json!(6), ErrorKind::BadRequest),
            (
                r#"{"id":7,"cmd":"stop","service":12}"#,
                json!(7),
                ErrorKind::BadRequest,
            ),
            (
                r#"{"id":8,"cmd":"hello","extra":true}"#,
                json!(8),
                ErrorKind::BadRequest,
            ),
        ];
        for (text, id, kind) in bad {
            let (got_id, e) = decode(text.as_bytes()).expect_err(text);
            assert_eq!((&got_id, e.kind), (id, *kind), "{text}: {}", e.message);
        }
    }

    #[test]
    fn answers_are_one_line_with_the_id() {
        let ok = encode_ok(&json!(9), json!({"a": 1}));
        assert_eq!(ok, b"{\"data\":{\"a\":1},\"id\":9,\"ok\":true}\n");
        let err = encode_err(
            &json!("x"),
            &Error::new(ErrorKind::UnknownService, "no service named 'q'"),
        );
        let v: Value = serde_json::from_slice(&err).expect("json");
        assert_eq!(v["error"]["kind"], "unknown-service");
        assert_eq!(v["id"], "x");
        assert_eq!(err.iter().filter(|&&b| b == b'\n').count(), 1);
    }

    #[test]
    fn last_exit_shape() {
        assert_eq!(
            serde_json::to_value(LastExit::Code(3)).expect("json"),
            json!({"code": 3})
        );
        assert_eq!(
            serde_json::to_value(LastExit::Signal("KILL".into())).expect("json"),
            json!({"signal": "KILL"})
        );
    }

    /// Every command, classified: read (`socket_group`), operate (`control_group`), or
    /// neither (root and supd's own user only). A command added to `COMMANDS` without
    /// a line here fails.
    #[test]
    fn every_command_is_classified_for_both_groups() {
        let cases: &[(Value, bool, bool)] = &[
            (json!({"cmd": "hello"}), true, true),
            (json!({"cmd": "status"}), true, true),
            (json!({"cmd": "log", "service": "a"}), true, true),
            (json!({"cmd": "watch"}), true, true),
            (json!({"cmd": "metrics"}), true, true),
            (json!({"cmd": "show", "service": "a"}), true, true),
            (json!({"cmd": "versions", "tool": "t"}), true, true),
            (json!({"cmd": "lease-candidacy", "lease": "l"}), true, true),
            (json!({"cmd": "start", "service": "a"}), false, true),
            (json!({"cmd": "stop", "services": ["a", "b"]}), false, true),
            (json!({"cmd": "restart", "service": "a"}), false, true),
            (
                json!({"cmd": "signal", "service": "a", "signal": "HUP"}),
                false,
                true,
            ),
            (json!({"cmd": "reload", "service": "a"}), false, true),
            (json!({"cmd": "reload"}), false, false),
            (json!({"cmd": "shutdown"}), false, false),
            (
                json!({"cmd": "install", "tool": "t", "version": "1", "dir": "/x"}),
                false,
                false,
            ),
            (
                json!({"cmd": "upgrade", "tool": "t", "version": "1"}),
                false,
                false,
            ),
            (json!({"cmd": "rollback", "tool": "t"}), false, false),
            (json!({"cmd": "prune", "tool": "t"}), false, false),
            (
                json!({"cmd": "lease-grant", "lease": "l", "holder": "h", "term": 1, "valid_for": "1s"}),
                false,
                false,
            ),
            (json!({"cmd": "lease-release", "lease": "l"}), false, false),
            (json!({"cmd": "reexec"}), false, false),
            (json!({"cmd": "poweroff"}), false, false),
            (json!({"cmd": "reboot"}), false, false),
            (json!({"cmd": "halt"}), false, false),
        ];
        for (v, read, operate) in cases {
            let c: Command = serde_json::from_value(v.clone()).expect("a command");
            assert_eq!((c.read_only(), c.operates()), (*read, *operate), "{v}");
            assert!(!c.read_only() || c.operates(), "operators read too: {v}");
        }
        for name in COMMANDS {
            assert!(
                cases.iter().any(|(v, _, _)| v["cmd"] == *name),
                "'{name}' is not classified here"
            );
        }
    }

    #[test]
    fn only_reading_commands_are_read_only() {
        assert!(Command::Watch {}.read_only());
        assert!(Command::Show {
            service: "web".into()
        }
        .read_only());
        assert!(!Command::Shutdown {}.read_only());
        assert!(!Command::Stop {
            service: Some("a".into()),
            services: vec![],
        }
        .read_only());
    }
}
