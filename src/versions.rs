//! Tool directories on disk: `tools_dir/TOOL/VERSION/` and the relative symlink
//! `tools_dir/TOOL/current`; the version manifest `sup-tool.toml`; the upgrade records in
//! `state_dir/tools/TOOL.json`. File system only; the decisions are in `upgrade`.
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

/// Where the records live.
fn records_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("tools")
}

/// The file of a tool's record.
pub fn record_path(state_dir: &Path, tool: &str) -> PathBuf {
    records_dir(state_dir).join(format!("{tool}.json"))
}

/// Reads a tool's record: `Ok(None)` when there is none yet, `Err` when it is unreadable
/// or corrupt (the caller reports it and goes on from the link).
pub fn load_record(state_dir: &Path, tool: &str) -> Result<Option<Record>, String> {
    let path = records_dir(state_dir).join(format!("{tool}.json"));
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
    let path = records_dir(state_dir).join(format!("{tool}.json"));
    let _ = fs::rename(&path, path.with_extension("json.corrupt"));
}

/// Replaces a tool's record, durably.
pub fn save_record(state_dir: &Path, tool: &str, r: &Record) -> io::Result<()> {
    let dir = records_dir(state_dir);
    // By default this is tools_dir too: services' users pass through it.
    crate::records::create_dirs(&dir, PUBLIC_DIR)?;
    let bytes = serde_json::to_vec_pretty(r).map_err(io::Error::other)?;
    atomic_write(&dir.join(format!("{tool}.json")), &bytes, true)
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
    fs::create_dir(&tmp).map_err(|e| format!("cannot create {}: {e}", tmp.display()))?;
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

/// The copy itself, run as a helper process so a large tree never blocks supd: copies
/// modes, links and times, makes every file readable and every directory searchable by
/// all (exec bits are kept: a service run as any user can run its version), then
/// flushes the file system that holds the copy.
pub fn install_command(src: &Path, tmp: &Path) -> Vec<String> {
    let script = "cp -a -- \"$1/.\" \"$2\" && chmod -R a+rX -- \"$2\" && sync -f \"$2\"";
    vec![
        "/bin/sh".into(),
        "-c".into(),
        script.into(),
        "sup-install".into(),
        src.to_string_lossy().into_owned(),
        tmp.to_string_lossy().into_owned(),
    ]
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

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("sup-versions-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).expect("dir");
        d
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
        fs::write(t.join("tools/agent.json"), "{\"current\": ").expect("truncate");
        assert!(load_record(&t, "agent")
            .expect_err("corrupt")
            .contains("is corrupt"));
        set_aside(&t, "agent");
        assert_eq!(load_record(&t, "agent"), Ok(None));
        assert!(t.join("tools/agent.json.corrupt").exists());
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
