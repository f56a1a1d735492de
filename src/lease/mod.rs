//! Leases: leadership for one role across a cluster, following upgrades.
//!
//! `rule` is the pure rule of leadership; `store` the few operations it needs from a
//! coordination store, with a file store (`file`) for one host and etcd's JSON gateway
//! (`etcd`) for a cluster; `record` the JSON kept in the store. `sup-lease` runs the
//! rule every third of the TTL, and at once when `watch` sees `leader` change, and tells
//! supd, which runs the `leader_only` services.

pub mod etcd;
pub mod file;
pub mod memory;
pub mod node;
pub mod record;
pub mod rule;
pub mod store;
pub mod supd;
pub mod watch;
