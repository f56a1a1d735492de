//! `supd --check` as a lint: what parses but would fail every start at run time (a
//! program that is missing or that the service's user may not run, an unknown user or
//! group, a missing required `env_file`, a missing `cwd`) is an error, at the place of
//! the key that names it, with what to do.
//!
//! The program is found as the launcher finds it at each start (`launch::resolve`: inside
//! the version `current` names for a versioned service, beside the config file for a
//! relative path, in the service's `PATH` for a bare name, tried as `execvp` does), so
//! the lint and the run never disagree. A versioned service whose tool has no version
//! installed yet is a warning, not an error: it waits for `install` and `upgrade`, as
//! at run time.
//!
//! This reads the user and group databases (`getpwnam`): it runs only in `supd --check`,
//! a process of its own, never in supd's loop.

use super::error::ConfigError;
use super::read;
use super::walk::Lines;
use super::{Check, Config, ServiceConfig, SupdConfig};
use crate::access::{self, Want, Who};
use crate::launch::{self, Launch, NotLaunched};
use crate::sys::acl;
use nix::unistd::{Gid, Group, Uid, User};
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::CString;
use std::fmt;
use std::path::{Path, PathBuf};
use toml::de::{DeTable, DeValue};

/// One thing the lint found: an error, or a warning that does not fail the check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    pub error: ConfigError,
    pub warning: bool,
}

/// `FILE:LINE:COLUMN: KEY: MESSAGE`, and `FILE:LINE:COLUMN: warning: KEY: MESSAGE`.
impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.warning {
            let mut e = self.error.clone();
            e.key = format!("warning: {}", e.key);
            write!(f, "{e}")
        } else {
            write!(f, "{}", self.error)
        }
    }
}

/// Lints `cfg` and prints what it finds on stderr, then, when there are errors, the
/// count after `path`. Whether the config is free of errors (warnings allowed).
pub fn report(cfg: &Config, path: &Path) -> bool {
    let found = lint(cfg);
    for f in &found {
        eprintln!("{f}");
    }
    let errors = found.iter().filter(|f| !f.warning).count();
    if errors > 0 {
        eprintln!(
            "{}: {errors} error{}",
            path.display(),
            if errors == 1 { "" } else { "s" }
        );
    }
    errors == 0
}

/// Everything the lint finds in a config that loaded, in file order; the same finding
/// of the instances of one table said once.
pub fn lint(cfg: &Config) -> Vec<Finding> {
    let mut lint = Lint {
        places: places(&cfg.files),
        users: BTreeMap::new(),
        groups: BTreeMap::new(),
        whos: BTreeMap::new(),
        runs: Runs::new(),
        found: Vec::new(),
    };
    for svc in cfg.services.values() {
        lint.service(svc, &cfg.supd);
    }
    lint.found.extend(syslog_dir(cfg));
    let mut seen = BTreeSet::new();
    let mut found: Vec<Finding> = (lint.found.into_iter())
        .filter(|f| seen.insert(f.to_string()))
        .collect();
    let rank = |f: &PathBuf| cfg.files.iter().position(|g| g == f).unwrap_or(usize::MAX);
    found.sort_by_key(|f| (rank(&f.error.file), f.error.line, f.error.column));
    found
}

/// A position in a config file.
#[derive(Clone, Debug)]
struct Place {
    file: PathBuf,
    line: usize,
    column: usize,
}

/// Where each key of each `[service.NAME]` table is written, by (table, key): `""` is
/// the table's name, `health.command` a key of `health`, `env_file[1]` the second item
/// of `env_file`. A later file's place wins (an override after the file it overrides).
type Places = BTreeMap<(String, String), Place>;

