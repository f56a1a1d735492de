//! Lossless upgrades (issue 29) pushed at their edges with real processes: stored fds of
//! every kind, stored fds dropped while a run still holds their file, floods of notify
//! messages, a supd killed while it holds a service's sockets, odd Unix socket paths.
//! Each test: its own sandbox, waits with deadlines, every process ended by its pid.

mod common;
use common::lossless::adversary::*;
use common::lossless::{ask, free_port, SERVER};
use common::Sandbox;
use nix::sys::signal::Signal;
use std::time::{Duration, Instant};

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
        idle_within(supd, Duration::from_secs(5)),
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

/// A service that failed for good (`restart = "never"` here; `on_crash_loop = "stop"`
/// likewise) has no run coming: its port must refuse clients as a stopped service's
/// does, not take them into a backlog nobody reads (they hung until their own
/// timeout). A start binds it again. (A tool's service keeps its sockets: a rollback
/// may start it again.)
#[test]
fn a_service_that_failed_for_good_refuses_clients() {
    let mut sb = Sandbox::new();
    let port = free_port();
    let flag = sb.path("second");
    let (cmd, report) = service(
        &sb,
        "once",
        &format!(
            r#"
if not os.path.exists("{flag}"):
    open("{flag}", "w").close()
    note(step="fail")
    sys.exit(2)
note(step="up")
l = socket.socket(fileno=3)
while True:
    c, _ = l.accept()
    c.sendall(b"%d\n" % os.getpid())
    c.close()
"#,
            flag = flag.display()
        ),
    );
    sb.config(&format!(
        "[service.web]\ncommand = {cmd}\nlisten = [\"tcp:127.0.0.1:{port}\"]\nfd_store = 2\nrestart = \"never\"\n"
    ));
    sb.start();
    let st = sb.wait_state("web", "failed");
    assert!(st.get("listening").is_none(), "{st}");
    let e = std::net::TcpStream::connect(("127.0.0.1", port))
        .expect_err("a failed service's port accepted a connection nobody will serve");
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused);
    assert!(sb.supctl(&["start", "web"]).status.success());
    let r = wait_report(&sb, &report, |r| r.iter().any(|l| l["step"] == "up"));
    let up = r.iter().find(|l| l["step"] == "up").expect("up");
    assert_eq!(
        ask(&format!("127.0.0.1:{port}")).expect("bound again"),
        up["pid"].to_string()
    );
    sb.stop_supd(Signal::SIGTERM);
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
            "[service.a]\ncommand = [\"/bin/true\"]\nlisten = [\"tcp:127.0.0.1:8080\"]\nready = \"fd:3\"\n",
            "choose N above them all",
        ),
        (
            "[service.a]\ncommand = [\"/bin/true\"]\nlisten = [\"tcp:127.0.0.1:8080\"]\ninstances = 2\n",
            "cannot be bound by each of its 2 instances",
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
        idle_within(supd, Duration::from_secs(5)),
        "{}",
        sb.supd_log()
    );
    assert!(sb
        .supd_log()
        .contains("web: stored fd conn hung up: dropped from its fd store"));
    sb.stop_supd(Signal::SIGTERM);
}

/// supd killed (SIGKILL) while a service holds its sockets and stored fds: those are
/// lost with it, but nothing hangs. The next supd ends the run it finds, binds the
/// sockets again (the Unix socket's stale file replaced) and serves.
#[test]
fn a_killed_supd_loses_its_store_but_the_next_one_binds_and_serves() {
    let mut sb = Sandbox::new();
    let report = sb.path("runs.jsonl");
    let srv = sb.file("srv.py", SERVER);
    let port = free_port();
    let unix = sb.path("app.sock");
    sb.config(&format!(
        r#"[service.web]
command = ["{srv}", "{report}"]
listen = ["tcp:127.0.0.1:{port}", "unix:{unix}"]
fd_store = 4
env = {{ SRV_STORE_N = "2" }}
"#,
        report = report.display(),
        unix = unix.display()
    ));
    sb.start();
    let first = wait_report(&sb, &report, |r| !r.is_empty())[0]["pid"]
        .as_i64()
        .expect("pid") as i32;
    wait_status(&sb, "web", |st| stored_names(st).len() == 2);
    sb.stop_supd(Signal::SIGKILL);
    // The run lives on and still answers on its copy of the sockets.
    assert!(common::alive(first));
    assert_eq!(
        ask(&format!("127.0.0.1:{port}")).expect("the run"),
        first.to_string()
    );
    assert!(unix.exists(), "the socket file of a killed supd is left");
    sb.start();
    assert!(common::wait_exit(first, common::DEADLINE).is_some());
    let r = wait_report(&sb, &report, |r| r.len() >= 2);
    let second = r[1]["pid"].to_string();
    assert_eq!(
        r[1]["listen_fds"], "2",
        "the store went with the killed supd"
    );
    assert_eq!(ask(&format!("127.0.0.1:{port}")).expect("tcp"), second);
    let mut s = std::os::unix::net::UnixStream::connect(&unix).expect("unix");
    let mut got = String::new();
    std::io::Read::read_to_string(&mut s, &mut got).expect("read");
    assert_eq!(got.trim(), second);
    answers_quickly(&sb, "web");
    no_panic(&sb);
    sb.stop_supd(Signal::SIGTERM);
    assert!(!unix.exists(), "a stop of supd leaves its socket file");
}

