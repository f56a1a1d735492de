//! Fleet upgrades on a real etcd: four nodes (supd and sup-lease each) on one machine,
//! an artifact server on loopback.

mod common;
use common::etcd::Etcd;
use common::fleet;
use nix::sys::signal::Signal;
use std::time::{Duration, Instant};

/// etcd's TTLs are whole seconds.
const TTL: &str = "1s";

#[test]
fn a_good_version_rolls_one_node_at_a_time_through_kills_and_leadership_follows() {
    let Some(e) = Etcd::start() else { return };
    let took = fleet::good_roll(Some(e.store()), TTL);
    eprintln!("a 4-node roll with a 2s probation took {took:?}");
}

#[test]
fn a_bad_version_halts_on_the_canary_and_a_tampered_artifact_is_never_installed() {
    let Some(e) = Etcd::start() else { return };
    fleet::bad_roll(Some(e.store()), TTL);
}

#[test]
fn two_canaries_and_two_slots() {
    let Some(e) = Etcd::start() else { return };
    fleet::two_canaries(Some(e.store()));
}

/// etcd stopped (SIGSTOP) for longer than the TTL and the probation while the canary is
/// in probation: every store call times out meanwhile; when etcd is back, the roll goes
/// on where it was, one node at a time, each node upgraded once.
#[test]
fn etcd_paused_mid_probation_resumes_the_roll() {
    let Some(e) = Etcd::start() else { return };
    let c = fleet::nodes(Some(e.store()), 3, "2s");
    let art = common::Sandbox::new();
    let srv = fleet::ArtifactServer::start(&art.dir);
    let (name, sha) = fleet::artifact(&art.dir, "2.0.0", "exec /bin/sleep 3600");
    fleet::set(&c, "2.0.0", &srv.url(&name), &sha, &[]);
    let mut roll = fleet::Roll::new();
    roll.until(&c, 1, common::DEADLINE, "a canary in probation", |_, o| {
        !o.is_empty()
    });
    e.signal(Signal::SIGSTOP);
    let end = Instant::now() + Duration::from_secs(4);
    // The fault lasts 4 s on purpose; meanwhile the nodes are looked at (two looks
    // running, as `Roll::until` does: nodes are asked one after the other).
    let mut before: Vec<String> = Vec::new();
    while Instant::now() < end {
        let now = roll.look(&c);
        let both: Vec<&String> = now.iter().filter(|n| before.contains(n)).collect();
        assert!(both.len() <= 1, "{both:?} in probation together");
        before = now;
        std::thread::sleep(Duration::from_millis(50));
    }
    e.signal(Signal::SIGCONT);
    roll.until(
        &c,
        1,
        common::DEADLINE * 3,
        "2.0.0 on every node",
        |s, _| s["state"] == "done" && fleet::all_committed(s, "2.0.0", 3),
    );
    for n in &c.nodes {
        let v =
            n.sb.request(serde_json::json!({"cmd": "versions", "tool": "agent"}))["data"].clone();
        let attempts: Vec<_> = v["versions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|x| x["version"] == "2.0.0")
            .map(|x| x["attempts"].clone())
            .collect();
        assert_eq!(attempts, vec![serde_json::json!(1)], "{}: {v}", n.name);
    }
}
