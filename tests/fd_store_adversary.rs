//! The fd store (issue 29) pushed at its edges with real processes: stored fds of every
//! kind, stored fds dropped while a run still holds their file, floods of notify
//! messages, reexecs in a flood, stores past a spawner request or the open-files limit.
//! Each test: its own sandbox, waits with deadlines, every process ended by its pid.

mod common;
use common::lossless::adversary::*;
use common::lossless::{ask, free_port, SERVER};
use common::Sandbox;
use nix::sys::signal::Signal;
use std::time::Duration;

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
links = ["pipe:[%d]" % os.fstat(r).st_ino, "socket:[%d]" % os.fstat(a.fileno()).st_ino]
def removed_then_hung(*_):
    tell("FDSTOREREMOVE=1\nFDNAME=pair")
    note(step="removed")
def hang_pipe(*_):
    b.close()
    os.close(w)
    note(step="hung")
signal.signal(signal.SIGUSR1, removed_then_hung)
signal.signal(signal.SIGUSR2, hang_pipe)
note(step="stored", links=links)
while True:
    signal.pause()
"#,
    );
    sb.config(&format!(
        "[service.keeper]\ncommand = {cmd}\nfd_store = 4\n"
    ));
    sb.start();
    let r = wait_report(&sb, &report, |r| r.iter().any(|l| l["step"] == "stored"));
    let links: Vec<String> = (r.iter().find(|l| l["step"] == "stored"))
        .and_then(|l| l["links"].as_array().cloned())
        .expect("links")
        .iter()
        .filter_map(|l| l.as_str().map(str::to_string))
        .collect();
    wait_status(&sb, "keeper", |st| stored_names(st) == ["pipe", "pair"]);
    let supd = sb.supd_pid();
    for l in &links {
        assert!(holds_link(supd, l), "supd does not hold the stored {l}");
    }
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
        common::in_poll_within(supd, Duration::from_secs(5)),
        "supd never went back to sleep: a hang-up of a file it no longer holds wakes it for ever\n{}",
        sb.supd_log()
    );
    answers_quickly(&sb, "keeper");
    for l in &links {
        assert!(!holds_link(supd, l), "supd still holds the dropped {l}");
    }
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

/// A store of more fds than the open-files limit runs get (1024 here; a run may raise
/// its own, as Go's runtime does): the next run must still get them. Each start failed
/// "cannot set up its fds: Bad file descriptor" (the child set the run's limit, then
/// `dup2`'d past it), for as long as the store held them.
#[test]
// A run given more fds than its open-files soft limit holds gets its limit raised by
// their number (up to the hard limit): they are put in place, and it can open more.
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

/// A stored connection whose client resets it while no run is there (the service waits
/// out a long backoff): supd drops it at once, `status` shows it gone, and supd sleeps.
#[test]
fn a_stored_connection_reset_between_runs_is_dropped() {
    let mut sb = Sandbox::new();
    let report = sb.path("runs.jsonl");
    let srv = sb.file("srv.py", SERVER);
    let port = free_port();
    sb.config(&format!(
        r#"[service.web]
command = ["{srv}", "{report}"]
listen = ["tcp:127.0.0.1:{port}"]
fd_store = 4
env = {{ SRV_MODE = "store", SRV_EXIT = "3" }}
restart_delay = "1h"
restart_delay_max = "1h"
"#,
        report = report.display()
    ));
    sb.start();
    wait_report(&sb, &report, |r| !r.is_empty());
    let mut client = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    std::io::Write::write_all(&mut client, b"hello\n").expect("write");
    let st = wait_status(&sb, "web", |st| {
        st["state"] == "backoff" && stored_names(st) == ["conn"]
    });
    assert!(
        st["stored_fds"][0]["what"]
            .as_str()
            .unwrap_or("")
            .contains(&format!("127.0.0.1:{port}")),
        "{st}"
    );
    let supd = sb.supd_pid();
    // The stored socket, as the kernel names it: its inode, from /proc/net/tcp.
    let client_port = client.local_addr().expect("addr").port();
    let inode = tcp_inode(port, client_port).expect("the stored connection");
    let holds = |ino: &str| holds_link(supd, &format!("socket:[{ino}]"));
    assert!(
        holds(&inode),
        "supd does not hold the stored socket {inode}"
    );
    // A reset (SO_LINGER 0): the stored socket reports POLLHUP and POLLERR.
    nix::sys::socket::setsockopt(
        &client,
        nix::sys::socket::sockopt::Linger,
        &nix::libc::linger {
            l_onoff: 1,
            l_linger: 0,
        },
    )
    .expect("linger");
    drop(client);
    let st = wait_status(&sb, "web", |st| st.get("stored_fds").is_none());
    assert_eq!(st["state"], "backoff", "{st}");
    common::wait_in_poll(supd);
    assert!(
        !holds(&inode),
        "supd still holds the dropped socket {inode}"
    );
    assert!(
        common::in_poll_within(supd, Duration::from_secs(5)),
        "{}",
        sb.supd_log()
    );
    assert!(sb
        .supd_log()
        .contains("web: stored fd conn hung up: dropped from its fd store"));
    sb.stop_supd(Signal::SIGTERM);
}

