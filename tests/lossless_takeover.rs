//! Adversary tests of the take-over of a killed supd's `listen` sockets (issue 29):
//! what the next supd takes out of the runs the killed one left, and what it must not
//! hold; and of the open-files limit of a run given many fds.

mod common;
use common::lossless::adversary::{service, wait_status};
use common::lossless::{free_port, runs, server, wait_runs};
use common::Sandbox;
use nix::sys::signal::Signal;
use std::io::{ErrorKind, Read};
use std::time::{Duration, Instant};

/// A service wanted down at the next supd's start (`autostart = false`, started by hand
/// before the kill): the next supd ends the run it left and starts none, so it must not
/// hold the sockets it took from it: a client is refused, not left in a backlog nobody
/// reads.
#[test]
fn a_service_not_started_again_keeps_no_taken_socket() {
    let mut sb = Sandbox::new();
    let (srv, report) = server(&sb);
    let port = free_port();
    sb.config(&format!(
        r#"[service.web]
command = ["{srv}", "{report}"]
autostart = false
listen = ["tcp:127.0.0.1:{port}"]
"#,
        report = report.display(),
    ));
    sb.start();
    let out = sb.supctl(&["start", "web"]);
    assert!(out.status.success(), "{out:?}");
    let first = wait_runs(&sb, &report, 1)[0].clone();
    let left = first["pid"].as_i64().expect("pid") as i32;
    sb.stop_supd(Signal::SIGKILL);
    sb.start();
    assert!(
        common::wait_exit(left, common::DEADLINE).is_some(),
        "the left run was not ended\n{}",
        sb.supd_log()
    );
    let st = wait_status(&sb, "web", |st| st["state"] == "stopped");
    let addr = format!("127.0.0.1:{port}");
    match std::net::TcpStream::connect(&addr) {
        Err(e) => assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "{e}"),
        Ok(mut c) => {
            // Accepted into a backlog: nobody ever answers.
            c.set_read_timeout(Some(Duration::from_secs(1)))
                .expect("timeout");
            let mut buf = [0u8; 16];
            let got = c.read(&mut buf);
            panic!(
                "a stopped service's port still takes connections ({got:?}); status {st}\n{}",
                sb.supd_log()
            );
        }
    }
    assert_eq!(runs(&report).len(), 1, "web was started again");
    sb.stop_supd(Signal::SIGTERM);
}

/// The socket file of a Unix `listen` socket removed while no supd ran: the socket the
/// left run holds is reached by no client, so the next supd must bind the address anew
/// (a file clients find) rather than take the unreachable socket over.
#[test]
fn a_unix_socket_whose_file_went_is_bound_anew() {
    let mut sb = Sandbox::new();
    let (srv, report) = server(&sb);
    let unix = sb.path("app.sock");
    sb.config(&format!(
        r#"[service.web]
command = ["{srv}", "{report}"]
listen = ["unix:{unix}"]
"#,
        report = report.display(),
        unix = unix.display()
    ));
    sb.start();
    wait_runs(&sb, &report, 1);
    sb.stop_supd(Signal::SIGKILL);
    std::fs::remove_file(&unix).expect("remove the socket file");
    sb.start();
    let r = wait_runs(&sb, &report, 2);
    let mut c = std::os::unix::net::UnixStream::connect(&unix).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (the next run: {})\n{}",
            unix.display(),
            r[1],
            sb.supd_log()
        )
    });
    c.set_read_timeout(Some(common::DEADLINE)).expect("timeout");
    let mut got = String::new();
    c.read_to_string(&mut got).expect("read");
    assert_eq!(got.trim(), r[1]["pid"].to_string());
    sb.stop_supd(Signal::SIGTERM);
}

