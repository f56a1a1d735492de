//! Fleet upgrades under faults, on the file store: processes killed at odd moments of a
//! roll, garbage in the fleet's keys, a store that cannot be read for a while, a target
//! set while another roll is in probation, several nodes in probation at once, a fleet of
//! one node.

mod common;
use common::cluster::{Cluster, SUP_LEASE};
use common::fleet::{self, all_committed, artifact, row, ArtifactServer, Roll};
use common::*;
use nix::sys::signal::Signal;
use serde_json::json;
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use sup::lease::store::Store;

fn nodes(n: usize, probation: &'static str) -> Cluster {
    fleet::nodes(None, n, probation)
}

/// The cluster's file store, for writing what no sup-lease would.
fn store(c: &Cluster) -> sup::lease::file::FileStore {
    let path = c.store.strip_prefix("file:").expect("a file store");
    sup::lease::file::FileStore::new(path.into())
}

/// Makes the file store unreadable: a corrupt generation after the latest, made as a
/// writer makes one (create-if-absent: nobody writes after it, since nobody can read
/// it); its path, whose removal makes the store readable again as it was.
fn corrupt_generation(s: &sup::lease::file::FileStore) -> std::path::PathBuf {
    let number = |p: &std::path::Path, skip: usize| -> Option<u64> {
        let n = p.file_name()?.to_str()?.get(skip..)?;
        n.bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| n.parse().ok())?
    };
    let deadline = Instant::now() + DEADLINE;
    loop {
        assert!(Instant::now() < deadline, "no corrupt generation made");
        let list = |dir: &std::path::Path, skip: usize| -> Vec<(u64, std::path::PathBuf)> {
            let mut v: Vec<_> = std::fs::read_dir(dir)
                .map(|d| d.flatten().map(|e| e.path()).collect::<Vec<_>>())
                .unwrap_or_default()
                .into_iter()
                .filter_map(|p| Some((number(&p, skip)?, p)))
                .collect();
            v.sort();
            v
        };
        // The latest: the highest generation of the highest epoch that has one.
        let Some((n, latest)) = list(s.dir(), 1)
            .into_iter()
            .rev()
            .find_map(|(_, e)| list(&e, 0).pop())
        else {
            continue;
        };
        let Ok(text) = std::fs::read_to_string(&latest) else {
            continue;
        };
        if text.contains("\"sealed\":true") {
            continue; // being carried into the next epoch
        }
        let next = latest.with_file_name((n + 1).to_string());
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&next)
        {
            Ok(mut f) => {
                use std::io::Write;
                f.write_all(b"{corrupt").expect("corrupt");
                return next;
            }
            Err(_) => continue, // another writer wrote first
        }
    }
}

/// Writes `value` at `/sup/fleet/agent/KEY`, no condition, no lease.
fn put_raw(c: &Cluster, key: &str, value: &str) {
    store(c)
        .put(&format!("/sup/fleet/agent/{key}"), value, 0, None)
        .expect("put");
}

/// Processes running `sup-lease fleet fetch` for `node`'s staging directory.
fn fetches(c: &Cluster, node: &str) -> Vec<i32> {
    let staging = c.node(node).sb.path("staging");
    let staging = staging.to_string_lossy();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()))
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|b| {
                let args: Vec<String> = b
                    .split(|c| *c == 0)
                    .map(|a| String::from_utf8_lossy(a).into_owned())
                    .collect();
                args.windows(2).any(|w| w == ["fleet", "fetch"])
                    && args.iter().any(|a| *a == staging)
            })
        })
        .filter(|pid| alive(*pid))
        .collect()
}