/// A run that throws everything at its notify socket: fds of every kind (some hung up
/// already), names a `LISTEN_FDNAMES` cannot carry, `FDSTORE=1` without fds, fds
/// without `FDSTORE=1`, removals of unknown names, a message of 253 fds, more fds than
/// `fd_store`, and thousands of messages. supd keeps within `fd_store`, stays
/// responsive, never panics, and holds no more fds after each stop than after the
/// first (nothing leaks).
#[test]
fn a_flood_of_store_messages_leaks_nothing_and_keeps_supd_responsive() {
    let mut sb = Sandbox::new();
    let (cmd, report) = service(
        &sb,
        "flood",
        r#"
import select
kinds = []
r, w = os.pipe(); kinds.append(("pipe_r", r)); os.close(w)
r, w = os.pipe(); kinds.append(("pipe_w", w)); os.close(r)
kinds.append(("eventfd", os.eventfd(0)))
kinds.append(("memfd", os.memfd_create("m")))
kinds.append(("dir", os.open("/", os.O_RDONLY | os.O_DIRECTORY)))
kinds.append(("null", os.open("/dev/null", os.O_RDWR)))
kinds.append(("opath", os.open("/", os.O_PATH)))
a, b = socket.socketpair(); kinds.append(("pair_closed", a.detach())); b.close()
a, keep = socket.socketpair(); kinds.append(("pair", a.detach()))
kinds.append(("unconnected", socket.socket().detach()))
kinds.append(("epoll", select.epoll().fileno()))
for name, fd in kinds:
    tell("FDSTORE=1\nFDNAME=" + name, [fd])
r, w = os.pipe()
for bad in ["a:b", "x" * 300, "", "sp ace", "tab\there"]:
    tell("FDSTORE=1\nFDNAME=" + bad, [r])
tell("FDSTORE=1")
tell("FDSTORE=1\nFDNAME=nofds")
tell("READY=1", [r, w])
tell("STATUS=fds", [r] * 10)
tell("FDSTOREREMOVE=1\nFDNAME=unknown")
tell("FDSTOREREMOVE=1")
tell("FDSTORE=1\nFDSTOREREMOVE=1\nFDNAME=both", [r])
tell("FDSTORE=1\nFDNAME=big", [r] * 253)
tell("FDSTORE=1\nFDNAME=over", [r] * 100)
tell("FDSTOREREMOVE=1\nFDNAME=big")
for i in range(4000):
    tell("FDSTORE=1\nFDNAME=f%d" % (i % 7), [r, w])
    if i % 3 == 0:
        tell("FDSTOREREMOVE=1\nFDNAME=f%d" % ((i + 3) % 7))
note(step="done", pipe=os.fstat(r).st_ino)
while True:
    signal.pause()
"#,
    );
    sb.config(&format!(
        "[service.flood]\ncommand = {cmd}\nfd_store = 300\nautostart = false\n"
    ));
    sb.start();
    let supd = sb.supd_pid();
    for round in 1..=2 {
        assert!(sb.supctl(&["start", "flood"]).status.success());
        // Asked while the flood goes on.
        for _ in 0..3 {
            answers_quickly(&sb, "flood");
        }
        wait_report(&sb, &report, |r| {
            r.iter().filter(|l| l["step"] == "done").count() == round
        });
        let st = sb.status("flood");
        let names = stored_names(&st);
        assert!(names.len() <= 300, "{}", names.len());
        for gone in [
            "pipe_r",
            "pipe_w",
            "pair_closed",
            "unconnected",
            "big",
            "nofds",
        ] {
            assert!(!names.iter().any(|n| n == gone), "{gone}: {names:?}");
        }
        for kept in ["eventfd", "memfd", "dir", "null", "opath", "pair", "epoll"] {
            assert!(names.iter().any(|n| n == kept), "{kept}: {names:?}");
        }
        let pipe = wait_report(&sb, &report, |_| true)
            .iter()
            .rev()
            .find(|l| l["step"] == "done")
            .map(|l| l["pipe"].clone())
            .expect("its pipe");
        assert!(sb.supctl(&["stop", "flood"]).status.success());
        sb.wait_state("flood", "stopped");
        assert!(sb.status("flood").get("stored_fds").is_none());
        // None of what the run sent is held any more: its pipe (sent 8,000 times), an
        // eventfd or a memfd (supd holds neither of its own). (A count of supd's fds
        // would also count its spawner's sockets, which come and go.)
        common::wait_in_poll(supd);
        let held: Vec<String> = std::fs::read_dir(format!("/proc/{supd}/fd"))
            .expect("its fds")
            .flatten()
            .filter_map(|e| std::fs::read_link(e.path()).ok())
            .map(|l| l.to_string_lossy().into_owned())
            .filter(|l| {
                *l == format!("pipe:[{pipe}]")
                    || l.contains("[eventfd]")
                    || l.starts_with("/memfd:m")
            })
            .collect();
        assert!(held.is_empty(), "round {round}: supd still holds {held:?}");
    }
    assert!(
        common::in_poll_within(supd, Duration::from_secs(5)),
        "{}",
        sb.supd_log()
    );
    let log = sb.supd_log();
    assert!(log.contains("FDNAME=\"a:b\" is not a name"), "{log}");
    assert!(
        log.contains("carried 2 fds without FDSTORE=1: closed"),
        "{log}"
    );
    assert!(log.contains("over fd_store = 300"), "{log}");
    no_panic(&sb);
    sb.stop_supd(Signal::SIGTERM);
}

