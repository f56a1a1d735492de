//! The loop keeps going round: nothing one service does holds up another's restart or a
//! control answer (issue 10).

mod common;
use common::*;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::json;
use std::time::{Duration, Instant};

/// How long one `status` round trip takes.
fn status_time(sb: &Sandbox) -> Duration {
    let t = Instant::now();
    sb.ok(json!({"cmd": "status"}));
    t.elapsed()
}

#[test]
fn a_start_that_fails_at_once_with_zero_delay_does_not_spin() {
    let mut sb = Sandbox::new();
    sb.config(
        "[service.spin]\ncommand = [\"/nonexistent/program\"]\nrestart_delay = \"0s\"\n\
         crash_loop = { restarts = 100000, window = \"1h\" }\n\n\
         [service.other]\ncommand = [\"/bin/sleep\", \"3600\"]\nrestart_delay = \"0s\"\n",
    );
    sb.start();
    let first = sb.wait_state("other", "running")["pid"]
        .as_i64()
        .expect("pid") as i32;
    let mut w = sb.watch();
    let begun = Instant::now();
    let times: Vec<Duration> = (0..20).map(|_| status_time(&sb)).collect();
    let slowest = times.iter().max().copied().unwrap_or_default();
    // A spinning loop makes every answer slow; a loaded machine delays one or two.
    let slow = times
        .iter()
        .filter(|t| **t > Duration::from_millis(500))
        .count();
    kill(Pid::from_raw(first), Signal::SIGKILL).expect("kill other");
    let killed = Instant::now();
    let again = w.until(&sb, |e| {
        e["service"] == "other" && e["to"] == "running" && e["pid"].as_i64() != Some(first as i64)
    });
    let restart = killed.elapsed();
    // Four more failed starts of `spin` take at least 300 ms: 100 ms between tries.
    let before = sb.status("spin")["restarts"].as_u64().expect("restarts");
    let t = Instant::now();
    for _ in 0..4 {
        w.until(&sb, |e| e["service"] == "spin" && e["to"] == "backoff");
    }
    let four = t.elapsed();
    assert!(four >= Duration::from_millis(300), "4 tries in {four:?}");
    let attempts = sb.status("spin")["restarts"].as_u64().expect("restarts");
    assert!(attempts >= before + 4);
    let window = begun.elapsed();
    eprintln!(
        "slowest status {slowest:?}; other restarted in {restart:?} ({again}); spin tried {attempts} times in {window:?}"
    );
    assert!(
        slow <= 2,
        "{slow} of 20 status answers took over 500 ms: {times:?}"
    );
    // A restart queued behind the spin would wait for ever; 3 s is a loaded machine's
    // fork and exec with room to spare.
    assert!(restart < Duration::from_secs(3), "restart took {restart:?}");
    // At most one try per 100 ms, plus the first.
    let bound = window.as_millis() as u64 / 100 + 5;
    assert!(
        attempts <= bound,
        "a failing start was retried {attempts} times in {window:?}"
    );
}

#[test]
fn a_restarted_supd_serves_at_once_while_it_ends_what_its_predecessor_left() {
    let mut sb = Sandbox::new();
    // Its first run ignores TERM; later ones do not (so the test ends quickly).
    let mark = sb.path("first-run-done");
    let svc = sb.script(
        "stubborn",
        &format!(
            "[ -e {m} ] || trap '' TERM\ntouch {m}\necho >&3\nwhile :; do sleep 1; done",
            m = mark.display()
        ),
    );
    sb.config(&format!(
        "[service.stubborn]\ncommand = [\"{svc}\"]\nready = \"fd:3\"\nstop_timeout = \"1h\"\n"
    ));
    sb.start();
    let old = sb.wait_state("stubborn", "running")["pid"]
        .as_i64()
        .expect("pid") as i32;
    sb.stop_supd(Signal::SIGKILL);
    // It ignores TERM and may take an hour: the new supd answers meanwhile.
    let begun = Instant::now();
    sb.start();
    let all = sb.ok(json!({"cmd": "status"}));
    eprintln!("answered {:?} after start: {all}", begun.elapsed());
    assert_eq!(all["cleanup"]["services"], json!(["stubborn"]), "{all}");
    let s = sb.status("stubborn");
    assert!(s["pid"].is_null(), "not started beside what is left: {s}");
    assert!(
        s["reason"]
            .as_str()
            .is_some_and(|r| r.contains(&format!("waiting for pid {old} of the previous run"))),
        "{s}"
    );
    let mut w = sb.watch();
    kill(Pid::from_raw(old), Signal::SIGKILL).expect("end the leftover");
    let new = w.state(&sb, "stubborn", "running")["pid"]
        .as_i64()
        .expect("pid") as i32;
    assert_ne!(new, old);
    assert!(sb.ok(json!({"cmd": "status"}))["cleanup"].is_null());
}