/// A configured open-files limit too low for the fds a run is given (`limits.nofile`
/// below its stored fds): the start fails at once, saying so, rather than hanging or
/// failing with a bare "Bad file descriptor".
#[test]
fn a_nofile_limit_below_the_passed_fds_fails_the_start_clearly() {
    let mut sb = Sandbox::new();
    let port = free_port();
    // The first run (given its socket alone) stores 30 memfds, 5 at a time: it never
    // holds more than its limit allows.
    let (cmd, report) = service(
        &sb,
        "web",
        r#"
note(started=True)
if os.environ.get("LISTEN_FDS") == "1":
    for _ in range(6):
        fds = [os.memfd_create("x") for _ in range(5)]
        tell("FDSTORE=1\nFDNAME=extra", fds)
        for f in fds:
            os.close(f)
time.sleep(3600)
"#,
    );
    sb.config(&format!(
        r#"[service.web]
command = {cmd}
listen = ["tcp:127.0.0.1:{port}"]
fd_store = 40
limits = {{ nofile = 20 }}
"#
    ));
    sb.start();
    wait_runs(&sb, &report, 1);
    wait_status(&sb, "web", |st| {
        st["stored_fds"].as_array().is_some_and(|a| a.len() == 30)
    });
    let out = sb.supctl(&["restart", "web"]);
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let st = wait_status(&sb, "web", |st| {
        !matches!(
            st["state"].as_str(),
            Some("running" | "starting" | "stopping")
        )
    });
    let text = format!("{said} {st}");
    assert!(
        text.contains("nofile"),
        "the error does not name the limit: {text}\n{}",
        sb.supd_log()
    );
    assert_eq!(runs(&report).len(), 1, "a run started past its limit");
    sb.stop_supd(Signal::SIGTERM);
}

/// A normal service's open-files soft limit is the one supd was started with.
#[test]
fn a_normal_services_open_files_limit_is_unchanged() {
    let mut sb = Sandbox::new();
    let out = sb.path("limit");
    let script = sb.script(
        "lim.sh",
        &format!(
            "ulimit -n > {o}.tmp; mv {o}.tmp {o}; exec sleep 3600",
            o = out.display()
        ),
    );
    sb.config(&format!("[service.plain]\ncommand = [\"{script}\"]\n"));
    sb.start();
    let dir = common::files::watch_dir_of(&out);
    let end = Instant::now() + common::DEADLINE;
    while !out.exists() {
        let left = end.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "{}", sb.supd_log());
        common::files::next_events(&dir, left);
    }
    let got: String = std::fs::read_to_string(&out).expect("limit");
    let (soft, _) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .expect("getrlimit");
    let want = if soft == libc::RLIM_INFINITY {
        "unlimited".to_string()
    } else {
        soft.to_string()
    };
    assert_eq!(got.trim(), want);
    sb.stop_supd(Signal::SIGTERM);
}

/// The inode of the socket a run got as fd 3 + `i`.
/// The test server as service `web` on 127.0.0.1:`port`, with `extra` config lines;
/// supd started. Returns the file the server reports its runs to.
fn start_web(sb: &mut Sandbox, port: u16, extra: &str) -> std::path::PathBuf {
    let (srv, report) = server(sb);
    sb.config(&format!(
        "[service.web]\ncommand = [\"{srv}\", \"{}\"]\nlisten = [\"tcp:127.0.0.1:{port}\"]\n{extra}",
        report.display()
    ));
    sb.start();
    report
}

fn inode(run: &serde_json::Value, i: usize) -> serde_json::Value {
    run["fds"][i]["inode"].clone()
}

