//! The control socket's limit attacked (issue 23, item 8's fix): root's newcomer at the
//! limit displaces the longest-idle connection. Idle must mean idle: a client whose
//! request is sent but not read yet by supd is owed an answer.

mod common;
use common::*;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::json;

/// Sixty-four connections, the first one a real client whose request arrives while
/// supd is busy (stopped here for the length of one loop turn), with root's newcomer
/// in the same turn: supd accepted before it read, took the first client (connected
/// longest ago) for idle and closed it with its request unread: a `supctl` lost its
/// answer under load.
#[test]
fn a_request_sent_but_not_read_yet_is_not_displaced() {
    let mut sb = Sandbox::new();
    sb.config("");
    sb.start();
    let mut first = sb.client();
    assert_eq!(first.call(json!({"cmd": "hello"}))["ok"], true);
    // The rest of the limit, each admitted (one round trip) after the first.
    let held: Vec<Client> = (1..64)
        .map(|_| {
            let mut c = sb.client();
            assert_eq!(c.call(json!({"cmd": "hello"}))["ok"], true);
            c
        })
        .collect();
    let supd = Pid::from_raw(sb.supd_pid());
    kill(supd, Signal::SIGSTOP).expect("SIGSTOP");
    first.send_raw(b"{\"cmd\":\"hello\",\"id\":77}\n");
    let mut newcomer = sb.client();
    newcomer.send_raw(b"{\"cmd\":\"hello\",\"id\":78}\n");
    kill(supd, Signal::SIGCONT).expect("SIGCONT");
    let a = newcomer.read();
    let b = first.read();
    assert_eq!(
        b.as_ref().map(|b| b["id"].clone()),
        Some(json!(77)),
        "the first client's request, sent before the newcomer came, is answered: {b:?}\n{}",
        sb.supd_log()
    );
    // The newcomer is served too: another connection, idle, made room.
    assert_eq!(
        a.map(|a| a["id"].clone()),
        Some(json!(78)),
        "{}",
        sb.supd_log()
    );
    drop(held);
}

/// Held: clients that send half a request line and stall for ever hold no place
/// against root: a partial line is no request, and its connection is idle.
#[test]
fn half_lines_that_stall_never_keep_root_out() {
    let mut sb = Sandbox::new();
    sb.config("");
    sb.start();
    let held: Vec<Client> = (0..64)
        .map(|_| {
            let mut c = sb.client();
            c.send_raw(b"{\"cmd\":\"hel");
            c
        })
        .collect();
    let t = std::time::Instant::now();
    for _ in 0..3 {
        assert_eq!(sb.request(json!({"cmd": "hello"}))["ok"], true);
    }
    assert!(
        t.elapsed() < std::time::Duration::from_secs(5),
        "{:?}",
        t.elapsed()
    );
    drop(held);
}
