//! Launching a service: resolving what its start runs (a `Launch`): which program
//! (inside the tool's current version or not), its arguments, environment, directory
//! and who it runs as. The version is looked up here at each start; the user and the
//! directory are named here and looked up by the child itself, so that a user database
//! or a file system that hangs holds back that one start, never supd.

use crate::config::{Ready, ServiceConfig, SupdConfig};
use crate::sys::{Account, Tuning};
use std::path::{Path, PathBuf};

/// The PATH a service gets unless its `env` sets one (kept with the spawn plan, whose
/// child looks a bare program name up in it).
pub use crate::sys::plan::DEFAULT_PATH;

/// A start that cannot happen, and whether retrying could help at once.
#[derive(Debug, PartialEq, Eq)]
pub enum NotLaunched {
    /// A versioned service whose tool has no `current`: it waits for an upgrade.
    NoVersion(String),
    /// Anything else (unknown user, missing cwd): a failed start.
    Failed(String),
}

/// What a service's start runs, resolved from its config (the spawn plan is made of it:
/// `sys::plan`).
#[derive(Debug, PartialEq, Eq)]
pub struct Launch {
    pub program: String,
    pub args: Vec<String>,
    pub cwd: PathBuf,
    pub env: Vec<(String, String)>,
    /// Who it runs as: names, looked up by the child itself (a user database that
    /// hangs then holds back that start alone).
    pub creds: Option<Account>,
    /// The tool's version this start runs, for versioned services.
    pub version: Option<String>,
    /// umask, nice and resource limits, set by the child.
    pub tuning: Tuning,
    /// The child sets `WATCHDOG_PID` to its own pid (a `watchdog` is configured).
    pub watchdog_pid: bool,
}

/// Resolves a service's start.
pub fn resolve(
    cfg: &ServiceConfig,
    supd: &SupdConfig,
    notify_socket: Option<&Path>,
) -> Result<Launch, NotLaunched> {
    let (version, version_dir) = match &cfg.tool {
        Some(tool) => match crate::versions::current(&supd.tools_dir, tool) {
            Some(v) => {
                let dir = supd.tools_dir.join(tool).join(&v);
                (Some(v), Some(dir))
            }
            None => {
                return Err(NotLaunched::NoVersion(format!(
                    "no current version of tool '{tool}'"
                )))
            }
        },
        None => (None, None),
    };
    let argv0 = cfg.command.first().cloned().unwrap_or_default();
    let program = if argv0.starts_with('/') {
        argv0
    } else if let Some(dir) = &version_dir {
        dir.join(&argv0).to_string_lossy().into_owned()
    } else if argv0.contains('/') {
        cfg.base_dir.join(&argv0).to_string_lossy().into_owned()
    } else {
        argv0 // a bare name: looked up in the service's PATH
    };
    // An unversioned service run as a user starts in `/`: supd's state_dir is private
    // (0750 or 0751), a directory such a user could not read.
    let cwd = cfg.cwd.clone().or(version_dir).unwrap_or_else(|| {
        if cfg.user.is_some() {
            PathBuf::from("/")
        } else {
            supd.state_dir.clone()
        }
    });
    // The directory is entered, and the user looked up, by the child: a file system or a
    // user database that hangs stalls that start only, never supd.
    let creds = (cfg.user.is_some() || cfg.group.is_some()).then(|| Account {
        user: cfg.user.clone(),
        group: cfg.group.clone(),
    });
    let mut env = vec![
        ("PATH".to_string(), DEFAULT_PATH.to_string()),
        ("SUP_SERVICE".to_string(), cfg.name.clone()),
    ];
    if let Some(i) = &cfg.instance {
        env.push(("SUP_INSTANCE".into(), i.index.to_string()));
    }
    if let Some(v) = &version {
        env.push(("SUP_VERSION".into(), v.clone()));
    }
    // A notify service's socket, a watchdog's or an fd store's (given only to those).
    if let Some(sock) = notify_socket
        .filter(|_| cfg.ready == Ready::Notify || cfg.watchdog.is_some() || cfg.fd_store > 0)
    {
        env.push(("NOTIFY_SOCKET".into(), sock.to_string_lossy().into_owned()));
    }
    // As systemd: the timeout in microseconds; WATCHDOG_PID (the main pid) is set by
    // the child itself.
    if let Some(d) = cfg.watchdog {
        env.push(("WATCHDOG_USEC".into(), d.as_micros().to_string()));
    }
    if let Some(user) = &cfg.user {
        // HOME comes from the user database, in the child, unless `env` sets it.
        env.push(("USER".into(), user.clone()));
        env.push(("LOGNAME".into(), user.clone()));
    }
    // Read at each start, so an edited file takes effect at the next one; `env` wins.
    for file in &cfg.env_file {
        let text = match crate::config::read_env_file(&file.path) {
            Ok(t) => t,
            Err(_) if file.optional => continue,
            Err(why) => {
                return Err(NotLaunched::Failed(format!(
                    "env_file {}: {why}",
                    file.path.display()
                )))
            }
        };
        for (k, v) in parse_env_file(&text).map_err(|(line, why)| {
            NotLaunched::Failed(format!("env_file {}:{line}: {why}", file.path.display()))
        })? {
            set_var(&mut env, k, v);
        }
    }
    for (k, v) in &cfg.env {
        set_var(&mut env, k.clone(), v.clone());
    }
    Ok(Launch {
        program,
        args: cfg.command.iter().skip(1).cloned().collect(),
        cwd,
        env,
        creds,
        version,
        tuning: Tuning {
            umask: cfg.umask,
            nice: cfg.nice.or_else(crate::sys::child_nice),
            limits: cfg.limits.clone(),
        },
        watchdog_pid: cfg.watchdog.is_some(),
    })
}