/// The places of the service keys the lint speaks of, in `files` (read again: the
/// loaded config keeps values, not positions).
fn places(files: &[PathBuf]) -> Places {
    let mut out = Places::new();
    for file in files {
        let Ok(text) = read::read_config_file(file) else {
            continue;
        };
        let (doc, syntax) = DeTable::parse_recoverable(&text);
        if !syntax.is_empty() {
            continue;
        }
        let lines = Lines::new(&text);
        let mut put = |table: &str, key: String, offset: usize| {
            let (line, column) = lines.line_col(&text, offset);
            let file = file.clone();
            out.insert((table.to_string(), key), Place { file, line, column });
        };
        for (key, value) in doc.get_ref().iter() {
            let (DeValue::Table(services), "service") = (value.get_ref(), key.get_ref().as_ref())
            else {
                continue;
            };
            for (table, def) in services.iter() {
                let name = table.get_ref().as_ref();
                let DeValue::Table(keys) = def.get_ref() else {
                    continue;
                };
                put(name, String::new(), table.span().start);
                for (k, v) in keys.iter() {
                    let k_name = k.get_ref().to_string();
                    match (k_name.as_str(), v.get_ref()) {
                        ("env_file", DeValue::Array(items)) => {
                            for (i, item) in items.iter().enumerate() {
                                put(name, format!("env_file[{i}]"), item.span().start);
                            }
                        }
                        ("health", DeValue::Table(h)) => {
                            for (hk, _) in h.iter().filter(|(hk, _)| hk.get_ref() == "command") {
                                put(name, "health.command".into(), hk.span().start);
                            }
                        }
                        _ => {}
                    }
                    put(name, k_name, k.span().start);
                }
            }
        }
    }
    out
}

/// `[supd] syslog`: the directory of its socket must exist (supd binds the socket there
/// and makes no directory for it), said at the key in the main file.
fn syslog_dir(cfg: &Config) -> Option<Finding> {
    let dir = cfg.supd.syslog.as_deref()?.parent()?;
    if dir.as_os_str().is_empty() || dir.is_dir() {
        return None;
    }
    let file = cfg.files.first().cloned().unwrap_or_default();
    let (line, column) = read::read_config_file(&file)
        .ok()
        .and_then(|text| {
            let (doc, _) = DeTable::parse_recoverable(&text);
            let DeValue::Table(supd) = doc.get_ref().get("supd")?.get_ref() else {
                return None;
            };
            let (key, _) = supd.get_key_value("syslog")?;
            Some(Lines::new(&text).line_col(&text, key.span().start))
        })
        .unwrap_or((0, 0));
    Some(Finding {
        error: ConfigError {
            file,
            line,
            column,
            key: "supd.syslog".into(),
            message: format!(
                "the directory {} does not exist (supd binds the socket there; it makes no directory)",
                dir.display()
            ),
        },
        warning: false,
    })
}

/// A user as the lint needs it: its ids.
#[derive(Clone)]
struct Account {
    uid: u32,
    gid: u32,
}

struct Lint {
    places: Places,
    /// Users and groups looked up, by name (`Err`: the lookup itself failed).
    users: BTreeMap<String, Result<Option<Account>, String>>,
    groups: BTreeMap<String, Result<Option<u32>, String>>,
    /// Who runs a service, by its (user, group): the groups of a user looked up once.
    whos: BTreeMap<(Option<String>, Option<String>), Who>,
    runs: Runs,
    found: Vec<Finding>,
}

impl Lint {
    fn say(&mut self, table: &str, key: &str, message: String, warning: bool) {
        // The key's place; else its table's (a key set where the lint does not look).
        let base = key.split(['.', '[']).next().unwrap_or(key);
        let place = [key, base, ""]
            .iter()
            .find_map(|k| self.places.get(&(table.to_string(), k.to_string())))
            .cloned();
        let (file, line, column) =
            place.map_or((PathBuf::new(), 0, 0), |p| (p.file, p.line, p.column));
        let shown = match key.find('[') {
            Some(i) => &key[..i],
            None => key,
        };
        self.found.push(Finding {
            error: ConfigError {
                file,
                line,
                column,
                key: format!("service.{table}.{shown}"),
                message,
            },
            warning,
        });
    }

