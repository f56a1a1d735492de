//! The watch of a lease's keys, in a thread of sup-lease with a store connection of
//! its own: it wakes the campaign for a tick at once when `leader` (or the `released`
//! mark) changes, and keeps what a successor needs to lead at once after a holder's
//! store lease ended ([`Seen::ended`]).
//!
//! Every member writes its `members/NODE` key right after the keepalive it renews its
//! store lease with, and a holder grants supd leadership only after both, so that write
//! follows the keepalive its grant rests on. The watch sees every write without a gap
//! (from one revision to the next) and dates each from when it saw it first, later than
//! the write. When `leader` and its holder's member key vanish in one revision (their
//! store lease expired, or was revoked), the holder's last write, seen at U, bounds
//! the keepalive its last grant rests on: sent before U, so the grant, with its kill
//! grace, ends before U + 3T/4, and a successor leads from U + T (the margin T/4 as in
//! sup-lease(8) TIME AND MARGIN). After an expiry U + T is at once: the store lease
//! ended T after the arrival of that keepalive, later than its send. U is never earlier
//! than the write of `leader` seen: a holder that took the key and was still waiting out
//! an old holder's grant never led, and that grant is bounded from the take.

use super::store::{Change, Store, Watched};
use crate::time::Boot;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the watch learnt, shared with the campaign.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Seen {
    /// Each key's last write seen (revision) and when it was first seen.
    writes: BTreeMap<String, (u64, Boot)>,
    /// The last time `leader` vanished with its holder's store lease: the term it held
    /// (the revision of its last write) and when its holder's last write was seen.
    pub ended: Option<(u64, Boot)>,
}

impl Seen {
    /// Takes in the changes a watch of `prefix` saw (`now`: when); whether `leader` or
    /// `released` changed (a tick is due).
    pub fn apply(&mut self, prefix: &str, changes: &[Change], now: Boot) -> bool {
        let leader = format!("{prefix}leader");
        let released = format!("{prefix}released");
        let mut due = false;
        let mut i = 0;
        while i < changes.len() {
            let rev = changes[i].revision;
            let batch: Vec<&Change> = changes[i..]
                .iter()
                .take_while(|c| c.revision == rev)
                .collect();
            i += batch.len();
            if let Some(l) = batch.iter().find(|c| c.key == leader && c.deleted) {
                // Its holder's member key gone in the same revision, last written
                // where this watch saw it: the holder's store lease ended.
                let member = batch.iter().find_map(|c| {
                    let seen = self.writes.get(&c.key)?;
                    (c.deleted
                        && c.key.starts_with(&format!("{prefix}members/"))
                        && c.prev != 0
                        && seen.0 == c.prev)
                        .then_some(seen.1)
                });
                // And no earlier than the write of `leader` itself: a holder that took
                // the key and waited out an old holder's grant never led; that grant
                // is bounded from the take, which came after its member write. Not
                // seen: no date.
                let taken = (self.writes.get(&leader))
                    .filter(|w| w.0 == l.prev)
                    .map(|w| w.1);
                self.ended = member.zip(taken).map(|(at, t)| (l.prev, at.max(t)));
            }
            for c in batch {
                due |= c.key == leader || c.key == released;
                if c.deleted {
                    self.writes.remove(&c.key);
                } else if self.writes.get(&c.key).is_none_or(|w| w.0 != c.revision) {
                    self.writes.insert(c.key.clone(), (c.revision, now));
                }
            }
        }
        due
    }

    /// After a gap: the keys as read now (seen now); what was seen before is forgotten,
    /// since a write may have been missed.
    pub fn restart(&mut self, keys: &[(String, u64)], now: Boot) {
        self.writes = keys.iter().map(|(k, r)| (k.clone(), (*r, now))).collect();
    }
}

