//! The operator's commands on a fleet: `set`, `status`, `halt`, `resume`, `forget`.
//! Each reads the fleet's keys once and writes the target by compare-and-swap, so a
//! command that raced another writer, or that names an epoch that is no longer the
//! target's (`--epoch N`), is refused with nothing changed.

use super::artifact::check_sha256;
use super::node::{snapshot, stamp, write_target, Snapshot};
use super::record::{prefix, Halt, Phase, Status, Target, Transfer};
use super::rule::{forget_command, Peer};
use crate::lease::store::{Cond, Store};
use serde_json::{json, Value};

/// `fleet set`'s arguments.
#[derive(Clone, Debug, Default)]
pub struct SetArgs {
    pub version: String,
    pub url: String,
    pub sha256: String,
    pub canary: Option<u32>,
    pub max_parallel: Option<u32>,
    pub irreversible: bool,
    pub force: bool,
}

/// The most nodes in probation at once that a roll may allow.
pub const MAX_PARALLEL: u32 = 100;

/// Whether `url` is one a node can fetch.
pub fn check_url(url: &str) -> Result<(), String> {
    let ok = ["http://", "https://", "file:///"]
        .iter()
        .any(|p| url.starts_with(p) && url.len() > p.len());
    match ok {
        true => Ok(()),
        false => Err(format!(
            "'{url}' is not a URL a node can fetch: http://, https:// or file:///PATH of a .tar.gz"
        )),
    }
}

fn read(store: &mut dyn Store, tool: &str) -> Result<Snapshot, String> {
    snapshot(store, tool).map_err(|e| format!("cannot read the fleet of {tool}: {e}"))
}

/// Sets the fleet's target: a new roll (a halt of the last one is cleared).
pub fn set(
    store: &mut dyn Store,
    tool: &str,
    a: &SetArgs,
    expect: Option<u64>,
) -> Result<String, String> {
    crate::versions::check_version(&a.version)?;
    check_url(&a.url)?;
    let sha = check_sha256(&a.sha256)?;
    if a.canary == Some(0) || a.max_parallel == Some(0) {
        return Err("--canary and --max-parallel are at least 1".into());
    }
    // A node takes a slot on condition that every slot is as it read them: one compare
    // each, in one store transaction (etcd allows 128 operations in one by default).
    if a.max_parallel.is_some_and(|m| m > MAX_PARALLEL) {
        return Err(format!("--max-parallel is at most {MAX_PARALLEL}"));
    }
    let snap = read(store, tool)?;
    let t = write_target(store, tool, &snap, expect, |t| {
        if let Some(mark) = t.bad.get(&a.version) {
            if !a.force {
                return Err(format!(
                    "{} is marked bad for the fleet (on {}: {}); --force tries it again",
                    a.version, mark.node, mark.reason
                ));
            }
            t.bad.remove(&a.version);
            t.forced += 1;
        }
        if a.force {
            t.forced_versions.insert(a.version.clone());
        }
        t.version = Some(a.version.clone());
        t.url = a.url.clone();
        t.sha256 = sha.clone();
        t.canary = a.canary.unwrap_or(1);
        t.max_parallel = a.max_parallel.unwrap_or(1);
        t.irreversible = a.irreversible;
        t.allow_irreversible = a.irreversible;
        t.halted = None;
        t.set_at = stamp();
        Ok(())
    })?;
    Ok(format!(
        "fleet {tool}: target {} (epoch {}, canary {}, max-parallel {}{})\n",
        a.version,
        t.epoch,
        t.canary,
        t.max_parallel,
        if t.irreversible { ", irreversible" } else { "" }
    ))
}

/// Halts the roll: no node starts the target until `resume`.
pub fn halt(store: &mut dyn Store, tool: &str, expect: Option<u64>) -> Result<String, String> {
    let snap = read(store, tool)?;
    let Some(version) = snap.target.version.clone() else {
        return Err(format!(
            "the fleet of {tool} has no target: nothing to halt"
        ));
    };
    if let Some(h) = &snap.target.halted {
        return Ok(format!("fleet {tool}: already halted: {}\n", h.reason));
    }
    let t = write_target(store, tool, &snap, expect, |t| {
        t.halted = Some(Halt {
            version,
            node: None,
            reason: "halted by an operator".into(),
            at: stamp(),
        });
        Ok(())
    })?;
    Ok(format!(
        "fleet {tool}: halted (epoch {}); nodes in probation finish it\n",
        t.epoch
    ))
}