/// Makes `runtime_dir = "NAME"`'s `/run/NAME` for a start: a directory of mode 0755 and
/// supd's own (root's) until the child gives it to the service's user (`SpawnSpec::give`)
/// before it drops root. One that exists keeps what it holds: the directory is not
/// removed when the service stops (only a reboot empties /run), and each start sets its
/// mode and owner again. A file or a symbolic link in its place fails the start.
pub fn make_runtime_dir(name: &str) -> Result<PathBuf, String> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let dir = Path::new(crate::config::runtime_dir::RUN).join(name);
    let fail = |e: &dyn std::fmt::Display| format!("runtime_dir {}: {e}", dir.display());
    match std::fs::symlink_metadata(&dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(fail(&"exists and is not a directory")),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            match std::fs::DirBuilder::new().mode(0o755).create(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(fail(&format!("cannot make it: {e}"))),
            }
        }
        Err(e) => return Err(fail(&e)),
    }
    // A user's service gets it from its child; anyone else's is supd's (a directory a
    // previous config gave to another user is taken back).
    let (uid, gid) = (nix::unistd::geteuid(), nix::unistd::getegid());
    nix::unistd::chown(&dir, Some(uid), Some(gid))
        .map_err(|e| fail(&format!("cannot take it back: {e}")))?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| fail(&format!("cannot set its mode: {e}")))?;
    Ok(dir)
}

fn set_var(env: &mut Vec<(String, String)>, k: String, v: String) {
    env.retain(|(name, _)| *name != k);
    env.push((k, v));
}

