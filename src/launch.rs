//! Preparing a service's process: which program (inside the tool's current version or
//! not), its arguments, environment, directory and credentials. Lookups happen here, in
//! the parent, at each start, so users and versions created after the config was read
//! are found.

use crate::config::{Ready, ServiceConfig, SupdConfig};
use crate::sys::Credentials;
use std::path::{Path, PathBuf};

/// The PATH a service gets unless its `env` sets one.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// A start that cannot happen, and whether retrying could help at once.
#[derive(Debug, PartialEq, Eq)]
pub enum NotLaunched {
    /// A versioned service whose tool has no `current`: it waits for an upgrade.
    NoVersion(String),
    /// Anything else (unknown user, missing cwd): a failed start.
    Failed(String),
}

/// What to run, resolved.
#[derive(Debug, PartialEq, Eq)]
pub struct Plan {
    pub program: String,
    pub args: Vec<String>,
    pub cwd: PathBuf,
    pub env: Vec<(String, String)>,
    pub creds: Option<Credentials>,
    /// The tool's version this start runs, for versioned services.
    pub version: Option<String>,
}

impl PartialEq for Credentials {
    fn eq(&self, o: &Self) -> bool {
        (self.uid, self.gid, &self.groups) == (o.uid, o.gid, &o.groups)
    }
}
impl Eq for Credentials {}

/// Resolves a service's start.
pub fn plan(
    cfg: &ServiceConfig,
    supd: &SupdConfig,
    notify_socket: Option<&Path>,
) -> Result<Plan, NotLaunched> {
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
    let cwd = cfg
        .cwd
        .clone()
        .or(version_dir)
        .unwrap_or_else(|| supd.state_dir.clone());
    if !cwd.is_dir() {
        return Err(NotLaunched::Failed(format!(
            "cwd {}: no such directory",
            cwd.display()
        )));
    }
    let creds = match &cfg.user {
        Some(user) => Some(credentials(user, cfg.group.as_deref()).map_err(NotLaunched::Failed)?),
        None => match &cfg.group {
            Some(g) => Some(group_only(g).map_err(NotLaunched::Failed)?),
            None => None,
        },
    };
    let mut env = vec![
        ("PATH".to_string(), DEFAULT_PATH.to_string()),
        ("SUP_SERVICE".to_string(), cfg.name.clone()),
    ];
    if let Some(v) = &version {
        env.push(("SUP_VERSION".into(), v.clone()));
    }
    if let (Ready::Notify, Some(sock)) = (cfg.ready, notify_socket) {
        env.push(("NOTIFY_SOCKET".into(), sock.to_string_lossy().into_owned()));
    }
    if let Some(user) = &cfg.user {
        if let Ok(Some(u)) = nix::unistd::User::from_name(user) {
            env.push(("USER".into(), u.name.clone()));
            env.push(("LOGNAME".into(), u.name));
            env.push(("HOME".into(), u.dir.to_string_lossy().into_owned()));
        }
    }
    for (k, v) in &cfg.env {
        env.retain(|(name, _)| name != k);
        env.push((k.clone(), v.clone()));
    }
    Ok(Plan {
        program,
        args: cfg.command.iter().skip(1).cloned().collect(),
        cwd,
        env,
        creds,
        version,
    })
}

/// uid, gid and supplementary groups of `user` (the group overridden by `group`).
fn credentials(user: &str, group: Option<&str>) -> Result<Credentials, String> {
    let u = match nix::unistd::User::from_name(user) {
        Ok(Some(u)) => u,
        Ok(None) => return Err(format!("unknown user '{user}'")),
        Err(e) => return Err(format!("cannot look up user '{user}': {e}")),
    };
    let gid = match group {
        Some(g) => group_only(g)?.gid,
        None => u.gid.as_raw(),
    };
    let name = crate::sys::cstring(user).map_err(|e| format!("user '{user}': {e}"))?;
    let groups = nix::unistd::getgrouplist(&name, gid.into())
        .map(|gs| gs.iter().map(|g| g.as_raw()).collect())
        .unwrap_or_else(|_| vec![gid]);
    Ok(Credentials {
        uid: u.uid.as_raw(),
        gid,
        groups,
    })
}

/// Credentials that change only the group (uid stays supd's).
fn group_only(group: &str) -> Result<Credentials, String> {
    match nix::unistd::Group::from_name(group) {
        Ok(Some(g)) => Ok(Credentials {
            uid: nix::unistd::getuid().as_raw(),
            gid: g.gid.as_raw(),
            groups: vec![g.gid.as_raw()],
        }),
        Ok(None) => Err(format!("unknown group '{group}'")),
        Err(e) => Err(format!("cannot look up group '{group}': {e}")),
    }
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
        let p = plan(&c, &s, None).expect("plan");
        assert_eq!(
            (p.program.as_str(), p.args.as_slice(), p.cwd.as_path()),
            ("/bin/echo", &["hi".to_string()][..], dir.as_path())
        );
        c.command = vec!["sleep".into()];
        assert_eq!(plan(&c, &s, None).expect("plan").program, "sleep");
        c.command = vec!["bin/x".into()];
        assert_eq!(plan(&c, &s, None).expect("plan").program, "/etc/sup/bin/x");
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
        let p = plan(&c, &supd(&dir), Some(Path::new("/run/n.sock"))).expect("plan");
        let get = |k: &str| p.env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("PATH"), Some("/opt/bin"));
        assert_eq!(get("MODE"), Some("x"));
        assert_eq!(get("SUP_SERVICE"), Some("a"));
        assert_eq!(get("NOTIFY_SOCKET"), Some("/run/n.sock"));
        assert_eq!(get("HOME"), None);
    }

    #[test]
    fn refusals_say_why() {
        let dir = std::env::temp_dir();
        let mut c = ServiceConfig::new("a", vec!["/bin/true".into()], "/".into());
        c.user = Some("no-such-user-sup".into());
        assert_eq!(
            plan(&c, &supd(&dir), None),
            Err(NotLaunched::Failed(
                "unknown user 'no-such-user-sup'".into()
            ))
        );
        c.user = None;
        c.cwd = Some("/nonexistent/dir".into());
        assert_eq!(
            plan(&c, &supd(&dir), None),
            Err(NotLaunched::Failed(
                "cwd /nonexistent/dir: no such directory".into()
            ))
        );
        c.cwd = None;
        c.tool = Some("agent".into());
        let none = dir.join(format!("sup-launch-{}", std::process::id()));
        assert_eq!(
            plan(&c, &supd(&none), None),
            Err(NotLaunched::NoVersion(
                "no current version of tool 'agent'".into()
            ))
        );
    }

    #[test]
    fn versioned_programs_run_inside_current() {
        let dir = std::env::temp_dir().join(format!("sup-launch-v-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("tools/agent/1.2.0/bin")).expect("mkdir");
        std::os::unix::fs::symlink("1.2.0", dir.join("tools/agent/current")).expect("symlink");
        let mut c = ServiceConfig::new("a", vec!["bin/agent".into()], "/".into());
        c.tool = Some("agent".into());
        let p = plan(&c, &supd(&dir), None).expect("plan");
        assert_eq!(p.version.as_deref(), Some("1.2.0"));
        assert_eq!(
            p.program,
            dir.join("tools/agent/1.2.0/bin/agent").to_string_lossy()
        );
        assert_eq!(p.cwd, dir.join("tools/agent/1.2.0"));
    }
}
