//! The lease scenarios, for any store. Each checks its outcome, and every wait checks
//! that two engines never ran at once.
#![allow(dead_code)]

use super::cluster::*;
use nix::sys::signal::Signal;

/// The end of every scenario: two more TTLs, checking for overlaps all along and once
/// more at the end (an engine that overlapped writes its mark a moment after it starts).
fn settle(c: &Cluster) {
    ttls(c, 2);
    c.assert_no_overlap();
}

fn ttls(c: &Cluster, n: u32) {
    let t0 = std::time::Instant::now();
    let ttl = crate::common::parse_ttl(c.ttl);
    c.wait(&format!("{n} TTLs"), |_| t0.elapsed() >= ttl * n);
}

/// Three nodes on 0.6.2, one leads; another is upgraded to 0.8.1 and leads alone.
pub fn fleet(store: Option<String>, ttl: &'static str) {
    let c = Cluster::new(&["0.6.2", "0.6.2", "0.6.2"], store, ttl);
    let first = c.wait_any_leader();
    let other = c
        .nodes
        .iter()
        .find(|n| n.name != first)
        .expect("another node");
    other.install("0.8.1", false);
    other.upgrade("0.8.1", true);
    c.wait_leader(&other.name.clone());
    let st = c.status_text();
    assert!(
        st.contains(&format!("leader: {} (0.8.1)", other.name)),
        "{st}"
    );
    settle(&c);
}

/// A crash-looping upgrade never takes leadership; the old leader keeps it.
pub fn crash_loop(store: Option<String>, ttl: &'static str) {
    let c = Cluster::new(&["0.6.2", "0.6.2"], store, ttl);
    let first = c.wait_any_leader();
    let other = c.nodes.iter().find(|n| n.name != first).expect("other");
    other.install("0.8.1", true);
    other.upgrade("0.8.1", false); // rolls back
    let log_before = std::fs::read_to_string(c.shared.join("engine.log")).unwrap_or_default();
    ttls(&c, 3);
    assert_eq!(c.running_engines(), std::slice::from_ref(&first));
    let log_after = std::fs::read_to_string(c.shared.join("engine.log")).unwrap_or_default();
    // Only the leader's engine started since (again, if a renewal came late on a loaded
    // machine: at T = 1 s a tick late by T/6 lets its grant run out): never the other's.
    let elsewhere: Vec<&str> = log_after[log_before.len().min(log_after.len())..]
        .lines()
        .filter(|l| l.split_whitespace().next() != Some(first.as_str()))
        .collect();
    assert!(
        log_after.starts_with(&log_before) && elsewhere.is_empty(),
        "the engine was started elsewhere: {elsewhere:?} (log before {log_before:?}, after {log_after:?})"
    );
    settle(&c);
}

