//! Fleet upgrades on one machine: an artifact server on loopback (a thread serving a
//! directory, counting what it served), artifacts built as an operator would (`tar czf`
//! of a version directory, its sha256), and a look at every node's supd all along a roll.
#![allow(dead_code)]

use super::cluster::{Cluster, SUP_LEASE};
use super::*;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

/// An HTTP server on 127.0.0.1 serving the files of `dir`, until dropped.
pub struct ArtifactServer {
    pub port: u16,
    pub dir: PathBuf,
    /// Requests served, by path.
    pub hits: Arc<Mutex<BTreeMap<String, u32>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ArtifactServer {
    pub fn start(dir: &Path) -> ArtifactServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        listener.set_nonblocking(true).expect("nonblocking");
        let hits: Arc<Mutex<BTreeMap<String, u32>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (d, h, s) = (dir.to_path_buf(), hits.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((conn, _)) => serve(conn, &d, &h),
                    // Nothing to accept: wait on the listener a little (poll, not sleep).
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
        ArtifactServer {
            port,
            dir: dir.to_path_buf(),
            hits,
            stop,
            thread: Some(thread),
        }
    }

    pub fn url(&self, name: &str) -> String {
        format!("http://127.0.0.1:{}/{name}", self.port)
    }

    pub fn hits(&self, name: &str) -> u32 {
        let h = self.hits.lock().expect("hits");
        h.get(&format!("/{name}")).copied().unwrap_or(0)
    }
}

impl Drop for ArtifactServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(conn: TcpStream, dir: &Path, hits: &Mutex<BTreeMap<String, u32>>) {
    let _ = conn.set_nonblocking(false);
    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
    let mut r = BufReader::new(match conn.try_clone() {
        Ok(c) => c,
        Err(_) => return,
    });
    let mut line = String::new();
    if r.read_line(&mut line).is_err() {
        return;
    }
    let path = line.split_whitespace().nth(1).unwrap_or("/").to_string();
    loop {
        let mut h = String::new();
        match r.read_line(&mut h) {
            Ok(0) | Err(_) => break,
            Ok(_) if h.trim().is_empty() => break,
            Ok(_) => {}
        }
    }
    *hits.lock().expect("hits").entry(path.clone()).or_insert(0) += 1;
    let mut w = conn;
    match std::fs::read(dir.join(path.trim_start_matches('/'))) {
        Ok(body) => {
            let _ = write!(
                w,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = w.write_all(&body);
        }
        Err(_) => {
            let _ = w.write_all(
                b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            );
        }
    }
}

/// Builds `agent-VERSION.tar.gz` in `dir` as an operator would: a version directory with
/// `bin/agent` (which marks, in its node's sandbox, that this version ran there, then
/// runs `body`), packed with `tar czf`. Returns the file's name and its sha256.
pub fn artifact(dir: &Path, version: &str, body: &str) -> (String, String) {
    artifact_with(dir, version, body, None)
}

/// Same, with a `sup-tool.toml` of `manifest` in the version directory.
pub fn artifact_with(
    dir: &Path,
    version: &str,
    body: &str,
    manifest: Option<&str>,
) -> (String, String) {
    let src = dir.join(format!("src-{version}"));
    std::fs::create_dir_all(src.join("bin")).expect("mkdir");
    if let Some(m) = manifest {
        std::fs::write(src.join("sup-tool.toml"), m).expect("manifest");
    }
    let script = src.join("bin/agent");
    // The cwd is tools/agent/VERSION in the node's sandbox.
    std::fs::write(
        &script,
        format!("#!/bin/sh\necho \"$SUP_VERSION $(date +%s%N)\" >> ../../../ran\n{body}\n"),
    )
    .expect("write");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let name = format!("agent-{version}.tar.gz");
    let out = Command::new("tar")
        .arg("czf")
        .arg(dir.join(&name))
        .arg("-C")
        .arg(&src)
        .arg(".")
        .output()
        .expect("tar");
    assert!(
        out.status.success(),
        "tar: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (name.clone(), sha256_of(&dir.join(&name)))
}

pub fn sha256_of(path: &Path) -> String {
    use sha2::Digest;
    let bytes = std::fs::read(path).expect("read artifact");
    sha2::Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `sup-lease --store STORE fleet WORDS...`.
pub fn fleet(c: &Cluster, words: &[&str]) -> std::process::Output {
    Command::new(SUP_LEASE)
        .args(["--store", &c.store, "fleet"])
        .args(words)
        .output()
        .expect("sup-lease fleet")
}

/// `fleet status agent --json`.
pub fn status(c: &Cluster) -> Value {
    let out = fleet(c, &["status", "agent", "--json"]);
    assert!(
        out.status.success(),
        "fleet status: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("fleet status JSON")
}

/// `fleet set agent VERSION --url URL --sha256 SHA ...`, which must succeed.
pub fn set(c: &Cluster, version: &str, url: &str, sha: &str, more: &[&str]) {
    let mut words = vec!["set", "agent", version, "--url", url, "--sha256", sha];
    words.extend_from_slice(more);
    let out = fleet(c, &words);
    assert!(
        out.status.success(),
        "fleet set: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The versions each node ran, from the marks its agents left.
pub fn ran(c: &Cluster, node: &str) -> Vec<String> {
    runs(c, node).into_iter().map(|(v, _)| v).collect()
}

/// Each run's version and start (nanoseconds of the wall clock), from the marks.
pub fn runs(c: &Cluster, node: &str) -> Vec<(String, u128)> {
    std::fs::read_to_string(c.node(node).sb.path("ran"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (v, t) = l.split_once(' ')?;
            Some((v.to_string(), t.trim().parse().ok()?))
        })
        .collect()
}

/// The first start of `version` on each node that ran it, earliest first. A probation
/// begins at its node's first start and lasts at least the probation, so two nodes in
/// probation together start less than a probation apart: unlike looks at the nodes,
/// which a short interval may fall between, the marks miss nothing.
pub fn first_starts(c: &Cluster, version: &str) -> Vec<(u128, String)> {
    let mut starts: Vec<(u128, String)> = c
        .nodes
        .iter()
        .filter_map(|n| {
            let first = runs(c, &n.name).into_iter().find(|(v, _)| v == version)?;
            Some((first.1, n.name.clone()))
        })
        .collect();
    starts.sort();
    starts
}

/// Asserts that each first start from index `from` on in `starts` came at least a
/// probation after the one before it, less a margin: a probation is counted from the
/// upgrade, and its run starts a little later (the old run stopped, the new one
/// spawned), later still on a loaded machine. Two nodes let into probation together
/// start within a tick or so of each other: half a probation tells them apart with room
/// for a start delayed on a loaded machine.
pub fn assert_one_at_a_time(starts: &[(u128, String)], from: usize, probation: Duration) {
    let least = probation.as_nanos() / 2;
    for w in starts[from.saturating_sub(1)..].windows(2) {
        assert!(
            w[1].0 - w[0].0 >= least,
            "{} started {:?} after {}: in probation together ({starts:?})",
            w[1].1,
            Duration::from_nanos((w[1].0 - w[0].0) as u64),
            w[0].1
        );
    }
}

/// The nodes that ran `version`, by the marks its runs left.
pub fn tried(c: &Cluster, version: &str) -> Vec<String> {
    c.nodes
        .iter()
        .filter(|n| ran(c, &n.name).iter().any(|v| v == version))
        .map(|n| n.name.clone())
        .collect()
}

/// What each node's supd says of the agent (`versions agent`); Null for a node whose
/// supd does not answer (killed by the test).
pub fn versions(c: &Cluster) -> Vec<(String, Value)> {
    c.nodes
        .iter()
        .map(|n| {
            let v = if n.sb.supd.is_some() {
                n.sb.request(json!({"cmd": "versions", "tool": "agent"}))["data"].clone()
            } else {
                Value::Null
            };
            (n.name.clone(), v)
        })
        .collect()
}

/// Watches a roll: looks at every node's supd until `done` holds for the fleet's
/// status, and fails at once if two nodes are seen in probation together in two looks
/// running (the marks of `first_starts` miss nothing a look may). Returns
/// the nodes in the order they were first seen in probation.
pub struct Roll {
    pub order: Vec<String>,
}

impl Roll {
    pub fn new() -> Roll {
        Roll { order: Vec::new() }
    }

    /// Looks once; returns the nodes in probation now.
    pub fn look(&mut self, c: &Cluster) -> Vec<String> {
        let now: Vec<String> = versions(c)
            .into_iter()
            .filter(|(_, v)| v["phase"] == "probation")
            .map(|(n, _)| n)
            .collect();
        for n in &now {
            if !self.order.contains(n) {
                self.order.push(n.clone());
            }
        }
        now
    }

    /// Looks until `done` holds of the fleet's status, within `deadline`; at most
    /// `max_parallel` nodes in probation at any look.
    pub fn until(
        &mut self,
        c: &Cluster,
        max_parallel: usize,
        deadline: Duration,
        what: &str,
        done: impl Fn(&Value, &[String]) -> bool,
    ) -> Value {
        let end = Instant::now() + deadline;
        let mut watches: Vec<Watch> = c.nodes.iter().map(|n| n.sb.watch()).collect();
        let mut before: Vec<String> = Vec::new();
        loop {
            // The nodes are asked one after the other: a node seen in probation may
            // have committed before the next one was asked and started its own. Only
            // nodes seen in probation in two looks running are in probation together.
            let now = self.look(c);
            let both: Vec<&String> = now.iter().filter(|n| before.contains(n)).collect();
            assert!(
                both.len() <= max_parallel,
                "{both:?} in probation together\n{}\n{}",
                text(c),
                c.logs()
            );
            before = now;
            c.assert_no_overlap();
            let s = status(c);
            if done(&s, &self.order) {
                return s;
            }
            assert!(
                Instant::now() < end,
                "{what}: not within {deadline:?}\n{}\n{}",
                text(c),
                c.logs()
            );
            // Every upgrade, lease and state change comes as an event on some node.
            for w in &mut watches {
                w.next_within(Duration::from_millis(20));
            }
        }
    }
}

impl Default for Roll {
    fn default() -> Roll {
        Roll::new()
    }
}

/// `fleet status agent` for people, for failures.
pub fn text(c: &Cluster) -> String {
    String::from_utf8_lossy(&fleet(c, &["status", "agent"]).stdout).into_owned()
}

/// The fleet's row of `node` in a status.
pub fn row<'a>(s: &'a Value, node: &str) -> &'a Value {
    s["nodes"]
        .as_array()
        .and_then(|a| a.iter().find(|n| n["node"] == node))
        .unwrap_or(&Value::Null)
}

/// Whether every node in `s` runs `version`, committed.
pub fn all_committed(s: &Value, version: &str, nodes: usize) -> bool {
    let rows = s["nodes"].as_array().cloned().unwrap_or_default();
    rows.len() == nodes
        && rows
            .iter()
            .all(|n| n["running"] == version && n["phase"] == "committed")
}

/// Four nodes on 1.0.0, each with `sup-lease --lease engine --fleet agent`, a 2 s
/// probation; an artifact server; every node joined.
pub fn four_nodes(store: Option<String>, ttl: &'static str) -> (Cluster, Sandbox, ArtifactServer) {
    let opts = super::cluster::Options {
        fleet: true,
        probation: "2s",
        ..Default::default()
    };
    let c = Cluster::with(&["1.0.0"; 4], store, ttl, opts);
    let art = Sandbox::new();
    let srv = ArtifactServer::start(&art.dir);
    Roll::new().until(&c, 0, DEADLINE, "every node joins", |s, _| {
        s["nodes"].as_array().is_some_and(|a| {
            a.len() == 4
                && a.iter()
                    .all(|n| n["state"] == "live" && n["running"] == "1.0.0")
        })
    });
    (c, art, srv)
}

/// Node `i`'s supd and sup-lease killed (-9) and started again.
pub fn kill_node(c: &mut Cluster, i: usize) {
    c.nodes[i].signal_lease(nix::sys::signal::Signal::SIGKILL);
    if let Some(mut l) = c.nodes[i].lease.take() {
        let _ = l.wait();
    }
    c.nodes[i].sb.stop_supd(nix::sys::signal::Signal::SIGKILL);
    c.nodes[i].sb.start();
    c.start_lease(i);
}

/// Node `i`'s sup-lease killed (-9) and started again.
pub fn kill_lease(c: &mut Cluster, i: usize) {
    c.nodes[i].signal_lease(nix::sys::signal::Signal::SIGKILL);
    if let Some(mut l) = c.nodes[i].lease.take() {
        let _ = l.wait();
    }
    c.start_lease(i);
}

fn index(c: &Cluster, node: &str) -> usize {
    c.nodes.iter().position(|n| n.name == node).expect("a node")
}

/// A good version rolls across all four nodes one at a time, the leader of the lease is
/// never the canary, and leadership ends on the new version. The node in probation
/// (supd and sup-lease) and a waiting node (sup-lease) are killed mid-roll and started
/// again: each rejoins where it was. Returns how long the roll took.
pub fn good_roll(store: Option<String>, ttl: &'static str) -> Duration {
    let (mut c, art, srv) = four_nodes(store, ttl);
    let leader = c.wait_any_leader();
    let (name, sha) = artifact(&art.dir, "2.0.0", "exec /bin/sleep 3600");
    let started = Instant::now();
    set(&c, "2.0.0", &srv.url(&name), &sha, &[]);
    let mut roll = Roll::new();
    roll.until(&c, 1, DEADLINE * 2, "a second node in probation", |_, o| {
        o.len() == 2
    });
    let second = index(&c, &roll.order[1]);
    let waiting = (0..4)
        .find(|i| !roll.order.contains(&c.nodes[*i].name) && c.nodes[*i].name != leader)
        .or_else(|| (0..4).find(|i| !roll.order.contains(&c.nodes[*i].name)))
        .expect("a node still waiting");
    kill_node(&mut c, second);
    kill_lease(&mut c, waiting);
    let s = roll.until(&c, 1, DEADLINE * 4, "2.0.0 on every node", |s, _| {
        s["state"] == "done" && all_committed(s, "2.0.0", 4)
    });
    let took = started.elapsed();
    let starts = first_starts(&c, "2.0.0");
    assert_eq!(starts.len(), 4, "every node ran 2.0.0: {starts:?}");
    assert_one_at_a_time(&starts, 0, Duration::from_secs(2));
    assert_ne!(starts[0].1, leader, "the leader is never the canary");
    assert_eq!(s["committed"], 4);
    for n in &c.nodes {
        let v = n.sb.request(json!({"cmd": "versions", "tool": "agent"}))["data"].clone();
        assert_eq!(v["current"], "2.0.0", "{}: {v}", n.name);
        assert_eq!(
            v["versions"].as_array().map(|a| a
                .iter()
                .filter(|e| e["version"] == "2.0.0")
                .map(|e| e["attempts"].as_u64())
                .collect::<Vec<_>>()),
            Some(vec![Some(1)]),
            "{}: one attempt, none repeated after the kills",
            n.name
        );
    }
    assert!(srv.hits(&name) >= 4, "every node fetched it");
    c.wait("leadership on 2.0.0", |c| {
        c.status_text().contains("(2.0.0), term")
    });
    took
}

/// A bad version rolls back on the canary, is marked bad for the fleet and halts the
/// roll; no other node runs (or even fetches) it, including one that was offline during
/// the halt; `resume` needs `--force`, which is counted. Then a tampered artifact is
/// never installed, and once it is mended the nodes fetch it again by themselves; a
/// stale operator write is refused.
pub fn bad_roll(store: Option<String>, ttl: &'static str) {
    let (mut c, art, srv) = four_nodes(store, ttl);
    // n4 is offline during the bad roll.
    c.nodes[3].signal_lease(nix::sys::signal::Signal::SIGTERM);
    if let Some(mut l) = c.nodes[3].lease.take() {
        let _ = l.wait();
    }
    let (name, sha) = artifact(&art.dir, "3.0.0", "exit 3");
    set(&c, "3.0.0", &srv.url(&name), &sha, &[]);
    let mut roll = Roll::new();
    let s = roll.until(&c, 1, DEADLINE * 2, "the roll halts", |s, _| {
        s["state"] == "halted"
    });
    let canary = s["halted"]["node"]
        .as_str()
        .expect("halted by a node")
        .to_string();
    // (A crash loop of a few ms may come and go between two looks: who ran it is told
    // by the marks its runs leave.)
    assert_eq!(
        tried(&c, "3.0.0"),
        vec![canary.clone()],
        "only the canary tried it"
    );
    assert_eq!(s["halted"]["version"], "3.0.0");
    assert!(
        s["bad"]["3.0.0"]["reason"]
            .as_str()
            .is_some_and(|r| !r.is_empty()),
        "{s}"
    );
    assert_eq!(row(&s, &canary)["phase"], "rolled-back", "{s}");
    c.start_lease(3);
    let s = roll.until(&c, 1, DEADLINE, "n4 answers the halted target", |s, _| {
        row(s, "n4")["state"] == "live"
    });
    assert_ne!(row(&s, "n4")["phase"], "downloading");
    assert_eq!(
        tried(&c, "3.0.0"),
        vec![canary.clone()],
        "nobody else, n4 neither"
    );
    let n4 = &c.nodes[3]
        .sb
        .request(json!({"cmd": "versions", "tool": "agent"}))["data"];
    assert!(
        !n4.to_string().contains("3.0.0"),
        "n4 never fetched it: {n4}"
    );
    // resume without --force is refused; with it, the node that rolled it back tries it
    // once more (it goes first), counted, and halts the roll again.
    let out = fleet(&c, &["resume", "agent"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("marked bad for the fleet"));
    assert!(fleet(&c, &["resume", "agent", "--force"]).status.success());
    let s = roll.until(&c, 1, DEADLINE * 2, "halted again", |s, _| {
        s["state"] == "halted" && s["target"]["forced"] == 1
    });
    assert_eq!(
        s["halted"]["node"],
        canary.as_str(),
        "{}\n{}",
        text(&c),
        c.logs()
    );
    assert_eq!(tried(&c, "3.0.0"), vec![canary.clone()], "nobody else");
    // A tampered artifact: the server has other bytes than the sha256 says.
    let (good, sha4) = artifact(&art.dir, "4.0.0", "exec /bin/sleep 3600");
    let real = std::fs::read(art.dir.join(&good)).expect("read");
    std::fs::write(art.dir.join(&good), b"not what was published").expect("tamper");
    set(&c, "4.0.0", &srv.url(&good), &sha4, &[]);
    let s = roll.until(&c, 1, DEADLINE * 2, "every node refuses it", |s, _| {
        s["nodes"].as_array().is_some_and(|a| {
            a.iter().all(|n| {
                n["result"] == "download failed"
                    && n["reason"].as_str().is_some_and(|r| r.contains("sha256"))
            })
        })
    });
    for (n, v) in versions(&c) {
        assert!(
            !v.to_string().contains("4.0.0"),
            "{n} installed a tampered 4.0.0: {v}
{s}"
        );
        let staged = c.node(&n).sb.path("staging/agent/4.0.0");
        assert!(!staged.exists(), "{n} unpacked it");
    }
    // A stale operator write is refused: this one read epoch 1.
    let out = fleet(&c, &["halt", "agent", "--epoch", "1"]);
    assert_eq!(out.status.code(), Some(1), "a stale write is refused");
    assert!(String::from_utf8_lossy(&out.stderr).contains("not 1"));
    // Mended: the nodes fetch it again by themselves (backoff) and the roll goes on.
    std::fs::write(art.dir.join(&good), real).expect("mend");
    roll.until(&c, 1, DEADLINE * 4, "4.0.0 on every node", |s, _| {
        s["state"] == "done" && all_committed(s, "4.0.0", 4)
    });
}

/// An irreversible version (its manifest says so) goes on after its first commit only
/// when the operator allows it: the node that committed it halts the roll, nobody else
/// runs it until `fleet resume`, then it rolls on; the lease's floor rises to it.
pub fn irreversible_roll(store: Option<String>, ttl: &'static str) {
    let (c, art, srv) = four_nodes(store, ttl);
    let (name, sha) = artifact_with(
        &art.dir,
        "2.0.0",
        "exec /bin/sleep 3600",
        Some("revertible = false\n"),
    );
    set(&c, "2.0.0", &srv.url(&name), &sha, &[]);
    let mut roll = Roll::new();
    let s = roll.until(&c, 1, DEADLINE * 2, "the roll pauses", |s, _| {
        s["state"] == "halted"
    });
    let first = s["halted"]["node"].as_str().expect("a node").to_string();
    assert!(
        s["halted"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("irreversible")),
        "{s}"
    );
    assert!(
        s["bad"].as_object().is_some_and(|b| b.is_empty()),
        "not bad: {s}"
    );
    assert_eq!(row(&s, &first)["phase"], "committed");
    assert_eq!(
        tried(&c, "2.0.0"),
        vec![first.clone()],
        "nobody else ran it"
    );
    assert!(fleet(&c, &["resume", "agent"]).status.success());
    roll.until(&c, 1, DEADLINE * 4, "2.0.0 on every node", |s, _| {
        s["state"] == "done" && all_committed(s, "2.0.0", 4)
    });
    c.wait("the floor rises to 2.0.0", |c| {
        String::from_utf8_lossy(&c.policy(&["show"]).stdout).contains("floor 2.0.0")
    });
}

/// `n` nodes on 1.0.0 following the fleet of `agent` (TTL 1s), each with `probation`
/// for the agent; every node joined.
pub fn nodes(store: Option<String>, n: usize, probation: &'static str) -> Cluster {
    let opts = super::cluster::Options {
        fleet: true,
        probation,
        ..Default::default()
    };
    let versions = vec!["1.0.0"; n];
    let c = Cluster::with(&versions, store, "1s", opts);
    Roll::new().until(&c, 0, DEADLINE, "every node joins", |s, _| {
        s["nodes"].as_array().is_some_and(|a| {
            a.len() == n
                && a.iter()
                    .all(|r| r["state"] == "live" && r["running"] == "1.0.0")
        })
    });
    c
}

/// Canary 2 and max-parallel 2 on three nodes: the first two go together, the third
/// after both committed; never more than two in probation.
pub fn two_canaries(store: Option<String>) {
    let c = nodes(store, 3, "2s");
    let art = Sandbox::new();
    let srv = ArtifactServer::start(&art.dir);
    let (name, sha) = artifact(&art.dir, "2.0.0", "exec /bin/sleep 3600");
    set(
        &c,
        "2.0.0",
        &srv.url(&name),
        &sha,
        &["--canary", "2", "--max-parallel", "2"],
    );
    Roll::new().until(&c, 2, DEADLINE * 3, "2.0.0 on every node", |s, _| {
        s["state"] == "done" && all_committed(s, "2.0.0", 3)
    });
    let starts = first_starts(&c, "2.0.0");
    assert_eq!(starts.len(), 3, "{starts:?}");
    // The two canaries together, the third once both committed.
    assert_one_at_a_time(&starts, 2, Duration::from_secs(2));
}

/// Publishes `version` (an agent running `body`) on a new artifact server and sets it
/// as the fleet's target; the server lives as long as what is returned.
pub fn publish_and_set(c: &Cluster, version: &str, body: &str) -> (Sandbox, ArtifactServer) {
    let art = Sandbox::new();
    let srv = ArtifactServer::start(&art.dir);
    let (name, sha) = artifact(&art.dir, version, body);
    set(c, version, &srv.url(&name), &sha, &[]);
    (art, srv)
}

/// Waits until a node is in probation: the canary, whose name is returned.
pub fn wait_canary(c: &Cluster, roll: &mut Roll) -> String {
    roll.until(c, 1, DEADLINE, "a canary in probation", |_, o| {
        !o.is_empty()
    });
    roll.order[0].clone()
}
