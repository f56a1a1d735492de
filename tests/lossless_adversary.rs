//! Lossless upgrades (issue 29) pushed at their edges with real processes: held
//! sockets across reloads, killed supds, other users, odd Unix socket paths, addresses
//! that cannot all be bound (the fd store's are in `fd_store_adversary.rs`). Each test:
//! its own sandbox, waits with deadlines, every process ended by its pid.

mod common;
use common::lossless::adversary::*;
use common::lossless::{ask, free_port, SERVER};
use common::Sandbox;
use nix::sys::signal::Signal;
use std::time::Instant;

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

/// A service that failed for good (`restart = "never"` here; `on_crash_loop = "stop"`
/// likewise) has no run coming: its port must refuse clients as a stopped service's
/// does, not take them into a backlog nobody reads (they hung until their own
/// timeout). A start binds it again. (A tool's service in probation keeps its
/// sockets: the rollback starts it again.)
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
