//! Issue 22: terms never go back. A store that was wiped (etcd stopped, its data dir
//! deleted, started again empty on the same port; the file store moved away) counts its
//! revisions from 1 again and has lost the operator's policy: the term handed to supd
//! (SUP_LEASE_TERM in the engine's environment) went from 25 back to 5, and the floor
//! vanished, so an older node could lead. Each node now remembers the highest term it
//! saw, the store and the policy, in a file of its own.

mod common;
use common::cluster::Cluster;
use common::etcd::{copy_log_until_ready, free_port, installed, one_member};
use common::*;
use nix::sys::signal::Signal;
use std::process::{Child, Stdio};

/// An etcd that can be wiped: stopped, its data dir deleted, started again empty on the
/// same ports. Ended by its pid.
struct Etcd {
    child: Option<Child>,
    client: u16,
    peer: u16,
    dir: Sandbox,
    runs: u32,
}

impl Etcd {
    fn start() -> Option<Etcd> {
        if !installed() {
            return None;
        }
        let mut e = Etcd {
            child: None,
            client: free_port(),
            peer: free_port(),
            dir: Sandbox::new(),
            runs: 0,
        };
        e.spawn();
        Some(e)
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client)
    }

    fn store(&self) -> String {
        format!("etcd:{}", self.url())
    }

    fn spawn(&mut self) {
        self.runs += 1;
        let url = self.url();
        let peer_url = format!("http://127.0.0.1:{}", self.peer);
        let mut child = one_member(&self.dir.path("data"), &url, &peer_url)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start etcd");
        let log = self.dir.path(&format!("etcd-{}.log", self.runs));
        let rx = copy_log_until_ready(&mut child, std::fs::File::create(log).ok());
        self.child = Some(child);
        assert!(
            rx.recv_timeout(DEADLINE).is_ok(),
            "etcd did not become ready within {DEADLINE:?}"
        );
    }

    /// Stopped, emptied, started again.
    fn wipe(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        std::fs::remove_dir_all(self.dir.path("data")).expect("delete etcd's data");
        self.spawn();
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The terms each engine started with, in order: the engine writes `NODE TERM`.
fn terms(c: &Cluster) -> Vec<(String, u64)> {
    std::fs::read_to_string(c.shared.join("engine.log"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (node, term) = l.split_once(' ')?;
            Some((node.to_string(), term.trim().parse().ok()?))
        })
        .collect()
}

/// n2 (1.1.0) leads under the operator's floor 1.1.0; the store is wiped; the engine
/// starts again with a term above every term before, the floor comes back, and n1
/// (1.0.0) does not lead once n2 is gone.
fn a_wiped_store(c: &mut Cluster, wipe: &mut dyn FnMut()) {
    c.wait_leader("n2");
    let out = c.policy(&["floor", "1.1.0"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    c.wait("the floor at 1.1.0 and n1 not eligible", |c| {
        let st = c.status_text();
        st.contains("floor 1.1.0") && st.contains("member n1: 1.0.0 (committed, healthy)\n")
    });
    // Each node reads it at its next tick (every T/3): 2T is six of them.
    let t0 = std::time::Instant::now();
    let ttl2 = parse_ttl(c.ttl) * 2;
    c.wait("2 TTLs", |_| t0.elapsed() >= ttl2);
    let before = terms(c);
    let highest = before.iter().map(|(_, t)| *t).max().expect("a term");
    wipe();
    c.wait("the engine started again after the wipe", |c| {
        terms(c).len() > before.len()
    });
    let after = terms(c);
    for w in after.windows(2) {
        assert!(
            w[1].1 >= w[0].1,
            "a term went back: {after:?}\n{}",
            c.logs()
        );
    }
    assert!(after[before.len()].1 > highest, "{after:?}");
    c.wait("the floor written back", |c| {
        c.status_text().contains("floor 1.1.0")
    });
    for n in &c.nodes {
        let d = std::fs::read_to_string(n.sb.path("sup-lease.engine.json")).unwrap_or_default();
        assert!(d.contains("\"floor\": \"1.1.0\""), "{}: {d}", n.name);
    }
    let logs = c.logs();
    assert!(
        logs.contains("the store was wiped") || logs.contains("the store was replaced"),
        "said loudly: {logs}"
    );
    assert!(
        logs.contains("the store has no policy: written back"),
        "{logs}"
    );
    // The newer node goes: the older one stays below the floor, and nobody leads.
    let gone = terms(c).len();
    c.nodes[1].signal_lease(Signal::SIGTERM);
    let t0 = std::time::Instant::now();
    let ttl3 = parse_ttl(c.ttl) * 3;
    c.wait("nobody leads for 3 TTLs", |c| {
        assert!(
            !c.running_engines().contains(&"n1".to_string()),
            "n1 (1.0.0) leads below the floor\n{}",
            c.status_text()
        );
        t0.elapsed() >= ttl3
    });
    assert!(
        !terms(c)[gone..].iter().any(|(n, _)| n == "n1"),
        "{:?}",
        terms(c)
    );
}

#[test]
fn i22_a_wiped_etcd_gives_no_lower_term_and_the_floor_comes_back() {
    let Some(mut e) = Etcd::start() else { return };
    let mut c = Cluster::new(&["1.0.0", "1.1.0"], Some(e.store()), "1s");
    a_wiped_store(&mut c, &mut || e.wipe());
}

#[test]
fn i22_a_deleted_file_store_gives_no_lower_term_and_the_floor_comes_back() {
    let mut c = Cluster::new(&["1.0.0", "1.1.0"], None, "900ms");
    // Started anew as the man page tells operators: the store's directory moved away
    // in one rename (no lock: a writer that read the old store cannot write into the
    // new one).
    let dir = c.shared.join("store.json.d");
    let away = c.shared.join("store.json.d.away");
    a_wiped_store(&mut c, &mut || {
        std::fs::rename(&dir, &away).expect("move the store away")
    });
}

/// A restart of sup-lease keeps what it remembered: the file is in the node's state
/// directory (by default beside a socket of its own) and names the highest term.
#[test]
fn i22_what_a_node_remembers_is_in_a_file_beside_its_socket() {
    let c = Cluster::new(&["1.0.0"], None, "900ms");
    c.wait_leader("n1");
    let path = c.nodes[0].sb.path("sup-lease.engine.json");
    c.wait("the memory written", |c| {
        path.exists() && !terms(c).is_empty()
    });
    let d: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("json");
    let highest = terms(&c).iter().map(|(_, t)| *t).max().expect("a term");
    assert!(d["term"].as_u64().expect("term") >= highest, "{d}");
    assert!(
        d["store"].as_str().expect("store").starts_with("file:"),
        "{d}"
    );
}
