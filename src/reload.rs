//! `reload`: the config read again, outside the loop.
//!
//! Reading and checking tens of thousands of services takes a tenth of a second or more,
//! and the loop must not be deaf for that long (an exit to restart, a SIGTERM with a
//! shutdown timeout). So a forked child reads the config, compares it with the services
//! supd has (its copy of them, as they were at the fork), and writes back over a pipe
//! only what differs: the errors, or the `[supd]` table, the leases, the files, the
//! removed names and the definitions added or changed. The loop polls that pipe and
//! applies the difference when it ends: an unchanged reload costs the loop nothing but
//! the fork.
//!
//! One read at a time: a reload asked for while one runs waits for the next read (the
//! running one may have read the files before the edit that prompted it). Only a reload
//! changes a slot's definition, so the difference computed at the fork still holds when
//! it is applied; each name is checked again against the slots all the same.
//! When the fork fails, the config is read in the loop, as before. A config that loads
//! has the last good copies of its files refreshed by whoever read it
//! (`config/lastgood.rs`).

use crate::config::{LeaseConfig, Origins, ServiceConfig, SupdConfig};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::path::PathBuf;

/// The most a helper may write back (the definitions of every service, when all change).
const ANSWER_MAX: usize = 256 << 20;

/// What a new config changes, relative to the slots at the fork.
#[derive(Debug, Serialize, Deserialize)]
pub struct Delta {
    pub supd: SupdConfig,
    pub leases: BTreeMap<String, LeaseConfig>,
    pub files: Vec<PathBuf>,
    /// Services that are new, changed, or defined again after a removal.
    pub defs: BTreeMap<String, ServiceConfig>,
    /// Services the config no longer has.
    pub removed: Vec<String>,
    /// Where the keys of services were set, for those whose origins differ from supd's
    /// (`show`): apart from `defs`, so a moved line changes no service.
    #[serde(default)]
    pub origins: BTreeMap<String, Origins>,
}

/// A helper reading the config, and who waits for its answer.
pub struct Job {
    pid: i32,
    pipe: File,
    answer: Vec<u8>,
    /// Clients (connection, request id) answered when this read ends.
    waiting: Vec<(u64, Value)>,
    /// Asked for after the fork: another read follows, for these clients.
    again: Option<Vec<(u64, Value)>>,
}

/// A reader's answer, once it ended.
pub struct Finished {
    /// The difference, the config's errors, or why the reader failed.
    pub result: Result<Result<Delta, Vec<String>>, String>,
    /// The reader, for the message.
    pub pid: i32,
    /// Clients answered now.
    pub waiting: Vec<(u64, Value)>,
    /// Clients that asked after the fork: another read is for them.
    pub again: Option<Vec<(u64, Value)>>,
}

impl Job {
    /// The reader `pid` writes to `pipe`; `waiting` are answered when it is done.
    pub fn new(pid: i32, pipe: File, waiting: Vec<(u64, Value)>) -> Job {
        Job {
            pid,
            pipe,
            answer: Vec::new(),
            waiting,
            again: None,
        }
    }

    /// The pipe the loop polls.
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.pipe.as_fd()
    }

    /// The reader's pid.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// A reload asked for while this one reads: another read follows, for `client`.
    pub fn ask_again(&mut self, client: Option<(u64, Value)>) {
        self.again.get_or_insert_with(Vec::new).extend(client);
    }

    /// Reads what the reader wrote: `None` while more is to come, else the end (`Ok`
    /// at end-of-file, or why the answer is cut).
    pub fn read(&mut self) -> Option<Result<(), String>> {
        let mut chunk = [0u8; 64 << 10];
        loop {
            match self.pipe.read(&mut chunk) {
                Ok(0) => return Some(Ok(())),
                Ok(n) if self.answer.len() + n > ANSWER_MAX => {
                    return Some(Err("its answer is too large".to_string()))
                }
                Ok(n) => self.answer.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return None,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Some(Err(e.to_string())),
            }
        }
    }

    /// The reader ended (`end`, from [`Job::read`]): its answer, and who waits for it.
    pub fn finish(self, end: Result<(), String>) -> Finished {
        let result = end.and_then(|()| {
            serde_json::from_slice::<Result<Delta, Vec<String>>>(&self.answer)
                .map_err(|e| format!("its answer is not readable ({e})"))
        });
        Finished {
            result,
            pid: self.pid,
            waiting: self.waiting,
            again: self.again,
        }
    }
}
