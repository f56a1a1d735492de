//! What a node remembers of a lease across restarts, in a small file of its own: the
//! highest term it saw, which store it saw it in (its identity and revision), and the
//! policy it last read. A store that was wiped or replaced (etcd restarted empty, the
//! file store deleted) starts its revisions from 1 again and has no policy: from this
//! memory the node hands out no lower term (the leader record it writes carries a
//! `min_term`) and writes the policy back (create-if-absent, never over one there).
//!
//! The pure parts ([`Durable::judge`], [`Durable::observe`], [`Durable::min_term`],
//! [`Durable::restore`]) take plain data; [`load`] and [`save`] are the file.

use super::record::Policy;
use super::store::Identity;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The file's content.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Durable {
    /// The highest term this node saw handed out (its own, a leader's, a member's).
    pub term: u64,
    /// The identity of the store it saw it in (empty: unknown).
    pub store: String,
    /// The highest revision of that store it saw.
    pub revision: u64,
    /// The policy it last read from the store, when there was one.
    pub policy: Option<Policy>,
}

/// The file of `lease` in `dir`.
pub fn path(dir: &Path, lease: &str) -> PathBuf {
    dir.join(format!("sup-lease.{lease}.json"))
}

impl Durable {
    /// Why the store seen now is not the one remembered (wiped or replaced), or `None`
    /// when it is the same, or when nothing was remembered yet.
    pub fn judge(&self, seen: &Identity) -> Option<String> {
        if self.store.is_empty() && self.revision == 0 {
            return None;
        }
        if !self.store.is_empty() && !seen.id.is_empty() && seen.id != self.store {
            return Some(format!(
                "the store was replaced: it is {}, it was {} (at revision {}, term {})",
                seen.id, self.store, self.revision, self.term
            ));
        }
        if seen.revision < self.revision {
            return Some(format!(
                "the store was wiped: its revision is {}, below {} seen before (term {})",
                seen.revision, self.revision, self.term
            ));
        }
        None
    }

    /// Takes in what this tick saw: the store's identity, the term of `leader` and the
    /// highest one the members say they saw, and the policy (when the store has one).
    /// The store and revision follow the store (a new one after a wipe); the term only
    /// rises. A policy in the store replaces the one remembered; none keeps it, to be
    /// written back. Whether anything but the revision changed (worth a write now).
    pub fn observe(&mut self, seen: &Identity, terms: &[u64], policy: Option<&Policy>) -> bool {
        let before = self.clone();
        if self.judge(seen).is_some() || self.store != seen.id {
            self.revision = seen.revision;
        }
        self.store = seen.id.clone();
        self.revision = self.revision.max(seen.revision);
        self.term = terms.iter().copied().fold(self.term, u64::max);
        if let Some(p) = policy {
            self.policy = Some(p.clone());
        }
        Durable {
            revision: before.revision,
            ..self.clone()
        } != before
    }

    /// The least term a leadership this node writes may have: one more than any it saw.
    pub fn min_term(&self, members_saw: u64) -> u64 {
        self.term.max(members_saw) + 1
    }

    /// The policy to write back when the store has none (`store_has` false) and this
    /// node remembers one that an operator or a raised floor wrote: its epoch raised by
    /// one, as every policy write does.
    pub fn restore(&self, store_has: bool) -> Option<Policy> {
        if store_has {
            return None;
        }
        let p = self.policy.as_ref().filter(|p| p.epoch > 0)?;
        Some(Policy {
            epoch: p.epoch + 1,
            ..p.clone()
        })
    }
}

