//! Lossless upgrades (issue 29) pushed at their edges with real processes: stored fds of
//! every kind, stored fds dropped while a run still holds their file, floods of notify
//! messages, a supd killed while it holds a service's sockets, odd Unix socket paths.
//! Each test: its own sandbox, waits with deadlines, every process ended by its pid.

mod common;
use common::lossless::{ask, free_port, runs, SERVER};
use common::Sandbox;
use nix::sys::signal::Signal;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The python helpers every test service here starts with: `tell` sends a notify
/// message with fds; `note` appends one JSON line to the report (argv[1]).
const PRELUDE: &str = r#"#!/usr/bin/env python3
import json, os, signal, socket, sys, time
notify = os.environ.get("NOTIFY_SOCKET")
report = sys.argv[1]
def tell(msg, fds=()):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.connect(notify)
    socket.send_fds(s, [msg.encode()], list(fds))
    s.close()
def note(**kw):
    kw["pid"] = os.getpid()
    kw["listen_fds"] = os.environ.get("LISTEN_FDS")
    kw["names"] = os.environ.get("LISTEN_FDNAMES")
    with open(report, "a") as f:
        f.write(json.dumps(kw) + "\n")
"#;

/// A test service: [`PRELUDE`] then `body`; returns its command line (with the report).
fn service(sb: &Sandbox, name: &str, body: &str) -> (String, PathBuf) {
    let report = sb.path(&format!("{name}.jsonl"));
    let path = sb.file(&format!("{name}.py"), &format!("{PRELUDE}{body}"));
    (format!("[\"{path}\", \"{}\"]", report.display()), report)
}

/// Waits until `report` holds a line for which `pred` holds; returns all lines.
fn wait_report(sb: &Sandbox, report: &Path, pred: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let dir = common::files::watch_dir_of(report);
    let end = Instant::now() + common::DEADLINE;
    loop {
        let r = runs(report);
        if pred(&r) {
            return r;
        }
        let left = end.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "report: {r:?}\n{}", sb.supd_log());
        common::files::next_events(&dir, left);
    }
}

/// Waits (looking after each turn of supd's loop) until `service`'s status satisfies
/// `pred`; returns it.
fn wait_status(sb: &Sandbox, service: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let end = Instant::now() + common::DEADLINE;
    loop {
        let st = sb.status(service);
        if pred(&st) {
            return st;
        }
        assert!(Instant::now() < end, "status: {st}\n{}", sb.supd_log());
        common::wait_in_poll(sb.supd_pid());
    }
}

/// The names of the stored fds `status` shows.
fn stored_names(st: &Value) -> Vec<String> {
    st["stored_fds"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|s| s["name"].as_str().unwrap_or("").to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// How many fds `pid` has open.
fn fd_count(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("its fds")
        .count()
}

/// Whether `pid` blocks in poll within `limit`: a supd whose loop is woken for ever by
/// a ready fd never does. Its state is looked at every millisecond (no event tells that
/// a process went to sleep).
fn idle_within(pid: i32, limit: Duration) -> bool {
    let end = Instant::now() + limit;
    loop {
        let call = std::fs::read_to_string(format!("/proc/{pid}/syscall")).unwrap_or_default();
        let nr = call.split_whitespace().next().unwrap_or("");
        if matches!(
            (std::env::consts::ARCH, nr),
            ("x86_64", "7" | "271") | ("aarch64", "73")
        ) {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1)); // a state, not an event
    }
}

/// supd's log holds no panic.
fn no_panic(sb: &Sandbox) {
    let log = sb.supd_log();
    assert!(!log.contains("panicked"), "supd panicked:\n{log}");
}

/// `status` answers within a second.
fn answers_quickly(sb: &Sandbox, service: &str) {
    let t = Instant::now();
    sb.status(service);
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "status took {:?}",
        t.elapsed()
    );
}

