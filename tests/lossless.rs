//! Lossless upgrades (issue 29): supd binds a service's `listen` sockets, hands them to
//! each run as sd_listen_fds(3) expects and holds them between runs; a service's fd
//! store keeps what it hands supd for its next run.

mod common;
use common::lossless::adversary::wait_status;
use common::lossless::{ask, free_port, runs, say, server, wait_runs};
use common::Sandbox;
use serde_json::json;
use std::net::TcpStream;
use std::time::Duration;

#[test]
fn sockets_are_passed_as_sd_listen_fds_expects() {
    let mut sb = Sandbox::new();
    let (srv, report) = server(&sb);
    let port = free_port();
    let unix = sb.path("app.sock");
    sb.config(&format!(
        r#"[service.web]
command = ["{srv}", "{report}"]
listen = ["tcp:127.0.0.1:{port}", "tcp:[::1]:{port}", "unix:{unix}"]
"#,
        report = report.display(),
        unix = unix.display()
    ));
    sb.start();
    let run = &wait_runs(&sb, &report, 1)[0];
    assert_eq!(run["listen_fds"], "3", "{run}");
    assert_eq!(run["listen_pid"], run["pid"].to_string(), "{run}");
    assert_eq!(run["names"], "web:web:web", "{run}");
    let fds = run["fds"].as_array().expect("fds");
    let addrs: Vec<&str> = fds
        .iter()
        .map(|f| f["addr"].as_str().unwrap_or(""))
        .collect();
    assert!(addrs[0].contains(&format!("'127.0.0.1', {port}")), "{run}");
    assert!(addrs[1].contains(&format!("'::1', {port}")), "{run}");
    assert!(addrs[2].contains("app.sock"), "{run}");
    assert!(fds.iter().all(|f| f["listening"] == true), "{run}");
    // It answers on each; status shows what is held.
    let pid = run["pid"].to_string();
    assert_eq!(ask(&format!("127.0.0.1:{port}")).expect("v4"), pid);
    assert_eq!(ask(&format!("[::1]:{port}")).expect("v6"), pid);
    let st = sb.status("web");
    assert_eq!(
        st["listening"],
        json!([
            format!("tcp:127.0.0.1:{port}"),
            format!("tcp:[::1]:{port}"),
            format!("unix:{}", unix.display())
        ]),
        "{st}"
    );
    // A service without `listen` gets no LISTEN_* at all.
    sb.stop_supd(nix::sys::signal::Signal::SIGTERM);
}

#[test]
fn a_restart_refuses_no_connection_and_the_waiting_one_is_served_by_the_next_run() {
    let mut sb = Sandbox::new();
    let (srv, report) = server(&sb);
    let port = free_port();
    sb.config(&format!(
        r#"[service.web]
command = ["{srv}", "{report}"]
listen = ["tcp:127.0.0.1:{port}"]
env = {{ SRV_DELAY = "0.5" }}
"#,
        report = report.display()
    ));
    sb.start();
    wait_runs(&sb, &report, 1);
    let first = sb.wait_state("web", "running")["pid"].clone();
    let addr = format!("127.0.0.1:{port}");
    for round in 1..=3 {
        let out = sb.supctl(&["restart", "web"]);
        assert!(out.status.success(), "{out:?}");
        // Connected while the old run is stopping or the new one sleeps before its
        // accept: the held socket's backlog keeps it.
        let got = ask(&addr).unwrap_or_else(|e| panic!("round {round}: {e}\n{}", sb.supd_log()));
        assert_ne!(got, first.to_string(), "answered by the stopped run");
        let r = wait_runs(&sb, &report, round + 1);
        assert_eq!(got, r[round]["pid"].to_string());
        assert_eq!(r[round]["listen_fds"], "1");
        // The same socket, held by supd between the runs, not one bound anew.
        assert_eq!(
            r[round]["fds"][0]["inode"], r[0]["fds"][0]["inode"],
            "{r:?}"
        );
    }
    // Stopped: the port is closed (clients are refused, not left waiting), and status
    // holds nothing; started again, it is bound again.
    assert!(sb.supctl(&["stop", "web"]).status.success());
    sb.wait_state("web", "stopped");
    let e = TcpStream::connect(&addr).expect_err("a stopped service's port accepted");
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused);
    assert!(sb.status("web").get("listening").is_none());
    assert!(sb.supctl(&["start", "web"]).status.success());
    let pid = wait_runs(&sb, &report, 5)[4]["pid"].to_string();
    assert_eq!(ask(&addr).expect("started again"), pid);
    sb.stop_supd(nix::sys::signal::Signal::SIGTERM);
}