/// Lets a halted roll go on; `force` also clears the fleet's bad mark of the target (and
/// each node that rolled it back tries it once more), counted.
pub fn resume(
    store: &mut dyn Store,
    tool: &str,
    force: bool,
    expect: Option<u64>,
) -> Result<String, String> {
    let snap = read(store, tool)?;
    let Some(version) = snap.target.version.clone() else {
        return Err(format!(
            "the fleet of {tool} has no target: nothing to resume"
        ));
    };
    let t = write_target(store, tool, &snap, expect, |t| {
        if let Some(mark) = t.bad.get(&version) {
            if !force {
                return Err(format!(
                    "{version} is marked bad for the fleet (on {}: {}); --force tries it again",
                    mark.node, mark.reason
                ));
            }
            t.bad.remove(&version);
            t.forced += 1;
        }
        if force {
            t.forced_versions.insert(version.clone());
        }
        // Resuming past an irreversible version's first commit is the operator's leave
        // for the rest of the fleet to follow.
        if t.halted.is_some() {
            t.allow_irreversible = true;
        }
        t.halted = None;
        Ok(())
    })?;
    Ok(format!(
        "fleet {tool}: {version} rolls on (epoch {}{})\n",
        t.epoch,
        if force {
            format!(", forced {} times", t.forced)
        } else {
            String::new()
        }
    ))
}

/// Forgets a node that is gone for good: its roster entry, and a slot it still holds
/// (the roll waits for a slot's holder otherwise).
pub fn forget(store: &mut dyn Store, tool: &str, node: &str) -> Result<String, String> {
    let snap = read(store, tool)?;
    let Some(peer) = snap.peers.iter().find(|p| p.node == node) else {
        return Err(format!("no node named '{node}' in the fleet of {tool}"));
    };
    if peer.live.is_some() {
        return Err(format!(
            "{node} is live: stop its sup-lease first (it would join again at once)"
        ));
    }
    let p = prefix(tool);
    let mut said = String::new();
    for (i, s, rev) in snap.slots.iter().filter(|(_, s, _)| s.node == node) {
        store
            .delete(&format!("{p}slots/{i}"), Cond::ModRevision(*rev))
            .map_err(|e| format!("store: {e}"))?;
        said.push_str(&format!(
            "fleet {tool}: slot {i} ({}) given back\n",
            s.version
        ));
    }
    let key = format!("{p}roster/{node}");
    let roster = store.range(&key).map_err(|e| format!("store: {e}"))?;
    if let Some(kv) = roster.iter().find(|kv| kv.key == key) {
        store
            .delete(&key, Cond::ModRevision(kv.mod_revision))
            .map_err(|e| format!("store: {e}"))?;
    }
    said.push_str(&format!("fleet {tool}: {node} forgotten\n"));
    Ok(said)
}

/// The roll as a whole.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Progress {
    /// `none` (no target), `rolling`, `done` or `halted`.
    pub state: &'static str,
    /// Nodes that committed the target, of all known.
    pub committed: usize,
    pub total: usize,
}

/// How far the roll is: done when every live node committed the target (a node that is
/// gone does not hold it up, and is shown as such).
pub fn progress(snap: &Snapshot) -> Progress {
    let t = &snap.target;
    let on_target =
        |s: &Status| t.version.is_some() && s.running == t.version && s.phase == Phase::Committed;
    let committed = snap
        .peers
        .iter()
        .filter(|p| p.status().is_some_and(on_target))
        .count();
    let live_pending = snap
        .peers
        .iter()
        .filter_map(|p| p.live.as_ref())
        .any(|s| !on_target(s));
    let state = match () {
        _ if t.version.is_none() => "none",
        _ if t.halted.is_some() => "halted",
        _ if live_pending || snap.peers.is_empty() => "rolling",
        _ => "done",
    };
    Progress {
        state,
        committed,
        total: snap.peers.len(),
    }
}

