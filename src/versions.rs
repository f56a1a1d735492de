//! Tool directories on disk: `tools_dir/TOOL/VERSION/` and the relative symlink
//! `tools_dir/TOOL/current`; the version manifest `sup-tool.toml`; the upgrade records in
//! `state_dir/tool-records/TOOL.json` (moved there from `state_dir/tools`, by default
//! `tools_dir` itself, where a tool's name could be a record's). File system only; the decisions are in `upgrade`.
//!
//! Every change is atomic and durable: a version appears by a rename of a hidden
//! directory, `current` switches by a rename of a temporary symlink, a record is replaced
//! by a rename of an fsynced temporary file; then the directory is fsynced.

use crate::records::atomic_write;
use crate::upgrade::Record;
use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};

/// The mode of the directories supd makes in `tools_dir`: services run as a user must
/// reach and run their versions.
pub const PUBLIC_DIR: u32 = 0o755;

/// The name of the link to the version in use.
pub const CURRENT: &str = "current";
/// The optional manifest of a version.
pub const MANIFEST: &str = "sup-tool.toml";

/// A version name is a semver version without build metadata: "1.4.0", "2.0.0-rc.1".
pub fn check_version(v: &str) -> Result<(), String> {
    match semver::Version::parse(v) {
        Ok(ver) if ver.build.is_empty() => Ok(()),
        Ok(_) => Err(format!(
            "'{v}' has build metadata (+...): a version name is a semver version without it"
        )),
        Err(_) => Err(format!(
            "'{v}' is not a version: a name such as 1.4.0 or 2.0.0-rc.1 is expected"
        )),
    }
}

/// A tool name is fit to be a directory name.
pub fn check_tool(t: &str) -> Result<(), String> {
    if crate::config::valid_name(t) {
        Ok(())
    } else {
        Err(format!(
            "'{t}' is not a tool name: letters, digits, '-', '_', '.', not starting with '.'"
        ))
    }
}

pub fn tool_dir(tools_dir: &Path, tool: &str) -> PathBuf {
    tools_dir.join(tool)
}

/// The version `current` names, if it names one.
pub fn current(tools_dir: &Path, tool: &str) -> Option<String> {
    let target = fs::read_link(tool_dir(tools_dir, tool).join(CURRENT)).ok()?;
    target.file_name()?.to_str().map(str::to_string)
}

/// Installed versions, oldest first (semver order). Hidden and odd names are skipped.
pub fn installed(tools_dir: &Path, tool: &str) -> Vec<String> {
    let Ok(dir) = fs::read_dir(tool_dir(tools_dir, tool)) else {
        return Vec::new();
    };
    let mut vs: Vec<semver::Version> = dir
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| semver::Version::parse(n).ok())
        })
        .filter(|v| v.build.is_empty())
        .collect();
    vs.sort();
    vs.iter().map(ToString::to_string).collect()
}

pub fn is_installed(tools_dir: &Path, tool: &str, version: &str) -> bool {
    check_version(version).is_ok() && tool_dir(tools_dir, tool).join(version).is_dir()
}

/// Points `current` at `version`: a new relative symlink renamed over the old one, then
/// the directory fsynced. At every instant `current` names the old or the new version.
pub fn switch(tools_dir: &Path, tool: &str, version: &str) -> Result<Switched, io::Error> {
    let dir = tool_dir(tools_dir, tool);
    let tmp = dir.join(".current.tmp");
    let _ = fs::remove_file(&tmp);
    std::os::unix::fs::symlink(version, &tmp)?;
    fs::rename(&tmp, dir.join(CURRENT))?;
    // Renamed: `current` names the version now, whatever follows. A failed fsync of the
    // directory only leaves which link a power cut keeps open, and the record, written
    // before, explains both.
    let synced = if crate::failpoint::error_at("switch-fsync-fails") {
        Err(io::Error::from_raw_os_error(nix::libc::EIO))
    } else {
        File::open(&dir).and_then(|d| d.sync_all())
    };
    Ok(match synced {
        Ok(()) => Switched::Durable,
        Err(e) => Switched::NotSynced(e),
    })
}

/// A switch that was made: durable, or renamed but with the directory's fsync failed.
#[derive(Debug)]
pub enum Switched {
    Durable,
    NotSynced(io::Error),
}