#[test]
fn a_stored_connection_is_finished_by_the_next_run() {
    let mut sb = Sandbox::new();
    let (srv, report) = server(&sb);
    let port = free_port();
    sb.config(&format!(
        r#"[service.web]
command = ["{srv}", "{report}"]
listen = ["tcp:127.0.0.1:{port}"]
fd_store = 4
env = {{ SRV_MODE = "store", SRV_EXIT = "3", SRV_DELAY = "0.3" }}
restart_delay = "200ms"
"#,
        report = report.display()
    ));
    sb.start();
    let first = wait_runs(&sb, &report, 1)[0]["pid"].to_string();
    let mut client = TcpStream::connect(format!("127.0.0.1:{port}")).expect("connect");
    client
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    // The first run reads "hello", stores the connection and exits 3; the next run
    // finds it among its fds (after the socket, named conn), answers on it and drops
    // it from the store.
    let got = say(&mut client, "hello\n");
    let runs = wait_runs(&sb, &report, 2);
    let second = &runs[1];
    assert_eq!(got, format!("world {}\n", second["pid"]), "{runs:?}");
    assert_ne!(second["pid"].to_string(), first);
    assert_eq!(second["listen_fds"], "2", "{second}");
    assert_eq!(second["names"], "web:conn", "{second}");
    assert_eq!(second["fds"][1]["listening"], false, "{second}");
    // The client sees the end of the connection only when both the run and supd let
    // go of it: FDSTOREREMOVE emptied the store.
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut client, &mut rest).expect("the connection ends");
    assert_eq!(rest, "");
    assert!(
        sb.status("web").get("stored_fds").is_none(),
        "{}",
        sb.status("web")
    );
    sb.stop_supd(nix::sys::signal::Signal::SIGTERM);
}

#[test]
fn stored_fds_show_in_status_are_bounded_and_go_with_a_stop() {
    let mut sb = Sandbox::new();
    let (srv, report) = server(&sb);
    sb.config(&format!(
        r#"[service.keeper]
command = ["{srv}", "{report}"]
fd_store = 3
env = {{ SRV_STORE_N = "2" }}

[service.greedy]
command = ["{srv}", "{report2}"]
fd_store = 3
env = {{ SRV_STORE_N = "4" }}
"#,
        report = report.display(),
        report2 = sb.path("runs2.jsonl").display()
    ));
    sb.start();
    let keeper = wait_runs(&sb, &report, 1);
    assert!(
        keeper[0]["notify"].is_string(),
        "an fd store needs NOTIFY_SOCKET"
    );
    // Both pipes are stored, shown with their name; greedy's 4 are over fd_store = 3,
    // refused whole, and the log says why.
    wait_status(&sb, "keeper", |st| st.get("stored_fds").is_some());
    let st = sb.status("keeper");
    let stored = st["stored_fds"].as_array().expect("stored");
    assert_eq!(stored.len(), 2, "{st}");
    assert!(stored.iter().all(|s| s["name"] == "extra"), "{st}");
    assert!(
        stored[0]["what"]
            .as_str()
            .unwrap_or("")
            .contains("runs.jsonl.extra"),
        "{st}"
    );
    let log = common::files::wait_file(&sb.path("supd.stderr"), |l| {
        l.contains("greedy: FDSTORE of 4 fds refused")
    });
    assert!(log.contains("over fd_store = 3"), "{log}");
    assert!(sb.status("greedy").get("stored_fds").is_none());
    // A restart keeps them (and the next run gets them: 2 more make 4, refused); a
    // stop empties the store.
    assert!(sb.supctl(&["restart", "keeper"]).status.success());
    let r = wait_runs(&sb, &report, 2);
    assert_eq!(r[1]["listen_fds"], "2", "{:?}", r[1]);
    assert_eq!(r[1]["names"], "extra:extra");
    assert!(sb.supctl(&["stop", "keeper"]).status.success());
    sb.wait_state("keeper", "stopped");
    assert!(sb.status("keeper").get("stored_fds").is_none());
    sb.stop_supd(nix::sys::signal::Signal::SIGTERM);
}

