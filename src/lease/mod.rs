//! Leases: leadership for one role across a cluster, following upgrades.
//!
//! `rule` is the pure rule of leadership; `store` the few operations it needs from a
//! coordination store, with a file store (`file`) for one host and etcd's JSON gateway
//! (`etcd`) for a cluster, opened by `open_with` here (so that the store's trait
//! does not import its stores); `record` the JSON kept in the store. `sup-lease` runs the
//! rule every third of the TTL, and at once when `watch` sees `leader` change, and tells
//! supd, which runs the `leader_only` services.

pub mod etcd;
pub mod file;
pub mod memory;
pub mod node;
pub mod record;
pub mod rule;
pub mod snapshot;
pub mod store;
pub mod supd;
pub mod watch;

use std::time::Duration;
use store::{Store, StoreError, StoreOptions};

/// Opens `file:PATH` or `etcd:http://HOST:PORT`; a call gives up after `timeout`.
pub fn open(spec: &str, timeout: Duration) -> Result<Box<dyn Store>, StoreError> {
    open_with(spec, timeout, &StoreOptions::default())
}

/// Opens `file:PATH`, or `etcd:URL,URL,...` (`http://` or `https://` endpoints) reached
/// with `opts`; a call gives up after `timeout`, whichever endpoints it tries.
pub fn open_with(
    spec: &str,
    timeout: Duration,
    opts: &StoreOptions,
) -> Result<Box<dyn Store>, StoreError> {
    if let Some(path) = spec.strip_prefix("file:") {
        if opts.any() {
            return Err(StoreError(format!(
                "'{spec}': --cacert, --cert, --key, --user and --password-file are for an \
                 etcd store (etcd:https://HOST:PORT,...); a file store takes none"
            )));
        }
        return Ok(Box::new(file::FileStore::with_timeout(
            path.into(),
            timeout,
        )));
    }
    if let Some(urls) = spec.strip_prefix("etcd:") {
        return Ok(Box::new(etcd::EtcdStore::new(urls, timeout, opts)?));
    }
    Err(StoreError(format!(
        "'{spec}' is not a store: use file:PATH or etcd:http://HOST:PORT[,http://HOST:PORT...]"
    )))
}
