//! supctl: args → one request → print the answer → exit code.
//! Exit codes: 0 success, 1 failed or refused, 2 usage, 3 `status`: a service is not
//! up, 4 cannot reach supd, 5 `status`: all is up but supd runs with config errors.
//!
//! Its entry is the C `main`, not std's (see [`main`]): `supctl status NAME` is mostly
//! start-up, and std's adds work a client that runs for a millisecond does not need.
#![cfg_attr(not(test), no_main)]

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};
use sup::protocol::ServiceStatus;
use sup::time::Human;

/// How long supctl waits for supd by default (`--timeout`).
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// `println!` into a `String`: output is written once, by [`emit`], which cannot panic.
macro_rules! outln {
    ($o:expr) => {
        $o.push('\n')
    };
    ($o:expr, $($arg:tt)*) => {{
        $o.push_str(&format!($($arg)*));
        $o.push('\n');
    }};
}

#[path = "supctl/versions.rs"]
mod versions;
use versions::print_versions;
#[path = "supctl/log.rs"]
mod log;
#[path = "supctl/status.rs"]
mod status;
#[cfg(test)]
use status::show_status_outcome;
use status::{show_status, status_text, StatusData};

const USAGE: &str = "usage: supctl [-s SOCKET] [--json] [--timeout DURATION] COMMAND [ARGS]

commands:
  status [SERVICE...]         state of each service; exit 3 if one is not up,
                              5 if supd runs with config errors
  start SERVICE...            admin up; answers once up, or why not (exit 1);
                              'all' names every service; in 'after' order
  stop SERVICE...             admin down (stays down across restarts of supd);
                              dependents first; says when SIGKILL was needed
  restart SERVICE...          stop, then start
  signal SERVICE SIG          send SIG to the service's process group
  log [SERVICE...] [-n N] [-f] [--since TIME] [--grep RE] [--stderr]
                              last N lines of their output (none named: of
                              every service), merged by time, in local time;
                              -f follows; --since: a duration ago (10m), a
                              local time (2026-12-02 10:00, 10:00:05), RFC 3339
                              or @EPOCH; --grep: POSIX extended regex;
                              --stderr: only stderr lines
  watch                       one line per event until interrupted (--json: JSON)
  metrics                     Prometheus text format (0.0.4) of every service,
                              tool and supd itself
  show SERVICE                its effective settings, each with the file:line
                              that set it (overrides included) or 'default'
  reload [SERVICE]            re-read the config (nothing changes on error);
                              with SERVICE: send it its reload_signal
  shutdown                    stop every service, then supd exits
  poweroff | reboot | halt    system mode: stop every service, end every process, reboot(2)
  reexec [--binary PATH]      supd replaces its program, keeping every service
  hello                       protocol and supd version

versioned tools:
  install [--allow-special] TOOL VERSION DIR
                              copy DIR in as VERSION of TOOL (atomically),
                              modes kept; --allow-special: setuid/setgid files,
                              devices, FIFOs and sockets too (else refused)
  versions TOOL               installed versions and their marks
  upgrade TOOL VERSION [--force] [--irreversible] [--wait]
                              switch to VERSION with a probation; to the
                              current version with --force: clear its bad mark
  rollback TOOL [VERSION] [--force]
                              switch back now
  prune TOOL [--keep N]       delete old and bad versions";

enum Failure {
    Usage(String),
    /// Failed in supctl itself.
    Refused(String),
    /// Refused by supd (its error kind and message), or by the socket's permissions.
    Denied(String, String),
    Unreachable(String),
    /// `status`: a named service is not up (exit 3, as LSB and supervisorctl do).
    NotUp(Vec<String>),
    /// `status`: all is up, but supd runs with config errors (exit 5).
    ConfigErrors,
    /// Whoever reads our output is gone (`supctl status | head -1`): nothing to say.
    OutputClosed,
}

