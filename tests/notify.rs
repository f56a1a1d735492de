//! `ready = "notify"`: a READY=1 reaches its service whoever sends it from inside that
//! service (a helper that has already exited, a service with `user =`), never from
//! outside it, and across `reexec` (issue 9, item 8).

mod common;
use common::*;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::json;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};

/// A socket the test listens on, for services to say how far they got.
struct Handshake {
    sock: UnixDatagram,
    path: PathBuf,
}

impl Handshake {
    fn bind(sb: &Sandbox) -> Handshake {
        let path = sb.path("test.sock");
        let sock = UnixDatagram::bind(&path).expect("bind the test's socket");
        // Services of any user may tell.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).expect("chmod");
        sock.set_read_timeout(Some(DEADLINE)).expect("timeout");
        Handshake { sock, path }
    }

    /// Waits (with the deadline) for `word` from a service.
    fn expect(&self, sb: &Sandbox, word: &str) {
        let mut buf = [0u8; 64];
        let n = self
            .sock
            .recv(&mut buf)
            .unwrap_or_else(|e| panic!("no '{word}' within {DEADLINE:?}: {e}\n{}", sb.supd_log()));
        assert_eq!(String::from_utf8_lossy(&buf[..n]), word);
    }
}

/// The python service of these tests: says `bound` once it can be told `go` (on a socket
/// in a directory any user may write), waits for `go`, then does `then` and says `sent`.
fn service(sb: &Sandbox, name: &str, hs: &Handshake, then: &str) -> String {
    let go = go_path(sb, name);
    let dir = go.parent().expect("a directory");
    std::fs::create_dir_all(dir).expect("mkdir");
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    sb.file(
        &format!("{name}.py"),
        &format!(
            "#!/usr/bin/python3\n\
             import os, socket, subprocess, time\n\
             def tell(word):\n    \
                 socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(word, '{hs}')\n\
             go = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n\
             go.bind('{go}')\n\
             tell(b'bound')\n\
             go.recv(16)\n\
             {then}\n\
             tell(b'sent')\n\
             time.sleep(3600)\n",
            hs = hs.path.display(),
            go = go.display(),
        ),
    )
}

/// Python that sends READY=1 to `$NOTIFY_SOCKET` (or `to`) from the running process.
fn send_ready(to: Option<&Path>) -> String {
    let to = to.map_or("os.environ['NOTIFY_SOCKET']".to_string(), |p| {
        format!("'{}'", p.display())
    });
    format!("socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(b'READY=1', {to})")
}

fn go_path(sb: &Sandbox, name: &str) -> PathBuf {
    sb.path("go").join(name)
}

fn go(sb: &Sandbox, name: &str) {
    UnixDatagram::unbound()
        .expect("socket")
        .send_to(b"go", go_path(sb, name))
        .expect("tell the service to go on");
}

fn notify_socket(sb: &Sandbox, name: &str) -> PathBuf {
    sb.path("sup.sock.notify.d").join(name)
}

/// supd stopped (SIGSTOP) until this is dropped: what is sent meanwhile waits unread.
struct Frozen(Pid);

impl Frozen {
    fn new(sb: &Sandbox) -> Frozen {
        let pid = Pid::from_raw(sb.supd_pid());
        kill(pid, Signal::SIGSTOP).expect("SIGSTOP supd");
        Frozen(pid)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let _ = kill(self.0, Signal::SIGCONT);
    }
}

// see: issue 9 item 8: a READY=1 from a helper that exited before supd read it was
// dropped (no /proc entry to match), so the service never became ready.
#[test]
fn ready_from_a_helper_that_already_exited_counts() {
    let mut sb = Sandbox::new();
    let hs = Handshake::bind(&sb);
    // The helper is a process of its own that sends and exits; `run` reaps it.
    let helper = format!(
        "subprocess.run(['/usr/bin/python3', '-c', \"import os, socket; {}\"], check=True)",
        send_ready(None)
    );
    let svc = service(&sb, "svc", &hs, &helper);
    sb.config(&format!(
        "[service.svc]\ncommand = [\"{svc}\"]\nready = \"notify\"\nready_timeout = \"60s\"\n"
    ));
    sb.start();
    hs.expect(&sb, "bound");
    let pid = sb.status("svc")["pid"].clone();
    {
        // supd reads the datagram only once the helper is gone and reaped.
        let _frozen = Frozen::new(&sb);
        go(&sb, "svc");
        hs.expect(&sb, "sent");
    }
    let st = sb.wait_state("svc", "running");
    assert_eq!(st["pid"], pid, "the same process became ready: {st}");
}