/// How a node is shown: `live`, `unreachable` (its store lease is gone: the last status
/// it wrote), or `stale` (live, but its status answers an older target than the one set).
pub fn liveness(p: &Peer, target: &Target) -> &'static str {
    match &p.live {
        None => "unreachable",
        Some(s) if s.epoch < target.epoch => "stale",
        Some(_) => "live",
    }
}

/// A node gone in probation for longer than its limit, as a live node saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gone {
    /// The live node that says so.
    pub seen_by: String,
    /// Its probation left plus T, in ms.
    pub limit_ms: u64,
    /// The slot it holds.
    pub slot: Option<u32>,
    /// What to run if it is not coming back.
    pub forget: String,
}

/// Whether `p` is gone in probation for longer than its limit: said by a live node (the
/// reader's own clock is never asked; see `rule::gone`). `store` is the store as the
/// operator gave it, for the command to run.
pub fn gone(tool: &str, snap: &Snapshot, p: &Peer, store: &str) -> Option<Gone> {
    if p.live.is_some() {
        return None;
    }
    let (seen_by, limit_ms) = snap
        .peers
        .iter()
        .filter_map(|q| q.live.as_ref())
        .find_map(|s| Some((s.node.clone(), *s.gone.get(&p.node)?)))?;
    Some(Gone {
        seen_by,
        limit_ms,
        slot: snap
            .slots
            .iter()
            .find(|(_, s, _)| s.node == p.node)
            .map(|(i, _, _)| *i),
        forget: forget_command(store, tool, &p.node),
    })
}

/// `fleet status` as JSON; `store` as the operator gave it (for the commands it names).
pub fn status_json(tool: &str, snap: &Snapshot, store: &str) -> Value {
    let pr = progress(snap);
    let t = &snap.target;
    let nodes: Vec<Value> = snap
        .peers
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let s = p.status().cloned().unwrap_or_default();
            let gone = gone(tool, snap, p, store).map(|g| {
                json!({"seen_by": g.seen_by, "for_longer_than_ms": g.limit_ms,
                       "slot": g.slot, "forget": g.forget})
            });
            json!({
                "node": p.node, "order": i + 1, "state": liveness(p, t), "gone": gone,
                "progress": s.progress.filter(|_| p.live.is_some()),
                "probation_left_ms": s.probation_left_ms,
                "running": s.running, "proposed": s.proposed, "phase": s.phase.as_str(),
                "result": s.result, "reason": s.reason, "at": s.at, "epoch": s.epoch,
                "leader": s.leader, "irreversible": s.irreversible,
                "slot": snap.slots.iter().find(|(_, sl, _)| sl.node == p.node).map(|(i, _, _)| i),
            })
        })
        .collect();
    json!({
        "tool": tool,
        "state": pr.state,
        "committed": pr.committed,
        "total": pr.total,
        "target": t.version.as_ref().map(|_| json!({
            "version": t.version, "url": t.url, "sha256": t.sha256, "epoch": t.epoch,
            "canary": t.canary, "max_parallel": t.max_parallel, "irreversible": t.irreversible,
            "allow_irreversible": t.allow_irreversible, "forced": t.forced, "forced_versions": t.forced_versions, "set_at": t.set_at,
        })),
        "halted": t.halted,
        "bad": t.bad,
        "nodes": nodes,
    })
}