/// The C entry point, in place of std's: std's start-up installs a stack-overflow
/// handler (it reads /proc/self/maps and maps an alternate signal stack, a dozen system
/// calls, a third of what `s6-svstat` makes in all) and takes it down at exit. Of the
/// rest of std's start-up supctl keeps what it relies on ([`start`]). The arguments are
/// std's all the same: on glibc std reads them before `main`.
// The one attribute of the kind outside src/sys/: the C entry point must keep its name.
#[cfg(not(test))]
#[no_mangle]
extern "C" fn main(_argc: libc::c_int, _argv: *const *const libc::c_char) -> libc::c_int {
    start();
    // A panic cannot unwind out of an `extern "C"` function: its message is printed (by
    // the hook) and supctl exits 101, as std's entry does.
    std::panic::catch_unwind(supctl).map_or(101, libc::c_int::from)
}

/// Under the test harness (its own `main`) the entry is a plain function.
#[cfg(test)]
fn main() {
    start();
    std::process::exit(supctl().into());
}

/// What supctl keeps of std's start-up (`sys::client_start`): standard input, output
/// and error open, SIGPIPE ignored (a reader gone is a write error: `supctl status |
/// head -1` ends quietly, [`Failure::OutputClosed`]).
fn start() {
    sup::sys::client_start();
}

/// supctl: its exit code.
fn supctl() -> u8 {
    // Whether errors are said in JSON: known before the arguments are fully read.
    let json = std::env::args().skip(1).any(|a| a == "--json");
    let (code, kind, message, said_kind) = match run() {
        Ok(()) | Err(Failure::OutputClosed) => return 0,
        Err(Failure::NotUp(names)) => {
            if !json {
                note(&format!("supctl: not up: {}", names.join(", ")));
            }
            return 3;
        }
        Err(Failure::ConfigErrors) => {
            if !json {
                note("supctl: all is up, but supd runs with config errors (above); `supd --check` shows them");
            }
            return 5;
        }
        Err(Failure::Usage(m)) => (2, "usage".to_string(), m, false),
        Err(Failure::Refused(m)) => (1, "failed".to_string(), m, false),
        Err(Failure::Denied(kind, m)) => (1, kind, m, true),
        Err(Failure::Unreachable(m)) => (4, "unreachable".to_string(), m, false),
    };
    if json {
        let line = json!({"ok": false, "exit": code, "error": {"kind": kind, "message": message}});
        note(&line.to_string());
    } else if code == 2 {
        note(&format!("supctl: {message}; try 'supctl --help'"));
    } else if said_kind {
        note(&format!("supctl: {kind}: {message}"));
    } else {
        note(&format!("supctl: {message}"));
    }
    code
}

/// Writes to standard output: a closed reader ends supctl quietly; any other error (a
/// full disk) is a failure, said on stderr.
fn emit(text: &str) -> Result<(), Failure> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(Failure::OutputClosed),
        Err(e) => Err(Failure::Refused(format!(
            "cannot write to standard output: {e}"
        ))),
    }
}

/// A line on stderr; if even that cannot be written, there is no one left to tell.
fn note(text: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{text}");
}

struct Opts {
    socket: String,
    json: bool,
    /// `None`: wait for ever (`--timeout 0`).
    timeout: Option<Duration>,
    /// `--timeout` was given.
    timeout_given: bool,
    words: Vec<String>,
}

fn parse_args() -> Result<Opts, Failure> {
    let mut socket =
        std::env::var("SUP_SOCKET").unwrap_or_else(|_| sup::config::DEFAULT_SOCKET.into());
    let mut json = false;
    let mut timeout = Some(DEFAULT_TIMEOUT);
    let mut timeout_given = false;
    let mut words = Vec::new();
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "-s" | "--socket" => {
                socket = it
                    .next()
                    .ok_or_else(|| Failure::Usage("-s needs a socket path".into()))?
            }
            "--json" => json = true,
            "--timeout" => {
                let t = it
                    .next()
                    .ok_or_else(|| Failure::Usage("--timeout needs a duration".into()))?;
                let d = sup::time::parse_duration(&t)
                    .map_err(|e| Failure::Usage(format!("--timeout {t}: {e}")))?;
                timeout = (!d.is_zero()).then_some(d);
                timeout_given = true;
            }
            "-h" | "--help" if words.is_empty() => {
                emit(&format!("{USAGE}\n"))?;
                std::process::exit(0);
            }
            "--version" if words.is_empty() => {
                emit(&format!("supctl {}\n", sup::VERSION))?;
                std::process::exit(0);
            }
            o if words.is_empty() && o.starts_with('-') => {
                return Err(Failure::Usage(format!("unknown option '{o}'")))
            }
            _ => words.push(a),
        }
    }
    Ok(Opts {
        socket,
        json,
        timeout,
        timeout_given,
        words,
    })
}

