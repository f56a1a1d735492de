//! Leases on the file store (the fast subset): several nodes on one machine, leadership
//! follows upgrades, and two leader-only services never run at once.

mod common;
use common::scenarios;

const TTL: &str = "900ms";

#[test]
fn fleet_leadership_moves_to_the_upgraded_node() {
    scenarios::fleet(None, TTL);
}

#[test]
fn a_crash_looping_upgrade_never_takes_leadership() {
    scenarios::crash_loop(None, TTL);
}

#[test]
fn an_irreversible_leader_raises_the_floor_and_the_operator_lowers_it() {
    scenarios::floor(None, TTL);
}

#[test]
fn pinning_an_older_version_moves_leadership_and_keeps_it() {
    scenarios::pin(None, TTL);
}

#[test]
fn a_killed_or_paused_holder_is_replaced_without_overlap() {
    scenarios::killed_or_paused(None, TTL);
}

#[test]
fn a_holder_whose_engine_is_slow_to_stop_keeps_the_key_until_it_has() {
    scenarios::slow_step_down(None, TTL, 1.3);
}

#[test]
fn a_holder_stepping_down_slower_than_2t_is_not_taken_over() {
    scenarios::slow_step_down(None, TTL, 3.5);
}
