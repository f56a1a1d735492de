//! Fleet upgrades: one desired version of a tool for a whole fleet, rolled node by node
//! through the store, with every node's status visible from anywhere.
//!
//! `record` is what lives in the store; `rule` the pure rule of a roll for one node;
//! `node` the node's driver (store, supd), `fetch` its fetch in a child process; `artifact` fetches, verifies and
//! unpacks a version, `install` hands it to supd; `admin` the operator's commands (set,
//! status, halt, resume, forget).

pub mod admin;
pub mod artifact;
pub mod fetch;
pub mod install;
pub mod node;
pub mod record;
pub mod rule;