/// Whether the version's manifest says it may not be gone back from once it has run.
pub fn irreversible(version_dir: &Path) -> Result<bool, String> {
    let path = version_dir.join(MANIFEST);
    let text = match fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| format!("{}: {}", path.display(), e.message()))?;
    let mut revertible = true;
    for (k, v) in &table {
        match (k.as_str(), v) {
            ("revertible", toml::Value::Boolean(b)) => revertible = *b,
            ("revertible", _) => {
                return Err(format!(
                    "{}: revertible: expected true or false",
                    path.display()
                ))
            }
            (other, _) => {
                return Err(format!(
                    "{}: {other}: unknown key (expected: revertible)",
                    path.display()
                ))
            }
        }
    }
    Ok(!revertible)
}

/// The directory of the records in `state_dir`: a name that is neither `tools_dir`'s
/// default (`/var/lib/sup/tools`, which held them before, so that a tool named
/// `web.json` was the record of `web`) nor inside any `tools_dir` (`check_layout`).
pub const RECORDS: &str = "tool-records";

/// Where older supds kept the records (by default, `tools_dir` itself).
const OLD_RECORDS: &str = "tools";

/// Where the records live.
pub fn records_dir(state_dir: &Path) -> PathBuf {
    state_dir.join(RECORDS)
}

/// The file of a tool's record.
pub fn record_path(state_dir: &Path, tool: &str) -> PathBuf {
    records_dir(state_dir).join(format!("{tool}.json"))
}

/// `p` without `.` and with each `..` taken back (paths compared as written).
fn lexical(p: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// `p` with its longest existing ancestor resolved (symbolic links followed), the rest
/// as written.
fn resolved(p: &Path) -> PathBuf {
    let p = lexical(p);
    let mut rest = Vec::new();
    let mut head = p.as_path();
    loop {
        if let Ok(real) = fs::canonicalize(head) {
            return rest.iter().rev().fold(real, |acc, c| acc.join(c));
        }
        match (head.parent(), head.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_os_string());
                head = parent;
            }
            _ => return p,
        }
    }
}

/// Refuses a `tools_dir` that holds the records' directory, or lies inside it, as
/// written or through symbolic links: a tool's name could then be a record's (config
/// check).
pub fn check_layout(state_dir: &Path, tools_dir: &Path) -> Result<(), String> {
    let overlap = |records: PathBuf, tools: PathBuf| {
        records.starts_with(&tools) || tools.starts_with(&records)
    };
    let records = records_dir(state_dir);
    if overlap(lexical(&records), lexical(tools_dir))
        || overlap(resolved(&records), resolved(tools_dir))
    {
        let records = lexical(&records);
        return Err(format!(
            "tools_dir {} and {} (where supd keeps the tool records, in state_dir) overlap: a tool's name could be a record's; set tools_dir to a directory of its own (by default /var/lib/sup/tools)",
            tools_dir.display(),
            records.display()
        ));
    }
    Ok(())
}

/// Moves the record of `tool` from where older supds kept it (`state_dir/tools`, by
/// default `tools_dir`) to `records_dir`: only a regular file (never a tool's
/// directory, as `web.json` is for the tool of that name), by a rename (a copy, fsynced,
/// across file systems) and fsyncs of both directories, so that a supd killed at any
/// moment leaves the record in one place or the other, whole. Where both places hold
/// one, the new one wins and the old goes. The caller names only a configured or
/// installed tool.
pub fn migrate_record(state_dir: &Path, tool: &str) -> io::Result<bool> {
    let old_dir = state_dir.join(OLD_RECORDS);
    let old = old_dir.join(format!("{tool}.json"));
    match fs::symlink_metadata(&old) {
        Ok(m) if m.is_file() => {}
        Ok(_) => return Ok(false),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    }
    let dir = records_dir(state_dir);
    crate::records::create_dirs(&dir, crate::records::PRIVATE_DIR)?;
    let new = dir.join(format!("{tool}.json"));
    let new_there = match fs::symlink_metadata(&new) {
        Ok(m) if m.is_file() => true,
        Ok(_) => {
            return Err(io::Error::other(format!(
                "{} is not a file: {} is left where it is",
                new.display(),
                old.display()
            )))
        }
        Err(_) => false,
    };
    if !new_there {
        match fs::rename(&old, &new) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(nix::libc::EXDEV) => {
                atomic_write(&new, &fs::read(&old)?, true)?;
            }
            Err(e) => return Err(e),
        }
        File::open(&dir)?.sync_all()?;
    }
    // The new one is durable (written so, or renamed and its directory synced): the
    // old one may go.
    match fs::remove_file(&old) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    File::open(&old_dir)?.sync_all()?;
    Ok(!new_there)
}