    fn service(&mut self, svc: &ServiceConfig, supd: &SupdConfig) {
        let table = svc
            .instance
            .as_ref()
            .map_or(&svc.name, |i| &i.table)
            .clone();
        let who = self.who(svc, &table);
        // Each env_file as the start reads it; the ones that fail are left out of the
        // plan below, which would stop at the first.
        let mut usable = svc.clone();
        usable.env_file.clear();
        for (i, f) in svc.env_file.iter().enumerate() {
            let key = format!("env_file[{i}]");
            let shown = f.path.display();
            match read::read_env_file(&f.path) {
                Ok(text) => match launch::parse_env_file(&text) {
                    Ok(_) => usable.env_file.push(f.clone()),
                    Err((line, why)) => self.say(
                        &table,
                        &key,
                        format!("env_file {shown}:{line}: {why}: correct that line"),
                        false,
                    ),
                },
                Err(_) if f.optional => {}
                Err(why) => {
                    // As written: relative to the file's directory when it was.
                    let written = f.path.strip_prefix(&svc.base_dir).unwrap_or(&f.path);
                    let m = format!(
                        "env_file {shown}: {why}: create it, or write \"-{}\" to make it optional",
                        written.display()
                    );
                    self.say(&table, &key, m, false)
                }
            }
        }
        // A cwd in the service's own runtime_dir is made at each start too.
        let own_run =
            (svc.runtime_dir.as_ref()).map(|n| Path::new(super::runtime_dir::RUN).join(n));
        if let Some(cwd) = (svc.cwd.as_ref())
            .filter(|c| !made_by_supd(c, supd) && Some(c.as_path()) != own_run.as_deref())
        {
            if let Some(why) = dir_problem(cwd, who.as_ref()) {
                self.say(&table, "cwd", why, false);
            }
        }
        // A Unix socket of `listen` whose directory is not there fails every start
        // (supd makes none; a runtime_dir of the service is made before the bind).
        for (i, addr) in svc.listen.iter().enumerate() {
            let super::listen::ListenAddr::Unix(path) = addr else {
                continue;
            };
            let dir = path.parent().unwrap_or(Path::new("/"));
            if !dir.is_dir() && Some(dir) != own_run.as_deref() {
                let m = format!(
                    "{addr}: its directory {} does not exist: make it, or listen in the service's runtime_dir",
                    dir.display()
                );
                self.say(&table, &format!("listen[{i}]"), m, false);
            }
        }
        let plan = match launch::resolve(&usable, supd, None) {
            Ok(plan) => plan,
            Err(NotLaunched::NoVersion(_)) => {
                let tool = svc.tool.clone().unwrap_or_default();
                let at = supd.tools_dir.join(&tool).join("current");
                let message = format!(
                    "no version of tool '{tool}' is installed ({} does not exist): its services wait for one (supctl install, then supctl upgrade); their programs are checked once it is",
                    at.display()
                );
                self.say(&table, "tool", message, true);
                return;
            }
            Err(NotLaunched::Failed(why)) => {
                self.say(&table, "command", why, false);
                return;
            }
        };
        // `current` names a version that is not there (removed by hand, a prune cut
        // short): every start fails, for want of the version rather than of a program.
        if let (Some(tool), Some(v)) = (svc.tool.as_deref(), plan.version.as_deref()) {
            let dir = supd.tools_dir.join(tool).join(v);
            if !dir.is_dir() {
                let message = format!(
                    "{} names version {v}, but version {v} is not installed ({} does not exist): install it (supctl install), or point current at an installed version",
                    supd.tools_dir.join(tool).join("current").display(),
                    dir.display()
                );
                self.say(&table, "tool", message, false);
                return;
            }
        }
        let Some(who) = who else {
            return; // its user or group is unknown: said above
        };
        if let Some(why) = program_problem(svc, &svc.command, &plan, &who, &mut self.runs) {
            self.say(&table, "command", why, false);
        }
        if let Some(Check::Command(argv)) = svc.health.as_ref().map(|h| &h.check) {
            let mut check = usable.clone();
            check.command = argv.clone();
            if let Ok(plan) = launch::resolve(&check, supd, None) {
                if let Some(why) = program_problem(svc, argv, &plan, &who, &mut self.runs) {
                    self.say(&table, "health.command", why, false);
                }
            }
        }
    }

    /// Who the service runs as, as its child takes it at each start; `None` when its
    /// user or group is unknown (said here).
    fn who(&mut self, svc: &ServiceConfig, table: &str) -> Option<Who> {
        let asked = (svc.user.clone(), svc.group.clone());
        if let Some(who) = self.whos.get(&asked) {
            return Some(who.clone());
        }
        let who = self.who_anew(svc, table)?;
        self.whos.insert(asked, who.clone());
        Some(who)
    }