/// An HTTP server on loopback whose every connection (its request read) is handed to
/// `serve`, until dropped.
struct Server {
    port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    fn start(mut serve: impl FnMut(TcpStream, &Arc<AtomicBool>) + Send + 'static) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        listener.set_nonblocking(true).expect("nonblocking");
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((mut conn, _)) => {
                        use std::io::Read;
                        let _ = conn.set_nonblocking(false);
                        let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
                        let mut buf = [0u8; 4096];
                        let _ = conn.read(&mut buf);
                        serve(conn, &s);
                    }
                    Err(_) => {
                        use std::os::fd::AsFd;
                        let mut fds = [nix::poll::PollFd::new(
                            listener.as_fd(),
                            nix::poll::PollFlags::POLLIN,
                        )];
                        let _ = nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(100u16));
                    }
                }
            }
        });
        Server {
            port,
            stop,
            thread: Some(thread),
        }
    }

    /// Stops accepting and waits for the server's thread (and what `serve` holds).
    fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// An HTTP server on loopback that sends the start of a big body and then nothing, until
/// dropped: a download that never ends.
fn stall() -> Server {
    let mut held = Vec::new();
    Server::start(move |mut conn, _| {
        use std::io::Write;
        let _ = conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 10000000\r\n\r\n0123456789");
        held.push(conn);
    })
}

/// Ends `name`'s sup-lease and supd with SIGKILL, and takes it out of the cluster the test
/// looks at for good (its sandbox ends what is left).
fn kill_node(c: &mut Cluster, name: &str) {
    let i = c.nodes.iter().position(|n| n.name == name).expect("node");
    c.nodes[i].end_lease(Signal::SIGKILL);
    c.nodes[i].sb.stop_supd(Signal::SIGKILL);
    drop(c.nodes.remove(i));
}

/// What a node's supd says of the agent.
fn local(c: &Cluster, node: &str) -> serde_json::Value {
    c.node(node)
        .sb
        .request(json!({"cmd": "versions", "tool": "agent"}))["data"]
        .clone()
}

/// Waits until `pred` holds of node's supd's `versions agent`.
fn wait_local(c: &Cluster, node: &str, what: &str, pred: impl Fn(&serde_json::Value) -> bool) {
    let mut w = c.node(node).sb.watch();
    let end = Instant::now() + DEADLINE;
    loop {
        let v = local(c, node);
        if pred(&v) {
            return;
        }
        assert!(
            Instant::now() < end,
            "{what}: not within {DEADLINE:?}: {v}\n{}",
            c.logs()
        );
        w.next_within(Duration::from_millis(50));
    }
}

/// supd's attempts at `version` on `node`.
fn attempts(c: &Cluster, node: &str, version: &str) -> u64 {
    local(c, node)["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["version"] == version)
        .and_then(|v| v["attempts"].as_u64())
        .unwrap_or(0)
}

#[test]
fn an_installed_version_is_not_fetched_again() {
    let mut c = nodes(1, "1s");
    // This test runs the fetch by hand: the node's own sup-lease is stopped.
    c.nodes[0].end_lease(Signal::SIGTERM);
    let art = Sandbox::new();
    let srv = ArtifactServer::start(&art.dir);
    let (name, sha) = artifact(&art.dir, "2.0.0", "exec /bin/sleep 3600");
    let sb = &c.nodes[0].sb;
    let fetch = || {
        Command::new(SUP_LEASE)
            .args(["fleet", "fetch", "agent", "2.0.0", "--url"])
            .arg(srv.url(&name))
            .args(["--sha256", &sha, "--staging"])
            .arg(sb.path("staging"))
            .arg("--socket")
            .arg(&sb.socket)
            .output()
            .expect("sup-lease fleet fetch")
    };
    let first = fetch();
    assert!(first.status.success(), "{first:?}");
    assert_eq!(srv.hits(&name), 1);
    let again = fetch();
    assert!(again.status.success(), "{again:?}");
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("installed already"),
        "{again:?}"
    );
    assert_eq!(srv.hits(&name), 1, "no second download");
}