/// What is at a Unix socket's path is the service's only while it is the file supd
/// made: a link there (dangling or not) is refused at the start with why, and a file
/// put in place of a held socket (its directory removed and made again) is left where
/// it is when supd lets go.
#[test]
fn a_unix_path_that_is_not_supds_socket_is_left_alone() {
    let mut sb = Sandbox::new();
    let report = sb.path("runs.jsonl");
    let srv = sb.file("srv.py", SERVER);
    let dir = sb.path("d");
    std::fs::create_dir(&dir).expect("mkdir");
    let target = sb.path("target.sock");
    let _other = std::os::unix::net::UnixListener::bind(&target).expect("bind");
    std::os::unix::fs::symlink(&target, dir.join("link.sock")).expect("link");
    std::os::unix::fs::symlink(sb.path("nothing"), dir.join("dangling.sock")).expect("link");
    sb.config(&format!(
        r#"[service.link]
command = ["{srv}", "{report}"]
listen = ["unix:{dir}/link.sock"]
restart_delay = "1h"
restart_delay_max = "1h"

[service.dangling]
command = ["{srv}", "{report}"]
listen = ["unix:{dir}/dangling.sock"]
restart_delay = "1h"
restart_delay_max = "1h"

[service.held]
command = ["{srv}", "{report}"]
listen = ["unix:{dir}/held.sock"]
"#,
        report = report.display(),
        dir = dir.display()
    ));
    sb.start();
    for name in ["link", "dangling"] {
        let st = wait_status(&sb, name, |st| st["state"] == "backoff");
        assert!(
            st["reason"]
                .as_str()
                .unwrap_or("")
                .contains("exists and is not a socket"),
            "{st}"
        );
    }
    assert!(std::fs::symlink_metadata(dir.join("link.sock")).is_ok());
    assert!(std::fs::symlink_metadata(dir.join("dangling.sock")).is_ok());
    sb.wait_state("held", "running");
    // The directory goes and comes back with someone else's file at the path.
    std::fs::remove_dir_all(&dir).expect("rm");
    std::fs::create_dir(&dir).expect("mkdir");
    std::fs::write(dir.join("held.sock"), "someone else's").expect("write");
    assert!(sb.supctl(&["stop", "held"]).status.success());
    sb.wait_state("held", "stopped");
    assert_eq!(
        std::fs::read_to_string(dir.join("held.sock")).expect("left"),
        "someone else's"
    );
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
        idle_within(supd, Duration::from_secs(5)),
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

/// `reexec` while a start fails on a port in use, one of its two addresses bound: the
/// bound one is carried, and once the port is free the next start binds the other.
#[test]
fn a_reexec_while_a_port_is_in_use_carries_what_was_bound() {
    let mut sb = Sandbox::new();
    let report = sb.path("runs.jsonl");
    let srv = sb.file("srv.py", SERVER);
    let free = free_port();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let busy = taken.local_addr().expect("addr").port();
    sb.config(&format!(
        r#"[service.web]
command = ["{srv}", "{report}"]
listen = ["tcp:127.0.0.1:{free}", "tcp:127.0.0.1:{busy}"]
restart_delay = "200ms"
restart_delay_max = "200ms"
"#,
        report = report.display()
    ));
    sb.start();
    let st = wait_status(&sb, "web", |st| st["state"] == "backoff");
    assert!(
        st["reason"].as_str().unwrap_or("").contains("in use"),
        "{st}"
    );
    sb.reexec();
    let st = sb.status("web");
    assert_eq!(
        st["listening"],
        serde_json::json!([format!("tcp:127.0.0.1:{free}")]),
        "{st}"
    );
    // A client of the bound port waits in its backlog until a run comes.
    let waiting = std::thread::spawn(move || ask(&format!("127.0.0.1:{free}")));
    drop(taken);
    let r = wait_report(&sb, &report, |r| !r.is_empty());
    let pid = r[0]["pid"].to_string();
    assert_eq!(r[0]["listen_fds"], "2");
    assert_eq!(waiting.join().expect("client").expect("served"), pid);
    assert_eq!(ask(&format!("127.0.0.1:{busy}")).expect("busy one"), pid);
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

/// A run as `user = "nobody"`: supd binds as root (a port below 1024 works), the Unix
/// socket's file is nobody's, open to all (0666), and each run serves on both.
#[test]
fn a_run_as_another_user_gets_its_socket_file_and_a_low_port() {
    if !common::is_root() {
        eprintln!("skipped: needs root (a user switch, a port below 1024)");
        return;
    }
    let mut sb = Sandbox::new();
    let low = (900..1000)
        .find(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
        .expect("a free port below 1024");
    let report = sb.path("runs.jsonl");
    std::fs::write(&report, "").expect("report");
    common::files::chmod(&report, 0o666);
    let srv = sb.file("srv.py", SERVER);
    let unix = sb.path("app.sock");
    sb.config(&format!(
        r#"[service.web]
command = ["{srv}", "{report}"]
listen = ["tcp:127.0.0.1:{low}", "unix:{unix}"]
user = "nobody"
"#,
        report = report.display(),
        unix = unix.display()
    ));
    sb.start();
    for round in 1..=2 {
        let r = wait_report(&sb, &report, |r| r.len() == round);
        let pid = r[round - 1]["pid"].to_string();
        assert_eq!(ask(&format!("127.0.0.1:{low}")).expect("low port"), pid);
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::symlink_metadata(&unix).expect("socket file");
        assert_eq!((m.uid(), m.mode() & 0o777), (uid_of("nobody"), 0o666));
        let mut s = std::os::unix::net::UnixStream::connect(&unix).expect("unix");
        let mut got = String::new();
        std::io::Read::read_to_string(&mut s, &mut got).expect("read");
        assert_eq!(got.trim(), pid);
        if round == 1 {
            assert!(sb.supctl(&["restart", "web"]).status.success());
        }
    }
    assert!(sb.supctl(&["stop", "web"]).status.success());
    sb.wait_state("web", "stopped");
    assert!(!unix.exists(), "a stopped service's socket file is left");
    sb.stop_supd(Signal::SIGTERM);
}

/// Reloads while a run holds its sockets: one that changes only the environment keeps
/// the socket (a client that connects during the restart is served by the next run);
/// one that moves the address from 127.0.0.1 to ::1 and drops the Unix entry lets go
/// of both (refused, the file removed) and binds the new one.
#[test]
fn reloads_keep_what_they_keep_and_let_go_of_what_they_drop() {
    let mut sb = Sandbox::new();
    let report = sb.path("runs.jsonl");
    let srv = sb.file("srv.py", SERVER);
    let port = free_port();
    let unix = sb.path("app.sock");
    let config = |listen: &str, delay: &str| {
        format!(
            r#"[service.web]
command = ["{srv}", "{report}"]
listen = [{listen}]
env = {{ SRV_DELAY = "{delay}" }}
"#,
            report = report.display()
        )
    };
    let both = format!("\"tcp:127.0.0.1:{port}\", \"unix:{}\"", unix.display());
    sb.config(&config(&both, "0"));
    sb.start();
    wait_report(&sb, &report, |r| r.len() == 1);
    // The environment alone changes: a restart, the sockets kept.
    sb.config(&config(&both, "0.5"));
    assert!(sb.supctl(&["reload"]).status.success());
    let got = ask(&format!("127.0.0.1:{port}")).expect("served across the reload");
    let r = wait_report(&sb, &report, |r| r.len() == 2);
    assert_eq!(got, r[1]["pid"].to_string());
    // The address moves to ::1; the Unix entry goes.
    sb.config(&config(&format!("\"tcp:[::1]:{port}\""), "0"));
    assert!(sb.supctl(&["reload"]).status.success());
    let r = wait_report(&sb, &report, |r| r.len() == 3);
    assert_eq!(r[2]["listen_fds"], "1", "{:?}", r[2]);
    assert_eq!(
        ask(&format!("[::1]:{port}")).expect("::1"),
        r[2]["pid"].to_string()
    );
    let e = std::net::TcpStream::connect(("127.0.0.1", port)).expect_err("still bound");
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused);
    assert!(!unix.exists(), "the dropped Unix socket's file is left");
    assert_eq!(
        sb.status("web")["listening"],
        serde_json::json!([format!("tcp:[::1]:{port}")])
    );
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
    assert!(idle_within(sb.supd_pid(), Duration::from_secs(5)));
    sb.stop_supd(Signal::SIGTERM);
}

/// An upgrade to a version that crashes at once, rolled back after its crash loop:
/// clients that connect all along are all served (by the old version, before and
/// after); none is refused or cut, though no run accepts for a while.
#[test]
fn an_upgrade_rolled_back_refuses_no_client() {
    use common::agent::*;
    let mut sb = Sandbox::new();
    let report = sb.path("runs.jsonl");
    let srv = sb.file("srv.py", SERVER);
    let port = free_port();
    agent_config(
        &sb,
        &format!("probation = \"1h\"\nlisten = [\"tcp:127.0.0.1:{port}\"]\n"),
    );
    place(&sb, "1.0.0", &format!("exec {srv} {}", report.display()));
    place(&sb, "2.0.0", "exit 3");
    place_current(&sb, "1.0.0");
    sb.start();
    sb.wait_state("agent", "running");
    wait_report(&sb, &report, |r| r.len() == 1);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut answers = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                answers.push(ask(&format!("127.0.0.1:{port}")).map_err(|e| e.to_string()));
            }
            answers
        })
    };
    let mut w = sb.watch();
    let out = sb.supctl(&["upgrade", "agent", "2.0.0"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let (from, to) = rollback_event(&mut w, &sb);
    assert_eq!((from.as_str(), to.as_str()), ("2.0.0", "1.0.0"));
    let r = wait_report(&sb, &report, |r| r.len() == 2);
    let back = r[1]["pid"].to_string();
    // A few answers of the version back, then the clients stop.
    let end = Instant::now() + common::DEADLINE;
    while ask(&format!("127.0.0.1:{port}")).ok() != Some(back.clone()) {
        assert!(Instant::now() < end, "the version back does not answer");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let answers = clients.join().expect("clients");
    let failed: Vec<_> = answers.iter().filter(|a| a.is_err()).collect();
    assert!(failed.is_empty(), "{failed:?} of {} clients", answers.len());
    assert!(runs(&sb, "2.0.0") >= 1, "2.0.0 never ran");
    sb.stop_supd(Signal::SIGTERM);
}

/// An `env` that sets LISTEN_FDS, LISTEN_PID and LISTEN_FDNAMES (copied from a systemd
/// unit, say) for a service supd passes sockets to: the run sees supd's values alone.
/// Both were in its environment, the config's first, which is the one getenv reads: the
/// run found no socket (LISTEN_PID was not its pid).
#[test]
fn the_listen_variables_a_run_sees_are_supds() {
    let mut sb = Sandbox::new();
    let report = sb.path("runs.jsonl");
    let srv = sb.file("srv.py", SERVER);
    let port = free_port();
    sb.config(&format!(
        r#"[service.web]
command = ["{srv}", "{report}"]
listen = ["tcp:127.0.0.1:{port}"]
env = {{ LISTEN_PID = "1", LISTEN_FDS = "7", LISTEN_FDNAMES = "x" }}
"#,
        report = report.display()
    ));
    sb.start();
    let r = wait_report(&sb, &report, |r| !r.is_empty());
    assert_eq!(r[0]["listen_fds"], "1", "{:?}", r[0]);
    assert_eq!(r[0]["listen_pid"], r[0]["pid"].to_string(), "{:?}", r[0]);
    assert_eq!(r[0]["names"], "web", "{:?}", r[0]);
    let pid = r[0]["pid"].as_i64().expect("pid");
    let environ = std::fs::read(format!("/proc/{pid}/environ")).expect("environ");
    let listen: Vec<String> = environ
        .split(|b| *b == 0)
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .filter(|v| v.starts_with("LISTEN_"))
        .collect();
    assert_eq!(listen.len(), 3, "{listen:?}");
    assert_eq!(
        ask(&format!("127.0.0.1:{port}")).expect("served"),
        pid.to_string()
    );
    assert!(sb.supd_log().contains("its env sets LISTEN_FDS"));
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