    fn who_anew(&mut self, svc: &ServiceConfig, table: &str) -> Option<Who> {
        let mut known = true;
        let account = match &svc.user {
            Some(name) => match self.user(name) {
                Ok(Some(a)) => Some(a),
                Ok(None) => {
                    let m = format!("no user '{name}' on this system: create it (such as adduser --system {name}) or correct the name");
                    self.say(table, "user", m, false);
                    known = false;
                    None
                }
                Err(why) => {
                    self.say(
                        table,
                        "user",
                        format!("cannot look up user '{name}': {why}"),
                        false,
                    );
                    known = false;
                    None
                }
            },
            None => None,
        };
        let group = match &svc.group {
            Some(name) => match self.group(name) {
                Ok(Some(gid)) => Some(gid),
                Ok(None) => {
                    let m = format!("no group '{name}' on this system: create it (such as addgroup --system {name}) or correct the name");
                    self.say(table, "group", m, false);
                    known = false;
                    None
                }
                Err(why) => {
                    let m = format!("cannot look up group '{name}': {why}");
                    self.say(table, "group", m, false);
                    known = false;
                    None
                }
            },
            None => None,
        };
        if !known {
            return None;
        }
        Some(match (&svc.user, account) {
            (Some(name), Some(a)) => {
                let gid = group.unwrap_or(a.gid);
                let gids = CString::new(name.as_str())
                    .ok()
                    .and_then(|c| nix::unistd::getgrouplist(&c, Gid::from_raw(gid)).ok())
                    .map_or(vec![gid], |g| g.into_iter().map(Gid::as_raw).collect());
                Who {
                    name: name.clone(),
                    uid: a.uid,
                    gids,
                }
            }
            // No user: supd's own, taken to be the one running the check.
            _ => {
                let uid = Uid::effective();
                let gids = match group {
                    Some(g) => vec![g],
                    None => {
                        let mut g: Vec<u32> = (nix::unistd::getgroups().unwrap_or_default())
                            .into_iter()
                            .map(Gid::as_raw)
                            .collect();
                        g.push(Gid::effective().as_raw());
                        g
                    }
                };
                let name = User::from_uid(uid)
                    .ok()
                    .flatten()
                    .map_or(uid.to_string(), |u| u.name);
                Who {
                    name,
                    uid: uid.as_raw(),
                    gids,
                }
            }
        })
    }

    fn user(&mut self, name: &str) -> Result<Option<Account>, String> {
        self.users
            .entry(name.to_string())
            .or_insert_with(|| {
                User::from_name(name)
                    .map(|u| {
                        u.map(|u| Account {
                            uid: u.uid.as_raw(),
                            gid: u.gid.as_raw(),
                        })
                    })
                    .map_err(|e| e.to_string())
            })
            .clone()
    }

    fn group(&mut self, name: &str) -> Result<Option<u32>, String> {
        self.groups
            .entry(name.to_string())
            .or_insert_with(|| {
                Group::from_name(name)
                    .map(|g| g.map(|g| g.gid.as_raw()))
                    .map_err(|e| e.to_string())
            })
            .clone()
    }
}

/// What a path is to a user (uid, gids): `None` when it does not exist, else whether
/// the user may run it.
type Runs = BTreeMap<(PathBuf, u32, Vec<u32>), Option<Result<(), String>>>;

/// A directory supd makes itself at start: a `cwd` there need not exist before.
fn made_by_supd(dir: &Path, supd: &SupdConfig) -> bool {
    [
        Some(supd.state_dir.as_path()),
        Some(supd.tools_dir.as_path()),
        Some(supd.log_dir.as_path()),
        supd.socket.parent(),
    ]
    .into_iter()
    .flatten()
    .any(|d| d == dir)
}

/// Why the service's `cwd` cannot be entered by `who` (when known), or `None`.
fn dir_problem(cwd: &Path, who: Option<&Who>) -> Option<String> {
    let shown = cwd.display();
    match std::fs::metadata(cwd) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some(format!(
            "directory {shown} does not exist: create it (such as mkdir -p {shown}) or correct the path"
        )),
        Err(e) => Some(format!("directory {shown}: {e}")),
        Ok(m) if !m.is_dir() => Some(format!(
            "{shown} is not a directory: cwd names the directory the service starts in"
        )),
        Ok(_) => who.and_then(|who| {
            acl::stat_chain(cwd, acl::owner_names)
                .and_then(|chain| access::check(&chain, who, Want::Enter))
                .err()
        }),
    }
}

