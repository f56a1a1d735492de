//! supd's side of leases, driven by hand (no sup-lease): candidacy, grants with their
//! validity, the term passed to leader-only services, release, events.

mod common;
use common::*;
use serde_json::json;
use std::time::Duration;

fn config(sb: &Sandbox) {
    let out = sb.path("term");
    let engine = sb.script(
        "engine.sh",
        &format!(
            "echo \"$SUP_LEASE_TERM\" > {o}.tmp; mv {o}.tmp {o}\nexec /bin/sleep 3600",
            o = out.display()
        ),
    );
    sb.config(&format!(
        "[lease.engine]\ntool = \"agent\"\n\n[service.agent]\ntool = \"agent\"\ncommand = [\"bin/agent\"]\nprobation = \"1s\"\nrestart_delay = \"10ms\"\n\
         crash_loop = {{ restarts = 3, window = \"1m\" }}\n\n[service.engine]\ncommand = [\"{engine}\"]\nleader_only = \"engine\"\nstop_timeout = \"2s\"\n"
    ));
}

#[test]
fn grants_run_leader_only_services_until_they_run_out() {
    let mut sb = Sandbox::new();
    config(&sb);
    sb.start();
    let st = sb.status("engine");
    assert_eq!(st["state"], "stopped");
    assert_eq!(st["reason"], "waiting for lease 'engine'");
    // An operator's start does not run it without the lease either.
    sb.ok(json!({"cmd": "start", "service": "engine"}));
    assert_eq!(sb.status("engine")["state"], "stopped");

    let mut w = sb.watch();
    // Long enough for the engine's start on a loaded machine; the renewal shortens it.
    sb.ok(json!({"cmd": "lease-grant", "lease": "engine", "holder": "n1", "term": 7, "valid_for": "1h"}));
    let g = w.until(&sb, |e| e["event"] == "lease");
    assert_eq!(
        (g["what"].clone(), g["term"].clone()),
        (json!("granted"), json!(7))
    );
    sb.wait_state("engine", "running");
    let end = std::time::Instant::now() + DEADLINE;
    while !sb.path("term").exists() {
        assert!(std::time::Instant::now() < end);
        sb.status("engine");
    }
    assert_eq!(
        std::fs::read_to_string(sb.path("term"))
            .expect("term")
            .trim(),
        "7",
        "SUP_LEASE_TERM"
    );
    sb.ok(json!({"cmd": "lease-grant", "lease": "engine", "holder": "n1", "term": 7, "valid_for": "600ms"}));
    assert_eq!(w.until(&sb, |e| e["event"] == "lease")["what"], "renewed");
    // Nobody renews: the validity ends and the service stops by itself.
    let e = w.until(&sb, |e| e["event"] == "lease");
    assert_eq!(
        (e["what"].clone(), e["term"].clone()),
        (json!("expired"), json!(7))
    );
    let st = sb.wait_state("engine", "stopped");
    assert!(
        st["reason"]
            .as_str()
            .unwrap_or("")
            .starts_with("lease expired"),
        "{st}"
    );
}

#[test]
fn release_answers_once_the_services_have_exited() {
    let mut sb = Sandbox::new();
    config(&sb);
    sb.start();
    sb.ok(json!({"cmd": "lease-grant", "lease": "engine", "holder": "n1", "term": 3, "valid_for": "1h"}));
    let pid = sb.wait_state("engine", "running")["pid"]
        .as_i64()
        .expect("pid") as i32;
    let r = sb.ok(json!({"cmd": "lease-release", "lease": "engine"}));
    assert_eq!(r["released"], true);
    assert!(!alive(pid), "the engine is gone when release answers");
    assert_eq!(sb.status("engine")["pid"], json!(null));
}