/// `reexec` while a run sends `FDSTORE=1` messages (one fd each) until told to stop:
/// the messages waiting in its notify socket cross each exec with the socket, those
/// read before are carried in the store: none is lost, none reordered.
#[test]
fn a_reexec_in_the_middle_of_a_store_flood_loses_no_fd() {
    let mut sb = Sandbox::new();
    let stop = sb.path("stop");
    let (cmd, report) = service(
        &sb,
        "flow",
        &format!(
            r#"
note(step="begin")
n = 0
while n < 4000 and not os.path.exists("{stop}"):
    e = os.eventfd(0)
    tell("FDSTORE=1\nFDNAME=f%d" % n, [e])
    os.close(e)
    n += 1
    time.sleep(0.001)
note(step="done", n=n)
while True:
    signal.pause()
"#,
            stop = stop.display()
        ),
    );
    sb.config(&format!(
        "[service.flow]\ncommand = {cmd}\nfd_store = 4096\n"
    ));
    sb.start();
    wait_report(&sb, &report, |r| r.iter().any(|l| l["step"] == "begin"));
    for _ in 0..3 {
        sb.reexec();
    }
    std::fs::write(&stop, "").expect("stop");
    let r = wait_report(&sb, &report, |r| r.iter().any(|l| l["step"] == "done"));
    let n = r.iter().find(|l| l["step"] == "done").expect("done")["n"]
        .as_u64()
        .expect("n") as usize;
    let st = wait_status(&sb, "flow", |st| stored_names(st).len() >= n);
    let names = stored_names(&st);
    let want: Vec<String> = (0..n).map(|i| format!("f{i}")).collect();
    assert_eq!(names, want, "lost or reordered across the reexecs");
    no_panic(&sb);
    sb.stop_supd(Signal::SIGTERM);
}

