//! Where each effective key of a service was set: plain data kept beside the services
//! (`Config::origins`), never inside a `ServiceConfig`, so that whether a service changed
//! on reload is decided by its settings alone (a moved line restarts nothing).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Where a service's keys were set.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Origins {
    /// The file that defined the service, then its overrides in the order applied.
    pub files: Vec<PathBuf>,
    /// Each key set (`env.NAME` and `limits.NAME` for their entries): the index in
    /// `files` of the file that won, and the key's line there.
    pub keys: BTreeMap<String, (usize, usize)>,
    /// `instances = N` of the table, 1 unless written (a service holds its index only).
    pub instances: u32,
}

impl Origins {
    /// A service defined in `file`, nothing set yet.
    pub fn new(file: PathBuf) -> Origins {
        Origins {
            files: vec![file],
            keys: BTreeMap::new(),
            instances: 1,
        }
    }

    /// `key` set at `line` of file `file` (an index in `files`).
    pub fn set(&mut self, key: &str, file: usize, line: usize) {
        self.keys.insert(key.to_string(), (file, line));
    }

    /// Where `key` was set: "file:line", or "default".
    pub fn of(&self, key: &str) -> String {
        match self.keys.get(key) {
            Some((f, line)) => match self.files.get(*f) {
                Some(file) => format!("{}:{line}", file.display()),
                None => "default".into(),
            },
            None => "default".into(),
        }
    }
}
