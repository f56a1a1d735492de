//! Leases on the file store, several nodes on one machine: leadership follows upgrades,
//! and two leader-only services never run at once.

mod common;
use common::cluster::*;
use common::*;

#[test]
fn fleet_leadership_moves_to_the_upgraded_node() {
    let c = Cluster::new(&["0.6.2", "0.6.2", "0.6.2"], None, "900ms");
    let first = c.wait_any_leader();
    let other = c
        .nodes
        .iter()
        .find(|n| n.name != first)
        .expect("another node");
    other.install("0.8.1", false);
    other.upgrade("0.8.1", true);
    c.wait_leader(&other.name.clone());
    c.assert_no_overlap();
    let st = c.status_text();
    assert!(
        st.contains(&format!("leader: {} (0.8.1)", other.name)),
        "{st}"
    );
}