/// The left run frozen (SIGSTOP) when the next supd starts: its socket is taken all
/// the same, the run is ended past its stop timeout, and a client that connected while
/// no supd ran is answered by the next run on the very same socket.
#[test]
fn a_frozen_left_runs_socket_is_taken_and_its_backlog_served() {
    let mut sb = Sandbox::new();
    let port = free_port();
    let report = start_web(&mut sb, port, "stop_timeout = \"1s\"\n");
    let first = wait_runs(&sb, &report, 1)[0].clone();
    let left = first["pid"].as_i64().expect("pid") as i32;
    sb.stop_supd(Signal::SIGKILL);
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(left), Signal::SIGSTOP).expect("stop");
    // Waits in the frozen run's backlog.
    let mut waiting = std::net::TcpStream::connect(format!("127.0.0.1:{port}")).expect("connect");
    waiting
        .set_read_timeout(Some(common::DEADLINE))
        .expect("timeout");
    sb.start();
    let r = wait_runs(&sb, &report, 2);
    assert_eq!(inode(&r[1], 0), inode(&first, 0), "{r:?}");
    let mut got = String::new();
    waiting.read_to_string(&mut got).expect("answered");
    assert_eq!(got.trim(), r[1]["pid"].to_string());
    assert!(
        common::wait_exit(left, common::DEADLINE).is_some(),
        "the frozen run lives"
    );
    sb.stop_supd(Signal::SIGTERM);
}

/// The left run forked a worker that serves the socket, and its main process closed its
/// own copy: nothing is taken; the next run binds the address once the worker is ended
/// with its run, and serves (no hang, no lasting "address in use").
#[test]
fn a_socket_only_a_worker_holds_is_bound_anew_after_it_is_ended() {
    let mut sb = Sandbox::new();
    let port = free_port();
    let (cmd, report) = service(
        &sb,
        "web",
        r#"
first = not os.path.exists(report)
note(inode=os.fstat(3).st_ino, first=first)
s = socket.socket(fileno=3)
if first:
    if os.fork() == 0:
        while True:
            c, _ = s.accept()
            c.sendall(b"worker\n")
            c.close()
    s.close()
    time.sleep(3600)
while True:
    c, _ = s.accept()
    c.sendall(("%d\n" % os.getpid()).encode())
    c.close()
"#,
    );
    sb.config(&format!(
        r#"[service.web]
command = {cmd}
listen = ["tcp:127.0.0.1:{port}"]
stop_timeout = "2s"
"#
    ));
    sb.start();
    let first = wait_runs(&sb, &report, 1)[0].clone();
    let addr = format!("127.0.0.1:{port}");
    assert_eq!(common::lossless::ask(&addr).expect("the worker"), "worker");
    sb.stop_supd(Signal::SIGKILL);
    sb.start();
    let r = wait_runs(&sb, &report, 2);
    assert_ne!(r[1]["inode"], first["inode"], "{r:?}");
    assert_eq!(
        common::lossless::ask(&addr).expect("the next run"),
        r[1]["pid"].to_string()
    );
    assert!(!sb.supd_log().contains("took over"), "{}", sb.supd_log());
    sb.stop_supd(Signal::SIGTERM);
}

/// supd killed twice in a row, the second while it still ends the run the first left
/// (which ignores SIGTERM): the third takes the very same socket from that run, which
/// is ended at last.
#[test]
fn a_supd_killed_during_its_cleanup_leaves_the_socket_to_the_next() {
    let mut sb = Sandbox::new();
    let port = free_port();
    let (cmd, report) = service(
        &sb,
        "web",
        r#"
signal.signal(signal.SIGTERM, signal.SIG_IGN)
note(inode=os.fstat(3).st_ino)
s = socket.socket(fileno=3)
while True:
    c, _ = s.accept()
    c.sendall(("%d\n" % os.getpid()).encode())
    c.close()
"#,
    );
    sb.config(&format!(
        r#"[service.web]
command = {cmd}
listen = ["tcp:127.0.0.1:{port}"]
stop_timeout = "3s"
"#
    ));
    sb.start();
    let first = wait_runs(&sb, &report, 1)[0].clone();
    let left = first["pid"].as_i64().expect("pid") as i32;
    sb.stop_supd(Signal::SIGKILL);
    sb.start();
    sb.stop_supd(Signal::SIGKILL);
    assert!(common::alive(left), "the left run was ended at once");
    assert_eq!(
        runs(&report).len(),
        1,
        "a run started before the left one ended"
    );
    sb.start();
    let r = wait_runs(&sb, &report, 2);
    assert_eq!(r[1]["inode"], first["inode"], "{r:?}\n{}", sb.supd_log());
    assert!(!common::alive(left), "the left run lives on");
    let addr = format!("127.0.0.1:{port}");
    assert_eq!(
        common::lossless::ask(&addr).expect("the next run"),
        r[1]["pid"].to_string()
    );
    sb.stop_supd(Signal::SIGTERM);
}