/// Reads the file; nothing yet is an empty memory. One that cannot be read is said
/// (an error: terms may go back) and taken as empty.
pub fn load(path: &Path) -> Durable {
    match std::fs::read(path) {
        Ok(b) => serde_json::from_slice(&b).unwrap_or_else(|e| {
            log::error!(
                "{}: cannot read what this node remembers of the lease ({e}): starting afresh; terms it hands out may go back",
                path.display()
            );
            Durable::default()
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Durable::default(),
        Err(e) => {
            log::error!(
                "{}: cannot read what this node remembers of the lease ({e}): starting afresh; terms it hands out may go back",
                path.display()
            );
            Durable::default()
        }
    }
}

/// Writes the file durably (a temp file, fsync, rename, fsync of the directory),
/// making the directory when missing.
pub fn save(path: &Path, d: &Durable) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let bytes = serde_json::to_vec_pretty(d).map_err(std::io::Error::other)?;
    crate::records::atomic_write(path, &bytes, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::record::Strategy;

    fn id(id: &str, revision: u64) -> Identity {
        Identity {
            id: id.into(),
            revision,
        }
    }

    fn floor(v: &str, epoch: u64) -> Policy {
        Policy {
            epoch,
            strategy: Strategy::Newest,
            target: None,
            floor: Some(v.into()),
        }
    }

    #[test]
    fn a_wiped_or_replaced_store_is_told_once() {
        let mut d = Durable::default();
        assert_eq!(d.judge(&id("etcd:1", 3)), None, "nothing remembered yet");
        d.observe(&id("etcd:1", 40), &[25], None);
        assert_eq!(
            d.judge(&id("etcd:1", 41)),
            None,
            "the same store, further on"
        );
        let why = d.judge(&id("etcd:1", 7)).expect("wiped");
        assert!(why.contains("wiped") && why.contains("below 40"), "{why}");
        let why = d.judge(&id("etcd:2", 90)).expect("replaced");
        assert!(why.contains("replaced") && why.contains("etcd:1"), "{why}");
        assert_eq!(d.judge(&id("", 41)), None, "an unknown id: by revision");
        // Once taken in, the new store is the one remembered: said once.
        d.observe(&id("etcd:1", 7), &[], None);
        assert_eq!((d.revision, d.term), (7, 25), "the term stays");
        assert_eq!(d.judge(&id("etcd:1", 8)), None);
    }

    #[test]
    fn the_term_only_rises_and_the_next_one_is_above_all_seen() {
        let mut d = Durable::default();
        assert!(d.observe(&id("f", 5), &[5], None));
        assert!(!d.observe(&id("f", 9), &[5], None), "the revision alone");
        assert!(d.observe(&id("f", 30), &[25, 4], None));
        assert!(
            !d.observe(&id("f", 31), &[3], None),
            "a lower term changes nothing"
        );
        assert_eq!(d.term, 25);
        assert_eq!(d.min_term(0), 26);
        assert_eq!(d.min_term(27), 28, "a member saw a higher one");
    }

    #[test]
    fn the_policy_is_kept_through_a_wipe_and_written_back_once() {
        let mut d = Durable::default();
        assert_eq!(d.restore(false), None, "nothing remembered");
        let p = floor("1.1.0", 4);
        assert!(d.observe(&id("f", 9), &[], Some(&p)));
        assert_eq!(d.restore(true), None, "the store has one");
        // Wiped: no policy in the store; the remembered one stays, to be written back.
        d.observe(&id("f", 2), &[], None);
        assert_eq!(d.restore(false), Some(floor("1.1.0", 5)));
        // The default policy (never written) is nothing to restore.
        let mut fresh = Durable::default();
        fresh.observe(&id("f", 1), &[], Some(&Policy::default()));
        assert_eq!(fresh.restore(false), None);
        // A newer policy in the store replaces the memory.
        d.observe(&id("f", 3), &[], Some(&floor("1.2.0", 1)));
        assert_eq!(d.policy, Some(floor("1.2.0", 1)));
    }

    #[test]
    fn the_file_round_trips_and_a_bad_one_is_empty() {
        let dir = crate::scratch::Scratch::new("memory");
        let p = path(&dir.join("sub"), "engine");
        assert_eq!(load(&p), Durable::default(), "no file yet");
        let mut d = Durable::default();
        d.observe(&id("etcd:1", 40), &[25], Some(&floor("1.1.0", 2)));
        save(&p, &d).expect("save");
        assert_eq!(load(&p), d);
        std::fs::write(&p, "{not json").expect("write");
        assert_eq!(load(&p), Durable::default());
    }
}