/// A grant whose term is older than the one held is refused (a stale holder, a store
/// that went back): the grant held stands, its services keep running.
#[test]
fn a_grant_with_an_older_term_than_the_one_held_is_refused() {
    let mut sb = Sandbox::new();
    config(&sb);
    sb.start();
    sb.ok(json!({"cmd": "lease-grant", "lease": "engine", "holder": "n1", "term": 7, "valid_for": "1h"}));
    let pid = sb.wait_state("engine", "running")["pid"].clone();
    let a = sb.request(json!({"cmd": "lease-grant", "lease": "engine", "holder": "n2", "term": 3, "valid_for": "1h"}));
    assert_eq!(a["ok"], false, "{a}");
    assert_eq!(a["error"]["kind"], "bad-request", "{a}");
    let msg = a["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("term 3") && msg.contains("term 7"), "{msg}");
    let st = sb.status("engine");
    assert_eq!(st["pid"], pid, "not restarted by the stale grant: {st}");
    // The same term renews.
    sb.ok(json!({"cmd": "lease-grant", "lease": "engine", "holder": "n1", "term": 7, "valid_for": "1h"}));
    assert_eq!(sb.status("engine")["pid"], pid);
}

#[test]
fn candidacy_follows_upgrades_at_once() {
    let mut sb = Sandbox::new();
    config(&sb);
    sb.start();
    let c = sb.ok(json!({"cmd": "lease-candidacy", "lease": "engine"}));
    assert_eq!(
        (c["version"].clone(), c["committed"].clone()),
        (json!(null), json!(false))
    );
    sb.install_version("0.6.2", "exec /bin/sleep 3600");
    sb.install_version("0.8.1", "exec /bin/sleep 3600");
    assert_eq!(
        sb.supctl(&["upgrade", "agent", "0.6.2", "--wait"])
            .status
            .code(),
        Some(0)
    );
    let c = sb.ok(json!({"cmd": "lease-candidacy", "lease": "engine"}));
    assert_eq!(
        (
            c["version"].clone(),
            c["committed"].clone(),
            c["running"].clone()
        ),
        (json!("0.6.2"), json!(true), json!(true))
    );
    assert_eq!(
        sb.supctl(&["upgrade", "agent", "0.8.1"]).status.code(),
        Some(0)
    );
    let c = sb.ok(json!({"cmd": "lease-candidacy", "lease": "engine"}));
    assert_eq!(
        (c["version"].clone(), c["committed"].clone()),
        (json!("0.8.1"), json!(false)),
        "in probation: not committed"
    );
    let a = sb.request(json!({"cmd": "lease-candidacy", "lease": "nope"}));
    assert_eq!(a["error"]["kind"], "unknown-lease");
    let a = sb.request(json!({"cmd": "lease-grant", "lease": "engine", "holder": "x", "term": 1, "valid_for": "soon"}));
    assert_eq!(a["error"]["kind"], "bad-request");
}

#[test]
fn an_expired_grant_kills_a_slow_service_within_half_its_validity() {
    let mut sb = Sandbox::new();
    let engine = sb.script(
        "stubborn.sh",
        "trap '' TERM\necho >&3\nwhile :; do /bin/sleep 1; done",
    );
    sb.config(&format!(
        "[lease.engine]\n\n[service.engine]\ncommand = [\"{engine}\"]\nready = \"fd:3\"\nleader_only = \"engine\"\nstop_timeout = \"30s\"\n"
    ));
    sb.start();
    // A grant long enough for the start on a loaded machine, then a renewal that ends it
    // soon (the watch opened before it, so its end cannot come unseen).
    sb.ok(json!({"cmd": "lease-grant", "lease": "engine", "holder": "n1", "term": 1, "valid_for": "1h"}));
    sb.wait_state("engine", "running");
    let mut w = sb.watch();
    sb.ok(json!({"cmd": "lease-grant", "lease": "engine", "holder": "n1", "term": 1, "valid_for": "600ms"}));
    let expired = w.until(&sb, |e| e["event"] == "lease" && e["what"] == "expired");
    let stopped = w.state(&sb, "engine", "stopped");
    let took = stopped["time"].as_u64().unwrap_or(0) - expired["time"].as_u64().unwrap_or(0);
    assert!(
        took < 2000,
        "stopped {took}ms after the grant ran out, not within half the validity (300ms) + slack"
    );
    assert_eq!(sb.status("engine")["last_exit"], json!({"signal": "KILL"}));
}

/// Issue 13: a leader-only service that turns unhealthy makes the candidacy unhealthy,
/// naming the service and its failure; after a release (the service stopped, its health
/// unknown) the node stays out for the service's cooldown, then is healthy again.
#[test]
fn i13_an_unhealthy_leader_only_service_holds_the_node_out_for_its_cooldown() {
    let mut sb = Sandbox::new();
    let sick = sb.path("sick");
    let engine = sb.script("engine.sh", "exec /bin/sleep 3600");
    sb.config(&format!(
        "[lease.engine]\n\n[service.engine]\ncommand = [\"{engine}\"]\nleader_only = \"engine\"\n\
         restart_delay = \"10ms\"\ncooldown = \"5s\"\n\
         health = {{ command = [\"/bin/sh\", \"-c\", \"! test -e {sick}\"], interval = \"100ms\", timeout = \"2s\", failures = 2 }}\n",
        sick = sick.display()
    ));
    sb.start();
    let candidacy = || sb.ok(json!({"cmd": "lease-candidacy", "lease": "engine"}));
    let c = candidacy();
    assert_eq!(
        (c["healthy"].clone(), c["reason"].clone()),
        (json!(true), json!(null)),
        "never ran, never unhealthy: {c}"
    );
    sb.ok(json!({"cmd": "lease-grant", "lease": "engine", "holder": "n1", "term": 1, "valid_for": "1h"}));
    sb.wait_state("engine", "running");
    assert_eq!(candidacy()["healthy"], true);
    let mut w = sb.watch();
    std::fs::write(&sick, "").expect("sick");
    // Unhealthy: supd stops it (to restart it).
    w.state(&sb, "engine", "stopping");
    let verdict = std::time::Instant::now();
    std::fs::remove_file(&sick).expect("well again");
    let c = candidacy();
    assert_eq!(c["healthy"], false, "{c}");
    let why = c["reason"].as_str().unwrap_or("");
    assert!(why.starts_with("engine "), "names the service: {c}");
    assert!(why.contains("health"), "and its failure: {c}");
    // Released: it no longer runs, its health is unknown; the node is still out.
    sb.ok(json!({"cmd": "lease-release", "lease": "engine"}));
    let c = candidacy();
    assert_eq!(c["healthy"], false, "{c}");
    assert!(
        c["reason"]
            .as_str()
            .unwrap_or("")
            .contains("a candidate again in"),
        "{c}"
    );
    // The cooldown over, it may lead again.
    let end = std::time::Instant::now() + DEADLINE;
    while candidacy()["healthy"] != true {
        assert!(
            std::time::Instant::now() < end,
            "still out: {}",
            candidacy()
        );
        w.next_within(Duration::from_millis(50));
    }
    assert!(
        verdict.elapsed() >= Duration::from_secs(4),
        "out for {:?} only, not its cooldown (5s)",
        verdict.elapsed()
    );
    assert_eq!(candidacy()["reason"], json!(null));
}

/// Issue 13: a missed watchdog holds the node out too, and says so; a reexec keeps it.
#[test]
fn i13_a_leader_only_service_that_stops_pinging_its_watchdog_holds_the_node_out() {
    let mut sb = Sandbox::new();
    let engine = sb.script("engine.sh", "exec /bin/sleep 3600");
    sb.config(&format!(
        "[lease.engine]\n\n[service.engine]\ncommand = [\"{engine}\"]\nleader_only = \"engine\"\n\
         watchdog = \"300ms\"\ncooldown = \"1h\"\n"
    ));
    sb.start();
    let mut w = sb.watch();
    sb.ok(json!({"cmd": "lease-grant", "lease": "engine", "holder": "n1", "term": 1, "valid_for": "1h"}));
    w.state(&sb, "engine", "stopping");
    sb.ok(json!({"cmd": "lease-release", "lease": "engine"}));
    let c = sb.ok(json!({"cmd": "lease-candidacy", "lease": "engine"}));
    assert_eq!(c["healthy"], false, "{c}");
    let why = c["reason"].as_str().unwrap_or("");
    assert!(
        why.starts_with("engine was unhealthy")
            && why.contains("watchdog: no WATCHDOG=1 within 300ms")
            && why.contains("; a candidate again in "),
        "{c}"
    );
    // A reexec keeps the hold.
    let out = sb.supctl(&["reexec"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let c = sb.ok(json!({"cmd": "lease-candidacy", "lease": "engine"}));
    assert_eq!(c["healthy"], false, "after a reexec: {c}");
}

/// Issue 21, item 1: a leader-only versioned tool in probation is offered the lease on
/// trial: the candidacy says `trial` (and stays uncommitted); a committed version, or a
/// tool in probation that no leader-only service of the lease runs, is not on trial.
#[test]
fn i21_a_leader_only_tool_in_probation_is_a_candidate_on_trial() {
    let mut sb = Sandbox::new();
    sb.config(
        "[lease.engine]\ntool = \"agent\"\n\n[service.agent]\ntool = \"agent\"\ncommand = [\"bin/agent\"]\n\
         leader_only = \"engine\"\nprobation = \"1h\"\nrestart_delay = \"10ms\"\n\n\
         [lease.other]\ntool = \"agent\"\n",
    );
    sb.provision_version("1.0.0", "exec /bin/sleep 3600");
    sb.start();
    let candidacy = |lease: &str| sb.ok(json!({"cmd": "lease-candidacy", "lease": lease}));
    let c = candidacy("engine");
    assert_eq!(
        (
            c["version"].clone(),
            c["committed"].clone(),
            c["trial"].clone()
        ),
        (json!("1.0.0"), json!(true), json!(false)),
        "provisioned: committed, no trial: {c}"
    );
    sb.install_version("2.0.0", "exec /bin/sleep 3600");
    let out = sb.supctl(&["upgrade", "agent", "2.0.0"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let c = candidacy("engine");
    assert_eq!(
        (
            c["version"].clone(),
            c["committed"].clone(),
            c["trial"].clone()
        ),
        (json!("2.0.0"), json!(false), json!(true)),
        "in probation, held down: on trial: {c}"
    );
    // The same tool under a lease none of whose leader-only services runs it: its
    // probation does not wait for that lease, so no trial there.
    let c = candidacy("other");
    assert_eq!(
        (c["committed"].clone(), c["trial"].clone()),
        (json!(false), json!(false)),
        "{c}"
    );
}

// Issue 22: a holder whose leader-only services cannot run ----------------------------

/// supd's candidacy says when a leader-only service of the lease cannot run (here in its
/// crash-loop cooldown: it exits 1 at every start), and no longer once the release
/// stopped it (sup-lease remembers the rest).
#[test]
fn i22_the_candidacy_says_a_leader_only_service_that_fails_every_start() {
    let mut sb = Sandbox::new();
    let engine = sb.script("engine.sh", "exit 1");
    sb.config(&format!(
        "[lease.engine]\n\n[service.engine]\ncommand = [\"{engine}\"]\nleader_only = \"engine\"\nrestart_delay = \"10ms\"\n\
         crash_loop = {{ restarts = 2, window = \"1m\" }}\ncooldown = \"1h\"\n"
    ));
    sb.start();
    let c = sb.ok(json!({"cmd": "lease-candidacy", "lease": "engine"}));
    assert!(c["failing"].is_null(), "{c}");
    sb.ok(json!({"cmd": "lease-grant", "lease": "engine", "holder": "n1", "term": 3, "valid_for": "1h"}));
    sb.wait_state("engine", "cooldown");
    let c = sb.ok(json!({"cmd": "lease-candidacy", "lease": "engine"}));
    let why = c["failing"].as_str().unwrap_or_default();
    assert!(
        why.starts_with("engine is in its crash-loop cooldown (crash loop: 2 restarts"),
        "{c}"
    );
    sb.ok(json!({"cmd": "lease-release", "lease": "engine"}));
    let c = sb.ok(json!({"cmd": "lease-candidacy", "lease": "engine"}));
    assert!(c["failing"].is_null(), "stopped: {c}");
}

use common::cluster::{Cluster, Options};

/// Issue 22: a holder whose leader-only service fails every start kept the lease while
/// healthy standbys sat idle. Now it steps down, a standby leads, and the failing node
/// does not take the lease straight back once its services are stopped (it is the
/// preferred, newer version): it stays out for 2T first.
#[test]
fn i22_a_holder_whose_engine_fails_every_start_steps_down_for_a_standby() {
    let opts = Options {
        engine: "restart_delay = \"10ms\"\ncrash_loop = { restarts = 2, window = \"1m\" }\ncooldown = \"1h\"\n".into(),
        hold_leases: true,
        ..Options::default()
    };
    let mut c = Cluster::with(&["1.1.0", "1.0.0", "1.0.0"], None, "900ms", opts);
    std::fs::write(c.shared.join("fail-n1"), "").expect("fail-n1");
    c.start_lease(0);
    // n1, the newest version, alone at first: it takes the lease, and its engine fails.
    c.wait("n1 leads and its engine fails", |c| {
        let log = c.logs();
        log.contains("n1 leads (term") && c.node("n1").sb.status("engine")["state"] == "cooldown"
    });
    c.start_lease(1);
    c.start_lease(2);
    c.wait("a standby's engine runs", |c| {
        let e = c.running_engines();
        e.len() == 1 && e[0] != "n1"
    });
    let moved = std::time::Instant::now();
    let logs = c.logs();
    assert!(
        logs.contains("n1 steps down: this node is not eligible: failing (engine is in its crash-loop cooldown"),
        "{logs}"
    );
    let st = c.status_text();
    assert!(
        st.contains("failing: stepped down as its leader-only services failed"),
        "n1 says it stays out: {st}"
    );
    // Not straight back: the standby keeps leading through n1's hold (2T from its step
    // down, which came before `moved`, when this test saw the standby run: a loaded
    // machine makes that later; within 1 T, a "straight back" would come).
    let leads = |c: &Cluster| c.logs().matches("n1 leads (term").count();
    let before = leads(&c);
    let ttl = common::parse_ttl(c.ttl);
    c.wait("n1's hold", |c| {
        assert_eq!(
            leads(c),
            before,
            "n1 led again at once\n{}",
            c.status_text()
        );
        moved.elapsed() >= ttl
    });
}