/// The config's `listen` changed between the kill and the restart ([A, B] then
/// [B, C]): B is taken, C bound, and A is held by nobody once the left run is ended.
#[test]
fn only_the_addresses_still_listed_are_taken() {
    let mut sb = Sandbox::new();
    let (srv, report) = server(&sb);
    let (a, b, c) = (free_port(), free_port(), free_port());
    let config = |ports: [u16; 2]| {
        format!(
            r#"[service.web]
command = ["{srv}", "{report}"]
listen = ["tcp:127.0.0.1:{}", "tcp:127.0.0.1:{}"]
"#,
            ports[0],
            ports[1],
            report = report.display(),
        )
    };
    sb.config(&config([a, b]));
    sb.start();
    let first = wait_runs(&sb, &report, 1)[0].clone();
    let left = first["pid"].as_i64().expect("pid") as i32;
    sb.stop_supd(Signal::SIGKILL);
    sb.config(&config([b, c]));
    sb.start();
    let r = wait_runs(&sb, &report, 2);
    assert_eq!(
        inode(&r[1], 0),
        inode(&first, 1),
        "B is not the same: {r:?}"
    );
    assert!(r[1]["fds"][1]["addr"]
        .as_str()
        .unwrap_or("")
        .contains(&c.to_string()));
    assert!(common::wait_exit(left, common::DEADLINE).is_some());
    let refused = std::net::TcpStream::connect(format!("127.0.0.1:{a}"));
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| e.kind() == ErrorKind::ConnectionRefused),
        "A still takes connections: {refused:?}\n{}",
        sb.supd_log()
    );
    for port in [b, c] {
        assert_eq!(
            common::lossless::ask(&format!("127.0.0.1:{port}")).expect("served"),
            r[1]["pid"].to_string()
        );
    }
    sb.stop_supd(Signal::SIGTERM);
}

/// A tool's service that crash-looped into `on_crash_loop = "stop"` outside any
/// probation (its version provisioned, committed): no rollback is coming, so its port
/// must refuse clients as any failed service's does, not take them into a backlog
/// nobody reads.
#[test]
fn a_tools_service_failed_outside_probation_refuses_clients() {
    let mut sb = Sandbox::new();
    let port = free_port();
    sb.provision_version("1.0.0", "exit 1");
    sb.config(&format!(
        r#"[service.agent]
tool = "agent"
command = ["bin/agent"]
listen = ["tcp:127.0.0.1:{port}"]
restart_delay = "10ms"
crash_loop = {{ restarts = 2, window = "1m" }}
on_crash_loop = "stop"
"#
    ));
    sb.start();
    let st = sb.wait_state("agent", "failed");
    let got = std::net::TcpStream::connect(("127.0.0.1", port));
    assert!(
        got.as_ref()
            .is_err_and(|e| e.kind() == ErrorKind::ConnectionRefused),
        "a failed tool service's port takes connections nobody serves: {got:?}; status {st}\n{}",
        sb.supd_log()
    );
    sb.stop_supd(Signal::SIGTERM);
}

/// A service removed from the config before the restart: nothing is taken from its
/// left run, which is ended; its port then refuses clients (not held for ever).
#[test]
fn a_removed_services_sockets_are_not_taken() {
    let mut sb = Sandbox::new();
    let port = free_port();
    let report = start_web(&mut sb, port, "");
    let first = wait_runs(&sb, &report, 1)[0].clone();
    let left = first["pid"].as_i64().expect("pid") as i32;
    sb.stop_supd(Signal::SIGKILL);
    sb.config("[service.other]\ncommand = [\"/bin/sleep\", \"3600\"]\n");
    sb.start();
    assert!(common::wait_exit(left, common::DEADLINE).is_some());
    sb.wait_state("other", "running");
    let got = std::net::TcpStream::connect(("127.0.0.1", port));
    assert!(
        got.as_ref()
            .is_err_and(|e| e.kind() == ErrorKind::ConnectionRefused),
        "a removed service's port takes connections: {got:?}\n{}",
        sb.supd_log()
    );
    assert!(!sb.supd_log().contains("took over"), "{}", sb.supd_log());
    sb.stop_supd(Signal::SIGTERM);
}

