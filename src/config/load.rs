//! Loading: the main file, its `include` globs, each file's tables, then the checks
//! that need the whole config (`after` names, cycles, leases). The tables' keys are read
//! in `supd_table.rs`, `service_table.rs` (with `health_table.rs`) and `lease_table.rs`;
//! the checks across services are in `checks.rs`; the include patterns in `include.rs`.

use super::checks::{check_controllers, check_whole, instance_counts};
use super::error::ConfigError;
use super::include::glob;
use super::lease_table::read_lease;
use super::read::{self, TextOf};
use super::service_table::{read_service, Origin};
use super::supd_table::read_supd;
use super::walk::{FileCtx, Place};
use super::*;
use std::path::{Path, PathBuf};
use toml::de::DeTable;

/// Reads `path` and every file it includes. Returns the config, or every error found.
pub fn load(path: &Path) -> Result<Config, Vec<ConfigError>> {
    load_from(path, &mut |p| read::read_config_file(p), false)
}

/// [`load`] with each file's text from `text_of`; with `main_supd_only`, the main file
/// stands for its `[supd]` table alone, each valid key of it kept (its own errors are
/// not this load's: `lastgood.rs` has them).
pub(super) fn load_from(
    path: &Path,
    text_of: &mut TextOf,
    main_supd_only: bool,
) -> Result<Config, Vec<ConfigError>> {
    let path = absolute(path);
    let mut errors = Vec::new();
    let mut cfg = Config {
        supd: SupdConfig::default(),
        services: BTreeMap::new(),
        leases: BTreeMap::new(),
        files: vec![path.clone()],
        origins: BTreeMap::new(),
    };
    // Services and leases remember where they were defined, to report duplicates and
    // bad `after`s.
    let mut seen = Seen::default();
    let main_file = Place {
        file: path.clone(),
        line: 0,
        column: 0,
    };
    let mut source = Source {
        text_of,
        main_supd_only,
    };
    read_file(
        &path,
        &main_file,
        &mut source,
        &mut cfg,
        &mut seen,
        &mut errors,
    );
    let mut include_dirs = Vec::new();
    for (pattern, at) in std::mem::take(&mut seen.includes) {
        include_dirs.extend(pattern.parent().map(Path::to_path_buf));
        for file in glob(&pattern) {
            cfg.files.push(file.clone());
            read_file(&file, &at, &mut source, &mut cfg, &mut seen, &mut errors);
        }
    }
    super::overrides::read_all(
        &include_dirs,
        source.text_of,
        &mut cfg,
        &mut seen.services,
        &mut errors,
    );
    check_whole(&cfg, &seen.services, &mut errors);
    check_controllers(&cfg, &seen.services, &mut errors);
    let counts = instance_counts(&seen.services, &mut errors);
    super::instances::expand(&mut cfg.services, &counts);
    super::instances::expand_origins(&mut cfg.origins, &counts);
    // Tables iterate by key; people read a file from the top.
    let file_rank = |f: &PathBuf| cfg.files.iter().position(|g| g == f).unwrap_or(usize::MAX);
    errors.sort_by_key(|e| (file_rank(&e.file), e.line, e.column));
    if errors.is_empty() {
        Ok(cfg)
    } else {
        Err(errors)
    }
}

/// What the files read so far defined, and where.
#[derive(Default)]
struct Seen {
    services: BTreeMap<String, Origin>,
    leases: BTreeMap<String, Place>,
    /// The main file's include patterns, each with its place in that file.
    includes: Vec<(PathBuf, Place)>,
}

/// The config in `text`, as if read from `path`, without reading its includes: for the
/// fuzz target (`fuzz/fuzz_targets/config.rs`) and tests.
pub fn load_text(path: &Path, text: &str) -> Result<Config, Vec<ConfigError>> {
    let mut errors = Vec::new();
    let mut cfg = Config {
        supd: SupdConfig::default(),
        services: BTreeMap::new(),
        leases: BTreeMap::new(),
        files: vec![path.to_path_buf()],
        origins: BTreeMap::new(),
    };
    let mut seen = Seen::default();
    read_text(path, text, true, &mut cfg, &mut seen, &mut errors);
    check_whole(&cfg, &seen.services, &mut errors);
    let counts = instance_counts(&seen.services, &mut errors);
    super::instances::expand(&mut cfg.services, &counts);
    super::instances::expand_origins(&mut cfg.origins, &counts);
    if errors.is_empty() {
        Ok(cfg)
    } else {
        Err(errors)
    }
}