/// A user database that hangs (here /etc/passwd, in supd's own mount namespace, is a
/// FIFO nobody writes) holds back the start of the service that needs it, and nothing
/// else: status answers, and another service is restarted.
#[test]
fn a_user_database_that_hangs_holds_back_only_the_start_that_needs_it() {
    if !is_root() {
        eprintln!("skipped: needs root for a mount namespace");
        return;
    }
    let mut sb = Sandbox::new();
    let fifo = sb.path("passwd.fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).expect("fifo");
    // Members of `daemon` (gid 1) may read: the client below is one by its
    // supplementary groups only.
    sb.config_with(
        "socket_group = \"daemon\"",
        "[service.as_user]\ncommand = [\"/bin/sleep\", \"3600\"]\nuser = \"nobody\"\n\n\
         [service.other]\ncommand = [\"/bin/sleep\", \"3600\"]\nrestart_delay = \"0s\"\n",
    );
    let mut cmd = std::process::Command::new("unshare");
    cmd.args([
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        &format!(
            "mount --bind {} /etc/passwd && exec \"$0\" \"$@\"",
            fifo.display()
        ),
        SUPD,
    ]);
    sb.start_with(cmd, &["-c"]);
    let first = sb.wait_state("other", "running")["pid"]
        .as_i64()
        .expect("pid") as i32;
    let times: Vec<Duration> = (0..20).map(|_| status_time(&sb)).collect();
    let slowest = times.iter().max().copied().unwrap_or_default();
    let mut w = sb.watch();
    kill(Pid::from_raw(first), Signal::SIGKILL).expect("kill other");
    w.until(&sb, |e| {
        e["service"] == "other" && e["to"] == "running" && e["pid"].as_i64() != Some(first as i64)
    });
    let stuck = sb.status("as_user");
    eprintln!("slowest status {slowest:?} while the user database hung; {stuck}");
    // A supd blocked in the lookup would answer none of them until the FIFO is written;
    // a loaded machine delays one or two.
    let slow = times
        .iter()
        .filter(|t| **t > Duration::from_millis(500))
        .count();
    assert!(
        slow <= 2,
        "{slow} of 20 status answers took over 500 ms: {times:?}"
    );
    assert_eq!(
        stuck["state"], "starting",
        "forked, its lookup under way, its program not run yet: {stuck}"
    );
    // A client of another uid is judged without the user database: answered at once.
    let t = Instant::now();
    let other = std::process::Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--groups=1",
            SUPCTL,
            "--timeout",
            "5s",
            "-s",
        ])
        .arg(&sb.socket)
        .arg("hello")
        .output()
        .expect("setpriv supctl");
    eprintln!(
        "another uid's client: {:?} in {:?}",
        other.status.code(),
        t.elapsed()
    );
    assert_eq!(
        other.status.code(),
        Some(0),
        "supd did not answer another uid's client: {}",
        String::from_utf8_lossy(&other.stderr)
    );
    // `--timeout 5s` fails a supd that does not answer; this bounds the two execs too.
    assert!(t.elapsed() < Duration::from_secs(5));
    // Release the lookup: the files database is empty now, and the next source (or
    // none) answers; the start goes on, or fails with the reason, at once.
    drop(
        std::fs::OpenOptions::new()
            .write(true)
            .open(&fifo)
            .expect("open the fifo"),
    );
    // It runs once the lookup is answered (by the next source: `nobody` is known to
    // systemd's), or fails with the reason.
    let after = w.until(&sb, |e| {
        e["service"] == "as_user"
            && (e["to"] == "running"
                || e["reason"]
                    .as_str()
                    .is_some_and(|r| r.contains("user 'nobody'")))
    });
    eprintln!("after the release: {after}");
}

/// A control socket that cannot be bound (its directory is a file) does not end supd
/// (as PID 1 that would end the machine): it supervises, says why, and binds the socket
/// once it can.
#[test]
fn a_socket_that_cannot_be_bound_is_retried_while_services_run() {
    let mut sb = Sandbox::new();
    let blocked = sb.path("run");
    std::fs::write(&blocked, "not a directory").expect("block the socket's directory");
    let marker = sb.path("started");
    let svc = sb.script(
        "svc",
        &format!("touch {}\nexec sleep 3600", marker.display()),
    );
    sb.config_with("", &format!("[service.a]\ncommand = [\"{svc}\"]\n"));
    // The socket inside the blocked directory.
    let text = std::fs::read_to_string(sb.path("sup.toml")).expect("config");
    std::fs::write(
        sb.path("sup.toml"),
        text.replace("socket = \"sup.sock\"", "socket = \"run/sup.sock\""),
    )
    .expect("config");
    sb.socket = sb.path("run/sup.sock");
    sb.start();
    common::files::wait_file(&marker, |_| marker.exists());
    let log = sb.supd_log();
    assert!(
        log.contains("cannot create its directory") && log.contains("trying again"),
        "says why:\n{log}"
    );
    std::fs::remove_file(&blocked).expect("unblock");
    std::fs::create_dir(&blocked).expect("the directory");
    let sock = sb.socket.clone();
    common::files::wait_file(&sock, |_| sock.exists());
    sb.wait_state("a", "running");
}

/// A socket that accepts but never answers (what a killed supd's child holds for a
/// moment, between its fork and its first instruction) is not a live supd: a new supd
/// replaces it instead of refusing to start.
#[test]
fn a_socket_held_by_something_that_never_answers_is_replaced() {
    let mut sb = Sandbox::new();
    sb.config("[service.a]\ncommand = [\"/bin/sleep\", \"3600\"]\n");
    let mute = std::os::unix::net::UnixListener::bind(&sb.socket).expect("a mute listener");
    sb.start();
    sb.wait_state("a", "running");
    drop(mute);
}