fn run() -> Result<(), Failure> {
    let opts = parse_args()?;
    let Some((cmd, rest)) = opts.words.split_first() else {
        return Err(Failure::Usage("a command is needed".into()));
    };
    let request = build(cmd, rest)?;
    // `upgrade --wait` waits for a probation to end, however long it is; `start`, `stop`
    // and `restart` as long as the services take (supd bounds that by their
    // ready_timeout and stop_timeout), unless told otherwise.
    let waits = request["wait"] == true
        || (!opts.timeout_given && matches!(cmd.as_str(), "start" | "stop" | "restart"));
    let timeout = opts.timeout.filter(|_| !waits);
    let mut conn = Conn::open(&opts.socket, timeout)?;
    let asked = Instant::now();
    if cmd == "status" && !opts.json {
        let data: StatusData = conn.call_as(&request)?;
        return show_status(&data);
    }
    let data = conn.call(&request)?;
    match cmd.as_str() {
        "watch" => {
            conn.wait_for_ever();
            return stream(&mut conn, opts.json, print_event);
        }
        "reexec" => return after_reexec(&opts.socket, asked, opts.json),
        "log" if request["follow"] == true => {
            return log::follow(conn, &opts.socket, &request, data, opts.json);
        }
        _ => {}
    }
    print_answer(cmd, &data, opts.json)?;
    if cmd == "status" {
        let down: Vec<String> = data["services"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|s| !is_up(s))
            .map(|s| s["name"].as_str().unwrap_or("?").to_string())
            .collect();
        let listed = |key: &str| data[key].as_array().is_some_and(|a| !a.is_empty());
        return status_outcome(down, listed("config_errors") || listed("broken_files"));
    }
    Ok(())
}

/// `status`'s exit: 3 when a service is not up (as LSB and supervisorctl say it), else 5
/// when supd runs with config errors (a broken file: its services may not run as
/// written), else 0.
fn status_outcome(down: Vec<String>, config_errors: bool) -> Result<(), Failure> {
    if !down.is_empty() {
        Err(Failure::NotUp(down))
    } else if config_errors {
        Err(Failure::ConfigErrors)
    } else {
        Ok(())
    }
}

/// A line from supd.
fn parse(line: &str) -> Result<Value, Failure> {
    serde_json::from_str(line).map_err(|e| Failure::Refused(format!("bad answer from supd: {e}")))
}

/// Up, as `status` counts it: supd says so; from a supd too old to say, running.
fn is_up(s: &Value) -> bool {
    s["up"].as_bool().unwrap_or(s["state"] == "running")
}