/// Why `argv[0]`, resolved in `plan` as the start resolves it, cannot be run by `who`,
/// or `None`. As `execvp` does: the first candidate `who` may run wins; one that exists
/// but may not be run is said over the ones that do not exist.
/// `runs` remembers each path's verdict (`None`: it does not exist).
fn program_problem(
    svc: &ServiceConfig,
    argv: &[String],
    plan: &Launch,
    who: &Who,
    runs: &mut Runs,
) -> Option<String> {
    let argv0 = argv.first().map_or("", String::as_str);
    let path_var = (plan.env.iter().rev())
        .find(|(k, _)| k == "PATH")
        .map_or(launch::DEFAULT_PATH, |(_, v)| v.as_str());
    let bare = !plan.program.contains('/');
    // Relative candidates start in the cwd, entered before the exec.
    let candidates: Vec<PathBuf> = if bare {
        (path_var.split(':'))
            .map(|d| {
                plan.cwd
                    .join(if d.is_empty() { "." } else { d })
                    .join(&plan.program)
            })
            .collect()
    } else {
        vec![plan.cwd.join(&plan.program)]
    };
    let mut refused = None;
    for c in candidates {
        // Many services run one program: each path looked at once for each user.
        let verdict = runs
            .entry((c, who.uid, who.gids.clone()))
            .or_insert_with_key(|(c, _, _)| match std::fs::metadata(c) {
                Ok(_) => Some(
                    acl::stat_chain(c, acl::owner_names)
                        .and_then(|chain| access::check(&chain, who, Want::Exec)),
                ),
                // As execvp: these are not there; anything else refuses.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => None,
                Err(e) => Some(Err(format!(
                    "{}: {e}, to the user running --check (run it as supd's user)",
                    c.display()
                ))),
            });
        match verdict {
            None => {}
            Some(Ok(())) => return None,
            Some(Err(why)) => refused = refused.or(Some(why.clone())),
        }
    }
    refused.or_else(|| {
        Some(match (&plan.version, bare) {
            (Some(v), _) if !argv0.starts_with('/') => format!(
                "program {argv0} does not exist in version {v} of tool '{}' ({}): correct the path (it is relative to the version's directory), or install a version that has it",
                svc.tool.as_deref().unwrap_or(""),
                plan.program
            ),
            (_, true) => format!(
                "program '{argv0}' is not found in PATH ({path_var}): install it, give its absolute path, or set PATH in env"
            ),
            _ => format!(
                "program {} does not exist: install it, or correct the first item of the command",
                plan.program
            ),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn root() -> Who {
        Who {
            name: "root".into(),
            uid: 0,
            gids: vec![0],
        }
    }

    fn plan_of(svc: &ServiceConfig, supd: &SupdConfig) -> Launch {
        launch::resolve(svc, supd, None).expect("plan")
    }

    #[test]
    fn programs_are_found_as_the_start_finds_them() {
        let dir = crate::scratch::Scratch::new("lint");
        std::fs::create_dir_all(dir.join("bin")).expect("mkdir");
        let prog = dir.join("bin/prog");
        std::fs::write(&prog, "#!/bin/sh\n").expect("write");
        let supd = SupdConfig {
            state_dir: dir.to_path_buf(),
            tools_dir: dir.join("tools"),
            ..SupdConfig::default()
        };
        let mut svc = ServiceConfig::new("a", vec!["bin/prog".into()], dir.to_path_buf());
        let check = |svc: &ServiceConfig| {
            program_problem(
                svc,
                &svc.command,
                &plan_of(svc, &supd),
                &root(),
                &mut Runs::new(),
            )
        };
        // Relative to the config's directory; not executable by anyone: refused.
        let said = check(&svc).expect("not executable");
        assert!(
            said.contains("cannot execute") && said.contains("chmod"),
            "{said}"
        );
        std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        assert_eq!(check(&svc), None);
        // A bare name: in the service's PATH, its own `env` first.
        svc.command = vec!["prog".into()];
        let said = check(&svc).expect("not in the default PATH");
        assert!(said.contains("not found in PATH"), "{said}");
        svc.env.insert(
            "PATH".into(),
            format!("/nonexistent:{}", dir.join("bin").display()),
        );
        assert_eq!(check(&svc), None);
        svc.command = vec!["/nonexistent/prog".into()];
        let said = check(&svc).expect("missing");
        assert!(
            said.starts_with("program /nonexistent/prog does not exist"),
            "{said}"
        );
    }

    #[test]
    fn a_directory_supd_makes_need_not_exist() {
        let supd = SupdConfig::default();
        assert!(made_by_supd(Path::new("/var/lib/sup"), &supd));
        assert!(made_by_supd(Path::new("/run/sup"), &supd));
        assert!(!made_by_supd(Path::new("/var/lib/agent"), &supd));
        let said = dir_problem(Path::new("/nonexistent/sup-lint"), None).expect("missing");
        assert!(said.contains("mkdir -p /nonexistent/sup-lint"), "{said}");
        assert_eq!(dir_problem(Path::new("/"), Some(&root())), None);
    }
}
