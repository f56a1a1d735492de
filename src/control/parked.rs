//! The control part's parked answers: the answers owed to parked clients (`stop`,
//! `start`, `restart`, `upgrade --wait`, `lease-release` answer once what they asked for
//! happened), and the stops and restarts held until the services named with them that
//! come after them are down. The coordinator (`supervisor/waiters.rs`,
//! `supervisor/commands.rs`) decides when a waiter is settled and when a held stop may
//! go, on the slots.
//!
//! Across `reexec`, the held stops go over in their order ([`Control::handoff`]); the
//! waiters do not: their clients' connections close with the exec.

use super::Control;
use crate::service::Event;
use crate::time::Mono;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What a parked client waits for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WaitFor {
    /// The services' process groups are gone (`stop`); `many`: answer a list. `running`:
    /// those that had a process when asked (the answer says which needed SIGKILL).
    Down {
        names: Vec<String>,
        many: bool,
        running: Vec<String>,
    },
    /// The services are up, or it is clear they did not start (`start`, `restart`); at
    /// `by` at the latest, the answer says which are not up yet.
    Started {
        names: Vec<String>,
        many: bool,
        by: Mono,
    },
    /// The tool's upgrade committed, rolled back or failed (`upgrade --wait`).
    Upgrade(String),
    /// Every leader-only service of the lease has exited (`lease-release`), or `by` has
    /// come: SIGKILL was sent a while ago and what is left of them is wedged.
    LeaseDown { lease: String, by: Mono },
}

/// A stop or restart of one of several services, held until the services named with it
/// that come `after` it are down: dependents stop first, as at shutdown.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Queued {
    pub name: String,
    pub event: Event,
    pub until_down: Vec<String>,
}

/// An answer owed to a parked client.
pub struct Waiter {
    pub client: u64,
    pub id: Value,
    pub what: WaitFor,
}

/// A held stop or restart as the handoff carries it (format 4).
#[derive(Debug, Serialize, Deserialize)]
pub struct QueuedState {
    name: String,
    /// A restart; else a stop.
    restart: bool,
    until_down: Vec<String>,
}

impl Control {
    /// Parks an answer owed to `client`: its later requests wait until it is answered.
    pub fn park(&mut self, client: u64, id: &Value, what: WaitFor) {
        self.server.set_parked(client, true);
        self.waiters.push(Waiter {
            client,
            id: id.clone(),
            what,
        });
    }

    /// The client `id` is gone: nothing is owed to it any more.
    pub fn forget_client(&mut self, id: u64) {
        self.waiters.retain(|w| w.client != id);
    }

    /// The waiters, taken to be looked at; those not settled are given back with
    /// [`Control::give_back`], in their order.
    pub fn take_waiters(&mut self) -> Vec<Waiter> {
        std::mem::take(&mut self.waiters)
    }

    /// Gives back the waiters not settled, before any parked since they were taken.
    pub fn give_back(&mut self, mut waiters: Vec<Waiter>) {
        waiters.append(&mut self.waiters);
        self.waiters = waiters;
    }

