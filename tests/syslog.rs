//! `[supd] syslog` (issue 27): a message sent with logger(1) from inside a service lands
//! in that service's log (RFC 3164 and RFC 5424), one from an outsider in supd's own log;
//! a flood from one service is bounded and counted while another's messages still
//! arrive and supd answers at once; the socket survives `reexec`, moves with a reload,
//! is removed at exit; a path another process serves is refused; `--check` says a
//! missing directory.
//!
//! logger(1) sends and exits, and its parent reaps it, often before supd reads its
//! message. supd places such a message by the cgroup the sender's pidfd names (Linux
//! 6.16, with cgroups): `a_message_whose_sender_is_reaped_before_supd_reads_it_is_placed`
//! makes that happen each time, supd frozen while the sender is reaped. The other tests
//! keep their loggers unreaped until the service ends (`logger ... & exec sleep`: the
//! sleep, their parent now, never waits), so that they hold on every kernel.

mod common;
use common::files::wait_file;
use common::*;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

/// The sandbox's syslog socket.
fn socket(sb: &Sandbox) -> PathBuf {
    sb.path("log.sock")
}

/// A service's command that sends `logger_args` (after `-u SOCKET`) and sleeps, its
/// logger left unreaped.
fn logging(sb: &Sandbox, loggers: &[&str]) -> String {
    let sock = socket(sb);
    let mut cmd = String::new();
    for args in loggers {
        cmd += &format!("logger -u {} {args} & ", sock.display());
    }
    cmd += "exec sleep 3600";
    format!("[\"/bin/sh\", \"-c\", \"{cmd}\"]")
}

fn log_of(sb: &Sandbox, name: &str) -> String {
    let out = sb.supctl(&["log", name, "-n", "1000"]);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn logger_from_a_service_lands_in_its_log_an_outsider_s_in_supd_s() {
    let mut sb = Sandbox::new();
    let cmd = logging(
        &sb,
        &[
            "-t tag3164 hello-3164",
            "--rfc5424 -p daemon.warning -t tag5424 hello-5424",
        ],
    );
    sb.config_with(
        "syslog = \"log.sock\"",
        &format!("[service.talker]\ncommand = {cmd}\n[service.quiet]\ncommand = [\"/bin/sleep\", \"3600\"]\n"),
    );
    sb.start();
    let mode = std::fs::metadata(socket(&sb)).expect("the socket").mode();
    assert_eq!(mode & 0o777, 0o666, "anyone may log, as to /dev/log");
    // Both through the log writer into log_dir/talker.log...
    let file = wait_file(&sb.path("log/talker.log"), |t| {
        t.contains("[syslog user.notice] tag3164: hello-3164")
            && t.contains("[syslog daemon.warning] tag5424: hello-5424")
    });
    // ...stamped as captured output is...
    let line = file
        .lines()
        .find(|l| l.contains("hello-3164"))
        .expect("line");
    let stamp = line.split(' ').next().unwrap_or("");
    assert!(stamp.len() == 24 && stamp.ends_with('Z'), "{line}");
    // ...and kept for `supctl log`.
    let log = log_of(&sb, "talker");
    assert!(
        log.contains("[syslog user.notice] tag3164: hello-3164"),
        "{log}"
    );
    assert!(log.contains("tag5424: hello-5424"), "{log}");

    // The test is no service's: its message goes to supd's own log, nowhere else.
    let me = std::process::id();
    let s = UnixDatagram::unbound().expect("socket");
    s.send_to(
        b"<14>Dec  2 10:00:00 outsider[1]: hi-from-the-test",
        socket(&sb),
    )
    .expect("send");
    wait_file(&sb.path("supd.stderr"), |t| {
        t.contains(&format!(
            "syslog from pid {me} (no service's): [user.info] outsider[1]: hi-from-the-test"
        ))
    });
    for name in ["talker", "quiet"] {
        assert!(!log_of(&sb, name).contains("hi-from-the-test"));
    }

    // fds a sender attaches to a message are closed, never kept: anyone may send here.
    let (r, w) = nix::unistd::pipe().expect("pipe");
    let pipe = std::fs::read_link(format!("/proc/self/fd/{}", r.as_raw_fd())).expect("link");
    let fds = [r.as_raw_fd(), w.as_raw_fd()];
    let to = nix::sys::socket::UnixAddr::new(&socket(&sb)).expect("address");
    let s = UnixDatagram::unbound().expect("socket");
    nix::sys::socket::sendmsg(
        s.as_raw_fd(),
        &[std::io::IoSlice::new(b"<14>outsider: with-fds")],
        &[nix::sys::socket::ControlMessage::ScmRights(&fds)],
        nix::sys::socket::MsgFlags::empty(),
        Some(&to),
    )
    .expect("sendmsg");
    wait_file(&sb.path("supd.stderr"), |t| t.contains("with-fds"));
    let kept: Vec<_> = std::fs::read_dir(format!("/proc/{}/fd", sb.supd_pid()))
        .expect("supd's fds")
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|l| *l == pipe)
        .collect();
    assert!(kept.is_empty(), "supd kept a sender's fds: {kept:?}");
}