/// A stored fd that hangs up while the run still holds it too (a pipe whose writer
/// closes), and one dropped by `FDSTOREREMOVE` while the run keeps its copy and which
/// hangs up afterwards: supd drops its own fd, and must then go back to sleep. The
/// epoll set watches a file, not an fd number: closing supd's fd while another process
/// holds the file left it in the set, reporting its hang-up at every turn, and supd
/// spun at full CPU until the run closed its copy.
#[test]
fn a_stored_fd_dropped_while_the_run_holds_it_too_leaves_supd_idle() {
    let mut sb = Sandbox::new();
    let (cmd, report) = service(
        &sb,
        "keeper",
        r#"
r, w = os.pipe()
a, b = socket.socketpair()
tell("FDSTORE=1\nFDNAME=pipe", [r])
tell("FDSTORE=1\nFDNAME=pair", [a.fileno()])
def removed_then_hung(*_):
    tell("FDSTOREREMOVE=1\nFDNAME=pair")
    note(step="removed")
def hang_pipe(*_):
    b.close()
    os.close(w)
    note(step="hung")
signal.signal(signal.SIGUSR1, removed_then_hung)
signal.signal(signal.SIGUSR2, hang_pipe)
note(step="stored")
while True:
    signal.pause()
"#,
    );
    sb.config(&format!(
        "[service.keeper]\ncommand = {cmd}\nfd_store = 4\n"
    ));
    sb.start();
    wait_report(&sb, &report, |r| r.iter().any(|l| l["step"] == "stored"));
    wait_status(&sb, "keeper", |st| stored_names(st) == ["pipe", "pair"]);
    let supd = sb.supd_pid();
    let before = fd_count(supd);
    // The pair is dropped from the store; the run keeps its end.
    assert!(sb.supctl(&["signal", "keeper", "USR1"]).status.success());
    wait_report(&sb, &report, |r| r.iter().any(|l| l["step"] == "removed"));
    wait_status(&sb, "keeper", |st| stored_names(st) == ["pipe"]);
    // Its peer closes: the run's copy hangs up; so does the stored pipe (its writer
    // closed): supd drops it, the run keeps its own copy of both.
    assert!(sb.supctl(&["signal", "keeper", "USR2"]).status.success());
    wait_report(&sb, &report, |r| r.iter().any(|l| l["step"] == "hung"));
    wait_status(&sb, "keeper", |st| st.get("stored_fds").is_none());
    assert!(
        idle_within(supd, Duration::from_secs(5)),
        "supd never went back to sleep: a hang-up of a file it no longer holds wakes it for ever\n{}",
        sb.supd_log()
    );
    answers_quickly(&sb, "keeper");
    assert_eq!(
        fd_count(supd),
        before - 2,
        "supd holds its 2 stored fds no more"
    );
    no_panic(&sb);
    sb.stop_supd(Signal::SIGTERM);
}

/// Fds epoll cannot watch (character devices without poll such as /dev/null and
/// /dev/zero, an `O_PATH` fd, a regular file, a directory) are stored like any other and
/// given to the next run: a refused watch must not upset supd (a debug supd asserted
/// its epoll set held every stored fd, panicked and re-executed itself in a loop; a
/// release one warned at each turn that touched the service).
#[test]
fn stored_fds_epoll_cannot_watch_are_kept_and_passed() {
    let mut sb = Sandbox::new();
    let (cmd, report) = service(
        &sb,
        "odd",
        r#"
if os.environ.get("LISTEN_FDS"):
    note(step="next")
    while True:
        signal.pause()
kinds = [
    ("null", os.open("/dev/null", os.O_RDWR)),
    ("zero", os.open("/dev/zero", os.O_RDONLY)),
    ("opath", os.open("/tmp", os.O_PATH)),
    ("file", os.open(report, os.O_RDONLY)),
    ("dir", os.open("/", os.O_RDONLY | os.O_DIRECTORY)),
    ("memfd", os.memfd_create("m")),
    ("eventfd", os.eventfd(0)),
]
for name, fd in kinds:
    tell("FDSTORE=1\nFDNAME=" + name, [fd])
note(step="stored")
while True:
    signal.pause()
"#,
    );
    // The report exists before the run opens it.
    std::fs::write(&report, "").expect("report");
    sb.config(&format!("[service.odd]\ncommand = {cmd}\nfd_store = 16\n"));
    sb.start();
    wait_report(&sb, &report, |r| r.iter().any(|l| l["step"] == "stored"));
    let st = wait_status(&sb, "odd", |st| stored_names(st).len() == 7);
    assert_eq!(
        stored_names(&st),
        ["null", "zero", "opath", "file", "dir", "memfd", "eventfd"],
        "{st}"
    );
    answers_quickly(&sb, "odd");
    assert!(sb.supctl(&["restart", "odd"]).status.success());
    let r = wait_report(&sb, &report, |r| r.iter().any(|l| l["step"] == "next"));
    let next = r.iter().find(|l| l["step"] == "next").expect("next");
    assert_eq!(
        next["names"], "null:zero:opath:file:dir:memfd:eventfd",
        "{next}"
    );
    answers_quickly(&sb, "odd");
    no_panic(&sb);
    let log = sb.supd_log();
    assert!(!log.contains("cannot watch"), "{log}");
    sb.stop_supd(Signal::SIGTERM);
}