#[test]
fn a_port_in_use_or_a_missing_directory_fails_the_start_and_says_why() {
    let mut sb = Sandbox::new();
    let (srv, report) = server(&sb);
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("addr").port();
    sb.config(&format!(
        r#"[service.busy]
command = ["{srv}", "{report}"]
listen = ["tcp:127.0.0.1:{port}"]
restart_delay = "100ms"

[service.nodir]
command = ["{srv}", "{report}"]
listen = ["unix:{dir}/missing/app.sock"]
restart_delay = "100ms"
"#,
        report = report.display(),
        dir = sb.dir.display()
    ));
    sb.start();
    let mut w = sb.watch();
    let e = w.until(&sb, |e| {
        e["event"] == "state" && e["service"] == "busy" && e["to"] == "backoff"
    });
    let why = e["reason"].as_str().unwrap_or("");
    assert!(
        why.contains("in use") && why.contains(&port.to_string()),
        "{e}"
    );
    let e = w.until(&sb, |e| {
        e["event"] == "state" && e["service"] == "nodir" && e["to"] == "backoff"
    });
    assert!(
        e["reason"]
            .as_str()
            .unwrap_or("")
            .contains("does not exist"),
        "{e}"
    );
    assert!(runs(&report).is_empty(), "a run started without its socket");
    // Freed: the next start binds it.
    drop(taken);
    let run = wait_runs(&sb, &report, 1);
    assert_eq!(
        ask(&format!("127.0.0.1:{port}")).expect("bound at last"),
        run[0]["pid"].to_string()
    );
    sb.stop_supd(nix::sys::signal::Signal::SIGTERM);
}

#[test]
fn a_reexec_carries_the_sockets_and_the_store() {
    let mut sb = Sandbox::new();
    let (srv, report) = server(&sb);
    let port = free_port();
    sb.config(&format!(
        r#"[service.web]
command = ["{srv}", "{report}"]
listen = ["tcp:127.0.0.1:{port}"]
fd_store = 4
env = {{ SRV_STORE_N = "1" }}
"#,
        report = report.display()
    ));
    sb.start();
    let first = wait_runs(&sb, &report, 1)[0]["pid"].to_string();
    wait_status(&sb, "web", |st| st.get("stored_fds").is_some());
    sb.reexec();
    let st = sb.status("web");
    assert_eq!(
        st["listening"],
        json!([format!("tcp:127.0.0.1:{port}")]),
        "{st}"
    );
    assert_eq!(st["stored_fds"].as_array().map(Vec::len), Some(1), "{st}");
    assert_eq!(ask(&format!("127.0.0.1:{port}")).expect("same run"), first);
    // The next run gets the carried socket and the stored pipe.
    assert!(sb.supctl(&["restart", "web"]).status.success());
    let r = wait_runs(&sb, &report, 2);
    assert_eq!(r[1]["names"], "web:extra", "{:?}", r[1]);
    assert_eq!(
        ask(&format!("127.0.0.1:{port}")).expect("next run"),
        r[1]["pid"].to_string()
    );
    sb.stop_supd(nix::sys::signal::Signal::SIGTERM);
}

#[test]
fn fds_from_a_process_outside_the_service_are_refused() {
    let mut sb = Sandbox::new();
    let (srv, report) = server(&sb);
    sb.config(&format!(
        r#"[service.web]
command = ["{srv}", "{report}"]
fd_store = 4
"#,
        report = report.display()
    ));
    sb.start();
    let run = wait_runs(&sb, &report, 1);
    let notify = run[0]["notify"]
        .as_str()
        .expect("NOTIFY_SOCKET")
        .to_string();
    // This test process is no process of the service (root may write to the socket).
    let (r, _w) = nix::unistd::pipe().expect("pipe");
    let rights = [std::os::fd::AsRawFd::as_raw_fd(&r)];
    let tx = std::os::unix::net::UnixDatagram::unbound().expect("socket");
    let to = nix::sys::socket::UnixAddr::new(notify.as_str()).expect("addr");
    nix::sys::socket::sendmsg(
        std::os::fd::AsRawFd::as_raw_fd(&tx),
        &[std::io::IoSlice::new(b"FDSTORE=1\nFDNAME=evil")],
        &[nix::sys::socket::ControlMessage::ScmRights(&rights)],
        nix::sys::socket::MsgFlags::empty(),
        Some(&to),
    )
    .expect("sendmsg");
    let log = common::files::wait_file(&sb.path("supd.stderr"), |l| {
        l.contains("not a process of the service: refused")
    });
    assert!(log.contains("1 fds sent by pid"), "{log}");
    assert!(sb.status("web").get("stored_fds").is_none());
    sb.stop_supd(nix::sys::signal::Signal::SIGTERM);
}