/// `fleet status` for people: the roll, then one row per node in the order of the roll,
/// then what to do about a node gone in probation; `store` as the operator gave it.
pub fn status_text(tool: &str, snap: &Snapshot, store: &str) -> String {
    let pr = progress(snap);
    let t = &snap.target;
    let mut o = String::new();
    match &t.version {
        None => o.push_str(&format!("fleet {tool}: no target set\n")),
        Some(v) => o.push_str(&format!(
            "fleet {tool}: target {v} (epoch {}, canary {}, max-parallel {}{}): {}, {} of {} committed\n",
            t.epoch,
            t.canary,
            t.max_parallel,
            if t.irreversible { ", irreversible" } else { "" },
            pr.state,
            pr.committed,
            pr.total
        )),
    }
    if let Some(h) = &t.halted {
        o.push_str(&format!(
            "halted: {} {}: {} ({})\n",
            h.version,
            match &h.node {
                Some(n) => format!("on {n}"),
                None => "by an operator".into(),
            },
            h.reason,
            h.at
        ));
    }
    for (v, m) in &t.bad {
        o.push_str(&format!(
            "bad: {v} (on {}: {}, {})\n",
            m.node, m.reason, m.at
        ));
    }
    let rows: Vec<[String; 8]> = snap
        .peers
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let s = p.status().cloned().unwrap_or_default();
            let mut phase = s.phase.as_str().to_string();
            if let Some((i, _, _)) = snap.slots.iter().find(|(_, sl, _)| sl.node == p.node) {
                phase.push_str(&format!(" (slot {i})"));
            }
            if let Some(x) = s.progress.filter(|_| p.live.is_some()) {
                phase.push_str(&format!(" ({})", transfer(x)));
            }
            let liveness = match gone(tool, snap, p, store) {
                Some(_) => "gone",
                None => liveness(p, t),
            };
            let state = match (liveness, s.leader) {
                (l, true) => format!("{l}, leader"),
                (l, false) => l.to_string(),
            };
            let dash = |o: &Option<String>| o.clone().unwrap_or_else(|| "-".into());
            [
                (i + 1).to_string(),
                p.node.clone(),
                state,
                dash(&s.running),
                dash(&s.proposed),
                phase,
                dash(&s.result),
                match (&s.reason, s.at.as_str()) {
                    (Some(r), at) => format!("{at} {r}"),
                    (None, at) => at.to_string(),
                },
            ]
        })
        .collect();
    let head = [
        "#",
        "NODE",
        "STATE",
        "RUNNING",
        "PROPOSED",
        "PHASE",
        "RESULT",
        "WHEN, WHY",
    ];
    let mut width = head.map(str::len);
    for r in &rows {
        for (w, c) in width.iter_mut().zip(r.iter()).take(7) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut l = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i < 7 {
                l.push_str(&format!("{c:<w$}  ", w = width[i]));
            } else {
                l.push_str(c);
            }
        }
        l.trim_end().to_string() + "\n"
    };
    if !rows.is_empty() {
        o.push_str(&line(head.to_vec()));
        for r in &rows {
            o.push_str(&line(r.iter().map(String::as_str).collect()));
        }
    }
    for p in &snap.peers {
        if let Some(g) = gone(tool, snap, p, store) {
            let slot = match g.slot {
                Some(i) => format!(", holding slot {i}: the roll waits for it"),
                None => String::new(),
            };
            o.push_str(&format!(
                "{} has been gone longer than its probation plus T ({}, as {} saw it){slot}; \
                 if it is not coming back, run:\n  {}\n",
                p.node,
                crate::time::Human(std::time::Duration::from_millis(g.limit_ms)),
                g.seen_by,
                g.forget
            ));
        }
    }
    o
}

