//! The few operations leadership needs from a coordination store: leases with a TTL,
//! keys bound to them, revisions, and conditional writes. etcd has them all; the file
//! store imitates them for one host.

use crate::time::Boot;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// A store lease; 0 is "no lease".
pub type LeaseId = i64;

/// One key as the store has it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kv {
    pub key: String,
    pub value: String,
    pub create_revision: u64,
    pub mod_revision: u64,
    pub lease: LeaseId,
}

/// A condition on one key, checked atomically with the write it guards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cond {
    /// The key does not exist (create revision 0).
    Absent,
    /// The key was last written at this revision.
    ModRevision(u64),
    /// The key is bound to this lease.
    Lease(LeaseId),
}

/// Which store this is, and how far it has counted: a store that was wiped or replaced
/// (etcd restarted empty, the file deleted) shows another `id`, or a `revision` below
/// one seen before. An empty `id` is unknown (compared by revision only).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Identity {
    pub id: String,
    pub revision: u64,
}

/// A store that could not answer, or answered nonsense: said, never a crash.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreError(pub String);

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A change a watch saw: `key` written at `revision`, or deleted at `revision` after
/// its last write at `prev` (0: not known).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub key: String,
    pub revision: u64,
    pub deleted: bool,
    pub prev: u64,
}

/// What a watch saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Watched {
    /// Every change after the revision asked for, up to `revision` (to watch on from).
    Changes { changes: Vec<Change>, revision: u64 },
    /// Changes may have been missed; the store's revision now.
    Gap { revision: u64 },
}

/// The operations.
pub trait Store {
    /// A new lease that ends `ttl` after its last renewal.
    fn grant(&mut self, ttl: Duration) -> Result<LeaseId, StoreError>;
    /// Renews a lease; `false` when it is gone.
    fn keepalive(&mut self, id: LeaseId) -> Result<bool, StoreError>;
    /// Ends a lease now, and every key bound to it.
    fn revoke(&mut self, id: LeaseId) -> Result<(), StoreError>;
    /// Every key under `prefix`.
    fn range(&mut self, prefix: &str) -> Result<Vec<Kv>, StoreError>;
    /// Writes `key` (bound to `lease`, or to none when 0) if `cond` holds, or always
    /// when `cond` is `None`; the revision of the write, or `None` when `cond` failed.
    fn put(
        &mut self,
        key: &str,
        value: &str,
        lease: LeaseId,
        cond: Option<Cond>,
    ) -> Result<Option<u64>, StoreError> {
        let conds: Vec<(&str, Cond)> = cond.map(|c| (key, c)).into_iter().collect();
        self.put_when(key, value, lease, &conds)
    }
    /// Writes `key` if every condition holds, each on its own key, in one transaction:
    /// the revision of the write, or `None` when a condition failed.
    fn put_when(
        &mut self,
        key: &str,
        value: &str,
        lease: LeaseId,
        conds: &[(&str, Cond)],
    ) -> Result<Option<u64>, StoreError>;
    /// Deletes `key` if `cond` holds; whether it did.
    fn delete(&mut self, key: &str, cond: Cond) -> Result<bool, StoreError>;
    /// Whether `cond` holds now (a transaction, not a cached read).
    fn check(&mut self, key: &str, cond: Cond) -> Result<bool, StoreError>;
    /// Deletes `key` if `cond` holds and, in the same transaction, writes `marker`
    /// (bound to no lease) with `value`; whether it did. A holder's clean release says
    /// so with it, at the very moment its key goes.
    fn delete_marking(
        &mut self,
        key: &str,
        cond: Cond,
        marker: &str,
        value: &str,
    ) -> Result<bool, StoreError>;
    /// The changes under `prefix` after store revision `after`, in order, waiting for
    /// one until `deadline` (CLOCK_BOOTTIME; never blocks past it by more than a call's
    /// timeout): none at the deadline. A history that no longer reaches back to `after`
    /// (or `after` 0, for a store that has no revision 0) is a [`Watched::Gap`]: read
    /// the keys again and watch on from there.
    fn watch(&mut self, prefix: &str, after: u64, deadline: Boot) -> Result<Watched, StoreError>;
    /// The store's identity and its revision now.
    fn identity(&mut self) -> Result<Identity, StoreError>;
    /// Every key under `prefix` and the store's identity, in one request where the
    /// store can (etcd's answer header names both): a node's tick reads both, and a
    /// request more would eat into its grant's margin.
    fn range_with_identity(&mut self, prefix: &str) -> Result<(Vec<Kv>, Identity), StoreError> {
        let kvs = self.range(prefix)?;
        Ok((kvs, self.identity()?))
    }
}

/// How to reach an etcd store beyond its URLs, as etcdctl takes it: the CA that signed
/// etcd's certificate (`--cacert`), this node's certificate and key for mutual TLS
/// (`--cert`, `--key`), and etcd's authentication (`--user`, the password read from
/// `--password-file`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreOptions {
    pub cacert: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    pub user: Option<String>,
    pub password_file: Option<PathBuf>,
}

impl StoreOptions {
    /// Whether any option is given.
    pub fn any(&self) -> bool {
        *self != StoreOptions::default()
    }
}