fn absolute(path: &Path) -> PathBuf {
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()
            .map(|d| d.join(path))
            .unwrap_or_else(|_| path.to_path_buf())
    }
}

/// Where [`load_from`] takes the files' texts.
struct Source<'a, 'b> {
    text_of: &'a mut TextOf<'b>,
    main_supd_only: bool,
}

/// Reads one file: the main one (`by.line == 0`) or one that `by`, an include pattern,
/// matched. A file that cannot be read is an error at that pattern, naming the file.
fn read_file(
    path: &Path,
    by: &Place,
    source: &mut Source,
    cfg: &mut Config,
    seen: &mut Seen,
    errors: &mut Vec<ConfigError>,
) {
    let main = by.line == 0;
    let text = match (source.text_of)(path) {
        Ok(t) => t,
        Err(why) => {
            errors.push(if main {
                ConfigError {
                    file: path.to_path_buf(),
                    line: 0,
                    column: 0,
                    key: String::new(),
                    message: why,
                }
            } else {
                ConfigError {
                    file: by.file.clone(),
                    line: by.line,
                    column: by.column,
                    key: "supd.include".into(),
                    message: format!("{}: {why}", path.display()),
                }
            });
            return;
        }
    };
    if main && source.main_supd_only {
        return supd_only(path, &text, &mut cfg.supd, &mut seen.includes);
    }
    read_text(path, &text, main, cfg, seen, errors);
}

/// The `[supd]` table of a main file that does not load, each valid key of it kept and
/// each bad one at its default (a TOML syntax error keeps what parsed before it).
fn supd_only(path: &Path, text: &str, supd: &mut SupdConfig, includes: &mut Vec<(PathBuf, Place)>) {
    let (doc, _) = DeTable::parse_recoverable(text);
    let mut errors = Vec::new();
    let mut ctx = FileCtx::new(path, text, &mut errors);
    if let Some((_, v)) = doc.get_ref().iter().find(|(k, _)| k.get_ref() == "supd") {
        read_supd(&mut ctx, v, supd, includes);
    }
}

/// One file's text, read into `cfg`.
fn read_text(
    path: &Path,
    text: &str,
    main: bool,
    cfg: &mut Config,
    seen: &mut Seen,
    errors: &mut Vec<ConfigError>,
) {
    let (doc, syntax) = DeTable::parse_recoverable(text);
    let mut ctx = FileCtx::new(path, text, errors);
    for e in &syntax {
        let span = e.span().unwrap_or(0..0);
        ctx.err(span, "", format!("TOML syntax: {}", e.message()));
    }
    if !syntax.is_empty() {
        return;
    }
    for (key, value) in doc.get_ref().iter() {
        match (key.get_ref().as_ref(), main) {
            ("supd", true) => read_supd(&mut ctx, value, &mut cfg.supd, &mut seen.includes),
            ("service", _) => {
                let Some(table) = ctx.table(value, "service") else {
                    continue;
                };
                for (name, def) in table.iter() {
                    read_service(&mut ctx, name, def, cfg, &mut seen.services);
                }
            }
            ("lease", _) => {
                let Some(table) = ctx.table(value, "lease") else {
                    continue;
                };
                for (name, def) in table.iter() {
                    read_lease(&mut ctx, name, def, cfg, &mut seen.leases);
                }
            }
            ("supd", false) => ctx.err(
                key.span(),
                "supd",
                "[supd] belongs in the main config file, not in an included one",
            ),
            (other, _) => {
                let known = if main {
                    "supd, service, lease"
                } else {
                    "service, lease"
                };
                ctx.err(
                    key.span(),
                    other,
                    format!("unknown table (expected one of: {known})"),
                )
            }
        }
    }
}

#[cfg(test)]
mod tests;

/// The `[supd]` table alone, when the main file can be read: each valid key of it, each
/// bad one at its default (a file whose `[supd]` has errors still names where supd
/// keeps its state and serves).
pub fn load_supd_only(path: &Path) -> Option<SupdConfig> {
    let path = absolute(path);
    let text = read::read_config_file(&path).ok()?;
    let mut supd = SupdConfig::default();
    supd_only(&path, &text, &mut supd, &mut Vec::new());
    Some(supd)
}
