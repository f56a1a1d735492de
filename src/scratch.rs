//! Scratch directories for the unit tests: one per test under the system temp dir,
//! removed when the test passes and kept when it fails, for a look at what it left.
//! Test code alone (`#[cfg(test)]`): its `expect` fails a test, never supd.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// A fresh, empty directory; `&Scratch` is a `&Path`.
pub struct Scratch(PathBuf);

impl Scratch {
    /// `sup-TAG-PID-N`: unique within the run (tests run in threads of one process)
    /// and across runs (a pid left from a killed run is emptied first).
    pub fn new(tag: &str) -> Scratch {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "sup-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a scratch directory under the temp dir");
        Scratch(dir)
    }
}

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}