/// The uid of user `name`.
fn uid_of(name: &str) -> u32 {
    nix::unistd::User::from_name(name)
        .expect("user database")
        .unwrap_or_else(|| panic!("no user {name}"))
        .uid
        .as_raw()
}

/// A Unix socket in a directory its service's user may write: the user puts a link to
/// a file of root's where the socket was. Each start gives the socket's file to the
/// user (as root, before the switch): the link must not be followed, or the user owns
/// root's file (here a stand-in for /etc/shadow).
#[test]
fn a_link_put_where_the_socket_was_does_not_give_its_target_to_the_user() {
    if !common::is_root() {
        eprintln!("skipped: needs root (a user switch)");
        return;
    }
    let mut sb = Sandbox::new();
    let nobody = uid_of("nobody");
    let dir = sb.path("run");
    std::fs::create_dir(&dir).expect("mkdir");
    nix::unistd::chown(&dir, Some(nobody.into()), None).expect("chown");
    let victim = sb.path("victim");
    std::fs::write(&victim, "secret").expect("victim");
    common::files::chmod(&victim, 0o600);
    let sock = dir.join("app.sock");
    let (cmd, report) = service(
        &sb,
        "swap",
        &format!(
            r#"
marker = "{dir}/swapped"
if not os.path.exists(marker):
    os.remove("{sock}")
    os.symlink("{victim}", "{sock}")
    open(marker, "w").close()
    note(step="swapped")
    sys.exit(3)
note(step="next")
while True:
    signal.pause()
"#,
            dir = dir.display(),
            sock = sock.display(),
            victim = victim.display()
        ),
    );
    std::fs::write(&report, "").expect("report");
    common::files::chmod(&report, 0o666);
    sb.config(&format!(
        "[service.swap]\ncommand = {cmd}\nuser = \"nobody\"\nlisten = [\"unix:{}\"]\nrestart_delay = \"100ms\"\n",
        sock.display()
    ));
    sb.start();
    wait_report(&sb, &report, |r| r.iter().any(|l| l["step"] == "next"));
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(&victim).expect("victim");
    assert_eq!(
        (m.uid(), m.mode() & 0o777),
        (0, 0o600),
        "root's file was given to the service's user through the link"
    );
    sb.stop_supd(Signal::SIGTERM);
}

