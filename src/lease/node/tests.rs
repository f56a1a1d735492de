use super::*;
use crate::lease::file::FileStore;

#[test]
fn a_node_that_took_the_key_and_waits_out_t_leads_the_tool_for_a_fleet() {
    let path = std::env::temp_dir().join(format!("sup-leads-{}.json", std::process::id()));
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

#[test]
fn a_stale_policy_write_is_refused_and_bad_values_are_skipped() {
    let path = std::env::temp_dir().join(format!("sup-policy-{}.json", std::process::id()));
    let _ = std::fs::remove_file(&path);
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
    let _ = std::fs::remove_file(&path);
}
