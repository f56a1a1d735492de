//! The file store's tests: its operations, and writers that race, lose, are
//! stopped, rotate epochs and find what a stopped or killed writer left. Their
//! `unwrap`s and `expect`s are a test's: a failure there fails the test, never supd.

use super::*;
use std::path::Path;
use std::time::Instant;

/// A directory of the test's own, emptied first; the store's path in it.
fn sandbox(name: &str) -> (crate::scratch::Scratch, PathBuf) {
    let dir = crate::scratch::Scratch::new(&format!("filestore-{name}"));
    let path = dir.join("store.json");
    (dir, path)
}

/// The epochs in `PATH.d`, lowest first, and their generations.
fn epochs(store: &Path) -> Vec<(u64, Vec<u64>)> {
    let mut out: Vec<(u64, Vec<u64>)> = std::fs::read_dir(store)
        .expect("PATH.d")
        .filter_map(|e| {
            let e = e.expect("entry");
            let n = dirs::epoch_of(e.file_name().to_str()?)?;
            let mut gens: Vec<u64> = std::fs::read_dir(e.path())
                .expect("epoch")
                .filter_map(|g| dirs::generation_of(g.expect("entry").file_name().to_str()?))
                .collect();
            gens.sort_unstable();
            Some((n, gens))
        })
        .collect();
    out.sort_unstable();
    out
}

/// The other names in `PATH.d` (temp files, retired epochs).
fn others(store: &Path) -> Vec<String> {
    std::fs::read_dir(store)
        .expect("PATH.d")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| dirs::epoch_of(n).is_none())
        .collect()
}

fn value(s: &mut FileStore, key: &str) -> Option<String> {
    let kvs = s.range(key).expect("range");
    kvs.into_iter().find(|kv| kv.key == key).map(|kv| kv.value)
}

#[test]
fn leases_keys_and_conditions() {
    let (_dir, path) = sandbox("ops");
    let mut s = FileStore::new(path.clone());
    let a = s.grant(Duration::from_secs(10)).expect("grant");
    let b = s.grant(Duration::from_millis(300)).expect("grant");
    let r1 = s
        .put("/x/leader", "a", a, Some(Cond::Absent))
        .expect("put")
        .expect("created");
    assert_eq!(
        s.put("/x/leader", "b", b, Some(Cond::Absent)).expect("put"),
        None,
        "compare-and-create fails"
    );
    assert!(s.check("/x/leader", Cond::Lease(a)).expect("check"));
    assert!(!s.check("/x/leader", Cond::Lease(b)).expect("check"));
    let r2 = s
        .put("/x/leader", "a2", a, Some(Cond::ModRevision(r1)))
        .expect("put")
        .expect("cas");
    assert!(r2 > r1);
    assert_eq!(
        s.put("/x/leader", "z", a, Some(Cond::ModRevision(r1)))
            .expect("put"),
        None,
        "stale cas fails"
    );
    s.put("/x/members/b", "b", b, None).expect("put");
    s.put("/y/other", "o", 0, None).expect("put");
    // b's lease expires by the clock: its key goes with it.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while s.range("/x/").expect("range").len() != 1 {
        assert!(std::time::Instant::now() < deadline);
    }
    assert!(!s.keepalive(b).expect("keepalive"));
    assert!(s.keepalive(a).expect("keepalive"));
    let kvs = s.range("/x/").expect("range");
    assert_eq!(
        (
            kvs[0].key.as_str(),
            kvs[0].value.as_str(),
            kvs[0].create_revision,
            kvs[0].mod_revision
        ),
        ("/x/leader", "a2", r1, r2)
    );
    s.revoke(a).expect("revoke");
    assert!(s.range("/x/").expect("range").is_empty());
    assert!(!s.delete("/y/other", Cond::Lease(5)).expect("delete"));
    assert!(s.delete("/y/other", Cond::Lease(0)).expect("delete"));
}

#[test]
fn a_store_has_an_id_that_a_store_made_anew_does_not_share() {
    let (dir, path) = sandbox("id");
    let mut s = FileStore::new(path.clone());
    let first = s.identity().expect("identity");
    assert!(first.id.starts_with("file:"), "{first:?}");
    s.put("/x/a", "1", 0, None).expect("put");
    let later = s.identity().expect("identity");
    assert_eq!((later.id.as_str(), later.revision), (first.id.as_str(), 1));
    let (kvs, with_range) = s.range_with_identity("/x/").expect("range");
    assert_eq!((kvs.len(), with_range), (1, later.clone()));
    // Started anew as the man page says: PATH.d moved away.
    std::fs::rename(s.dir(), dir.join("away")).expect("mv PATH.d away");
    let anew = s.identity().expect("identity");
    assert_ne!(anew.id, first.id);
    assert_eq!(anew.revision, 0);
    assert!(s.range("/x/").expect("range").is_empty());
}