/// A reload that lowers `fd_store` below what is stored: the next run gets no more
/// than the new bound (none at 0). Every stored fd was passed to each run for as long
/// as the service was up, past the bound the config says, and with `fd_store = 0` (no
/// notify socket any more) there was no way to drop them; the `ready = "fd:N"` check,
/// which counts on `fd_store`, let N collide with them.
#[test]
fn a_reload_that_lowers_fd_store_drops_what_is_past_it() {
    let mut sb = Sandbox::new();
    let report = sb.path("runs.jsonl");
    let srv = sb.file("srv.py", SERVER);
    let config = |store: u32, n: u32| {
        format!(
            r#"[service.web]
command = ["{srv}", "{report}"]
fd_store = {store}
env = {{ SRV_STORE_N = "{n}" }}
"#,
            report = report.display()
        )
    };
    sb.config(&config(4, 3));
    sb.start();
    wait_report(&sb, &report, |r| !r.is_empty());
    wait_status(&sb, "web", |st| stored_names(st).len() == 3);
    for (store, runs) in [(1, 2), (0, 3)] {
        sb.config(&config(store, 0));
        assert!(sb.supctl(&["reload"]).status.success());
        let r = wait_report(&sb, &report, |r| r.len() == runs);
        let last = &r[runs - 1];
        let want = (store > 0).then(|| store.to_string());
        assert_eq!(
            last["listen_fds"].as_str().map(str::to_string),
            want,
            "fd_store = {store}: {last}\n{}",
            sb.supd_log()
        );
        let st = sb.status("web");
        assert_eq!(stored_names(&st).len(), store as usize, "{st}");
    }
    sb.stop_supd(Signal::SIGTERM);
}