/// A cron job's logger: it sends, exits and is reaped by the job's shell at once. Here
/// supd is frozen (SIGSTOP) from before the send until after the reap, so its pid names
/// nobody when supd reads the message: the cgroup the sender's pidfd names places it.
/// Again after a `reexec`, whose new image learns the cgroups supd made before it, and
/// for a service started after that. No message leaves its pidfd open in supd.
#[test]
fn a_message_whose_sender_is_reaped_before_supd_reads_it_is_placed() {
    let release = nix::sys::utsname::uname().expect("uname");
    let release = release.release().to_string_lossy().into_owned();
    let mut n = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|x| x.parse().unwrap_or(0));
    if (n.next().unwrap_or(0), n.next().unwrap_or(0)) < (6, 16) {
        eprintln!("skipped: Linux {release} passes no pidfd of a reaped sender");
        return;
    }
    let mut sb = Sandbox::new();
    // Each line read from NAME.go is a job: logger, reaped by the shell, then NAME.done.
    let mut services = String::new();
    for name in ["cron", "late"] {
        let go = sb.path(&format!("{name}.go"));
        nix::unistd::mkfifo(&go, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
        services += &format!(
            "[service.{name}]\nautostart = {}\ncommand = [\"/bin/sh\", \"-c\", \"while read x < {}; do logger -u {} -t job reaped-$x; echo $x > {}; done\"]\n",
            name == "cron",
            go.display(),
            socket(&sb).display(),
            sb.path(&format!("{name}.done")).display()
        );
    }
    sb.config_with("syslog = \"log.sock\"", &services);
    sb.start();
    sb.wait_state("cron", "running");
    let pid = sb.status("cron")["pid"].as_i64().expect("pid");
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    if !cgroup.contains("/cron.service") {
        eprintln!("skipped: supd gives its services no cgroup v2 here ({cgroup})");
        return;
    }
    let job = |sb: &Sandbox, name: &str, x: &str| {
        let supd = nix::unistd::Pid::from_raw(sb.supd_pid());
        nix::sys::signal::kill(supd, nix::sys::signal::Signal::SIGSTOP).expect("SIGSTOP supd");
        std::fs::write(sb.path(&format!("{name}.go")), format!("{x}\n")).expect("write");
        // The shell has waited for logger (reaped it) before it writes this.
        wait_file(&sb.path(&format!("{name}.done")), |t| t.trim() == x);
        nix::sys::signal::kill(supd, nix::sys::signal::Signal::SIGCONT).expect("SIGCONT supd");
        wait_file(&sb.path(&format!("log/{name}.log")), |t| {
            t.contains(&format!("[syslog user.notice] job: reaped-{x}"))
        });
    };
    job(&sb, "cron", "one");
    sb.reexec();
    job(&sb, "cron", "two");
    sb.ok(serde_json::json!({"cmd": "start", "service": "late"}));
    sb.wait_state("late", "running");
    job(&sb, "late", "three");
    assert!(
        !std::fs::read_to_string(sb.path("supd.stderr"))
            .unwrap_or_default()
            .contains("reaped-"),
        "placed in supd's own log too"
    );
    // Each message's pidfd is closed once read: 150 messages leave supd no more pidfds
    // than it holds for its runs.
    let pidfds = || {
        std::fs::read_dir(format!("/proc/{}/fd", sb.supd_pid()))
            .expect("supd's fds")
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter(|l| l.to_string_lossy() == "anon_inode:[pidfd]")
            .count()
    };
    let before = pidfds();
    let s = UnixDatagram::unbound().expect("socket");
    for i in 0..150 {
        s.send_to(
            format!("<14>outsider: message-{i}.").as_bytes(),
            socket(&sb),
        )
        .expect("send");
    }
    wait_file(&sb.path("supd.stderr"), |t| t.contains("message-149."));
    assert_eq!(pidfds(), before, "pidfds left open by the messages read");
}

