//! Fleet upgrades: one desired version of a tool for a whole fleet, rolled node by node
//! through the store, with every node's status visible from anywhere.
//!
//! `record` is what lives in the store; `rule` the pure rule of a roll for one node;
//! `node` the node's driver (store, supd, the fetch); `artifact` fetches, verifies and
//! unpacks a version; `admin` the operator's commands (set, status, halt, resume).

pub mod admin;
pub mod node;
pub mod record;
pub mod rule;