/// More fds than one spawner request carries (250): supd forks the run itself, and the
/// run gets all of them, in the order stored, with the sockets first.
#[test]
fn a_run_gets_a_store_larger_than_a_spawner_request_whole() {
    let mut sb = Sandbox::new();
    let port = free_port();
    let (cmd, report) = service(
        &sb,
        "big",
        r#"
if int(os.environ.get("LISTEN_FDS", "0")) > 1:
    n = int(os.environ["LISTEN_FDS"])
    names = os.environ["LISTEN_FDNAMES"].split(":")
    first = socket.socket(fileno=3)
    listening = first.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
    first.detach()
    kinds = set(os.readlink("/proc/self/fd/%d" % fd).split(":")[0] for fd in range(4, 3 + n))
    note(step="next", n=n, first=names[0], last=names[-1], listening=listening, kinds=sorted(kinds))
    while True:
        signal.pause()
fds = [os.eventfd(0) for _ in range(300)]
for i in range(0, 300, 100):
    tell("FDSTORE=1\nFDNAME=e%d" % (i // 100), fds[i:i + 100])
note(step="stored")
sys.exit(3)
"#,
    );
    sb.config(&format!(
        "[service.big]\ncommand = {cmd}\nlisten = [\"tcp:127.0.0.1:{port}\"]\nfd_store = 400\nrestart_delay = \"100ms\"\n"
    ));
    sb.start();
    let r = wait_report(&sb, &report, |r| r.iter().any(|l| l["step"] == "next"));
    let next = r.iter().find(|l| l["step"] == "next").expect("next");
    assert_eq!(next["n"], 301, "{next}");
    assert_eq!(next["first"], "big", "{next}");
    assert_eq!(next["last"], "e2", "{next}");
    assert_eq!(next["listening"], 1, "{next}");
    assert_eq!(next["kinds"], serde_json::json!(["anon_inode"]), "{next}");
    sb.stop_supd(Signal::SIGTERM);
}

/// A run that stores its own listening socket (fd 3), and one fd twice in a message
/// and again in another: each copy is kept under its name and passed; a stop lets go
/// of all of them, so the port refuses clients.
#[test]
fn a_stored_copy_of_the_listening_socket_goes_with_a_stop() {
    let mut sb = Sandbox::new();
    let port = free_port();
    let (cmd, report) = service(
        &sb,
        "self",
        r#"
if int(os.environ.get("LISTEN_FDS", "0")) > 1:
    note(step="next")
    l = socket.socket(fileno=3)
    while True:
        c, _ = l.accept()
        c.sendall(b"%d\n" % os.getpid())
        c.close()
e = os.eventfd(0)
tell("FDSTORE=1\nFDNAME=me", [3])
tell("FDSTORE=1\nFDNAME=twice", [e, e])
tell("FDSTORE=1\nFDNAME=twice", [e])
note(step="stored")
sys.exit(3)
"#,
    );
    sb.config(&format!(
        "[service.self]\ncommand = {cmd}\nlisten = [\"tcp:127.0.0.1:{port}\"]\nfd_store = 8\nrestart_delay = \"100ms\"\n"
    ));
    sb.start();
    let r = wait_report(&sb, &report, |r| r.iter().any(|l| l["step"] == "next"));
    let next = r.iter().find(|l| l["step"] == "next").expect("next");
    assert_eq!(next["names"], "self:me:twice:twice:twice", "{next}");
    assert_eq!(
        ask(&format!("127.0.0.1:{port}")).expect("served"),
        next["pid"].to_string()
    );
    assert!(sb.supctl(&["stop", "self"]).status.success());
    sb.wait_state("self", "stopped");
    let e = std::net::TcpStream::connect(("127.0.0.1", port)).expect_err("a copy kept it open");
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused);
    assert!(common::in_poll_within(
        sb.supd_pid(),
        Duration::from_secs(5)
    ));
    sb.stop_supd(Signal::SIGTERM);
}

/// The inode of the TCP socket on 127.0.0.1 with local port `local` and peer port
/// `peer` (/proc/net/tcp: "sl local_address rem_address st ... inode").
fn tcp_inode(local: u16, peer: u16) -> Option<String> {
    let text = std::fs::read_to_string("/proc/net/tcp").ok()?;
    text.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let port = |a: &str| u16::from_str_radix(a.rsplit(':').next()?, 16).ok();
        (port(f.get(1)?)? == local && port(f.get(2)?)? == peer)
            .then(|| f.get(9).map(|s| s.to_string()))?
    })
}

/// A run that floods its notify socket with refused store messages: each kind of
/// refusal is told at most once a second, with how many there were, so the flood does
/// not become a flood of supd's log.
#[test]
fn refusals_in_a_flood_are_told_once_a_second_with_their_count() {
    let mut sb = Sandbox::new();
    let (cmd, report) = service(
        &sb,
        "noisy",
        r#"
r, w = os.pipe()
for i in range(2000):
    tell("FDSTORE=1\nFDNAME=bad:name", [r])
note(step="done")
while True:
    signal.pause()
"#,
    );
    sb.config(&format!("[service.noisy]\ncommand = {cmd}\nfd_store = 4\n"));
    sb.start();
    wait_report(&sb, &report, |r| r.iter().any(|l| l["step"] == "done"));
    answers_quickly(&sb, "noisy");
    let log = sb.supd_log();
    let told = log.matches("FDSTORE of 1 fds refused").count();
    assert!((1..20).contains(&told), "{told} refusals told\n{log}");
    no_panic(&sb);
    sb.stop_supd(Signal::SIGTERM);
}