/// The request for a command line.
fn build(cmd: &str, rest: &[String]) -> Result<Value, Failure> {
    let usage = |m: &str| Failure::Usage(m.to_string());
    Ok(match cmd {
        "hello" | "watch" | "metrics" | "reload" | "shutdown" | "poweroff" | "reboot" | "halt"
            if rest.is_empty() =>
        {
            json!({"cmd": cmd})
        }
        "status" => {
            // `-l`: the long table (a MEMORY column), of supctl's alone.
            let long = |w: &String| w == "-l" || w == "--long";
            if rest.iter().any(long) {
                status::LONG.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            let names: Vec<&String> = rest.iter().filter(|w| !long(w)).collect();
            json!({"cmd": "status", "services": names})
        }
        // A service's own reload: its reload_signal.
        "reload" if rest.len() == 1 => json!({"cmd": "reload", "service": rest[0]}),
        "start" | "stop" | "restart" => match rest {
            [] => return Err(usage(&format!("{cmd} takes SERVICE... (or all)"))),
            [s] if s != "all" => json!({"cmd": cmd, "service": s}),
            _ => json!({"cmd": cmd, "services": rest}),
        },
        "show" => match rest {
            [s] => json!({"cmd": "show", "service": s}),
            _ => return Err(usage("show takes SERVICE")),
        },
        "signal" => match rest {
            [s, sig] => json!({"cmd": "signal", "service": s, "signal": sig}),
            _ => return Err(usage("signal takes SERVICE SIG")),
        },
        "log" => log::request(rest)?,
        "hello" | "watch" | "metrics" | "reload" | "shutdown" | "poweroff" | "reboot" | "halt" => {
            return Err(usage(&format!("{cmd} takes no arguments")))
        }
        "install" => {
            let special = rest.iter().any(|a| a == "--allow-special");
            let words: Vec<&String> = rest.iter().filter(|a| *a != "--allow-special").collect();
            match words[..] {
                [tool, version, dir] if !words.iter().any(|w| w.starts_with('-')) => {
                    let abs = std::fs::canonicalize(dir)
                        .map_err(|e| Failure::Refused(format!("{dir}: {e}")))?;
                    let mut req =
                        json!({"cmd": "install", "tool": tool, "version": version, "dir": abs});
                    // Only when asked: a supd older than the option still takes the rest.
                    if special {
                        req["allow_special"] = json!(true);
                    }
                    req
                }
                _ => return Err(usage("install takes [--allow-special] TOOL VERSION DIR")),
            }
        }
        "versions" => match rest {
            [tool] => json!({"cmd": "versions", "tool": tool}),
            _ => return Err(usage("versions takes TOOL")),
        },
        "upgrade" | "rollback" | "prune" => tool_command(cmd, rest)?,
        "reexec" => match rest {
            [] => json!({"cmd": "reexec"}),
            [flag, path] if flag == "--binary" => {
                let abs =
                    std::fs::canonicalize(path).unwrap_or_else(|_| std::path::PathBuf::from(path));
                json!({"cmd": "reexec", "binary": abs})
            }
            _ => return Err(usage("reexec takes [--binary PATH]")),
        },
        other => return Err(usage(&format!("unknown command '{other}'"))),
    })
}

/// After `reexec` was accepted: the connection closes with the exec; the new image
/// answers on the same socket.
fn after_reexec(socket: &str, asked: std::time::Instant, json: bool) -> Result<(), Failure> {
    // The listening socket stays open across the exec: this connects at once, and the
    // request waits in its backlog until the new image serves it.
    let mut c = Conn::open(socket, Some(Duration::from_secs(30)))?;
    let hello = c.call(&json!({"cmd": "hello"}))?;
    let age =
        std::time::Duration::from_millis(hello["image_uptime_ms"].as_u64().unwrap_or(u64::MAX));
    if age > asked.elapsed() {
        return Err(Failure::Refused(
            "supd kept running its old program: the exec failed (see its log)".into(),
        ));
    }
    if json {
        emit(&format!("{hello}\n"))
    } else {
        emit(&format!(
            "supd re-executed: version {}, pid {}\n",
            hello["version"].as_str().unwrap_or("?"),
            hello["pid"]
        ))
    }
}

/// `upgrade`, `rollback` and `prune`: positional words and flags.
fn tool_command(cmd: &str, rest: &[String]) -> Result<Value, Failure> {
    let usage = |m: String| Failure::Usage(m);
    let mut words = Vec::new();
    let mut req = json!({"cmd": cmd});
    let mut it = rest.iter();
    while let Some(a) = it.next() {
        match (cmd, a.as_str()) {
            ("upgrade" | "rollback", "--force") => req["force"] = json!(true),
            ("upgrade", "--irreversible") => req["irreversible"] = json!(true),
            ("upgrade", "--wait") => req["wait"] = json!(true),
            ("prune", "--keep") => {
                let n: usize = it
                    .next()
                    .and_then(|n| n.parse().ok())
                    .ok_or_else(|| usage("--keep needs a number".into()))?;
                req["keep"] = json!(n);
            }
            (_, flag) if flag.starts_with('-') => {
                return Err(usage(format!("{cmd}: unknown option '{flag}'")))
            }
            (_, word) => words.push(word.to_string()),
        }
    }
    match (cmd, words.as_slice()) {
        ("upgrade", [tool, version]) | ("rollback", [tool, version]) => {
            req["tool"] = json!(tool);
            req["version"] = json!(version);
        }
        ("rollback" | "prune", [tool]) => req["tool"] = json!(tool),
        ("upgrade", _) => return Err(usage("upgrade takes TOOL VERSION".into())),
        ("rollback", _) => return Err(usage("rollback takes TOOL [VERSION]".into())),
        _ => return Err(usage("prune takes TOOL".into())),
    }
    Ok(req)
}

/// A connection to supd, with a deadline for each answer unless waiting for ever.
struct Conn {
    /// Read through the buffer, written through its stream (no second descriptor).
    reader: BufReader<UnixStream>,
    path: String,
    timeout: Option<Duration>,
}

impl Conn {
    /// Connects within `timeout` (a stuck supd's backlog may be full: the wait for a
    /// place in it is bounded by the socket's send timeout).
    fn open(path: &str, timeout: Option<Duration>) -> Result<Conn, Failure> {
        use nix::sys::socket::{self, sockopt, AddressFamily, SockFlag, SockType, UnixAddr};
        use std::os::fd::AsRawFd;
        let unreachable = |e: &dyn std::fmt::Display| {
            Failure::Unreachable(format!("cannot reach supd at {path}: {e} (is supd running? -s or $SUP_SOCKET choose the socket)"))
        };
        let fd = socket::socket(
            AddressFamily::Unix,
            SockType::Stream,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .map_err(|e| unreachable(&e))?;
        if let Some(t) = timeout {
            let tv = nix::sys::time::TimeVal::new(t.as_secs() as _, t.subsec_micros() as _);
            socket::setsockopt(&fd, sockopt::SendTimeout, &tv).map_err(|e| unreachable(&e))?;
        }
        let addr = UnixAddr::new(path).map_err(|e| unreachable(&e))?;
        match socket::connect(fd.as_raw_fd(), &addr) {
            Ok(()) => {}
            Err(nix::errno::Errno::EAGAIN) => {
                return Err(Failure::Unreachable(format!(
                    "supd at {path} did not take the connection within {} (it is stuck, or at its limit of connections or open files; --timeout sets the wait)",
                    Human(timeout.unwrap_or_default())
                )))
            }
            Err(nix::errno::Errno::EACCES | nix::errno::Errno::EPERM) => {
                return Err(Failure::Denied(
                    "permission-denied".into(),
                    format!("you may not use supd's socket {path}: it is for root, supd's own user and members of its socket_group or control_group (run as one of them, or ask to be added to one of those groups)"),
                ))
            }
            Err(e) => return Err(unreachable(&e)),
        }
        Ok(Conn {
            reader: BufReader::new(UnixStream::from(fd)),
            path: path.to_string(),
            timeout,
        })
    }

    /// From now on, events may take as long as they take.
    fn wait_for_ever(&mut self) {
        self.timeout = None;
        let _ = self.reader.get_ref().set_read_timeout(None);
    }

    fn call(&mut self, request: &Value) -> Result<Value, Failure> {
        let line = self.exchange(request)?;
        let mut answer: Value = parse(&line)?;
        if answer["ok"] == true {
            // Taken, not copied.
            Ok(answer.get_mut("data").map(Value::take).unwrap_or_default())
        } else {
            Err(refusal(&answer))
        }
    }

    /// [`Conn::call`], its data read straight into `T` (status of 10,000 services: no
    /// tree of 10,000 JSON objects to build and free).
    fn call_as<T: serde::de::DeserializeOwned>(&mut self, request: &Value) -> Result<T, Failure> {
        #[derive(serde::Deserialize)]
        struct Answer<T> {
            ok: bool,
            data: Option<T>,
        }
        let line = self.exchange(request)?;
        match serde_json::from_str::<Answer<T>>(&line) {
            Ok(Answer {
                ok: true,
                data: Some(data),
            }) => Ok(data),
            // A refusal, or an answer not of that shape: as `call` says it.
            _ => {
                let answer: Value = parse(&line)?;
                Err(refusal(&answer))
            }
        }
    }

    /// Sends one request; its answer line.
    fn exchange(&mut self, request: &Value) -> Result<String, Failure> {
        let mut req = request.clone();
        req["id"] = json!(1);
        let mut line = serde_json::to_vec(&req).map_err(|e| Failure::Refused(e.to_string()))?;
        line.push(b'\n');
        let deadline = self.timeout.map(|t| Instant::now() + t);
        if let Err(e) = self.reader.get_ref().write_all(&line) {
            // supd may have answered and closed at once (too many connections): its
            // reason is worth more than our broken pipe.
            return match self.next(deadline) {
                Ok(Some(answer)) if answer["ok"] == false => Err(refusal(&answer)),
                _ => Err(Failure::Unreachable(format!(
                    "cannot send the request to supd at {}: {e}",
                    self.path
                ))),
            };
        }
        self.next_line(deadline)?.ok_or_else(|| {
            Failure::Unreachable(format!("supd at {} closed the connection", self.path))
        })
    }

    /// The next answer or event, within `deadline` when there is one.
    fn next(&mut self, deadline: Option<Instant>) -> Result<Option<Value>, Failure> {
        match self.next_line(deadline)? {
            Some(line) => parse(&line).map(Some),
            None => Ok(None),
        }
    }

    /// The next line, within `deadline` when there is one.
    fn next_line(&mut self, deadline: Option<Instant>) -> Result<Option<String>, Failure> {
        let mut line = String::new();
        if let Some(d) = deadline {
            let left = d.saturating_duration_since(Instant::now());
            // A zero timeout would mean none at all.
            let left = left.max(Duration::from_millis(1));
            self.reader
                .get_ref()
                .set_read_timeout(Some(left))
                .map_err(|e| Failure::Unreachable(format!("{}: {e}", self.path)))?;
        }
        match self.reader.read_line(&mut line) {
            Ok(0) => Ok(None),
            Ok(_) => Ok(Some(line)),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                Err(Failure::Unreachable(format!(
                    "supd at {} did not answer within {} (it may be stuck or busy; the request may still be carried out; --timeout sets the wait, 0 waits for ever)",
                    self.path,
                    Human(self.timeout.unwrap_or_default())
                )))
            }
            Err(e) => Err(Failure::Unreachable(format!("{}: {e}", self.path))),
        }
    }
}

/// The error of an answer, as supctl says it.
fn refusal(answer: &Value) -> Failure {
    let kind = answer["error"]["kind"].as_str().unwrap_or("failed");
    let msg = answer["error"]["message"].as_str().unwrap_or("no message");
    Failure::Denied(kind.to_string(), msg.to_string())
}

/// Prints events until supd closes the connection.
fn stream(conn: &mut Conn, json: bool, human: impl Fn(&mut String, &Value)) -> Result<(), Failure> {
    while let Some(event) = conn.next(None)? {
        let mut o = String::new();
        if json {
            outln!(o, "{event}");
        } else {
            human(&mut o, &event);
        }
        emit(&o)?;
    }
    Ok(())
}

fn print_event(o: &mut String, e: &Value) {
    let offset = e["time"]
        .as_u64()
        .map_or(0, |ms| sup::sys::utc_offset((ms / 1000) as i64));
    outln!(o, "{}", event_line(e, offset));
}

/// One event in `watch`'s human form: `TIME SUBJECT WHAT [DETAIL VALUE]... [: REASON]`,
/// the time of day local (`offset_s` east of UTC), the subject the service, tool or
/// lease, what its new state or the event's kind.
fn event_line(e: &Value, offset_s: i64) -> String {
    let s = |k: &str| e[k].as_str().filter(|v| !v.is_empty()).map(str::to_string);
    let time = e["time"]
        .as_u64()
        .map(|ms| sup::time::clock_stamp(ms, offset_s))
        .unwrap_or_else(|| "--:--:--.---".into());
    let mut line = vec![time];
    let detail = |line: &mut Vec<String>, key: &str, v: Option<String>| {
        if let Some(v) = v {
            line.push(format!("{key} {v}"));
        }
    };
    let num = |k: &str| e[k].as_u64().map(|n| n.to_string());
    let mut reason = s("reason");
    match e["event"].as_str() {
        Some("state") => {
            line.push(s("service").unwrap_or_else(|| "?".into()));
            line.push(s("to").unwrap_or_else(|| "?".into()));
            detail(&mut line, "pid", num("pid"));
            detail(&mut line, "version", s("version"));
            detail(&mut line, "from", s("from"));
        }
        Some("upgrade") => {
            line.push(s("tool").unwrap_or_else(|| "?".into()));
            line.push("upgrade".into());
            detail(&mut line, "phase", s("phase"));
            detail(&mut line, "version", s("version"));
            detail(&mut line, "from", s("from"));
            if let Some(w) = s("write_error") {
                let what = s("pending").unwrap_or_else(|| "a change".into());
                let waits = format!("{what} waits: {w}; supd retries");
                reason = Some(reason.map_or(waits.clone(), |r| format!("{r}; {waits}")));
            }
        }
        Some("health") => {
            line.push(s("service").unwrap_or_else(|| "?".into()));
            line.push("health".into());
            line.push(s("to").unwrap_or_else(|| "?".into()));
            detail(&mut line, "version", s("version"));
            detail(&mut line, "from", s("from"));
        }
        Some("oom") => {
            line.push(s("service").unwrap_or_else(|| "?".into()));
            line.push("oom".into());
        }
        Some("rollback") => {
            line.push(s("tool").unwrap_or_else(|| "?".into()));
            line.push("rollback".into());
            detail(&mut line, "from", s("from"));
            detail(&mut line, "to", s("to"));
        }
        Some("install") => {
            line.push(s("tool").unwrap_or_else(|| "?".into()));
            line.push("install".into());
            detail(&mut line, "version", s("version"));
            line.push(if e["ok"] == true { "done" } else { "failed" }.into());
            reason = s("error");
        }
        Some("lease") => {
            line.push(s("lease").unwrap_or_else(|| "?".into()));
            line.push("lease".into());
            line.push(s("what").unwrap_or_else(|| "?".into()));
            detail(&mut line, "term", num("term"));
            detail(
                &mut line,
                "valid for",
                e["valid_for_ms"]
                    .as_u64()
                    .map(|ms| Human(Duration::from_millis(ms)).to_string()),
            );
        }
        other => {
            line.push("-".into());
            line.push(other.unwrap_or("event").to_string());
            reason = Some(e.to_string());
        }
    }
    let mut text = line.join(" ");
    if let Some(r) = reason {
        text.push_str(": ");
        text.push_str(&r);
    }
    text
}

fn print_answer(cmd: &str, data: &Value, json: bool) -> Result<(), Failure> {
    let mut o = String::new();
    if json {
        outln!(o, "{data}");
        return emit(&o);
    }
    // Notes for stderr, after the output.
    let mut err = String::new();
    let o = &mut o;
    match cmd {
        "status" => {
            let d: StatusData = serde::Deserialize::deserialize(data).unwrap_or_default();
            status_text(o, &mut err, &d);
        }
        "start" | "stop" | "restart" => {
            let one = std::slice::from_ref(data);
            let list = data["services"].as_array().map_or(one, |l| l.as_slice());
            for v in list {
                if let Ok(st) = serde_json::from_value::<ServiceStatus>(v.clone()) {
                    let pid = st.pid.map(|p| format!(" (pid {p})")).unwrap_or_default();
                    let killed = if v["killed"] == true {
                        format!(
                            " with SIGKILL: still running {} (stop_timeout) after {}",
                            Human(Duration::from_millis(
                                v["stop_timeout_ms"].as_u64().unwrap_or(0)
                            )),
                            v["stop_signal"].as_str().unwrap_or("its stop_signal")
                        )
                    } else {
                        String::new()
                    };
                    // Up but not running (a one-shot), or waiting for its lease: why.
                    let why = match (cmd, st.state.as_str(), &st.reason) {
                        ("stop", _, _) | (_, "running", _) | (_, _, None) => String::new(),
                        (_, _, Some(r)) => format!(": {r}"),
                    };
                    outln!(o, "{}: {}{pid}{killed}{why}", st.name, st.state);
                }
            }
        }
        "log" => log::print(o, &mut err, data),
        // As it came: Prometheus' text format, for a scraper or a file.
        "metrics" => o.push_str(data["text"].as_str().unwrap_or_default()),
        "show" => {
            let files: Vec<&str> = (data["files"].as_array().into_iter().flatten())
                .filter_map(Value::as_str)
                .collect();
            let name = data["service"].as_str().unwrap_or("?");
            outln!(o, "# {name}: {}", files.join(" "));
            for s in data["settings"].as_array().into_iter().flatten() {
                let f = |k: &str| s[k].as_str().unwrap_or("?");
                outln!(o, "{} = {}   # {}", f("key"), f("value"), f("origin"));
            }
        }
        "reload" | "signal" if data["leader_gone"] == true => outln!(
            o,
            "{}: its main process {} has exited: sent {} to the {} processes left in its cgroup {}",
            data["service"].as_str().unwrap_or("?"),
            data["pid"],
            data["signal"].as_str().unwrap_or("?"),
            data["sent_to"].as_array().map_or(0, Vec::len),
            data["sent_to"]
        ),
        "reload" if data["service"].is_string() => outln!(
            o,
            "{}: sent {} to process group {}",
            data["service"].as_str().unwrap_or("?"),
            data["signal"].as_str().unwrap_or("?"),
            data["pid"]
        ),
        "reload" => outln!(
            o,
            "reloaded: added {}, removed {}, changed {}",
            data["added"],
            data["removed"],
            data["changed"]
        ),
        "hello" => outln!(
            o,
            "supd {} (protocol {}), pid {}",
            data["version"].as_str().unwrap_or("?"),
            data["protocol"],
            data["pid"]
        ),
        "versions" => print_versions(o, data),
        "upgrade" if data["cleared"].is_string() => outln!(
            o,
            "{}: {} is no longer marked bad",
            data["tool"].as_str().unwrap_or("?"),
            data["cleared"].as_str().unwrap_or("?")
        ),
        "upgrade" if data["phase"] == "committed" => {
            outln!(
                o,
                "{}: {} committed",
                data["tool"].as_str().unwrap_or("?"),
                data["current"].as_str().unwrap_or("?")
            )
        }
        "upgrade" | "rollback" => {
            let deadline = data["deadline_in_ms"]
                .as_u64()
                .map(|ms| {
                    format!(
                        ", probation ends in {}",
                        Human(std::time::Duration::from_millis(ms))
                    )
                })
                .unwrap_or_default();
            outln!(
                o,
                "{}: now at {} ({}{deadline})",
                data["tool"].as_str().unwrap_or("?"),
                data["current"].as_str().unwrap_or("?"),
                data["phase"].as_str().unwrap_or("?")
            );
        }
        "install" => outln!(
            o,
            "installed {} {} in {}",
            data["tool"].as_str().unwrap_or("?"),
            data["version"].as_str().unwrap_or("?"),
            data["path"].as_str().unwrap_or("?")
        ),
        "prune" => {
            let list = |k: &str| {
                data[k]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|v| v.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    })
                    .unwrap_or_default()
            };
            outln!(
                o,
                "pruned: {}",
                if list("pruned").is_empty() {
                    "nothing".into()
                } else {
                    list("pruned")
                }
            );
        }
        "signal" => outln!(
            o,
            "sent {} to {} (pid {})",
            data["signal"].as_str().unwrap_or("?"),
            data["service"].as_str().unwrap_or("?"),
            data["pid"]
        ),
        _ => {}
    }
    let shown = emit(o);
    if !err.is_empty() {
        note(err.trim_end());
    }
    shown
}

#[cfg(test)]
#[path = "supctl/tests.rs"]
mod tests;
