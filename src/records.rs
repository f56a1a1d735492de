//! What supd writes down in `state_dir`: the processes it started (so a new supd can end
//! what a killed one left) and the services an operator stopped (so they stay down).
//!
//! Files are replaced atomically: temp file, rename, and for what must survive a power
//! cut, fsync of the file and of the directory. The pid records skip the fsyncs on
//! purpose: after a power cut no process survives, so there is nothing to find, and an
//! fsync on every spawn would slow every restart.

use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::Path;

/// A process supd started.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PidRecord {
    pub service: String,
    /// The pid, which is also the process group (each service leads its own group).
    pub pid: i32,
    /// Start time from /proc (clock ticks since boot): guards against pid reuse.
    pub start_time: u64,
}

const PIDS: &str = "pids.json";
const DOWN: &str = "down.json";

/// Replaces `path` with `bytes` atomically; `durable` adds the fsyncs.
pub fn atomic_write(path: &Path, bytes: &[u8], durable: bool) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("state");
    let tmp = dir.join(format!(".{name}.tmp"));
    let mut f = File::create(&tmp)?;
    f.write_all(bytes)?;
    if durable {
        f.sync_all()?;
    }
    drop(f);
    fs::rename(&tmp, path)?;
    if durable {
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// Writes the records of every live service process.
pub fn write_pids(state_dir: &Path, records: &[PidRecord]) -> io::Result<()> {
    let bytes = serde_json::to_vec(records).map_err(io::Error::other)?;
    atomic_write(&state_dir.join(PIDS), &bytes, false)
}

/// Reads the records a previous supd left; a missing file is none, a corrupt one is
/// reported and treated as none.
pub fn read_pids(state_dir: &Path) -> Vec<PidRecord> {
    read_json(&state_dir.join(PIDS)).unwrap_or_default()
}

/// Writes the set of services an operator stopped (durably).
pub fn write_down(state_dir: &Path, down: &BTreeSet<String>) -> io::Result<()> {
    let bytes = serde_json::to_vec(down).map_err(io::Error::other)?;
    atomic_write(&state_dir.join(DOWN), &bytes, true)
}

/// Reads the set of services an operator stopped.
pub fn read_down(state_dir: &Path) -> BTreeSet<String> {
    read_json(&state_dir.join(DOWN)).unwrap_or_default()
}

fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Option<T> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return None,
        Err(e) => {
            log::warn!("cannot read {}: {e}", path.display());
            return None;
        }
    };
    match serde_json::from_slice(&bytes) {
        Ok(v) => Some(v),
        Err(e) => {
            log::warn!("{} is corrupt ({e}); ignoring it", path.display());
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_survives_corruption() {
        let dir = std::env::temp_dir().join(format!("sup-records-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("dir");
        assert!(read_pids(&dir).is_empty());
        let recs = vec![PidRecord {
            service: "a".into(),
            pid: 42,
            start_time: 7,
        }];
        write_pids(&dir, &recs).expect("write");
        assert_eq!(read_pids(&dir), recs);
        let down: BTreeSet<String> = ["x".to_string()].into();
        write_down(&dir, &down).expect("write");
        assert_eq!(read_down(&dir), down);
        fs::write(dir.join(PIDS), b"{truncated").expect("write");
        assert!(read_pids(&dir).is_empty());
        assert!(!dir.join(".pids.json.tmp").exists());
    }
}