#[test]
fn a_flood_is_bounded_and_counted_and_holds_nobody_back() {
    let mut sb = Sandbox::new();
    let sock = socket(&sb);
    let other = logging(&sb, &["-t other hello-other"]);
    sb.config_with(
        "syslog = \"log.sock\"",
        &format!(
            "[service.flood]\ncommand = [\"/bin/sh\", \"-c\", \"yes spam | logger -u {} -t flood\"]\n\
             [service.other]\ncommand = {other}\nautostart = false\n",
            sock.display()
        ),
    );
    let began = Instant::now();
    sb.start();
    // Counted and said, naming the service.
    let said = wait_file(&sb.path("supd.stderr"), |t| {
        t.contains("syslog: dropped") && t.contains("(service flood)")
    });
    // supd answers at once while the flood goes on.
    let asked = Instant::now();
    sb.status("flood");
    assert!(
        asked.elapsed().as_secs_f64() < 2.0,
        "status took {:?}",
        asked.elapsed()
    );
    // Another service's message still arrives.
    sb.ok(serde_json::json!({"cmd": "start", "service": "other"}));
    wait_file(&sb.path("log/other.log"), |t| {
        t.contains("other: hello-other")
    });
    // Bounded: 200 at once, then 200 a second.
    let kept = log_of(&sb, "flood").matches("flood: spam").count();
    let bound = 200.0 + 200.0 * began.elapsed().as_secs_f64();
    assert!((kept as f64) <= bound, "{kept} kept, bound {bound}");
    let dropped: u64 = said
        .lines()
        .filter_map(|l| l.split("syslog: dropped ").nth(1))
        .filter_map(|r| r.split(' ').next()?.parse::<u64>().ok())
        .sum();
    assert!(dropped > 0, "{said}");
    assert_eq!(sb.status("flood")["state"], "running");
}

#[test]
fn the_socket_survives_reexec_moves_with_a_reload_and_goes_at_exit() {
    let mut sb = Sandbox::new();
    let cmd = logging(&sb, &["-t after after-reexec"]);
    let services = format!("[service.late]\ncommand = {cmd}\nautostart = false\n");
    sb.config_with("syslog = \"log.sock\"", &services);
    sb.start();
    let ino = std::fs::metadata(socket(&sb)).expect("socket").ino();
    sb.reexec();
    assert_eq!(
        std::fs::metadata(socket(&sb)).expect("socket").ino(),
        ino,
        "the same socket, carried across the exec"
    );
    sb.ok(serde_json::json!({"cmd": "start", "service": "late"}));
    wait_file(&sb.path("log/late.log"), |t| {
        t.contains("after: after-reexec")
    });

    // A reload to another path moves it; the old file goes.
    sb.config_with("syslog = \"other.sock\"", &services);
    let out = sb.supctl(&["reload"]);
    assert!(out.status.success(), "{}", sb.supd_log());
    assert!(!socket(&sb).exists(), "the old socket's file is removed");
    let moved = sb.path("other.sock");
    assert!(std::fs::metadata(&moved).is_ok(), "{}", sb.supd_log());
    sb.stop_supd(nix::sys::signal::Signal::SIGTERM);
    assert!(!moved.exists(), "removed at exit");
}

#[test]
fn a_path_another_process_serves_is_refused_and_supd_goes_on() {
    let mut sb = Sandbox::new();
    let theirs = UnixDatagram::bind(socket(&sb)).expect("a syslog daemon's socket");
    sb.config_with(
        "syslog = \"log.sock\"",
        "[service.s]\ncommand = [\"/bin/sleep\", \"3600\"]\n",
    );
    sb.start();
    let log = wait_file(&sb.path("supd.stderr"), |t| {
        t.contains("no syslog listener")
    });
    let path = socket(&sb).display().to_string();
    assert!(
        log.contains(&format!("{path} is served by another process")),
        "{log}"
    );
    sb.wait_state("s", "running");
    // Still theirs.
    let s = UnixDatagram::unbound().expect("socket");
    s.send_to(b"<13>t: still theirs", socket(&sb))
        .expect("send");
    let mut buf = [0u8; 64];
    theirs.set_read_timeout(Some(DEADLINE)).expect("timeout");
    let n = theirs.recv(&mut buf).expect("theirs gets it");
    assert_eq!(&buf[..n], b"<13>t: still theirs");
}

#[test]
fn check_says_a_missing_directory() {
    let sb = Sandbox::new();
    sb.config_with(
        "syslog = \"/nonexistent-dir/log\"",
        "[service.s]\ncommand = [\"/bin/sleep\", \"3600\"]\n",
    );
    let out = Command::new(SUPD)
        .args(["--check", "-c"])
        .arg(sb.path("sup.toml"))
        .output()
        .expect("supd --check");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let at = format!("{}:7:1: supd.syslog:", sb.path("sup.toml").display());
    assert!(err.contains(&at), "{err}");
    assert!(err.contains("/nonexistent-dir does not exist"), "{err}");
}