#[test]
fn a_reload_keeps_the_sockets_it_still_lists_and_closes_the_others() {
    let mut sb = Sandbox::new();
    let (srv, report) = server(&sb);
    let (kept, dropped, added) = (free_port(), free_port(), free_port());
    let write = |sb: &Sandbox, listen: &str, env: &str| {
        sb.config(&format!(
            r#"[service.web]
command = ["{srv}", "{report}"]
listen = [{listen}]
env = {{ X = "{env}" }}
"#,
            report = report.display()
        ))
    };
    write(
        &sb,
        &format!("\"tcp:127.0.0.1:{kept}\", \"tcp:127.0.0.1:{dropped}\""),
        "1",
    );
    sb.start();
    let first = wait_runs(&sb, &report, 1);
    // The service changes (its env and its listen): restarted with the new definition.
    write(
        &sb,
        &format!("\"tcp:127.0.0.1:{added}\", \"tcp:127.0.0.1:{kept}\""),
        "2",
    );
    assert!(sb.supctl(&["reload"]).status.success());
    let r = wait_runs(&sb, &report, 2);
    let second = &r[1];
    assert_eq!(second["listen_fds"], "2", "{second}");
    assert!(second["fds"][0]["addr"]
        .as_str()
        .unwrap_or("")
        .contains(&added.to_string()));
    // The entry it still lists is the same socket: its backlog went on through the
    // reload.
    assert_eq!(
        second["fds"][1]["inode"], first[0]["fds"][0]["inode"],
        "{r:?}"
    );
    let e = TcpStream::connect(("127.0.0.1", dropped)).expect_err("a dropped entry still listens");
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused);
    assert_eq!(
        ask(&format!("127.0.0.1:{added}")).expect("added"),
        second["pid"].to_string()
    );
    sb.stop_supd(nix::sys::signal::Signal::SIGTERM);
}

/// A supd killed with SIGKILL: the next one copies the sockets out of the run it left
/// before ending it (pidfd_getfd), so that the address is never closed: the next run
/// gets the very same sockets, and the Unix socket's file stays.
#[test]
fn a_killed_supds_sockets_are_taken_over_from_the_run_it_left() {
    let mut sb = Sandbox::new();
    let (srv, report) = server(&sb);
    let port = free_port();
    let unix = sb.path("app.sock");
    sb.config(&format!(
        r#"[service.web]
command = ["{srv}", "{report}"]
listen = ["tcp:127.0.0.1:{port}", "unix:{unix}"]
"#,
        report = report.display(),
        unix = unix.display()
    ));
    sb.start();
    let first = wait_runs(&sb, &report, 1)[0].clone();
    sb.stop_supd(nix::sys::signal::Signal::SIGKILL);
    // The run it left serves on.
    let addr = format!("127.0.0.1:{port}");
    assert_eq!(ask(&addr).expect("the left run"), first["pid"].to_string());
    sb.start();
    let r = wait_runs(&sb, &report, 2);
    // Under Linux 3.10's system calls (RHEL 7) there is no pidfd_getfd: the address is
    // bound anew once the left run is gone, and served as well.
    let old_kernel =
        std::env::var_os("SUP_TEST_LINUX_3_10").is_some() && common::oldkernel::supported();
    if !old_kernel {
        for i in 0..2 {
            assert_eq!(
                r[1]["fds"][i]["inode"], first["fds"][i]["inode"],
                "socket {i}: {r:?}"
            );
        }
        assert!(
            sb.supd_log().contains("took over tcp:127.0.0.1"),
            "{}",
            sb.supd_log()
        );
    }
    assert_eq!(ask(&addr).expect("the next run"), r[1]["pid"].to_string());
    assert!(
        std::os::unix::net::UnixStream::connect(&unix).is_ok(),
        "the socket file went"
    );
    sb.stop_supd(nix::sys::signal::Signal::SIGTERM);
}