/// A store of more fds than the open-files limit runs get (1024 here; a run may raise
/// its own, as Go's runtime does): the next run must still get them. Each start failed
/// "cannot set up its fds: Bad file descriptor" (the child set the run's limit, then
/// `dup2`'d past it), for as long as the store held them.
#[test]
#[ignore = "bug: a run is given fds past its open-files soft limit (supd's original one): \
            each start fails until the service is stopped; the child sets the limit before \
            its dup2s, and a run whose fds fill its limit could not even load its libraries \
            (the fix needs a policy: raise the run's soft limit by the fds passed, or refuse \
            FDSTORE beyond the limit)"]
fn a_store_larger_than_the_open_files_limit_of_runs_is_passed_whole() {
    let mut sb = Sandbox::new();
    let (cmd, report) = service(
        &sb,
        "many",
        r#"
import resource
if os.environ.get("LISTEN_FDS"):
    note(step="next")
    while True:
        signal.pause()
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
fds = [os.eventfd(0) for _ in range(1100)]
for i in range(0, len(fds), 250):
    tell("FDSTORE=1\nFDNAME=e", fds[i:i + 250])
note(step="stored", soft=soft)
sys.exit(3)
"#,
    );
    sb.config(&format!(
        "[service.many]\ncommand = {cmd}\nfd_store = 1200\nrestart_delay = \"100ms\"\n"
    ));
    let (_, hard) =
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).expect("limit");
    assert!(
        hard >= 4096,
        "the hard open-files limit ({hard}) is too low for this test"
    );
    let mut cmd = std::process::Command::new("prlimit");
    cmd.arg(format!("--nofile=1024:{hard}")).arg(common::SUPD);
    sb.start_with(cmd, &["-c"]);
    let r = wait_report(&sb, &report, |r| r.iter().any(|l| l["step"] == "stored"));
    assert_eq!(r[0]["soft"], 1024, "{r:?}");
    // The next start, with 1100 stored fds (the report's wait fails with supd's log,
    // which says why each start failed).
    let r = wait_report(&sb, &report, |r| r.iter().any(|l| l["step"] == "next"));
    let next = r.iter().find(|l| l["step"] == "next").expect("next");
    assert_eq!(next["listen_fds"], "1100", "{next}");
    sb.stop_supd(Signal::SIGTERM);
}

/// A service that failed for good (`restart = "never"` here; `on_crash_loop = "stop"`
/// likewise) has no run coming: its port must refuse clients as a stopped service's
/// does, not take them into a backlog nobody will read (they hang until their own
/// timeout).
#[test]
#[ignore = "gap: sockets are let go only when the service is wanted down; a failed \
            service (restart = never, on_crash_loop = stop) is wanted up and keeps them, \
            so clients connect and hang; letting go at failed must not break a rollback's \
            restart, which holds the socket on purpose"]
fn a_service_that_failed_for_good_refuses_clients() {
    let mut sb = Sandbox::new();
    let port = free_port();
    sb.config(&format!(
        r#"[service.web]
command = ["/bin/sh", "-c", "exit 2"]
listen = ["tcp:127.0.0.1:{port}"]
restart = "never"
"#
    ));
    sb.start();
    sb.wait_state("web", "failed");
    let e = std::net::TcpStream::connect(("127.0.0.1", port))
        .expect_err("a failed service's port accepted a connection nobody will serve");
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused);
    sb.stop_supd(Signal::SIGTERM);
}

/// `supd --check` of `services`: its exit code and what it said.
fn check(sb: &Sandbox, services: &str) -> (Option<i32>, String) {
    sb.config(services);
    let out = std::process::Command::new(common::SUPD)
        .arg("-c")
        .arg(sb.path("sup.toml"))
        .arg("--check")
        .output()
        .expect("supd --check");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code(), text)
}