    /// The instants by which waiters must be answered whatever happens.
    pub fn deadlines(&self) -> impl Iterator<Item = Mono> + '_ {
        self.waiters.iter().filter_map(|w| match w.what {
            WaitFor::LeaseDown { by, .. } | WaitFor::Started { by, .. } => Some(by),
            _ => None,
        })
    }

    /// Holds `ev` of `name` until `until_down` are down.
    pub fn hold(&mut self, name: &str, ev: Event, until_down: Vec<String>) {
        self.queued.push(Queued {
            name: name.to_string(),
            event: ev,
            until_down,
        });
    }

    /// Drops the held stops and restarts of `names`; returns the services they held
    /// down (to be looked at again).
    pub fn drop_held(&mut self, names: &[String]) -> Vec<String> {
        let released = (self.queued.iter())
            .filter(|q| names.contains(&q.name))
            .flat_map(|q| q.until_down.iter().cloned())
            .collect();
        self.queued.retain(|q| !names.contains(&q.name));
        released
    }

    /// Drops every held stop and restart (a shutdown stops everything anyway).
    pub fn clear_held(&mut self) {
        self.queued.clear();
    }

    /// The held stop or restart of `name`, if any.
    pub fn held(&self, name: &str) -> Option<&Queued> {
        self.queued.iter().find(|q| q.name == name)
    }

    /// Every held stop and restart, in order.
    pub fn all_held(&self) -> &[Queued] {
        &self.queued
    }

    /// Whether `name` is held down, waited for by a held stop or restart of a service
    /// it comes after.
    pub fn holds_down(&self, name: &str) -> bool {
        (self.queued.iter()).any(|q| q.until_down.iter().any(|d| d == name))
    }

    /// The first held stop or restart whose services are all down, taken.
    pub fn next_ready(&mut self, is_down: impl Fn(&str) -> bool) -> Option<Queued> {
        let i = (self.queued.iter()).position(|q| q.until_down.iter().all(|d| is_down(d)))?;
        Some(self.queued.remove(i))
    }

    /// What this part carries across `reexec`: the held stops and restarts, in order.
    pub fn handoff(&self) -> Vec<QueuedState> {
        (self.queued.iter())
            .filter_map(|q| {
                let restart = match q.event {
                    Event::Restart => true,
                    Event::Stop => false,
                    // Only stops and restarts are held (`dependents_first`).
                    _ => return None,
                };
                Some(QueuedState {
                    name: q.name.clone(),
                    restart,
                    until_down: q.until_down.clone(),
                })
            })
            .collect()
    }

    /// Takes over what a previous image carried: its held stops and restarts of the
    /// services `known` (the others left with the config).
    pub fn restore_held(&mut self, queued: Vec<QueuedState>, known: impl Fn(&str) -> bool) {
        self.queued = (queued.into_iter())
            .filter(|q| known(&q.name))
            .map(|q| Queued {
                name: q.name,
                event: if q.restart {
                    Event::Restart
                } else {
                    Event::Stop
                },
                until_down: q.until_down,
            })
            .collect();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::Server;

    fn control() -> Control {
        Control::new(Server::for_tests())
    }

    #[test]
    fn held_stops_go_in_order_once_their_dependents_are_down_and_cross_a_reexec() {
        let mut c = control();
        c.hold("db", Event::Stop, vec!["web".into()]);
        c.hold("cache", Event::Restart, vec!["web".into(), "api".into()]);
        assert!(c.holds_down("api") && !c.holds_down("db"));
        let carried = serde_json::to_value(c.handoff()).expect("writes");
        assert_eq!(
            carried,
            serde_json::json!([
                {"name": "db", "restart": false, "until_down": ["web"]},
                {"name": "cache", "restart": true, "until_down": ["web", "api"]},
            ]),
            "the format 4 shape"
        );
        let back: Vec<QueuedState> = serde_json::from_value(carried).expect("reads");
        let mut c = control();
        c.restore_held(back, |n| n != "gone");
        assert!(c.next_ready(|d| d == "api").is_none(), "web is up");
        let q = c
            .next_ready(|d| d == "web")
            .expect("db's dependents are down");
        assert_eq!((q.name.as_str(), q.event), ("db", Event::Stop));
        assert_eq!(c.drop_held(&["cache".into()]), vec!["web", "api"]);
        assert!(c.all_held().is_empty());
    }

    #[test]
    fn waiters_given_back_come_before_those_parked_meanwhile() {
        let mut c = control();
        c.park(1, &Value::from(1), WaitFor::Upgrade("a".into()));
        c.park(4, &Value::from(4), WaitFor::Upgrade("d".into()));
        c.forget_client(4);
        c.park(2, &Value::from(2), WaitFor::Upgrade("b".into()));
        let taken = c.take_waiters();
        c.park(3, &Value::from(3), WaitFor::Upgrade("c".into()));
        c.give_back(taken.into_iter().filter(|w| w.client == 2).collect());
        let left: Vec<u64> = c.take_waiters().iter().map(|w| w.client).collect();
        assert_eq!(left, vec![2, 3]);
    }
}
