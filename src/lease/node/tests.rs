use super::*;
use crate::lease::file::FileStore;
use std::io::Write;
use std::os::unix::net::UnixStream;

#[test]
fn a_node_that_took_the_key_and_waits_out_t_leads_the_tool_for_a_fleet() {
    let dir = crate::scratch::Scratch::new("leads");
    let path = dir.join("store.json");
    let mut n = Node::new(
        "engine".into(),
        "n1".into(),
        Duration::from_secs(3),
        Box::new(FileStore::new(path)),
        "/nonexistent.sock".into(),
    );
    n.tool = Some("agent".into());
    assert!(!n.leads_tool("agent"));
    n.memory.lead_from = Some(Boot::now().plus(Duration::from_secs(3)));
    assert!(
        n.leads_tool("agent"),
        "it leads in T: the fleet puts it last"
    );
    assert!(!n.leads_tool("other"));
    n.memory.lead_from = None;
    n.leading = Some(7);
    assert!(n.leads_tool("agent"));
}

/// Review of issue 22: a node that took the key over (or took an empty key it must
/// wait T on) waits out the old holder's grant: the old holder's runs may live
/// until T after the takeover. If it gives the key up meanwhile (here its supd does
/// not answer one candidacy: it sent no grant, so it gives up at once), the
/// `released` mark it writes names its own term, and a candidate that last saw that
/// term leads at once: beside the old holder's runs.
#[test]
fn a_holder_waiting_out_the_old_holders_grant_gives_the_key_up_without_a_released_mark() {
    let dir = crate::scratch::Scratch::new("waiting");
    let path = dir.join("store.json");
    let ttl = Duration::from_secs(3);
    let mut n = Node::new(
        "engine".into(),
        "b".into(),
        ttl,
        Box::new(FileStore::new(path.clone())),
        "/nonexistent.sock".into(),
    );
    // b took the key over a moment ago, bound to its store lease: it leads in T.
    let id = n.store.grant(ttl).expect("grant");
    n.my_lease = Some(id);
    n.last_renewal = Some(Boot::now());
    let rev = n
        .store
        .put(
            &n.key("leader"),
            r#"{"node":"b","version":null,"epoch":0}"#,
            id,
            None,
        )
        .expect("put")
        .expect("written");
    n.memory.lead_from = Some(Boot::now().plus(ttl));
    // Its supd does not answer this tick's candidacy.
    n.tick();
    let snap = snapshot(n.store.as_mut(), "engine").expect("read");
    let now = Boot::now();
    let c_leads = lead_from_after_acquire(Some(rev), snap.released, None, now, ttl);
    assert!(
        c_leads > now,
        "a candidate that saw term {rev} leads at once (released {:?}) while the old holder's runs may live for T",
        snap.released
    );
}

/// Review of issue 22: candidates match a `released` mark against the last term
/// they saw, which the rule keeps as the revision of `leader` (Memory::last_term).
/// After a store was wiped, the term handed to supd is min_term, above that
/// revision; a clean release that names it matches no candidate, and every clean
/// release waits T.
#[test]
fn a_clean_release_after_a_wipe_names_the_revision_candidates_match() {
    let dir = crate::scratch::Scratch::new("wiped");
    let path = dir.join("store.json");
    let ttl = Duration::from_secs(3);
    let mut n = Node::new(
        "engine".into(),
        "a".into(),
        ttl,
        Box::new(FileStore::new(path.clone())),
        "/nonexistent.sock".into(),
    );
    let id = n.store.grant(ttl).expect("grant");
    n.my_lease = Some(id);
    let rev = n
        .store
        .put(
            &n.key("leader"),
            r#"{"node":"a","version":null,"epoch":0,"min_term":100}"#,
            id,
            None,
        )
        .expect("put")
        .expect("written");
    let snap = snapshot(n.store.as_mut(), "engine").expect("read");
    assert_eq!(snap.term(), Some(100));
    // It led with the term supd was given, and steps down: supd answers that the
    // services exited.
    n.leading = snap.term();
    n.held = Some(rev);
    n.seen_leader = rev;
    let (mine, theirs) = UnixStream::pair().expect("pair");
    (&theirs).write_all(b"{\"ok\":true}\n").expect("answer");
    mine.set_nonblocking(true).expect("nonblocking");
    n.releasing = Some(Release {
        conn: mine,
        answer: Vec::new(),
    });
    n.finish_release();
    let snap = snapshot(n.store.as_mut(), "engine").expect("read");
    assert!(snap.leader.is_none(), "the key is given up");
    // What a candidate that saw this leader remembers, and matches the mark with.
    let now = Boot::now();
    assert_eq!(
        lead_from_after_acquire(Some(rev), snap.released, None, now, ttl),
        now,
        "released {:?}: a candidate that saw revision {rev} waits T",
        snap.released
    );
}

#[test]
fn a_stale_policy_write_is_refused_and_bad_values_are_skipped() {
    let dir = crate::scratch::Scratch::new("policy");
    let path = dir.join("store.json");
    let mut store = FileStore::new(path.clone());
    let first = snapshot(&mut store, "engine").expect("read");
    let p = write_policy(&mut store, "engine", &first, |p| {
        p.floor = Some("1.0.0".into())
    })
    .expect("first write");
    assert_eq!(p.epoch, 1);
    let e = write_policy(&mut store, "engine", &first, |p| p.floor = None).expect_err("stale");
    assert!(e.contains("changed by another writer since epoch 0"), "{e}");
    let fresh = snapshot(&mut store, "engine").expect("read");
    assert_eq!(
        write_policy(&mut store, "engine", &fresh, |p| p.floor = None)
            .expect("fresh write")
            .epoch,
        2
    );
    store
        .put("/sup/lease/engine/members/x", "{not json", 0, None)
        .expect("put");
    store
        .put("/sup/lease/engine/leader", "[]", 0, None)
        .expect("put");
    let s = snapshot(&mut store, "engine").expect("read despite garbage");
    assert!(s.members.is_empty() && s.leader.is_none());
}
