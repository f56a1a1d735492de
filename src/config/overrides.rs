//! Overrides, as systemd's drop-ins: for a service `NAME` defined in a file, the files
//! `NAME.d/*.toml` in that file's directory, read in name order once every file is
//! read, each holding one `[service.NAME]` table whose keys win over the definition's
//! and the earlier overrides' (`service_table::read_override`: `env` and `limits` merge
//! entry by entry, every other key is replaced whole).
//!
//! An override file is a file of the config like any other: its errors are its own
//! (file:line:column), and a broken one stands in for itself alone (`lastgood.rs`: its
//! last good copy, or nothing of it). In an include pattern's directory, a `NAME.d`
//! that no service defined there owns is an error at each table of its files.

use super::error::ConfigError;
use super::include::glob;
use super::read::TextOf;
use super::service_table::{read_override, Origin};
use super::walk::FileCtx;
use super::Config;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use toml::de::DeTable;

/// Reads the overrides of every service in `cfg` (and the orphan `NAME.d` directories
/// of `include_dirs`), each file added to `cfg.files` in the order read.
pub(super) fn read_all(
    include_dirs: &[PathBuf],
    text_of: &mut TextOf,
    cfg: &mut Config,
    origin: &mut BTreeMap<String, Origin>,
    errors: &mut Vec<ConfigError>,
) {
    // Each service's drop-in directory beside its defining file.
    let dirs: Vec<(String, PathBuf, PathBuf)> = (origin.iter())
        .filter_map(|(name, o)| {
            let base = o.file.parent()?.to_path_buf();
            Some((name.clone(), base.join(format!("{name}.d")), base))
        })
        .collect();
    let mut owned = BTreeSet::new();
    for (name, dir, base) in dirs {
        for file in glob(&dir.join("*.toml")) {
            read_one(&file, &name, Some(&base), text_of, cfg, origin, errors);
        }
        owned.insert(dir);
    }
    let mut seen_dirs = BTreeSet::new();
    for d in include_dirs {
        if !seen_dirs.insert(d.clone()) {
            continue;
        }
        for dir in orphans(d, &owned, include_dirs) {
            let name = dir
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".d"))
                .unwrap_or_default()
                .to_string();
            for file in glob(&dir.join("*.toml")) {
                read_one(&file, &name, None, text_of, cfg, origin, errors);
            }
        }
    }
}

/// The `X.d` directories in `dir` that no service owns (nor an include pattern reads).
fn orphans(dir: &Path, owned: &BTreeSet<PathBuf>, include_dirs: &[PathBuf]) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.ends_with(".d") && n.len() > 2 && !n.starts_with('.'))
        })
        .map(|e| e.path())
        .filter(|p| p.is_dir() && !owned.contains(p) && !include_dirs.contains(p))
        .collect();
    out.sort();
    out
}

/// One override file of service `name`: `base` is the directory of the file that
/// defined it (none: no file there defines it).
fn read_one(
    path: &Path,
    name: &str,
    base: Option<&Path>,
    text_of: &mut TextOf,
    cfg: &mut Config,
    origin: &mut BTreeMap<String, Origin>,
    errors: &mut Vec<ConfigError>,
) {
    cfg.files.push(path.to_path_buf());
    let text = match text_of(path) {
        Ok(t) => t,
        Err(why) => {
            errors.push(ConfigError {
                file: path.to_path_buf(),
                line: 0,
                column: 0,
                key: String::new(),
                message: why,
            });
            return;
        }
    };
    let (doc, syntax) = DeTable::parse_recoverable(&text);
    let mut ctx = FileCtx::new(path, &text, errors);
    ctx.base = base.map(Path::to_path_buf);
    for e in &syntax {
        let span = e.span().unwrap_or(0..0);
        ctx.err(span, "", format!("TOML syntax: {}", e.message()));
    }
    if !syntax.is_empty() {
        return;
    }
    let only = format!("an override file in {name}.d/ holds only a [service.{name}] table");
    for (key, value) in doc.get_ref().iter() {
        if key.get_ref() != "service" {
            let k = key.get_ref().to_string();
            ctx.err(key.span(), &k, format!("[{k}]: {only}"));
            continue;
        }
        let Some(table) = ctx.table(value, "service") else {
            continue;
        };
        for (n, def) in table.iter() {
            let key = format!("service.{}", n.get_ref());
            if n.get_ref() != name {
                ctx.err(n.span(), &key, format!("[{key}]: {only}"));
            } else if base.is_none() || !cfg.services.contains_key(name) {
                let dir = path
                    .parent()
                    .and_then(Path::parent)
                    .map_or_else(String::new, |d| d.display().to_string());
                ctx.err(
                    n.span(),
                    &key,
                    format!("an override of service '{name}', which no file in {dir} defines"),
                );
            } else {
                read_override(&mut ctx, name, def, cfg, origin);
            }
        }
    }
}

#[cfg(test)]
mod tests;