#[test]
fn a_service_of_another_user_can_say_ready() {
    if !is_root() {
        eprintln!("skipped: needs root to run a service as nobody");
        return;
    }
    let mut sb = Sandbox::new();
    let hs = Handshake::bind(&sb);
    let svc = service(&sb, "svc", &hs, &send_ready(None));
    sb.config(&format!(
        "[service.svc]\ncommand = [\"{svc}\"]\nuser = \"nobody\"\nready = \"notify\"\n\
         ready_timeout = \"60s\"\nrestart = \"never\"\n"
    ));
    sb.start();
    hs.expect(&sb, "bound");
    go(&sb, "svc");
    hs.expect(&sb, "sent");
    let st = sb.wait_state("svc", "running");
    assert_eq!(st["restarts"], 0, "{st}");
    let meta = std::fs::metadata(notify_socket(&sb, "svc")).expect("its socket");
    let nobody = nix::unistd::User::from_name("nobody")
        .expect("passwd")
        .expect("nobody");
    assert_eq!(
        (meta.uid(), meta.permissions().mode() & 0o777),
        (nobody.uid.as_raw(), 0o600),
        "its socket is nobody's and nobody else's"
    );
    let dir = std::fs::metadata(sb.path("sup.sock.notify.d")).expect("the directory");
    assert_eq!(
        (dir.uid(), dir.permissions().mode() & 0o777),
        (0, 0o711),
        "others may reach a socket, not list them"
    );
}

#[test]
fn ready_from_outside_the_service_is_refused() {
    let mut sb = Sandbox::new();
    let hs = Handshake::bind(&sb);
    let quiet = service(&sb, "quiet", &hs, &send_ready(None));
    let target = notify_socket(&sb, "quiet");
    let other = service(&sb, "other", &hs, &send_ready(Some(&target)));
    sb.config(&format!(
        "[service.quiet]\ncommand = [\"{quiet}\"]\nready = \"notify\"\nready_timeout = \"60s\"\n\n\
         [service.other]\ncommand = [\"{other}\"]\n"
    ));
    sb.start();
    hs.expect(&sb, "bound");
    hs.expect(&sb, "bound");
    let st = sb.status("quiet");
    assert_eq!(st["state"], "starting");
    // Another service, alive, sends to quiet's socket; so does the test itself. Both are
    // read before supd answers the status request that follows (they were queued first).
    go(&sb, "other");
    hs.expect(&sb, "sent");
    UnixDatagram::unbound()
        .expect("socket")
        .send_to(b"READY=1\n", &target)
        .expect("send");
    let again = sb.status("quiet");
    assert_eq!(
        (&again["state"], &again["pid"]),
        (&json!("starting"), &st["pid"]),
        "a stranger made it ready: {again}"
    );
    let refusals = sb
        .supd_log()
        .lines()
        .filter(|l| l.contains("quiet:") && l.contains("refused"))
        .count();
    assert!(refusals >= 1, "{}", sb.supd_log());
    // A flood from outside for 1.5 s is refused, and told at most once a second.
    let flood = UnixDatagram::unbound().expect("socket");
    flood.set_nonblocking(true).expect("nonblocking");
    let (mut sent, start) = (0, std::time::Instant::now());
    while start.elapsed() < std::time::Duration::from_millis(1500) {
        match flood.send_to(b"READY=1\n", &target) {
            Ok(_) => sent += 1,
            // The socket's queue is full: supd drains it.
            Err(_) => std::thread::yield_now(),
        }
    }
    assert!(sent >= 100, "only {sent} datagrams went out");
    let end = std::time::Instant::now() + DEADLINE;
    while !sb.supd_log().contains("notify messages refused") {
        assert!(std::time::Instant::now() < end, "{}", sb.supd_log());
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let told = sb
        .supd_log()
        .lines()
        .filter(|l| l.contains("quiet:") && l.contains("refused"))
        .count();
    assert!(
        told <= 2 + refusals,
        "{told} lines for {sent} refused messages"
    );
    // The socket works: quiet's own READY=1 is taken.
    go(&sb, "quiet");
    hs.expect(&sb, "sent");
    sb.wait_state("quiet", "running");
}

#[test]
fn readiness_works_after_reexec_for_a_service_started_before() {
    let mut sb = Sandbox::new();
    let hs = Handshake::bind(&sb);
    let svc = service(&sb, "svc", &hs, &send_ready(None));
    sb.config(&format!(
        "[service.svc]\ncommand = [\"{svc}\"]\nready = \"notify\"\nready_timeout = \"60s\"\n"
    ));
    sb.start();
    hs.expect(&sb, "bound");
    let before = sb.status("svc");
    let out = sb.supctl(&["reexec"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "reexec: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        sb.supd_log()
    );
    assert_eq!(sb.status("svc")["state"], "starting");
    go(&sb, "svc");
    hs.expect(&sb, "sent");
    let st = sb.wait_state("svc", "running");
    assert_eq!(
        st["pid"], before["pid"],
        "the same process became ready: {st}"
    );
    // Removed by a reload, the service takes its socket with it.
    sb.config("");
    let mut w = sb.watch();
    assert_eq!(sb.supctl(&["reload"]).status.code(), Some(0));
    w.state(&sb, "svc", "stopped");
    // Answered after the loop dropped the removed service.
    let all = sb.ok(json!({"cmd": "status"}));
    assert_eq!(all["services"], json!([]), "{all}");
    assert!(
        !notify_socket(&sb, "svc").exists(),
        "the socket of a removed service is gone"
    );
}