#[test]
fn a_watch_sees_writes_and_deletions_with_their_last_write_and_wakes_at_an_expiry() {
    let (_dir, path) = sandbox("watch");
    let mut s = FileStore::new(path.clone());
    let soon = || Boot::now().plus(Duration::from_millis(50));
    let Watched::Changes { changes, revision } = s.watch("/x/", 0, soon()).expect("watch") else {
        panic!("no gap from 0");
    };
    assert!(changes.is_empty());
    let a = s.grant(Duration::from_millis(400)).expect("grant");
    let r1 = s.put("/x/leader", "a", a, None).expect("put").expect("rev");
    let r2 = s
        .put("/x/members/a", "a", a, None)
        .expect("put")
        .expect("rev");
    s.put("/y/other", "o", 0, None).expect("put");
    let Watched::Changes { changes, revision } = s.watch("/x/", revision, soon()).expect("watch")
    else {
        panic!("gap");
    };
    let keys: Vec<(&str, u64)> = changes
        .iter()
        .map(|c| (c.key.as_str(), c.revision))
        .collect();
    assert_eq!(keys, [("/x/leader", r1), ("/x/members/a", r2)]);
    // Nothing more: back at the deadline, with nothing.
    let t0 = std::time::Instant::now();
    let w = s.watch("/x/", revision, soon()).expect("watch");
    assert_eq!(
        w,
        Watched::Changes {
            changes: vec![],
            revision
        }
    );
    assert!(t0.elapsed() >= Duration::from_millis(40));
    // The lease runs out with nobody touching the file: the watch sees both keys go
    // in one revision, with their last writes, well before its deadline.
    let t0 = std::time::Instant::now();
    let Watched::Changes { changes, .. } = s
        .watch("/x/", revision, Boot::now().plus(Duration::from_secs(5)))
        .expect("watch")
    else {
        panic!("gap");
    };
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    assert_eq!(changes.len(), 2, "{changes:?}");
    assert!(changes
        .iter()
        .all(|c| c.deleted && c.revision == changes[0].revision));
    assert_eq!((changes[0].prev, changes[1].prev), (r1, r2));
    assert!(matches!(
        s.watch("/x/", 1000, soon()),
        Ok(Watched::Gap { .. })
    ));
}

fn soon() -> Boot {
    Boot::now().plus(Duration::from_secs(2))
}

/// Counts `key` up by one by compare-and-swap, as a candidate would: read, write
/// conditioned on the revision read, again when another writer beat it.
fn count_up(s: &mut FileStore, key: &str) {
    loop {
        let kvs = s.range(key).expect("range");
        let (n, cond) = match kvs.iter().find(|kv| kv.key == key) {
            Some(kv) => (
                kv.value.parse::<u64>().expect("a count"),
                Cond::ModRevision(kv.mod_revision),
            ),
            None => (0, Cond::Absent),
        };
        if s.put(key, &(n + 1).to_string(), 0, Some(cond))
            .expect("put")
            .is_some()
        {
            return;
        }
    }
}