/// The tools installed in `tools_dir`: its directories named as tools are.
pub fn installed_tools(tools_dir: &Path) -> Vec<String> {
    let Ok(dir) = fs::read_dir(tools_dir) else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter(|t| check_tool(t).is_ok())
        .collect()
}

/// Reads a tool's record: `Ok(None)` when there is none yet, `Err` when it is unreadable
/// or corrupt (the caller reports it and goes on from the link).
pub fn load_record(state_dir: &Path, tool: &str) -> Result<Option<Record>, String> {
    let path = record_path(state_dir, tool);
    match fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| format!("{} is corrupt: {e}", path.display())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}

/// Keeps a corrupt record aside for a person to look at.
pub fn set_aside(state_dir: &Path, tool: &str) {
    let path = record_path(state_dir, tool);
    let _ = fs::rename(&path, path.with_extension("json.corrupt"));
}

/// Replaces a tool's record, durably.
pub fn save_record(state_dir: &Path, tool: &str, r: &Record) -> io::Result<()> {
    let dir = records_dir(state_dir);
    crate::records::create_dirs(&dir, crate::records::PRIVATE_DIR)?;
    let bytes = serde_json::to_vec_pretty(r).map_err(io::Error::other)?;
    atomic_write(&record_path(state_dir, tool), &bytes, true)
}

/// The hidden directory an install copies into, beside the versions.
pub fn install_tmp(tools_dir: &Path, tool: &str, version: &str) -> PathBuf {
    tool_dir(tools_dir, tool).join(format!(".install-{version}"))
}

/// Checks an install before any file is touched, then makes the hidden staging
/// directory (so it exists, and is known to be this install's, for the whole copy).
/// Returns it, and the staging a dead install left under that name, moved aside for
/// deletion. The caller has made sure no live install uses that name.
pub fn prepare_install(
    tools_dir: &Path,
    tool: &str,
    version: &str,
    src: &Path,
) -> Result<(PathBuf, Option<PathBuf>), String> {
    check_tool(tool)?;
    check_version(version)?;
    if !src.is_dir() {
        return Err(format!("{} is not a directory", src.display()));
    }
    let dest = tool_dir(tools_dir, tool).join(version);
    if dest.exists() {
        return Err(format!("version {version} of {tool} is already installed"));
    }
    let tmp = install_tmp(tools_dir, tool, version);
    crate::records::create_dirs(&tool_dir(tools_dir, tool), PUBLIC_DIR)
        .map_err(|e| format!("{}: {e}", tools_dir.display()))?;
    let leftover =
        hide_leftover(&tmp).map_err(|e| format!("cannot move {} aside: {e}", tmp.display()))?;
    // Private from its first moment, whatever supd's umask (0 as an init): nobody else
    // may drop a file into it before the copy starts (the copy sets the source's mode
    // at its end).
    std::os::unix::fs::DirBuilderExt::mode(&mut fs::DirBuilder::new(), 0o700)
        .create(&tmp)
        .map_err(|e| format!("cannot create {}: {e}", tmp.display()))?;
    Ok((tmp, leftover))
}

/// Renames a leftover directory to a fresh `.prune-…` name, at once, so that its name is
/// free and nothing mistakes it for live; returns the new name, for a helper to delete
/// (`None` when there was nothing, or it was a mere file, removed).
pub fn hide_leftover(p: &Path) -> io::Result<Option<PathBuf>> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let meta = match fs::symlink_metadata(p) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    if !meta.is_dir() {
        fs::remove_file(p)?;
        return Ok(None);
    }
    let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("x");
    if name.starts_with(".prune-") {
        return Ok(Some(p.to_path_buf()));
    }
    let hidden = p.with_file_name(format!(
        ".prune-{}-{}-{}",
        name.trim_start_matches('.'),
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    fs::rename(p, &hidden)?;
    Ok(Some(hidden))
}

/// Moves a finished copy into place: the version appears whole or not at all.
pub fn finish_install(tools_dir: &Path, tool: &str, version: &str) -> io::Result<()> {
    let dir = tool_dir(tools_dir, tool);
    let dest = dir.join(version);
    if dest.exists() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("version {version} appeared meanwhile"),
        ));
    }
    fs::rename(install_tmp(tools_dir, tool, version), &dest)?;
    File::open(&dir)?.sync_all()
}