/// A download's progress for people: "12345 of 1000000 bytes".
fn transfer(x: Transfer) -> String {
    match x.total {
        Some(t) => format!("{} of {t} bytes", x.bytes),
        None => format!("{} bytes", x.bytes),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::file::FileStore;

    /// The store, and the scratch directory it lives in (removed when dropped).
    fn store(name: &str) -> (FileStore, crate::scratch::Scratch) {
        let dir = crate::scratch::Scratch::new(&format!("fleet-{name}"));
        (FileStore::new(dir.join("store.json")), dir)
    }

    fn args(v: &str) -> SetArgs {
        SetArgs {
            version: v.into(),
            url: "http://127.0.0.1:1/a.tar.gz".into(),
            sha256: "AB".repeat(32),
            ..SetArgs::default()
        }
    }

    #[test]
    fn set_checks_its_arguments_and_a_stale_epoch_is_refused() {
        let (mut s, _dir) = store("set");
        let mut a = args("2.0.0");
        a.sha256 = "xyz".into();
        assert!(set(&mut s, "agent", &a, None)
            .unwrap_err()
            .contains("not a sha256"));
        let mut a = args("2.0.0");
        a.url = "/tmp/a.tar.gz".into();
        assert!(set(&mut s, "agent", &a, None)
            .unwrap_err()
            .contains("file:///PATH"));
        assert!(set(&mut s, "agent", &args("v2"), None)
            .unwrap_err()
            .contains("not a version"));
        let mut a = args("2.0.0");
        a.max_parallel = Some(MAX_PARALLEL + 1);
        assert!(set(&mut s, "agent", &a, None)
            .unwrap_err()
            .contains("at most"));
        let said = set(&mut s, "agent", &args("2.0.0"), Some(0)).expect("first set");
        assert!(said.contains("epoch 1"), "{said}");
        let snap = snapshot(&mut s, "agent").expect("read");
        assert_eq!(snap.target.sha256, "ab".repeat(32), "kept lowercase");
        // An operator who read epoch 0 is refused now that it is 1.
        let e = set(&mut s, "agent", &args("3.0.0"), Some(0)).unwrap_err();
        assert!(e.contains("at epoch 1, not 0"), "{e}");
        // So is a writer that raced another one (read, then somebody wrote).
        let old = snapshot(&mut s, "agent").expect("read");
        halt(&mut s, "agent", None).expect("halt");
        let e = write_target(&mut s, "agent", &old, None, |_| Ok(())).unwrap_err();
        assert!(e.contains("changed by another writer since epoch 1"), "{e}");
    }

    #[test]
    fn a_bad_version_is_set_or_resumed_only_with_force_counted() {
        let (mut s, _dir) = store("bad");
        set(&mut s, "agent", &args("2.0.0"), None).expect("set");
        let snap = snapshot(&mut s, "agent").expect("read");
        write_target(&mut s, "agent", &snap, None, |t| {
            t.bad.insert(
                "2.0.0".into(),
                super::super::record::Mark {
                    node: "n1".into(),
                    reason: "crash loop".into(),
                    at: String::new(),
                },
            );
            t.halted = Some(Halt {
                version: "2.0.0".into(),
                node: Some("n1".into()),
                reason: "crash loop".into(),
                at: String::new(),
            });
            Ok(())
        })
        .expect("halt as a node does");
        let e = resume(&mut s, "agent", false, None).unwrap_err();
        assert!(
            e.contains("marked bad for the fleet (on n1: crash loop)"),
            "{e}"
        );
        assert!(set(&mut s, "agent", &args("2.0.0"), None).is_err());
        let said = resume(&mut s, "agent", true, None).expect("forced");
        assert!(said.contains("forced 1 times"), "{said}");
        let t = snapshot(&mut s, "agent").expect("read").target;
        assert!(t.halted.is_none() && t.bad.is_empty() && t.forced == 1);
    }

    #[test]
    fn status_shows_the_order_gone_nodes_and_progress() {
        let (mut s, _dir) = store("status");
        set(&mut s, "agent", &args("2.0.0"), None).expect("set");
        let lease = s.grant(std::time::Duration::from_secs(30)).expect("grant");
        for (n, running, phase) in [
            ("n1", "2.0.0", Phase::Committed),
            ("n2", "1.0.0", Phase::Waiting),
        ] {
            let st = Status {
                node: n.into(),
                running: Some(running.into()),
                phase,
                epoch: 1,
                ..Status::default()
            };
            let v = serde_json::to_string(&st).expect("json");
            s.put(
                &format!("/sup/fleet/agent/roster/{n}"),
                &v,
                0,
                Some(Cond::Absent),
            )
            .expect("roster");
            if n == "n1" {
                s.put(&format!("/sup/fleet/agent/nodes/{n}"), &v, lease, None)
                    .expect("live");
            }
        }
        let snap = snapshot(&mut s, "agent").expect("read");
        assert_eq!(
            progress(&snap),
            Progress {
                state: "done",
                committed: 1,
                total: 2
            },
            "n2 is gone: it does not hold the roll up"
        );
        let text = status_text("agent", &snap, "file:/s");
        assert!(text.contains("1 of 2 committed"), "{text}");
        let n2 = text.lines().find(|l| l.contains("n2")).expect("n2's row");
        assert!(n2.starts_with("2 ") && n2.contains("unreachable"), "{text}");
        let j = status_json("agent", &snap, "file:/s");
        assert_eq!(j["nodes"][0]["state"], "live");
        assert_eq!(j["nodes"][1]["state"], "unreachable");
        halt(&mut s, "agent", None).expect("halt");
        let snap = snapshot(&mut s, "agent").expect("read");
        let j = status_json("agent", &snap, "file:/s");
        assert_eq!(
            j["nodes"][0]["state"], "stale",
            "n1 has not answered epoch 2 yet"
        );
        assert_eq!(j["state"], "halted");
    }
}
