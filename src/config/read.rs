//! Reading one config file without ever waiting on it: only a regular file of bounded
//! size is read.
//!
//! An include glob may match anything a directory holds. A FIFO would block `open` and
//! `read` until someone writes to it (freezing supd's loop during a reload), a character
//! device such as `/dev/zero` never ends. So the file is opened with `O_NONBLOCK` (an
//! open of a FIFO with no writer returns at once), looked at with `fstat` on that very
//! descriptor (no race with a rename), refused unless it is a regular file of at most
//! [`MAX_FILE_SIZE`], and read with the same bound, in case it grows meanwhile.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// The text of a file of the config, or why it is not read (`lastgood.rs` gives a
/// broken file's last good copy, or nothing, in its place).
pub(super) type TextOf<'a> = dyn FnMut(&Path) -> Result<String, String> + 'a;

/// The largest config file read, main or included (supd(8), sup.toml(5)): ample for
/// tens of thousands of services.
pub const MAX_FILE_SIZE: u64 = 4 << 20;

/// The largest `env_file` read (sup.toml(5)).
pub const MAX_ENV_FILE_SIZE: u64 = 1 << 20;

/// The text of `path`, or why it is not read (a sentence without the file's name).
pub fn read_config_file(path: &Path) -> Result<String, String> {
    read_bounded(path, MAX_FILE_SIZE, "config")
}

/// The text of a service's `env_file`, read the same careful way (at each start, in
/// supd's loop: a FIFO or a device must not stall it).
pub fn read_env_file(path: &Path) -> Result<String, String> {
    read_bounded(path, MAX_ENV_FILE_SIZE, "environment")
}

fn read_bounded(path: &Path, max: u64, what: &str) -> Result<String, String> {
    let mut file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| format!("cannot read: {}", plain(&e)))?;
    check_kind(&file, max, what)?;
    let mut bytes = Vec::new();
    (&mut file)
        .take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read: {}", plain(&e)))?;
    if bytes.len() as u64 > max {
        return Err(too_large(max, what));
    }
    String::from_utf8(bytes).map_err(|e| {
        format!(
            "cannot read: not UTF-8 text (invalid byte at offset {})",
            e.utf8_error().valid_up_to()
        )
    })
}

fn check_kind(file: &File, max: u64, what: &str) -> Result<(), String> {
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot read: {}", plain(&e)))?;
    let ft = meta.file_type();
    let kind = if ft.is_file() {
        return if meta.len() > max {
            Err(too_large(max, what))
        } else {
            Ok(())
        };
    } else if ft.is_dir() {
        "a directory"
    } else if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_char_device() {
        "a character device"
    } else if ft.is_block_device() {
        "a block device"
    } else if ft.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    };
    Err(format!(
        "cannot read: {kind}; only regular files are read as {what}"
    ))
}

fn too_large(max: u64, what: &str) -> String {
    format!(
        "cannot read: larger than {} MiB, the most a {what} file may hold",
        max >> 20
    )
}

/// An I/O error as a sentence, without Rust's "(os error N)".
fn plain(e: &std::io::Error) -> String {
    let s = e.to_string();
    match s.find(" (os error") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_and_directories_are_refused_at_once() {
        let zero = read_config_file(Path::new("/dev/zero")).unwrap_err();
        assert!(zero.contains("a character device"), "{zero}");
        let dir = read_config_file(Path::new("/")).unwrap_err();
        assert!(dir.contains("a directory"), "{dir}");
        let missing = read_config_file(Path::new("/nonexistent/sup.toml")).unwrap_err();
        assert_eq!(missing, "cannot read: No such file or directory");
    }

    #[test]
    fn a_fifo_with_no_writer_is_refused_without_waiting() {
        let dir = crate::scratch::Scratch::new("read");
        let fifo = dir.join("fifo.toml");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600))
            .expect("mkfifo");
        // A blocking open would wait here for a writer, forever.
        let why = read_config_file(&fifo).unwrap_err();
        assert!(why.contains("a FIFO"), "{why}");
    }
}
