//! Fleet upgrades on the file store (one host): the same rolls as on etcd.

mod common;
use common::fleet;

const TTL: &str = "1s";

#[test]
fn a_good_version_rolls_one_node_at_a_time_through_kills_and_leadership_follows() {
    fleet::good_roll(None, TTL);
}

#[test]
fn a_bad_version_halts_on_the_canary_and_a_tampered_artifact_is_never_installed() {
    fleet::bad_roll(None, TTL);
}

#[test]
fn an_irreversible_version_pauses_after_its_first_commit_until_the_operator_resumes() {
    fleet::irreversible_roll(None, TTL);
}