/// The left run's record names another process now (its pid reused: the start time
/// differs), which listens at the service's address: nothing is taken from that
/// stranger, nor is it ended; the next run says the address is in use, and binds it
/// once the stranger is gone. (Only the cgroup-less part is shown: a left run in its
/// cgroup is ended by the cgroup, whatever its record says.)
#[test]
fn nothing_is_taken_from_a_process_the_record_does_not_name() {
    let mut sb = Sandbox::new();
    let port = free_port();
    let report = start_web(&mut sb, port, "restart_delay = \"50ms\"\n");
    let first = wait_runs(&sb, &report, 1)[0].clone();
    let left = first["pid"].as_i64().expect("pid") as i32;
    sb.stop_supd(Signal::SIGKILL);
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(left), Signal::SIGKILL).expect("kill");
    assert!(common::wait_exit(left, common::DEADLINE).is_some());
    // The stranger: listens at the address, its pid in the record, with a start time
    // that is not its own.
    let mut stranger = std::process::Command::new("python3")
        .args([
            "-c",
            &format!(
                "import socket, sys, time\ns = socket.socket()\ns.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\ns.bind(('127.0.0.1', {port}))\ns.listen()\nprint('ok', flush=True)\ntime.sleep(3600)\n"
            ),
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("stranger");
    let mut ok = [0u8; 3];
    stranger
        .stdout
        .as_mut()
        .expect("its stdout")
        .read_exact(&mut ok)
        .expect("the stranger listens");
    let pid = stranger.id() as i32;
    let start = sup::proc::stat(pid).expect("its stat").start_time;
    std::fs::write(
        sb.path("state/pids/web"),
        format!("{pid} {} group\n", start + 1),
    )
    .expect("write record");
    sb.start();
    let st = wait_status(&sb, "web", |st| {
        st["reason"].as_str().is_some_and(|r| r.contains("in use"))
    });
    assert!(common::alive(pid), "the stranger was ended: {st}");
    assert!(!sb.supd_log().contains("took over"), "{}", sb.supd_log());
    let _ = stranger.kill();
    let _ = stranger.wait();
    let r = wait_runs(&sb, &report, 2);
    assert_ne!(inode(&r[1], 0), inode(&first, 0), "{r:?}");
    assert_eq!(
        common::lossless::ask(&format!("127.0.0.1:{port}")).expect("served"),
        r[1]["pid"].to_string()
    );
    sb.stop_supd(Signal::SIGTERM);
}

/// A `reexec` after a take-over carries the taken socket: the run after it still gets
/// the very socket the killed supd's run had.
#[test]
fn a_reexec_after_a_take_over_carries_the_socket() {
    let mut sb = Sandbox::new();
    let port = free_port();
    let report = start_web(&mut sb, port, "");
    let first = wait_runs(&sb, &report, 1)[0].clone();
    sb.stop_supd(Signal::SIGKILL);
    sb.start();
    wait_runs(&sb, &report, 2);
    sb.reexec();
    let out = sb.supctl(&["restart", "web"]);
    assert!(out.status.success(), "{out:?}");
    let r = wait_runs(&sb, &report, 3);
    assert_eq!(
        inode(&r[2], 0),
        inode(&first, 0),
        "{r:?}\n{}",
        sb.supd_log()
    );
    assert_eq!(
        common::lossless::ask(&format!("127.0.0.1:{port}")).expect("served"),
        r[2]["pid"].to_string()
    );
    sb.stop_supd(Signal::SIGTERM);
}