/// The variables of an `env_file`: `KEY=VALUE` lines; blank lines and lines starting
/// with `#` are skipped; a value wholly in single or double quotes loses them. An error
/// is its 1-based line and what was expected.
pub fn parse_env_file(text: &str) -> Result<Vec<(String, String)>, (usize, String)> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            return Err((i + 1, "expected KEY=VALUE".into()));
        };
        let k = k.trim();
        if k.is_empty() || k.contains(|c: char| c.is_whitespace() || c == '\0') {
            return Err((
                i + 1,
                format!("expected KEY=VALUE, with a name without spaces, not '{k}'"),
            ));
        }
        let v = v.trim();
        let v = [b'"', b'\'']
            .iter()
            .find_map(|&q| {
                (v.len() >= 2 && v.as_bytes()[0] == q && v.as_bytes()[v.len() - 1] == q)
                    .then(|| &v[1..v.len() - 1])
            })
            .unwrap_or(v);
        if v.contains('\0') {
            return Err((i + 1, "a value must not hold a NUL byte".into()));
        }
        out.push((k.to_string(), v.to_string()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn supd(dir: &Path) -> SupdConfig {
        SupdConfig {
            state_dir: dir.to_path_buf(),
            tools_dir: dir.join("tools"),
            ..SupdConfig::default()
        }
    }

    #[test]
    fn programs_resolve_by_kind() {
        let dir = std::env::temp_dir();
        let s = supd(&dir);
        let mut c = ServiceConfig::new(
            "a",
            vec!["/bin/echo".into(), "hi".into()],
            "/etc/sup".into(),
        );
        let p = resolve(&c, &s, None).expect("plan");
        assert_eq!(
            (p.program.as_str(), p.args.as_slice(), p.cwd.as_path()),
            ("/bin/echo", &["hi".to_string()][..], dir.as_path())
        );
        c.command = vec!["sleep".into()];
        assert_eq!(resolve(&c, &s, None).expect("plan").program, "sleep");
        c.command = vec!["bin/x".into()];
        assert_eq!(
            resolve(&c, &s, None).expect("plan").program,
            "/etc/sup/bin/x"
        );
    }

    #[test]
    fn environment_is_minimal_plus_env() {
        let dir = std::env::temp_dir();
        let mut c = ServiceConfig::new("a", vec!["/bin/true".into()], "/".into());
        c.ready = Ready::Notify;
        c.env = BTreeMap::from([
            ("PATH".to_string(), "/opt/bin".to_string()),
            ("MODE".to_string(), "x".to_string()),
        ]);
        let p = resolve(&c, &supd(&dir), Some(Path::new("/run/n.sock"))).expect("plan");
        let get = |k: &str| p.env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("PATH"), Some("/opt/bin"));
        assert_eq!(get("MODE"), Some("x"));
        assert_eq!(get("SUP_SERVICE"), Some("a"));
        assert_eq!(get("NOTIFY_SOCKET"), Some("/run/n.sock"));
        assert_eq!(get("HOME"), None);
    }

    #[test]
    fn an_instance_gets_its_index_in_sup_instance() {
        let dir = std::env::temp_dir();
        let mut c = ServiceConfig::new("w@2", vec!["/bin/true".into()], "/".into());
        let has = |c: &ServiceConfig| {
            let p = resolve(c, &supd(&dir), None).expect("plan");
            p.env.into_iter().find(|(n, _)| n == "SUP_INSTANCE")
        };
        assert_eq!(has(&c), None, "a plain service has none");
        c.instance = Some(crate::config::Instance {
            table: "w".into(),
            index: 2,
        });
        assert_eq!(has(&c), Some(("SUP_INSTANCE".into(), "2".into())));
    }

    #[test]
    fn env_files_parse_skip_comments_and_strip_quotes() {
        let text = "# a comment\n\nA=1\n  B = \"two words\" \nC='x'\nD=\"unbalanced\nE=a=b\n";
        let got = parse_env_file(text).expect("parsed");
        let want = [
            ("A", "1"),
            ("B", "two words"),
            ("C", "x"),
            ("D", "\"unbalanced"),
            ("E", "a=b"),
        ];
        assert_eq!(got, want.map(|(k, v)| (k.to_string(), v.to_string())));
        assert_eq!(
            parse_env_file("A=1\nnot a pair\n"),
            Err((2, "expected KEY=VALUE".to_string()))
        );
        assert!(parse_env_file("MY VAR=1").is_err());
    }

    #[test]
    fn refusals_say_why() {
        let dir = std::env::temp_dir();
        let mut c = ServiceConfig::new("a", vec!["/bin/true".into()], "/".into());
        // Users and directories are the child's to look up (see spawner::spawn_service):
        // the plan only names them.
        c.user = Some("no-such-user-sup".into());
        c.cwd = Some("/nonexistent/dir".into());
        let p = resolve(&c, &supd(&dir), None).expect("planned");
        assert_eq!(
            p.creds,
            Some(Account {
                user: Some("no-such-user-sup".into()),
                group: None
            })
        );
        assert_eq!(p.cwd, Path::new("/nonexistent/dir"));
        // With no cwd, a user's service starts in `/`, not in the private state_dir.
        c.cwd = None;
        assert_eq!(
            resolve(&c, &supd(&dir), None).expect("planned").cwd,
            Path::new("/")
        );
        c.user = None;
        assert_eq!(resolve(&c, &supd(&dir), None).expect("planned").cwd, dir);
        c.cwd = None;
        c.tool = Some("agent".into());
        let none = dir.join(format!("sup-launch-{}", std::process::id()));
        assert_eq!(
            resolve(&c, &supd(&none), None),
            Err(NotLaunched::NoVersion(
                "no current version of tool 'agent'".into()
            ))
        );
    }

    #[test]
    fn versioned_programs_run_inside_current() {
        let dir = crate::scratch::Scratch::new("launch-v");
        std::fs::create_dir_all(dir.join("tools/agent/1.2.0/bin")).expect("mkdir");
        std::os::unix::fs::symlink("1.2.0", dir.join("tools/agent/current")).expect("symlink");
        let mut c = ServiceConfig::new("a", vec!["bin/agent".into()], "/".into());
        c.tool = Some("agent".into());
        let p = resolve(&c, &supd(&dir), None).expect("plan");
        assert_eq!(p.version.as_deref(), Some("1.2.0"));
        assert_eq!(
            p.program,
            dir.join("tools/agent/1.2.0/bin/agent").to_string_lossy()
        );
        assert_eq!(p.cwd, dir.join("tools/agent/1.2.0"));
    }
}