#[test]
fn a_fetch_does_not_outlive_its_sup_lease_killed_mid_download() {
    let mut c = nodes(1, "1s");
    let stall = stall();
    let url = format!("http://127.0.0.1:{}/agent-2.0.0.tar.gz", stall.port);
    fleet::set(&c, "2.0.0", &url, &"ab".repeat(32), &[]);
    let end = Instant::now() + DEADLINE;
    while fetches(&c, "n1").is_empty() {
        assert!(Instant::now() < end, "no fetch started\n{}", c.logs());
        std::thread::sleep(Duration::from_millis(10));
    }
    c.nodes[0].end_lease(Signal::SIGKILL);
    let end = Instant::now() + DEADLINE;
    loop {
        let left = fetches(&c, "n1");
        if left.is_empty() {
            break;
        }
        if Instant::now() >= end {
            for p in &left {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(*p), Signal::SIGKILL);
            }
            panic!("the fetch (pid {left:?}) outlived its sup-lease, killed -9");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_garbage_target_is_shown_and_overwritten_by_fleet_set() {
    let c = nodes(2, "1s");
    put_raw(&c, "target", "{not json");
    let _published = fleet::publish_and_set(&c, "2.0.0", "exec /bin/sleep 3600");
    Roll::new().until(&c, 1, DEADLINE * 2, "2.0.0 on every node", |s, _| {
        s["state"] == "done" && all_committed(s, "2.0.0", 2)
    });
}

#[test]
fn garbage_slots_and_statuses_do_not_stop_the_roll() {
    let c = nodes(2, "1s");
    put_raw(&c, "slots/0", "garbage");
    put_raw(&c, "slots/x", "{}");
    put_raw(&c, "nodes/n9", "[1, 2]");
    put_raw(&c, "roster/n8", "7");
    // A live node's status overwritten: it says it again.
    put_raw(&c, "nodes/n1", "{\"phase\": 12}");
    Roll::new().until(&c, 0, DEADLINE, "n1 says its status again", |s, _| {
        row(s, "n1")["state"] == "live"
    });
    let _published = fleet::publish_and_set(&c, "2.0.0", "exec /bin/sleep 3600");
    Roll::new().until(&c, 1, DEADLINE * 2, "2.0.0 on both nodes", |s, _| {
        let live: Vec<_> = s["nodes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| r["node"] == "n1" || r["node"] == "n2")
            .collect();
        live.len() == 2
            && live
                .iter()
                .all(|r| r["running"] == "2.0.0" && r["phase"] == "committed")
    });
}

/// The canary's sup-lease is stopped while the canary is in probation, its supd rolls
/// the version back meanwhile, and the sup-lease is killed (-9) and started again: it
/// marks the version bad and halts the roll, and no other node ever runs it.
#[test]
fn a_rollback_seen_only_after_a_restart_still_halts_the_roll() {
    let mut c = nodes(2, "6s");
    // Up for a while, then a crash loop: time to stop the canary's sup-lease.
    let _published = fleet::publish_and_set(&c, "3.0.0", "/bin/sleep 1; exit 3");
    let mut roll = Roll::new();
    let canary = fleet::wait_canary(&c, &mut roll);
    let i = c.nodes.iter().position(|n| n.name == canary).expect("node");
    c.nodes[i].signal_lease(Signal::SIGSTOP);
    wait_local(&c, &canary, "the canary rolls back", |v| {
        v["phase"] == "rolled-back"
    });
    c.nodes[i].end_lease(Signal::SIGKILL);
    c.start_lease(i);
    let s = roll.until(&c, 1, DEADLINE, "the roll halts", |s, _| {
        s["state"] == "halted"
    });
    assert_eq!(s["halted"]["node"], canary.as_str(), "{s}");
    assert!(s["bad"]["3.0.0"].is_object(), "{s}");
    let s = roll.until(&c, 1, DEADLINE, "the slot is given back", |s, _| {
        row(s, &canary)["slot"].is_null() && row(s, &canary)["phase"] == "rolled-back"
    });
    assert_eq!(roll.order, vec![canary.clone()], "{s}");
    for n in &c.nodes {
        if n.name != canary {
            assert!(
                !fleet::ran(&c, &n.name).contains(&"3.0.0".to_string()),
                "{} ran 3.0.0",
                n.name
            );
            assert_eq!(attempts(&c, &n.name, "3.0.0"), 0);
        }
    }
}

/// The store cannot be read (a corrupt file) for longer than the TTL while the canary is
/// in probation: every node's store lease ends; when it can be read again, the roll goes
/// on where it was, one node at a time.
#[test]
fn a_store_unreadable_for_a_while_mid_probation_resumes_the_roll() {
    let c = nodes(3, "2s");
    let _published = fleet::publish_and_set(&c, "2.0.0", "exec /bin/sleep 3600");
    let mut roll = Roll::new();
    roll.until(&c, 1, DEADLINE, "a canary in probation", |_, o| {
        !o.is_empty()
    });
    let corrupt = corrupt_generation(&store(&c));
    // Longer than the TTL (1s) and than the probation (2s).
    let end = Instant::now() + Duration::from_secs(3);
    while Instant::now() < end {
        roll.look(&c);
        std::thread::sleep(Duration::from_millis(50));
    }
    // Gone, the generation before it is the latest again.
    std::fs::remove_file(&corrupt).expect("restore");
    roll.until(&c, 1, DEADLINE * 3, "2.0.0 on every node", |s, _| {
        s["state"] == "done" && all_committed(s, "2.0.0", 3)
    });
    for n in &c.nodes {
        assert_eq!(attempts(&c, &n.name, "2.0.0"), 1, "{}", n.name);
    }
}

/// Canary 2 and max-parallel 2: the first two go together, the third after both
/// committed; never more than two in probation.
#[test]
fn two_canaries_and_two_slots() {
    fleet::two_canaries(None);
}

/// A fleet of one node, which leads the lease of the tool: it upgrades (there is nobody
/// to go after), and leadership stays with it on the new version.
#[test]
fn a_fleet_of_one_node_upgrades_its_leader() {
    let c = nodes(1, "1s");
    c.wait_leader("n1");
    let _published = fleet::publish_and_set(&c, "2.0.0", "exec /bin/sleep 3600");
    Roll::new().until(&c, 1, DEADLINE * 2, "2.0.0 on n1", |s, _| {
        s["state"] == "done" && all_committed(s, "2.0.0", 1)
    });
    c.wait("leadership on 2.0.0", |c| {
        c.status_text().contains("(2.0.0), term")
    });
}

/// A new target set while the canary of the last one is in probation: the canary
/// finishes (its slot held meanwhile), then the new target rolls, one node at a time.
#[test]
fn a_target_set_mid_probation_waits_for_it() {
    let c = nodes(3, "2s");
    let art = Sandbox::new();
    let srv = ArtifactServer::start(&art.dir);
    let (a, sha_a) = artifact(&art.dir, "2.0.0", "exec /bin/sleep 3600");
    let (b, sha_b) = artifact(&art.dir, "2.1.0", "exec /bin/sleep 3600");
    fleet::set(&c, "2.0.0", &srv.url(&a), &sha_a, &[]);
    let mut roll = Roll::new();
    roll.until(&c, 1, DEADLINE, "a canary in probation", |_, o| {
        !o.is_empty()
    });
    fleet::set(&c, "2.1.0", &srv.url(&b), &sha_b, &[]);
    roll.until(&c, 1, DEADLINE * 3, "2.1.0 on every node", |s, _| {
        s["state"] == "done" && all_committed(s, "2.1.0", 3)
    });
    for n in &c.nodes {
        assert!(attempts(&c, &n.name, "2.1.0") == 1, "{}", n.name);
    }
}

/// Canary 2, max-parallel 2 and a bad version: both canaries try it at once, both roll
/// back, the roll halts once (one node named), and the third node never runs it.
#[test]
fn a_bad_version_on_two_canaries_at_once_halts_once() {
    let c = nodes(3, "2s");
    let art = Sandbox::new();
    let srv = ArtifactServer::start(&art.dir);
    let (name, sha) = artifact(&art.dir, "3.0.0", "exit 3");
    fleet::set(
        &c,
        "3.0.0",
        &srv.url(&name),
        &sha,
        &["--canary", "2", "--max-parallel", "2"],
    );
    let mut roll = Roll::new();
    let s = roll.until(
        &c,
        2,
        DEADLINE * 2,
        "the roll halts, slots given back",
        |s, _| {
            s["state"] == "halted"
                && s["nodes"]
                    .as_array()
                    .is_some_and(|a| a.iter().all(|r| r["slot"].is_null()))
        },
    );
    let by = s["halted"]["node"].as_str().expect("a node").to_string();
    assert_eq!(s["bad"]["3.0.0"]["node"], by.as_str(), "{s}");
    let tried: Vec<String> = c
        .nodes
        .iter()
        .filter(|n| attempts(&c, &n.name, "3.0.0") > 0)
        .map(|n| n.name.clone())
        .collect();
    assert!(tried.len() <= 2 && tried.contains(&by), "{tried:?}\n{s}");
    let never: Vec<&str> = c
        .nodes
        .iter()
        .map(|n| n.name.as_str())
        .filter(|n| !tried.iter().any(|t| t == n))
        .collect();
    assert!(
        !never.is_empty(),
        "the third node never tried it: {tried:?}"
    );
    for n in never {
        assert!(!fleet::ran(&c, n).contains(&"3.0.0".to_string()), "{n}");
    }
}

/// `fleet forget` refuses a live node; a dead one that held a slot in probation is
/// forgotten with its slot, and the roll goes on without it.
#[test]
fn forgetting_a_dead_node_in_probation_lets_the_roll_go_on() {
    let mut c = nodes(3, "3s");
    let _published = fleet::publish_and_set(&c, "2.0.0", "exec /bin/sleep 3600");
    let mut roll = Roll::new();
    let canary = fleet::wait_canary(&c, &mut roll);
    let out = fleet::fleet(&c, &["forget", "agent", &canary]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("is live"));
    // Gone for good: out of the cluster the test looks at (its sandbox ends what is left).
    kill_node(&mut c, &canary);
    roll.until(&c, 1, DEADLINE, "the canary is gone", |s, _| {
        row(s, &canary)["state"] == "unreachable"
    });
    let out = fleet::fleet(&c, &["forget", "agent", &canary]);
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("given back"));
    roll.until(&c, 1, DEADLINE * 2, "2.0.0 on the other two", |s, _| {
        s["state"] == "done" && all_committed(s, "2.0.0", 2)
    });
}

/// A node rolls a version back while its sup-lease is away and the operator forgets it
/// (its slot with it). Back, it says the rollback (the roll halts, on it) and does not
/// force the version again by itself: only an operator's `--force` does.
#[test]
fn a_rollback_unreported_before_a_forget_is_reported_not_forced_again() {
    let mut c = nodes(1, "6s");
    let _published = fleet::publish_and_set(&c, "3.0.0", "/bin/sleep 1; exit 3");
    wait_local(&c, "n1", "n1 in probation", |v| v["phase"] == "probation");
    c.nodes[0].end_lease(Signal::SIGKILL);
    wait_local(&c, "n1", "n1 rolls back", |v| v["phase"] == "rolled-back");
    // Forgotten once its store lease is gone (a live node's forget is refused).
    Roll::new().until(&c, 1, DEADLINE, "n1 unreachable", |s, _| {
        fleet::row(s, "n1")["state"] == "unreachable"
    });
    let out = fleet::fleet(&c, &["forget", "agent", "n1"]);
    assert!(out.status.success(), "forget: {out:?}");
    c.start_lease(0);
    let s = Roll::new().until(&c, 1, DEADLINE, "the roll halts on n1", |s, _| {
        s["state"] == "halted"
    });
    assert_eq!(s["halted"]["node"], "n1", "{s}");
    assert_eq!(
        attempts(&c, "n1", "3.0.0"),
        1,
        "not forced again\n{}",
        c.logs()
    );
    // The operator forces it: now it is tried again.
    assert!(fleet::fleet(&c, &["resume", "agent", "--force"])
        .status
        .success());
    Roll::new().until(&c, 1, DEADLINE, "tried again, halted again", |s, _| {
        s["state"] == "halted" && s["target"]["forced"] == 1
    });
    wait_local(&c, "n1", "a second attempt", |v| {
        v["versions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|e| e["version"] == "3.0.0" && e["attempts"] == 2)
    });
}

/// A node holds a slot it has not used yet (its sup-lease was killed right after taking
/// it) and an operator upgrades the tool by hand to another version meanwhile: the
/// node waits for that probation to end, then upgrades. supd's "in probation" is not a
/// refusal of the target: the target is not marked bad for the fleet.
#[test]
fn a_slot_holder_busy_with_an_upgrade_by_hand_waits_for_it() {
    let c = nodes(1, "4s");
    let sb = &c.nodes[0].sb;
    sb.install_version("1.5.0", "exec /bin/sleep 3600");
    // 2.0.0 is there already (installed by hand: nothing to fetch).
    sb.install_version("2.0.0", "exec /bin/sleep 3600");
    // By hand: n1 is in probation of 1.5.0 when the target comes.
    let out = sb.supctl(&["upgrade", "agent", "1.5.0"]);
    assert!(out.status.success(), "{out:?}");
    fleet::set(
        &c,
        "2.0.0",
        "http://127.0.0.1:1/unused.tar.gz",
        &"ab".repeat(32),
        &[],
    );
    // The slot, as the node took it before the upgrade by hand.
    put_raw(
        &c,
        "slots/0",
        r#"{"node":"n1","version":"2.0.0","attempts_before":0}"#,
    );
    let s = Roll::new().until(&c, 1, DEADLINE * 2, "2.0.0 on n1", |s, _| {
        s["state"] != "rolling" || all_committed(s, "2.0.0", 1)
    });
    assert!(s["bad"].as_object().is_none_or(|b| b.is_empty()), "{s}");
    assert_eq!(s["state"], "done", "{s}\n{}", c.logs());
    assert_eq!(local(&c, "n1")["current"], "2.0.0");
}

/// A node that dies in probation keeps its slot: the roll waits for it. Once the others
/// have watched it gone longer than what was left of its probation plus T, `fleet
/// status` (text and JSON) and the waiting nodes' reasons say so, with the command to
/// run; not before. Forgetting it lets the roll go on.
#[test]
fn a_node_gone_in_probation_is_said_with_the_command_that_forgets_it() {
    let mut c = nodes(3, "3s");
    let _published = fleet::publish_and_set(&c, "2.0.0", "exec /bin/sleep 3600");
    let mut roll = Roll::new();
    let canary = fleet::wait_canary(&c, &mut roll);
    // What was left of its probation, as it published it: the limit rests on it.
    roll.until(&c, 1, DEADLINE, "the canary says its probation", |s, _| {
        row(s, &canary)["probation_left_ms"].is_u64()
    });
    kill_node(&mut c, &canary);
    let s = roll.until(&c, 1, DEADLINE, "the canary is unreachable", |s, _| {
        row(s, &canary)["state"] == "unreachable"
    });
    let unreachable = Instant::now();
    assert!(row(&s, &canary)["gone"].is_null(), "said at once: {s}");
    let s = roll.until(&c, 1, DEADLINE, "the canary is said gone", |s, _| {
        row(s, &canary)["gone"].is_object()
    });
    let after = unreachable.elapsed();
    // 3 s of probation + T (1 s), counted from when the others saw its key gone (which
    // is before this test did, by at most a look).
    assert!(
        after >= Duration::from_millis(3500),
        "said gone {after:?} after it was unreachable: {s}"
    );
    let forget = format!("sup-lease --store {} fleet forget agent {canary}", c.store);
    let gone = &row(&s, &canary)["gone"];
    assert_eq!(gone["forget"], forget.as_str(), "{s}");
    assert!(gone["seen_by"].is_string(), "{s}");
    let text = fleet::text(&c);
    assert!(
        text.contains(&format!("{canary} has been gone")) && text.contains(&forget),
        "{text}"
    );
    // The nodes that wait for its slot say it too.
    roll.until(
        &c,
        1,
        DEADLINE,
        "a waiting node names the command",
        |s, _| {
            s["nodes"].as_array().is_some_and(|a| {
                a.iter().any(|n| {
                    n["state"] == "live"
                        && n["reason"]
                            .as_str()
                            .is_some_and(|r| r.contains(&format!("fleet forget agent {canary}")))
                })
            })
        },
    );
    let out = fleet::fleet(&c, &["forget", "agent", &canary]);
    assert!(out.status.success(), "{out:?}");
    roll.until(&c, 1, DEADLINE * 2, "2.0.0 on the other two", |s, _| {
        s["state"] == "done" && all_committed(s, "2.0.0", 2)
    });
}

/// An HTTP server on loopback that answers every request with a big Content-Length and
/// then one byte a second, each connection in a thread of its own, until dropped.
struct Trickle {
    server: Server,
    hits: Arc<std::sync::atomic::AtomicUsize>,
    conns: Arc<std::sync::Mutex<Vec<std::thread::JoinHandle<()>>>>,
}

impl Trickle {
    const SIZE: usize = 1_000_000;

    fn start() -> Trickle {
        let hits = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let conns: Arc<std::sync::Mutex<Vec<_>>> = Arc::default();
        let (h, all) = (hits.clone(), conns.clone());
        let server = Server::start(move |mut conn, stop| {
            h.fetch_add(1, Ordering::SeqCst);
            let s = stop.clone();
            let t = std::thread::spawn(move || {
                use std::io::Write;
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n",
                    Trickle::SIZE
                );
                if conn.write_all(head.as_bytes()).is_err() {
                    return;
                }
                while !s.load(Ordering::SeqCst) {
                    if conn.write_all(b"x").is_err() {
                        return;
                    }
                    // The pace of the fault itself: one byte a second.
                    std::thread::sleep(Duration::from_secs(1));
                }
            });
            all.lock().expect("conns").push(t);
        });
        Trickle {
            server,
            hits,
            conns,
        }
    }
}

impl Drop for Trickle {
    fn drop(&mut self) {
        self.server.stop();
        for t in self.conns.lock().expect("conns").drain(..) {
            let _ = t.join();
        }
    }
}

/// An artifact served at one byte a second: while it comes, the node's row shows how
/// much of it came; its deadline (here 5 s, through SUP_FLEET_FETCH_PACE) ends the
/// attempt with a reason that says so, shown as the last attempt's; the node tries again.
#[test]
fn a_download_at_one_byte_a_second_shows_its_progress_fails_with_a_reason_and_is_retried() {
    let mut c = nodes(1, "1s");
    c.nodes[0].end_lease(Signal::SIGTERM);
    c.start_lease_with(0, &[("SUP_FLEET_FETCH_PACE", "floor=5s".as_ref())]);
    let slow = Trickle::start();
    let url = format!("http://127.0.0.1:{}/agent-2.0.0.tar.gz", slow.server.port);
    fleet::set(&c, "2.0.0", &url, &"ab".repeat(32), &[]);
    let mut roll = Roll::new();
    let s = roll.until(&c, 0, DEADLINE, "its progress shows", |s, _| {
        row(s, "n1")["progress"]["bytes"]
            .as_u64()
            .is_some_and(|b| b >= 1)
    });
    let n1 = row(&s, "n1");
    assert_eq!(n1["phase"], "downloading", "{s}");
    assert_eq!(n1["progress"]["total"], Trickle::SIZE as u64, "{s}");
    assert!(
        fleet::text(&c).contains(&format!("of {}", Trickle::SIZE)),
        "{}",
        fleet::text(&c)
    );
    let s = roll.until(&c, 0, DEADLINE, "the attempt fails, saying why", |s, _| {
        row(s, "n1")["result"] == "download failed"
    });
    let why = row(&s, "n1")["reason"].as_str().unwrap_or("").to_string();
    assert!(
        why.contains(&format!("download of {url} too slow")) && why.contains("bytes in"),
        "{s}"
    );
    let end = Instant::now() + DEADLINE;
    while slow.hits.load(Ordering::SeqCst) < 2 {
        assert!(Instant::now() < end, "not tried again\n{}", c.logs());
        std::thread::sleep(Duration::from_millis(50)); // the server's count, with a deadline
    }
}
