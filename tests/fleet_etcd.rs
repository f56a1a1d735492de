//! Fleet upgrades on a real etcd: four nodes (supd and sup-lease each) on one machine,
//! an artifact server on loopback.

mod common;
use common::etcd::Etcd;
use common::fleet;

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