/// An irreversible version that leads raises the floor; older nodes cannot lead even
/// when it dies; the operator lowers the floor and they can.
pub fn floor(store: Option<String>, ttl: &'static str) {
    let mut c = Cluster::new(&["0.6.2", "0.6.2"], store, ttl);
    let first = c.wait_any_leader();
    let i = c.nodes.iter().position(|n| n.name != first).expect("other");
    let other = c.nodes[i].name.clone();
    let src = c.nodes[i].sb.stage_version("0.8.1", "exec /bin/sleep 3600");
    std::fs::write(src.join("sup-tool.toml"), "revertible = false\n").expect("manifest");
    let out = c.nodes[i]
        .sb
        .supctl(&["install", "agent", "0.8.1", &src.to_string_lossy()]);
    assert_eq!(out.status.code(), Some(0));
    c.nodes[i].upgrade("0.8.1", true);
    c.wait_leader(&other);
    c.wait("the floor at 0.8.1", |c| {
        c.status_text().contains("floor 0.8.1")
    });
    c.nodes[i].signal_lease(Signal::SIGKILL);
    let t0 = std::time::Instant::now();
    let ttl4 = crate::common::parse_ttl(c.ttl) * 4;
    c.wait("nobody leads for 4 TTLs", |c| {
        c.running_engines().is_empty() && t0.elapsed() >= ttl4
    });
    let out = c.policy(&["floor", "0.6.2"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    c.wait_leader(&first);
    settle(&c);
}

/// Pinning an older version moves leadership to it, and it stays.
pub fn pin(store: Option<String>, ttl: &'static str) {
    let c = Cluster::new(&["0.6.2", "0.8.1", "0.8.1"], store, ttl);
    // n1 campaigns first and may lead alone for a moment; then the newest version leads.
    c.wait("the newest version leads", |c| {
        let e = c.running_engines();
        e.len() == 1 && e[0] != "n1"
    });
    let out = c.policy(&["pin", "0.6.2"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    c.wait_leader("n1");
    ttls(&c, 3);
    assert_eq!(
        c.running_engines(),
        ["n1"],
        "the pin holds while newer nodes live"
    );
    assert!(String::from_utf8_lossy(&c.policy(&["show"]).stdout).contains("pinned to 0.6.2"));
    settle(&c);
}

/// The holder's sup-lease killed, then another holder's paused: each time the engine
/// stops on the old holder before it starts elsewhere.
pub fn killed_or_paused(store: Option<String>, ttl: &'static str) {
    let mut c = Cluster::new(&["0.6.2", "0.6.2", "0.6.2"], store, ttl);
    let first = c.wait_any_leader();
    let i = c
        .nodes
        .iter()
        .position(|n| n.name == first)
        .expect("holder");
    c.nodes[i].signal_lease(Signal::SIGKILL);
    c.wait("another leader after a kill -9", |c| {
        let e = c.running_engines();
        e.len() == 1 && e[0] != first
    });
    let second = c.running_engines()[0].clone();
    assert_eq!(c.node(&first).sb.status("engine")["state"], "stopped");
    let j = c
        .nodes
        .iter()
        .position(|n| n.name == second)
        .expect("holder");
    c.nodes[j].signal_lease(Signal::SIGSTOP);
    c.wait("another leader after a pause", |c| {
        let e = c.running_engines();
        e.len() == 1 && e[0] != second
    });
    c.nodes[j].signal_lease(Signal::SIGCONT);
    ttls(&c, 2);
    assert_eq!(c.running_engines().len(), 1);
    settle(&c);
}

/// The store goes away (etcd stopped): the holder stops leading, nobody leads; it comes
/// back: the rule resumes.
pub fn store_down(etcd: &super::etcd::Etcd, ttl: &'static str) {
    let c = Cluster::new(&["0.6.2", "0.6.2"], Some(etcd.store()), ttl);
    c.wait_any_leader();
    etcd.signal(Signal::SIGSTOP);
    c.wait("no engine while the store is away", |c| {
        c.running_engines().is_empty()
    });
    ttls(&c, 2);
    assert!(c.running_engines().is_empty());
    etcd.signal(Signal::SIGCONT);
    c.wait_any_leader();
    settle(&c);
}

/// The holder steps down for an upgraded node while its engine takes `ttls` TTLs to stop:
/// the key is kept, renewed, until the engine has exited, and the holder, marked as
/// stepping down, is not taken over meanwhile (even past 2T).
pub fn slow_step_down(store: Option<String>, ttl: &'static str, ttls: f32) {
    let secs = crate::common::parse_ttl(ttl).as_secs_f32() * ttls;
    let c = Cluster::slow_to_stop(&["0.6.2", "0.6.2"], store, ttl, secs);
    let first = c.wait_any_leader();
    let other = c.nodes.iter().find(|n| n.name != first).expect("other");
    other.install("0.8.1", false);
    other.upgrade("0.8.1", true);
    c.wait_leader(&other.name.clone());
    settle(&c);
}

/// Issue 13: n1 (0.8.1, preferred) leads; its engine turns unhealthy (its health check
/// finds `sick-n1`): n1 steps down and n2 (0.6.2) leads, never both at once. n1 stays
/// out for the engine's cooldown (`hold`) although nothing runs there to be unhealthy
/// any more: leadership does not flap straight back. Then n1, healthy and preferred,
/// leads again.
pub fn unhealthy_holder(store: Option<String>, ttl: &'static str, hold: &str) {
    let opts = Options {
        engine: format!(
            "health = {{ command = [\"/bin/sh\", \"-c\", \"! test -e {{shared}}/sick-$NODE\"], interval = \"100ms\", timeout = \"2s\", failures = 2 }}\ncooldown = \"{hold}\"\n"
        ),
        ..Options::default()
    };
    let c = Cluster::with(&["0.8.1", "0.6.2"], store, ttl, opts);
    c.wait_leader("n1");
    let st = c.status_text();
    assert!(
        st.contains("member n1: 0.8.1 (committed, healthy, eligible)"),
        "{st}"
    );
    std::fs::write(c.shared.join("sick-n1"), "").expect("sick");
    c.wait_leader("n2");
    let moved = std::time::Instant::now();
    // The file goes: n1's engine would be healthy if it ran, but it does not run there.
    std::fs::remove_file(c.shared.join("sick-n1")).expect("well");
    let st = c.status_text();
    assert!(st.contains("leader: n2 (0.6.2)"), "{st}");
    assert!(
        st.contains("member n1: 0.8.1 (committed, unhealthy: engine "),
        "n1 is out for its health, and says why: {st}"
    );
    // No flap: n2 keeps leading while n1's hold lasts (T = 900ms: without the hold, n1,
    // preferred, would be back within about 2T).
    let hold_d = crate::common::parse_ttl(hold);
    c.wait("most of the hold", |c| {
        assert_eq!(
            c.running_engines(),
            ["n2"],
            "leadership came back before the hold ended\n{}",
            c.status_text()
        );
        moved.elapsed() >= hold_d * 2 / 3
    });
    // Then n1 is a candidate again, preferred: it leads.
    c.wait_leader("n1");
    assert!(
        moved.elapsed() >= hold_d * 2 / 3,
        "n1 was back after {:?}",
        moved.elapsed()
    );
    let logs = c.logs();
    assert!(
        logs.contains("n1 is not eligible to lead: engine"),
        "{logs}"
    );
    assert!(logs.contains("n1 is healthy again"), "{logs}");
    settle(&c);
}

/// The store revokes the holder's store lease before its TTL, as etcd does when a stalled
/// etcd leader resumes: the holder (its sup-lease paused, so that it cannot take the key
/// back) may still run its last grant, so the node that takes the empty key must not lead
/// before that grant is over. Without the wait after taking the key, the engines overlap.
pub fn early_revoke(store: Option<String>, ttl: &'static str) {
    let mut c = Cluster::new(&["0.6.2", "0.6.2"], store, ttl);
    let first = c.wait_any_leader();
    let i = c
        .nodes
        .iter()
        .position(|n| n.name == first)
        .expect("holder");
    c.nodes[i].signal_lease(Signal::SIGSTOP);
    let mut s =
        sup::lease::store::open(&c.store, std::time::Duration::from_secs(5)).expect("store");
    let snap = sup::lease::node::snapshot(s.as_mut(), "engine").expect("snapshot");
    let (_, _, id) = snap.leader.expect("a leader key");
    s.revoke(id).expect("revoke the holder's store lease");
    c.wait("another leader after an early revoke", |c| {
        let e = c.running_engines();
        e.len() == 1 && e[0] != first
    });
    c.nodes[i].signal_lease(Signal::SIGCONT);
    settle(&c);
}