/// Takes versions out of sight at once (a rename each); returns the hidden directories,
/// to be deleted by a helper process.
pub fn hide_for_pruning(
    tools_dir: &Path,
    tool: &str,
    versions: &[String],
) -> io::Result<Vec<PathBuf>> {
    let dir = tool_dir(tools_dir, tool);
    let mut hidden = Vec::new();
    for v in versions {
        let h = dir.join(format!(".prune-{v}"));
        fs::rename(dir.join(v), &h)?;
        hidden.push(h);
    }
    File::open(&dir)?.sync_all()?;
    Ok(hidden)
}

/// Hidden leftovers of an interrupted install, prune or switch.
pub fn leftovers(tools_dir: &Path, tool: &str) -> Vec<PathBuf> {
    let Ok(dir) = fs::read_dir(tool_dir(tools_dir, tool)) else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n.starts_with(".install-") || n.starts_with(".prune-") || n == ".current.tmp"
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> crate::scratch::Scratch {
        crate::scratch::Scratch::new(&format!("versions-{name}"))
    }

    #[test]
    fn version_names() {
        for ok in ["1.4.0", "2.0.0-rc.1", "0.0.1"] {
            assert!(check_version(ok).is_ok(), "{ok}");
        }
        for bad in [
            "../x",
            "latest",
            "1.2",
            "v1.2.3",
            "1.2.3+build5",
            "",
            "current",
        ] {
            assert!(check_version(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn switching_and_listing() {
        let t = scratch("switch");
        for v in ["1.10.0", "1.2.0", "2.0.0-rc.1", ".install-3.0.0", "junk"] {
            fs::create_dir_all(t.join("agent").join(v)).expect("mkdir");
        }
        assert_eq!(installed(&t, "agent"), ["1.2.0", "1.10.0", "2.0.0-rc.1"]);
        assert_eq!(current(&t, "agent"), None);
        switch(&t, "agent", "1.2.0").expect("switch");
        assert_eq!(current(&t, "agent").as_deref(), Some("1.2.0"));
        switch(&t, "agent", "1.10.0").expect("switch again");
        assert_eq!(
            fs::read_link(t.join("agent/current")).expect("link"),
            PathBuf::from("1.10.0"),
            "relative"
        );
        assert_eq!(leftovers(&t, "agent"), vec![t.join("agent/.install-3.0.0")]);
    }

    #[test]
    fn manifests() {
        let t = scratch("manifest");
        assert_eq!(irreversible(&t), Ok(false));
        fs::write(t.join(MANIFEST), "revertible = false\n").expect("write");
        assert_eq!(irreversible(&t), Ok(true));
        fs::write(t.join(MANIFEST), "revertible = true\n").expect("write");
        assert_eq!(irreversible(&t), Ok(false));
        fs::write(t.join(MANIFEST), "reversible = false\n").expect("write");
        assert!(irreversible(&t).expect_err("typo").contains("unknown key"));
    }

    #[test]
    fn records_round_trip_and_corruption_is_an_error() {
        let t = scratch("records");
        assert_eq!(load_record(&t, "agent"), Ok(None));
        let r = Record {
            current: Some("1.0.0".into()),
            ..Record::default()
        };
        save_record(&t, "agent", &r).expect("save");
        assert_eq!(load_record(&t, "agent"), Ok(Some(r)));
        fs::write(t.join("tool-records/agent.json"), "{\"current\": ").expect("truncate");
        assert!(load_record(&t, "agent")
            .expect_err("corrupt")
            .contains("is corrupt"));
        set_aside(&t, "agent");
        assert_eq!(load_record(&t, "agent"), Ok(None));
        assert!(t.join("tool-records/agent.json.corrupt").exists());
    }

    #[test]
    fn records_move_from_the_old_place_and_the_new_one_wins() {
        let t = scratch("migrate");
        let r = |v: &str| Record {
            current: Some(v.into()),
            ..Record::default()
        };
        let old = |tool: &str| t.join(format!("tools/{tool}.json"));
        fs::create_dir_all(t.join("tools/db")).expect("tools");
        fs::write(old("db"), serde_json::to_vec(&r("1.0.0")).expect("json")).expect("old");
        // Only the old one: moved, whole.
        assert!(migrate_record(&t, "db").expect("moved"));
        assert!(!old("db").exists());
        assert_eq!(load_record(&t, "db"), Ok(Some(r("1.0.0"))));
        // Both (a move cut short after the new one was made): the new one wins.
        fs::write(old("db"), serde_json::to_vec(&r("0.9.0")).expect("json")).expect("old");
        assert!(!migrate_record(&t, "db").expect("old dropped"));
        assert!(!old("db").exists());
        assert_eq!(load_record(&t, "db"), Ok(Some(r("1.0.0"))));
        // A directory (the tool web.json, where an older supd looked for web's record)
        // is never moved; nothing there is nothing to do.
        fs::create_dir_all(t.join("tools/web.json/1.0.0")).expect("a tool named web.json");
        assert!(!migrate_record(&t, "web").expect("a directory"));
        assert!(!migrate_record(&t, "cache").expect("nothing"));
        assert!(t.join("tools/web.json/1.0.0").is_dir());
        assert_eq!(load_record(&t, "web"), Ok(None));
    }

    #[test]
    fn tools_dir_may_not_hold_the_records() {
        let p = Path::new;
        assert!(check_layout(p("/var/lib/sup"), p("/var/lib/sup/tools")).is_ok());
        assert!(check_layout(p("/srv/state"), p("/srv/tools")).is_ok());
        assert!(check_layout(p("/var/lib/sup"), p("/var/lib/sup/tool-records-x")).is_ok());
        for tools in [
            "/var/lib/sup",
            "/var/lib",
            "/",
            "/var/lib/sup/tool-records",
            "/var/lib/sup/tool-records/x",
            "/var/lib/sup/tools/../.",
        ] {
            assert!(
                check_layout(p("/var/lib/sup"), p(tools)).is_err(),
                "{tools}"
            );
        }
    }

    #[test]
    fn tools_dir_may_not_reach_the_records_through_a_link() {
        // A tools_dir that is a link to state_dir (or a state_dir that is a link to a
        // parent of tools_dir): as written they do not overlap, and a tool named
        // `tool-records` would be the records' directory.
        let t = scratch("layout-link");
        let state = t.join("state");
        fs::create_dir_all(&state).expect("mkdir");
        std::os::unix::fs::symlink(&state, t.join("tools")).expect("link");
        assert!(check_layout(&state, &t.join("tools")).is_err());
        assert!(check_layout(&state, &t.join("tools/./")).is_err());
        std::os::unix::fs::symlink(&t, t.join("state-link")).expect("link");
        assert!(check_layout(&t.join("state-link/state"), &t.join("state")).is_err());
        // Not yet there: as written.
        assert!(check_layout(&state, &t.join("elsewhere/tools")).is_ok());
        let _ = fs::remove_dir_all(&t);
    }

    #[test]
    fn install_checks_come_first() {
        let t = scratch("install");
        let src = t.join("src");
        fs::create_dir_all(&src).expect("mkdir");
        assert!(prepare_install(&t, "agent", "latest", &src).is_err());
        assert!(prepare_install(&t, "../x", "1.0.0", &src).is_err());
        assert!(prepare_install(&t, "agent", "1.0.0", &t.join("nope")).is_err());
        assert!(!t.join("agent").exists(), "nothing touched by a refusal");
        fs::create_dir_all(t.join("agent/1.0.0")).expect("mkdir");
        assert!(prepare_install(&t, "agent", "1.0.0", &src)
            .expect_err("exists")
            .contains("already installed"));
    }

    #[test]
    fn dead_staging_is_moved_aside_before_a_new_install() {
        let t = scratch("staging");
        let src = t.join("src");
        fs::create_dir_all(&src).expect("mkdir");
        let (tmp, old) = prepare_install(&t, "agent", "2.0.0", &src).expect("prepare");
        assert!(
            tmp.is_dir() && old.is_none(),
            "the staging exists from the start"
        );
        fs::write(tmp.join("half"), "x").expect("write");
        let (tmp2, old) = prepare_install(&t, "agent", "2.0.0", &src).expect("again");
        let old = old.expect("the dead staging, moved aside");
        assert_eq!(tmp2, tmp);
        assert!(old.join("half").exists() && !tmp.join("half").exists());
        assert!(leftovers(&t, "agent").contains(&old));
        assert_eq!(hide_leftover(&old).expect("hidden"), Some(old.clone()));
        assert_eq!(hide_leftover(&t.join("nothing")).expect("none"), None);
    }
}