/// Addresses that cannot both be bound are refused by the config, not found at each
/// start: a wildcard beside an address of its port and family (in one service or two;
/// one of the two services crash-looped for ever on "the address is in use (another
/// program listens there: `ss -ltnp` names it)", and `ss` named supd), and an IPv4
/// address in IPv6 form (supd binds IPv6 alone: each start failed on EINVAL). Nothing
/// is bound here: `--check` only reads.
#[test]
fn addresses_that_cannot_all_be_bound_are_refused_by_the_config() {
    let sb = Sandbox::new();
    for (services, says) in [
        (
            "[service.a]\ncommand = [\"/bin/true\"]\nlisten = [\"tcp:0.0.0.0:8080\"]\n\
             [service.b]\ncommand = [\"/bin/true\"]\nlisten = [\"tcp:127.0.0.1:8080\"]\n",
            "service.b.listen: 'tcp:127.0.0.1:8080' cannot be bound beside a's 'tcp:0.0.0.0:8080'",
        ),
        (
            "[service.a]\ncommand = [\"/bin/true\"]\nlisten = [\"tcp:[::1]:8080\", \"tcp:[::]:8080\"]\n",
            "service.a.listen: 'tcp:[::]:8080' cannot be bound beside 'tcp:[::1]:8080'",
        ),
        (
            "[service.a]\ncommand = [\"/bin/true\"]\nlisten = [\"tcp:[::ffff:127.0.0.1]:8080\"]\n",
            "write \"tcp:127.0.0.1:8080\"",
        ),
        (
            "[service.a]\ncommand = [\"/bin/true\"]\nlisten = [\"unix:/run/x/a.sock\"]\n\
             [service.b]\ncommand = [\"/bin/true\"]\nlisten = [\"unix:/run/x/./a.sock\"]\n",
            "is a's too: one address, one service",
        ),
    ] {
        let (code, text) = check(&sb, services);
        assert_eq!(code, Some(1), "{services}\n{text}");
        assert!(text.contains(says), "{services}\n{text}");
    }
    // The wildcards of the two families are apart (IPv6 alone), as are two ports.
    let (code, text) = check(
        &sb,
        "[service.a]\ncommand = [\"/bin/true\"]\nlisten = [\"tcp:0.0.0.0:8080\", \"tcp:[::]:8080\"]\n\
         [service.b]\ncommand = [\"/bin/true\"]\nlisten = [\"tcp:127.0.0.1:8081\"]\n",
    );
    assert_eq!(code, Some(0), "{text}");
}

/// A reload moves an address from one service to another: the one that takes it starts
/// while the other (slow to stop) still holds it. Its start fails and is tried again
/// until the other lets go, and the reason says which service holds it (it said
/// "another program listens there: `ss -ltnp` names it", and ss named supd).
#[test]
fn an_address_moved_by_a_reload_is_taken_once_its_old_service_lets_go() {
    let mut sb = Sandbox::new();
    let report = sb.path("runs.jsonl");
    let srv = sb.file("srv.py", SERVER);
    let slow = sb.script("slow.sh", "trap 'sleep 1; exit 0' TERM\nsleep 1000 &\nwait");
    let (p1, p2, p3) = (free_port(), free_port(), free_port());
    let services = |a: u16, b: u16| {
        format!(
            r#"[service.a]
command = ["{srv}", "{report}"]
listen = ["tcp:127.0.0.1:{a}"]
restart_delay = "100ms"

[service.b]
command = ["{slow}"]
listen = ["tcp:127.0.0.1:{b}"]
"#,
            report = report.display()
        )
    };
    sb.config(&services(p1, p2));
    sb.start();
    sb.wait_state("b", "running");
    let first = wait_report(&sb, &report, |r| !r.is_empty())[0]["pid"].to_string();
    assert_eq!(ask(&format!("127.0.0.1:{p1}")).expect("a on p1"), first);
    let mut w = sb.watch();
    sb.config(&services(p2, p3));
    let out = sb.supctl(&["reload"]);
    assert!(out.status.success(), "{out:?}");
    let e = w.until(&sb, |e| {
        e["event"] == "state" && e["service"] == "a" && e["to"] == "backoff"
    });
    let why = e["reason"].as_str().unwrap_or("");
    assert!(
        why.contains(&format!("b still holds tcp:127.0.0.1:{p2}")),
        "{e}"
    );
    let r = wait_report(&sb, &report, |r| r.len() >= 2);
    assert_eq!(
        ask(&format!("127.0.0.1:{p2}")).expect("a on p2"),
        r.last().expect("a run")["pid"].to_string()
    );
    sb.stop_supd(Signal::SIGTERM);
}