#[test]
fn two_stores_on_one_path_interleave_writes_and_lose_none() {
    let (_dir, path) = sandbox("two");
    let mut a = FileStore::new(path.clone());
    let mut b = FileStore::new(path.clone());
    a.put("/x/a", "1", 0, None).expect("put");
    b.put("/x/b", "1", 0, None).expect("put");
    assert_eq!(value(&mut a, "/x/b").as_deref(), Some("1"));
    assert_eq!(value(&mut b, "/x/a").as_deref(), Some("1"));
    // Two processes' worth of writers at once, across several epochs: no count lost.
    let threads: Vec<_> = (0..2)
        .map(|t| {
            let path = path.clone();
            std::thread::spawn(move || {
                let mut s = FileStore::new(path);
                for i in 0..150 {
                    count_up(&mut s, "/x/count");
                    s.put(&format!("/x/{t}/{i}"), "v", 0, None).expect("put");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a writer");
    }
    assert_eq!(value(&mut a, "/x/count").as_deref(), Some("300"));
    assert_eq!(a.range("/x/").expect("range").len(), 2 + 1 + 300);
    // Every write a revision: 2, then 300 counts and 300 keys.
    assert_eq!(a.identity().expect("identity").revision, 602);
    assert!(epochs(a.dir()).len() <= 2, "{:?}", epochs(a.dir()));
}

#[test]
fn a_writer_that_lost_redoes_its_change_on_the_data_that_won() {
    let (_dir, path) = sandbox("lost");
    let mut a = FileStore::new(path.clone());
    let mut b = FileStore::new(path.clone());
    a.put("/x/seed", "s", 0, None).expect("put");
    // b writes between a's read and a's write: a's write loses, and a's change runs
    // again on data that has b's key.
    let mut runs: Vec<bool> = Vec::new();
    a.with(|d| {
        runs.push(d.kvs.contains_key("/x/b"));
        if runs.len() == 1 {
            b.put("/x/b", "b", 0, None).expect("b's write");
        }
        d.revision += 1;
        let rev = d.revision;
        d.kvs.insert(
            "/x/a".into(),
            Entry {
                value: "a".into(),
                create_revision: rev,
                mod_revision: rev,
                lease: 0,
            },
        );
    })
    .expect("a's write");
    assert_eq!(runs, [false, true]);
    assert_eq!(a.range("/x/").expect("range").len(), 3);
    assert_eq!(a.identity().expect("identity").revision, 3);
    // Two creates of one key, each from the same read: exactly one is made.
    for round in 0..20 {
        let key = format!("/x/leader{round}");
        let threads: Vec<_> = ["a", "b"]
            .into_iter()
            .map(|who| {
                let (path, key) = (path.clone(), key.clone());
                std::thread::spawn(move || {
                    FileStore::new(path)
                        .put(&key, who, 0, Some(Cond::Absent))
                        .expect("put")
                        .is_some()
                })
            })
            .collect();
        let won: Vec<bool> = threads
            .into_iter()
            .map(|t| t.join().expect("a writer"))
            .collect();
        assert_eq!(won.iter().filter(|w| **w).count(), 1, "{won:?}");
    }
}

#[test]
fn past_64_generations_a_new_epoch_keeps_every_key_and_the_revision_and_old_ones_go() {
    let (_dir, path) = sandbox("rotate");
    let mut s = FileStore::new(path.clone());
    for i in 0..300 {
        s.put(&format!("/x/{i}"), &i.to_string(), 0, None)
            .expect("put");
    }
    let mut other = FileStore::new(path.clone());
    assert_eq!(other.range("/x/").expect("range").len(), 300);
    assert_eq!(value(&mut other, "/x/299").as_deref(), Some("299"));
    assert_eq!(other.identity().expect("identity").revision, 300);
    let e = epochs(s.dir());
    // The sealed epoch and the one it goes on in; those before it retired.
    assert_eq!(e.len(), 2, "{e:?}");
    assert!(e[0].0 >= 4, "{e:?}");
    assert_eq!(e[1].0, e[0].0 + 1);
    assert!(e[1].1.len() <= dirs::ROTATE as usize + 1, "{e:?}");
    assert!(others(s.dir()).is_empty(), "{:?}", others(s.dir()));
}

#[test]
fn a_writer_frozen_between_its_read_and_its_write_does_not_land_and_reads_again() {
    let (_dir, path) = sandbox("frozen");
    let mut a = FileStore::new(path.clone());
    let mut b = FileStore::new(path.clone());
    a.put("/x/a", "1", 0, None).expect("put");
    // a read, then froze: its write is for the slot after what it read.
    let near = a.dirs.latest(soon()).expect("read");
    let far = a.dirs.latest(soon()).expect("read");
    let mut stale = near.data.clone();
    stale.revision += 1;
    stale.kvs.clear();
    // Another writer wrote once: the slot is taken.
    b.put("/x/b", "1", 0, None).expect("put");
    assert!(!a.dirs.commit(&near, &stale).expect("commit"), "EEXIST");
    // ... and 200 times, across epochs: a's epoch was retired.
    for i in 0..200 {
        b.put("/x/b", &i.to_string(), 0, None).expect("put");
    }
    let before = epochs(b.dir());
    assert!(before[0].0 > 1, "{before:?}");
    assert!(!a.dirs.commit(&far, &stale).expect("commit"), "ENOENT");
    assert_eq!(epochs(b.dir()), before, "nothing landed anywhere");
    assert_eq!(b.identity().expect("identity").revision, 202);
    // Through the store: a's change is redone on the latest data, nothing lost.
    let mut runs = 0;
    a.with(|d| {
        runs += 1;
        if runs == 1 {
            for _ in 0..200 {
                b.put("/x/c", "c", 0, None).expect("put");
            }
        }
        d.revision += 1;
        d.kvs.remove("/x/a");
    })
    .expect("a's write");
    assert_eq!(runs, 2);
    let keys: Vec<String> = b
        .range("/x/")
        .expect("range")
        .into_iter()
        .map(|kv| kv.key)
        .collect();
    assert_eq!(keys, ["/x/b", "/x/c"]);
    assert_eq!(b.identity().expect("identity").revision, 403);
}

#[test]
fn an_empty_epoch_and_a_seal_without_a_successor_left_behind_are_carried_on() {
    let (_dir, path) = sandbox("leftover");
    let mut s = FileStore::new(path.clone());
    s.put("/x/a", "1", 0, None).expect("put");
    // A helper stopped between making the next epoch and its first generation.
    std::fs::create_dir(s.dir().join("e2")).expect("an empty epoch");
    assert_eq!(value(&mut s, "/x/a").as_deref(), Some("1"));
    s.put("/x/b", "1", 0, None).expect("put");
    assert_eq!(epochs(s.dir()), [(1, vec![0, 1]), (2, vec![])]);
    // A rotating writer killed between its seal and the next epoch: e1 sealed, e2
    // still empty. A reader carries the seal on.
    let mut sealed: serde_json::Value = serde_json::from_slice(
        &std::fs::read(s.dir().join("e1/1")).expect("the latest generation"),
    )
    .expect("json");
    sealed["sealed"] = true.into();
    std::fs::write(s.dir().join("e1/2"), sealed.to_string()).expect("a seal");
    let mut other = FileStore::new(path.clone());
    assert_eq!(other.range("/x/").expect("range").len(), 2);
    assert_eq!(epochs(s.dir()), [(1, vec![0, 1, 2]), (2, vec![0])]);
    other.put("/x/c", "1", 0, None).expect("put");
    assert_eq!(epochs(s.dir())[1], (2, vec![0, 1]));
    // The same with no next epoch at all.
    let mut sealed: serde_json::Value =
        serde_json::from_slice(&std::fs::read(s.dir().join("e2/1")).expect("latest"))
            .expect("json");
    sealed["sealed"] = true.into();
    std::fs::write(s.dir().join("e2/2"), sealed.to_string()).expect("a seal");
    s.put("/x/d", "1", 0, None).expect("put");
    assert_eq!(epochs(s.dir())[2], (3, vec![0, 1]));
    assert_eq!(s.range("/x/").expect("range").len(), 4);
    assert_eq!(s.identity().expect("identity").revision, 4);
}

#[test]
fn an_older_one_file_store_is_imported_once() {
    let (dir, path) = sandbox("import");
    std::fs::write(
        &path,
        r#"{"id":"file:old","revision":7,"next_lease":0,"boot_id":"","leases":{},
            "kvs":{"/x/a":{"value":"v","create_revision":3,"mod_revision":7,"lease":0}},
            "gone":[],"gone_floor":0}"#,
    )
    .expect("an old store");
    let mut s = FileStore::new(path.clone());
    let id = s.identity().expect("identity");
    assert_eq!((id.id.as_str(), id.revision), ("file:old", 7));
    let kvs = s.range("/x/").expect("range");
    assert_eq!(
        (
            kvs[0].key.as_str(),
            kvs[0].value.as_str(),
            kvs[0].create_revision
        ),
        ("/x/a", "v", 3)
    );
    assert_eq!(s.put("/x/b", "w", 0, None).expect("put"), Some(8));
    assert!(!path.exists() && dir.join("store.json.imported").exists());
    // Moved away, the store starts anew: the old file is not imported again.
    std::fs::rename(s.dir(), dir.join("away")).expect("mv");
    assert_eq!(s.identity().expect("identity").revision, 0);
    assert_ne!(s.identity().expect("identity").id, "file:old");
}

#[test]
fn a_watch_sees_every_write_across_epochs_and_a_store_made_after_it_began() {
    let (_dir, path) = sandbox("watch-epochs");
    let mut s = FileStore::new(path.clone());
    // No PATH.d yet: the watch sees it made.
    let writer = {
        let path = path.clone();
        std::thread::spawn(move || {
            let mut w = FileStore::new(path);
            for i in 0..150 {
                w.put("/x/k", &i.to_string(), 0, None).expect("put");
            }
        })
    };
    let mut seen = 0;
    let mut after = 0;
    while after < 150 {
        let t0 = Instant::now();
        match s
            .watch("/x/", after, Boot::now().plus(Duration::from_secs(5)))
            .expect("watch")
        {
            Watched::Changes { changes, revision } => {
                assert!(!changes.is_empty(), "woke for nothing after {after}");
                assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
                assert!(changes
                    .iter()
                    .all(|c| c.revision > after && c.revision <= revision));
                seen += 1;
                after = revision;
            }
            Watched::Gap { revision } => panic!("a gap at {revision} after {after}"),
        }
    }
    writer.join().expect("the writer");
    assert!(seen >= 1);
}

/// Not a test by itself: the writer the next test stops, run as a process of its own
/// (this test binary again): writes as fast as it can, for ever.
#[test]
#[ignore]
fn writer_child() {
    let Some(path) = std::env::var_os("SUP_FILESTORE_WRITER") else {
        return;
    };
    let mut s = FileStore::new(path.into());
    // The count goes up by one, and then says how many of the counts are this
    // writer's: a write of it that did not land shows as a count too few.
    for mine in 1u64.. {
        count_up(&mut s, "/child/count");
        s.put("/child/mine", &mine.to_string(), 0, None)
            .expect("put");
    }
}

/// A process that is stopped, ended as the test ends.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.0.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT);
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn stopped(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("the child's stat");
    let state = stat.rsplit(')').next().expect("stat").trim_start();
    state.starts_with('T') || state.starts_with('t')
}

#[test]
fn a_writer_process_stopped_anywhere_holds_nobody_up_and_lands_nothing_stale() {
    use nix::sys::signal::{kill, Signal};
    let (_dir, path) = sandbox("stopped");
    let child = std::process::Command::new(std::env::current_exe().expect("this test"))
        .args(["--exact", "lease::file::tests::writer_child", "--ignored"])
        .env("SUP_FILESTORE_WRITER", &path)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("the writer");
    let child = Child(child);
    let pid = nix::unistd::Pid::from_raw(child.0.id() as i32);
    let mut s = FileStore::with_timeout(path.clone(), Duration::from_millis(300));
    let count = |s: &mut FileStore| {
        value(s, "/child/count").map_or(0, |v| v.parse::<u64>().expect("a count"))
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while count(&mut s) < 10 {
        assert!(Instant::now() < deadline, "the writer never wrote");
    }
    let mut seed = std::process::id() as u64 ^ Boot::now().as_ms();
    for i in 0..150 {
        // The writer runs on for a random 0-3 ms: the stop lands anywhere in its
        // read, its change, its temp file, its link or a rotation.
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        std::thread::sleep(Duration::from_micros(seed % 3000));
        kill(pid, Signal::SIGSTOP).expect("SIGSTOP");
        let deadline = Instant::now() + Duration::from_secs(5);
        while !stopped(child.0.id()) {
            assert!(Instant::now() < deadline, "the writer did not stop");
        }
        let t0 = Instant::now();
        s.put("/parent/i", &i.to_string(), 0, None)
            .unwrap_or_else(|e| panic!("stop {i}: a write while the writer is stopped: {e}"))
            .expect("a revision");
        count_up(&mut s, "/child/count");
        assert!(
            t0.elapsed() < Duration::from_millis(300),
            "stop {i}: {:?}",
            t0.elapsed()
        );
        let before = count(&mut s);
        kill(pid, Signal::SIGCONT).expect("SIGCONT");
        // Resumed, its stale write must not land over the two made meanwhile.
        let deadline = Instant::now() + Duration::from_secs(10);
        while count(&mut s) < before + 2 {
            assert!(
                Instant::now() < deadline,
                "stop {i}: the writer did not go on"
            );
        }
        assert_eq!(value(&mut s, "/parent/i"), Some(i.to_string()), "stop {i}");
    }
    // Every count made by either is there (the writer may be stopped between a count
    // and saying it made it).
    kill(pid, Signal::SIGSTOP).expect("SIGSTOP");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !stopped(child.0.id()) {
        assert!(Instant::now() < deadline, "the writer did not stop");
    }
    let mine: u64 = value(&mut s, "/child/mine")
        .expect("the writer's own count")
        .parse()
        .expect("a count");
    let total = count(&mut s);
    assert!(
        total == 150 + mine || total == 150 + mine + 1,
        "{total} counts, 150 of them the test's and {mine} the writer's"
    );
    drop(child);
}