/// Starts the watch of `prefix` on `store` (its own connection); each change of
/// `leader` or `released` is a byte in the pipe it returns. A failing store is tried
/// again a third of `ttl` later, never in a tight loop.
pub fn start(
    open: impl FnOnce() -> Option<Box<dyn Store>> + Send + 'static,
    prefix: String,
    ttl: Duration,
) -> Result<(std::fs::File, Arc<Mutex<Seen>>), String> {
    use nix::fcntl::OFlag;
    let (r, w) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)
        .map_err(|e| format!("pipe: {e}"))?;
    let mut w = std::fs::File::from(w);
    let seen = Arc::new(Mutex::new(Seen::default()));
    let theirs = seen.clone();
    std::thread::Builder::new()
        .name("watch".into())
        .spawn(move || {
            let Some(mut store) = open() else { return };
            let mut after = 0;
            loop {
                // A watch stuck on a dead connection sees nothing: a new one every T/3.
                let result = store.watch(&prefix, after, Boot::now().plus(ttl / 3));
                let now = Boot::now();
                let due = match result {
                    Ok(Watched::Changes { changes, revision }) => {
                        after = revision;
                        let mut s = theirs.lock().unwrap_or_else(|e| e.into_inner());
                        s.apply(&prefix, &changes, now)
                    }
                    Ok(Watched::Gap { revision }) => match store.range(&prefix) {
                        Ok(kvs) => {
                            let keys: Vec<(String, u64)> = kvs
                                .into_iter()
                                .map(|kv| (kv.key, kv.mod_revision))
                                .collect();
                            let mut s = theirs.lock().unwrap_or_else(|e| e.into_inner());
                            s.restart(&keys, now);
                            after = revision;
                            true
                        }
                        Err(e) => {
                            log::debug!("watch {prefix}: {e}");
                            std::thread::sleep(ttl / 3);
                            false
                        }
                    },
                    Err(e) => {
                        // The next watch goes on from the same revision: a history
                        // that no longer reaches back to it is a gap then.
                        log::debug!("watch {prefix}: {e}");
                        std::thread::sleep(ttl / 3);
                        false
                    }
                };
                if due {
                    use std::io::Write as _;
                    let _ = w.write(&[1]);
                }
            }
        })
        .map_err(|e| format!("thread: {e}"))?;
    Ok((std::fs::File::from(r), seen))
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: &str = "/sup/lease/e/";

    fn w(key: &str, revision: u64) -> Change {
        Change {
            key: format!("{P}{key}"),
            revision,
            deleted: false,
            prev: 0,
        }
    }

    fn d(key: &str, revision: u64, prev: u64) -> Change {
        Change {
            key: format!("{P}{key}"),
            revision,
            deleted: true,
            prev,
        }
    }

    /// Review of issue 22: a holder that took the key (over, or empty) and waits out the
    /// old holder's grant has not led; the runs that may still live are the old
    /// holder's, bounded by T after that holder lost the key, which is later than the
    /// new holder's member write of the same tick (a slow store between the two writes:
    /// the range and the put of `leader`). If its store lease then ends (revoked, or
    /// expired), the end must be dated no earlier than its write of `leader`, seen here
    /// at 900, not by its member write seen at 100: a successor would lead T after
    /// 100, while the old holder's grant, with its kill grace, may run until 3T/4
    /// after the key was taken, up to 900.
    #[test]
    fn an_end_is_dated_no_earlier_than_the_write_of_the_leader_key() {
        let mut s = Seen::default();
        let at = |ms| Boot::from_ms(ms);
        s.apply(P, &[w("members/b", 3)], at(100));
        assert!(s.apply(P, &[w("leader", 4)], at(900)));
        assert!(s.apply(P, &[d("leader", 5, 4), d("members/b", 5, 3)], at(1000)));
        assert_eq!(s.ended, Some((4, at(900))));
    }

    #[test]
    fn a_holders_store_lease_that_ended_is_dated_by_its_last_write_seen() {
        let mut s = Seen::default();
        let at = |ms| Boot::from_ms(ms);
        assert!(s.apply(P, &[w("members/a", 3), w("leader", 4)], at(100)));
        assert!(
            !s.apply(P, &[w("members/a", 6)], at(200)),
            "no tick for a member"
        );
        assert!(!s.apply(P, &[w("members/b", 7)], at(250)));
        // The leader (term 4) and a's member key (last written at 6) go in one revision.
        assert!(s.apply(P, &[d("leader", 9, 4), d("members/a", 9, 6)], at(1300)));
        assert_eq!(s.ended, Some((4, at(200))));
        // A write the watch did not see (a gap, then a deletion of a key written at a
        // revision it never saw): no date, the successor waits T.
        let mut s = Seen::default();
        s.restart(
            &[(format!("{P}members/a"), 6), (format!("{P}leader"), 4)],
            at(500),
        );
        assert!(s.apply(P, &[d("leader", 9, 4), d("members/a", 9, 8)], at(900)));
        assert_eq!(s.ended, None);
        // The leader deleted alone (a step-down): no end of a store lease.
        let mut s = Seen::default();
        s.apply(P, &[w("members/a", 3), w("leader", 4)], at(100));
        assert!(s.apply(P, &[d("leader", 5, 4)], at(150)));
        assert_eq!(s.ended, None);
        assert!(!s.apply(P, &[d("members/a", 6, 3)], at(160)));
        assert_eq!(s.ended, None, "the member key went in another revision");
        assert!(s.apply(P, &[w("released", 7)], at(170)), "the mark ticks");
    }
}
