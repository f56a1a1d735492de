//! Issue 21, item 1, through a fleet roll: a leader-only versioned tool (the contract's
//! own lease example) rolled across three nodes on the file store. A node's probation
//! counts only while it leads, so each node, the canary first, leads once on trial: a
//! good version is committed on every node having run there, and a version that exits
//! at once halts the roll on the canary while a committed 1.0.0 member runs the engine.
//! Before, the roll said "done, 3 of 3 committed" with the engine down on the fleet.

mod common;
use common::cluster::{Cluster, Options};
use common::fleet::{self, Roll};
use common::*;
use std::time::Duration;

fn three_nodes() -> Cluster {
    let opts = Options {
        fleet: true,
        agent_leads: true,
        probation: "2s",
        ..Options::default()
    };
    let c = Cluster::with(&["1.0.0"; 3], None, "1s", opts);
    Roll::new().until(&c, 0, DEADLINE, "every node joins", |s, _| {
        s["nodes"].as_array().is_some_and(|a| {
            a.len() == 3
                && a.iter()
                    .all(|n| n["state"] == "live" && n["running"] == "1.0.0")
        })
    });
    c.wait_any_leader();
    c
}

/// The agent's state and version on `node`.
fn agent(c: &Cluster, node: &str) -> (String, String) {
    let st = c.node(node).sb.status("agent");
    let s = |k: &str| st[k].as_str().unwrap_or("-").to_string();
    (s("state"), s("version"))
}

#[test]
fn i21_a_leader_only_tool_rolls_node_by_node_each_leading_on_trial() {
    let c = three_nodes();
    let (_art, _srv) = fleet::publish_and_set(&c, "2.0.0", "exec /bin/sleep 3600");
    let s = Roll::new().until(&c, 1, DEADLINE * 6, "2.0.0 on every node", |s, _| {
        s["state"] == "done" && fleet::all_committed(s, "2.0.0", 3)
    });
    assert_eq!(s["committed"], 3, "{s}");
    // Each node ran 2.0.0 (as the leader: it runs nowhere else) before its commit.
    let starts = fleet::first_starts(&c, "2.0.0");
    assert_eq!(starts.len(), 3, "every node ran 2.0.0: {starts:?}");
    c.wait("one engine, on 2.0.0", |c| {
        let e = c.running_engines();
        e.len() == 1 && agent(c, &e[0]) == ("running".into(), "2.0.0".into())
    });
}

#[test]
fn i21_a_leader_only_version_that_exits_at_once_halts_on_the_canary() {
    let c = three_nodes();
    let (_art, _srv) = fleet::publish_and_set(&c, "2.0.0", "exit 3");
    let s = Roll::new().until(&c, 1, DEADLINE * 4, "the roll halted", |s, _| {
        s["state"] == "halted"
    });
    let tried = fleet::tried(&c, "2.0.0");
    assert_eq!(tried.len(), 1, "the canary alone tried it: {tried:?}\n{s}");
    let v = c
        .node(&tried[0])
        .sb
        .ok(serde_json::json!({"cmd": "versions", "tool": "agent"}));
    assert_eq!(v["current"], "1.0.0", "{v}");
    // A committed 1.0.0 member leads and runs the engine; for a while, not by chance.
    let committed_leads = |c: &Cluster| {
        let e = c.running_engines();
        e.len() == 1 && agent(c, &e[0]) == ("running".into(), "1.0.0".into())
    };
    c.wait("a committed 1.0.0 member leads", committed_leads);
    let t0 = std::time::Instant::now();
    c.wait("3 T", |_| t0.elapsed() >= Duration::from_secs(3));
    // (Waited for: a tick late on a loaded machine may restart the holder's engine.)
    c.wait("a committed 1.0.0 member still leads", committed_leads);
}
