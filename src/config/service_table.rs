//! A `[service.NAME]` table: each of its keys, and the checks that need several keys of
//! one service. The `health` key's table is in `health_table.rs`; the checks across
//! services in `checks.rs`.

use super::health_table::read_health;
use super::lease_table::tool_name;
use super::origins::Origins;
use super::walk::{set, FileCtx, Value};
use super::*;
use std::path::PathBuf;
use toml::Spanned;

pub(super) const SERVICE_KEYS: &[&str] = &[
    "tool",
    "command",
    "cwd",
    "env",
    "user",
    "group",
    "restart",
    "success_codes",
    "restart_delay",
    "restart_delay_max",
    "stable_after",
    "crash_loop",
    "on_crash_loop",
    "cooldown",
    "probation",
    "regression_window",
    "ready",
    "ready_timeout",
    "stop_signal",
    "stop_timeout",
    "after",
    "autostart",
    "log",
    "log_max_size",
    "log_keep",
    "log_stderr",
    "leader_only",
    "umask",
    "nice",
    "instances",
    "limits",
    "env_file",
    "reload_signal",
    "watchdog",
    "health",
    "kill_mode",
    "runtime_dir",
    "memory_max",
    "memory_high",
    "cpu_weight",
    "cpu_max",
    "pids_max",
    "io_weight",
    "listen",
    "fd_store",
];

/// Where a service was defined, for errors found after all files are read.
#[derive(Clone)]
pub(super) struct Origin {
    pub(super) file: PathBuf,
    pub(super) line: usize,
    pub(super) column: usize,
    pub(super) after: Vec<(String, usize, usize)>,
    /// The file whose `after` won (the definition's or an override's).
    pub(super) after_in: PathBuf,
    pub(super) leader_only: Option<(String, usize, usize)>,
    pub(super) leader_only_in: PathBuf,
    /// `instances = N`: checked, 1 unless written.
    pub(super) instances: u32,
    /// Where each cgroup limit that is set was written (the last table's), for the
    /// check that the machine has its controller (`checks::check_controllers`).
    pub(super) resources: Vec<(&'static str, PathBuf, usize, usize)>,
}

pub(super) fn read_service(
    ctx: &mut FileCtx,
    name: &Spanned<std::borrow::Cow<str>>,
    def: &Value,
    cfg: &mut Config,
    origin: &mut BTreeMap<String, Origin>,
) {
    let n = name.get_ref().to_string();
    let prefix = format!("service.{n}");
    let (line, column) = ctx.pos(name.span().start);
    if !valid_name(&n) {
        ctx.err(
            name.span(),
            &prefix,
            "a service name is letters, digits, '-', '_', '.' or '@', not starting with '.'",
        );
        return;
    }
    if let Some(first) = origin.get(&n) {
        let msg = format!(
            "service '{n}' is already defined at {}:{}:{}",
            first.file.display(),
            first.line,
            first.column
        );
        ctx.err(name.span(), &prefix, msg);
        return;
    }
    let Some(table) = ctx.table(def, &prefix) else {
        return;
    };
    let mut svc = ServiceConfig::new(&n, Vec::new(), ctx.dir());
    let mut org = Origin {
        file: ctx.path.to_path_buf(),
        line,
        column,
        after: Vec::new(),
        after_in: ctx.path.to_path_buf(),
        leader_only: None,
        leader_only_in: ctx.path.to_path_buf(),
        instances: 1,
        resources: Vec::new(),
    };
    let mut origins = Origins::new(ctx.path.to_path_buf());
    let saw_command = read_keys(ctx, &n, table, &mut svc, &mut org, &mut origins);
    if org.instances == 1 {
        if let Err(why) = super::instances::check_plain_name(&n) {
            ctx.err(name.span(), &prefix, why);
        }
    }
    if !saw_command {
        ctx.err(
            name.span(),
            &format!("{prefix}.command"),
            "missing: every service needs a command, such as [\"/usr/bin/agent\", \"--flag\"]",
        );
    }
    check_service(ctx, def, &prefix, &svc, None);
    origin.insert(n.clone(), org);
    cfg.origins.insert(n.clone(), origins);
    cfg.services.insert(n, svc);
}

/// An override's `[service.NAME]` table (`overrides.rs`), applied over the service as
/// the files before it left it: each key it sets wins; `env` and `limits` are merged
/// entry by entry. Relative paths in it start where the service's defining file is.
pub(super) fn read_override(
    ctx: &mut FileCtx,
    name: &str,
    def: &Value,
    cfg: &mut Config,
    origin: &mut BTreeMap<String, Origin>,
) {
    let prefix = format!("service.{name}");
    let (Some(svc), Some(org), Some(origins)) = (
        cfg.services.get_mut(name),
        origin.get_mut(name),
        cfg.origins.get_mut(name),
    ) else {
        return;
    };
    let Some(table) = ctx.table(def, &prefix) else {
        return;
    };
    origins.files.push(ctx.path.to_path_buf());
    let before = svc.clone();
    read_keys(ctx, name, table, svc, org, origins);
    check_service(ctx, def, &prefix, svc, Some(&before));
}

/// The keys of one table of service `n` (its definition or an override), set into `svc`
/// and each one's place noted in `origins`; whether it set `command`.
fn read_keys(
    ctx: &mut FileCtx,
    n: &str,
    table: &toml::de::DeTable,
    svc: &mut ServiceConfig,
    org: &mut Origin,
    origins: &mut Origins,
) -> bool {
    let mut saw_command = false;
    let file = origins.files.len() - 1;
    let prefix = format!("service.{n}");
    for (key, v) in table.iter() {
        let k = key.get_ref().as_ref();
        let full = format!("{prefix}.{k}");
        let f = full.as_str();
        let (line, _) = ctx.pos(key.span().start);
        let errors_before = ctx.errors.len();
        let p = &mut svc.policy;
        match k {
            "tool" => svc.tool = ctx.parsed(v, f, tool_name),
            "command" => {
                saw_command = true;
                if let Some(argv) = ctx.strings(v, f) {
                    if argv.first().is_none_or(|a| a.is_empty()) {
                        ctx.err(
                            v.span(),
                            f,
                            "expected a non-empty array whose first item is the program",
                        );
                    }
                    svc.command = argv;
                }
            }
            "cwd" => svc.cwd = ctx.path(v, f),
            "env" => {
                for (var, value, at) in read_env(ctx, v, f) {
                    origins.set(&format!("env.{var}"), file, at);
                    svc.env.insert(var, value);
                }
            }
            "user" => svc.user = ctx.string(v, f),
            "group" => svc.group = ctx.string(v, f),
            "restart" => set(
                &mut p.restart,
                ctx.choice(
                    v,
                    f,
                    &[
                        ("always", RestartMode::Always),
                        ("on-failure", RestartMode::OnFailure),
                        ("never", RestartMode::Never),
                    ],
                ),
            ),
            "success_codes" => set(&mut p.success_codes, read_codes(ctx, v, f)),
            "restart_delay" => set(&mut p.restart_delay, ctx.duration(v, f)),
            "restart_delay_max" => set(&mut p.restart_delay_max, ctx.duration(v, f)),
            "stable_after" => set(&mut p.stable_after, ctx.duration(v, f)),
            "crash_loop" => set(&mut p.crash_loop, read_crash_loop(ctx, v, f)),
            "on_crash_loop" => set(
                &mut p.on_crash_loop,
                ctx.choice(
                    v,
                    f,
                    &[
                        ("cooldown", OnCrashLoop::Cooldown),
                        ("stop", OnCrashLoop::Stop),
                        ("shutdown", OnCrashLoop::Shutdown),
                    ],
                ),
            ),
            "cooldown" => set(&mut p.cooldown, ctx.duration(v, f)),
            "probation" => set(&mut svc.probation, ctx.duration(v, f)),
            "regression_window" => set(&mut svc.regression_window, ctx.duration(v, f)),
            "ready" => set(&mut svc.ready, ctx.parsed(v, f, parse_ready)),
            "ready_timeout" => set(&mut svc.ready_timeout, ctx.duration(v, f)),
            "stop_signal" => set(&mut svc.stop_signal, ctx.parsed(v, f, parse_signal)),
            "stop_timeout" => set(&mut svc.stop_timeout, ctx.duration(v, f)),
            "reload_signal" => set(&mut svc.reload_signal, ctx.parsed(v, f, parse_signal)),
            "after" => {
                // A later table's `after` replaces the list.
                svc.after.clear();
                org.after.clear();
                org.after_in = ctx.path.to_path_buf();
                if let Some(items) = ctx.array(v, f) {
                    for item in items {
                        if let Some(s) = ctx.string(item, f) {
                            let (l, c) = ctx.pos(item.span().start);
                            org.after.push((s.clone(), l, c));
                            svc.after.push(s);
                        }
                    }
                }
            }
            "autostart" => set(&mut svc.autostart, ctx.boolean(v, f)),
            "log" => set(
                &mut svc.log,
                ctx.choice(
                    v,
                    f,
                    &[
                        ("file", LogMode::File),
                        ("inherit", LogMode::Inherit),
                        ("null", LogMode::Null),
                    ],
                ),
            ),
            "log_max_size" => set(
                &mut svc.log_max_size,
                ctx.parsed(v, f, crate::time::parse_size),
            ),
            "log_keep" => match ctx.integer(v, f) {
                Some(n) if (0..=1000).contains(&n) => svc.log_keep = n as u32,
                Some(_) => ctx.err(v.span(), f, "expected a number of files from 0 to 1000"),
                None => {}
            },
            "log_stderr" => set(
                &mut svc.log_stderr,
                ctx.choice(
                    v,
                    f,
                    &[("marked", LogStderr::Marked), ("merged", LogStderr::Merged)],
                ),
            ),
            "leader_only" => {
                if let Some(s) = ctx.string(v, f) {
                    let (l, c) = ctx.pos(v.span().start);
                    org.leader_only = Some((s.clone(), l, c));
                    org.leader_only_in = ctx.path.to_path_buf();
                    svc.leader_only = Some(s);
                }
            }
            "umask" => svc.umask = ctx.parsed(v, f, parse_umask),
            "nice" => match ctx.integer(v, f) {
                Some(n) if (-20..=19).contains(&n) => svc.nice = Some(n as i32),
                Some(_) => ctx.err(v.span(), f, "expected a nice value from -20 to 19"),
                None => {}
            },
            "limits" => {
                for (limit, at) in read_limits(ctx, v, f) {
                    origins.set(&format!("limits.{}", limit.name), file, at);
                    svc.limits.retain(|l| l.name != limit.name);
                    svc.limits.push(limit);
                }
            }
            "watchdog" => match ctx.duration(v, f) {
                Some(d) if d.is_zero() => ctx.err(
                    v.span(),
                    f,
                    "expected a duration longer than 0, such as \"30s\" (leave it out for none)",
                ),
                d => svc.watchdog = d.or(svc.watchdog),
            },
            "health" => svc.health = read_health(ctx, v, f).map(Box::new),
            "kill_mode" => set(
                &mut svc.kill_mode,
                ctx.choice(
                    v,
                    f,
                    &[
                        ("cgroup", KillMode::Cgroup),
                        ("group", KillMode::Group),
                        ("main", KillMode::Main),
                    ],
                ),
            ),
            "runtime_dir" => svc.runtime_dir = ctx.parsed(v, f, super::runtime_dir::parse),
            "memory_max" | "memory_high" | "cpu_weight" | "cpu_max" | "pids_max" | "io_weight" => {
                super::resources::read(ctx, k, v, f, &mut svc.resources);
                if let Some(&name) = super::resources::KEYS.iter().find(|&&x| x == k) {
                    let (l, c) = ctx.pos(key.span().start);
                    org.resources.retain(|(x, ..)| *x != name);
                    org.resources.push((name, ctx.path.to_path_buf(), l, c));
                }
            }
            "listen" => {
                let mut listen = Vec::new();
                for item in ctx.array(v, f).unwrap_or(&[]) {
                    if let Some(addr) = ctx.parsed(item, f, super::listen::parse) {
                        match listen.iter().find(|l| super::listen::clashes(l, &addr)) {
                            Some(l) if *l == addr => {
                                ctx.err(item.span(), f, format!("'{addr}' is listed twice"))
                            }
                            Some(l) => ctx.err(
                                item.span(),
                                f,
                                format!(
                                    "'{addr}' cannot be bound beside '{l}': a wildcard address (0.0.0.0, [::]) takes its port on every address of its family; list one"
                                ),
                            ),
                            None => listen.push(addr),
                        }
                    }
                }
                if listen.len() > super::listen::LISTEN_MAX {
                    ctx.err(
                        v.span(),
                        f,
                        format!("at most {} sockets", super::listen::LISTEN_MAX),
                    );
                }
                svc.listen = listen;
            }
            "fd_store" => match ctx.integer(v, f).map(super::listen::fd_store) {
                Some(Ok(n)) => svc.fd_store = n,
                Some(Err(why)) => ctx.err(v.span(), f, why),
                None => {}
            },
            "instances" => match ctx
                .integer(v, f)
                .map(|count| super::instances::count(n, count))
            {
                Some(Ok(count)) => {
                    org.instances = count;
                    origins.instances = count;
                }
                Some(Err(why)) => ctx.err(v.span(), f, why),
                None => {}
            },
            "env_file" => {
                // A later table's `env_file` replaces the list.
                svc.env_file.clear();
                for item in ctx.array(v, f).unwrap_or(&[]) {
                    let Some(s) = ctx.string(item, f) else {
                        continue;
                    };
                    let (optional, path) = match s.strip_prefix('-') {
                        Some(rest) => (true, rest),
                        None => (false, s.as_str()),
                    };
                    if path.is_empty() || path.contains('\0') {
                        ctx.err(
                            item.span(),
                            f,
                            "expected a file name, such as \"/etc/default/agent\" (a leading '-' makes it optional)",
                        );
                        continue;
                    }
                    let path = ctx.dir().join(path);
                    svc.env_file.push(EnvFile { path, optional });
                }
            }
            _ => {
                ctx.unknown(key.span(), f, SERVICE_KEYS);
                continue;
            }
        }
        if k != "env" && k != "limits" && ctx.errors.len() == errors_before {
            origins.set(k, file, line);
        }
    }
    saw_command
}

/// Checks that need several keys of one service; after an override (`before`: the
/// service as the files before it left it), only what the override made wrong.
fn check_service(
    ctx: &mut FileCtx,
    def: &Value,
    prefix: &str,
    svc: &ServiceConfig,
    before: Option<&ServiceConfig>,
) {
    for (key, message) in problems(svc) {
        if before.is_none_or(|b| !problems(b).contains(&(key, message))) {
            ctx.err(def.span(), &format!("{prefix}.{key}"), message);
        }
    }
    if let (Some(cmd), None) = (svc.command.first(), &svc.tool) {
        if !cmd.starts_with('/') && cmd.contains('/') && !svc.base_dir.join(cmd).exists() {
            // Not an error: the program may be installed later. It is reported at start.
            log::debug!("{prefix}: {cmd} does not exist yet");
        }
    }
}

/// What is wrong across keys of `svc`: each key with its message.
fn problems(svc: &ServiceConfig) -> Vec<(&'static str, &'static str)> {
    let p = &svc.policy;
    let mut out = Vec::new();
    if p.restart_delay_max < p.restart_delay {
        out.push((
            "restart_delay_max",
            "must not be shorter than restart_delay",
        ));
    }
    if let Ready::Fd(n) = svc.ready {
        // The sockets and stored fds are fds 3.. of each run (sd_listen_fds(3)).
        if !svc.listen.is_empty() || svc.fd_store > 0 {
            let top = 3 + svc.listen.len() as i64 + i64::from(svc.fd_store);
            if (n as i64) < top {
                out.push((
                    "ready",
                    "ready = \"fd:N\" takes an fd the sockets of `listen` and the fds of `fd_store` are given as (3 and up, one each): choose N above them all",
                ));
            }
        }
    }
    if svc.ready == Ready::Exited && p.restart == RestartMode::Always {
        out.push((
            "ready",
            "ready = \"exited\" is for one-shot tasks: set restart = \"never\" or \"on-failure\"",
        ));
    }
    out
}

/// `env`'s entries, each with the line it is on.
fn read_env(ctx: &mut FileCtx, v: &Value, key: &str) -> Vec<(String, String, usize)> {
    let mut env = Vec::new();
    let Some(table) = ctx.table(v, key) else {
        return env;
    };
    for (name, value) in table.iter() {
        let n = name.get_ref().to_string();
        let full = format!("{key}.{n}");
        if n.is_empty() || n.contains('=') || n.contains('\0') {
            ctx.err(
                name.span(),
                &full,
                "an environment variable's name must not be empty or hold '='",
            );
            continue;
        }
        if let Some(s) = ctx.string(value, &full) {
            let (line, _) = ctx.pos(name.span().start);
            env.push((n, s, line));
        }
    }
    env
}

fn read_codes(ctx: &mut FileCtx, v: &Value, key: &str) -> Option<Vec<i32>> {
    let items = ctx.array(v, key)?;
    let mut codes = Vec::new();
    for item in items {
        match ctx.integer(item, key) {
            Some(n) if (0..=255).contains(&n) => codes.push(n as i32),
            Some(_) => ctx.err(item.span(), key, "an exit code is from 0 to 255"),
            None => {}
        }
    }
    Some(codes)
}

fn read_crash_loop(ctx: &mut FileCtx, v: &Value, key: &str) -> Option<CrashLoop> {
    let table = ctx.table(v, key)?;
    let mut cl = Policy::default().crash_loop;
    for (k, item) in table.iter() {
        let full = format!("{key}.{}", k.get_ref());
        match k.get_ref().as_ref() {
            "restarts" => match ctx.integer(item, &full) {
                Some(n) if (1..=100_000).contains(&n) => cl.restarts = n as u32,
                Some(_) => ctx.err(
                    item.span(),
                    &full,
                    "expected a number of restarts from 1 to 100000",
                ),
                None => {}
            },
            "window" => set(&mut cl.window, ctx.duration(item, &full)),
            _ => ctx.unknown(k.span(), &full, &["restarts", "window"]),
        }
    }
    Some(cl)
}

/// `umask = "027"`: an octal string of at most four digits, up to 0777.
fn parse_umask(s: &str) -> Result<u32, String> {
    match u32::from_str_radix(s, 8) {
        Ok(n) if n <= 0o777 && !s.is_empty() && s.len() <= 4 && !s.starts_with('+') => Ok(n),
        _ => Err(format!(
            "'{s}' is not a umask: expected an octal string such as \"027\" (0 to 0777)"
        )),
    }
}

/// `limits = { nofile = 65536, core = "0:unlimited" }`: each with the line it is on.
fn read_limits(ctx: &mut FileCtx, v: &Value, key: &str) -> Vec<(Rlimit, usize)> {
    let mut out = Vec::new();
    let Some(table) = ctx.table(v, key) else {
        return out;
    };
    for (k, item) in table.iter() {
        let name = k.get_ref().to_string();
        let full = format!("{key}.{name}");
        if !LIMIT_NAMES.contains(&name.as_str()) {
            ctx.unknown(k.span(), &full, LIMIT_NAMES);
            continue;
        }
        let value = match item.get_ref() {
            toml::de::DeValue::Integer(_) => match ctx.integer(item, &full) {
                Some(n) if n >= 0 => Ok((Some(n as u64), Some(n as u64))),
                Some(_) => Err("a limit is not negative".to_string()),
                None => continue,
            },
            _ => match ctx.string(item, &full) {
                Some(s) => parse_limit(&s),
                None => continue,
            },
        };
        match value {
            Ok((soft, hard)) => {
                let (line, _) = ctx.pos(k.span().start);
                out.push((Rlimit { name, soft, hard }, line));
            }
            Err(why) => ctx.err(item.span(), &full, why),
        }
    }
    out
}

/// "unlimited", "N", or "SOFT:HARD" with each a number or "unlimited"; soft <= hard.
fn parse_limit(s: &str) -> Result<(Option<u64>, Option<u64>), String> {
    let one = |t: &str| -> Result<Option<u64>, ()> {
        match t.trim() {
            "unlimited" | "infinity" => Ok(None),
            n => n.parse::<u64>().map(Some).map_err(|_| ()),
        }
    };
    let expected = || {
        format!(
            "'{s}': expected a number, \"unlimited\", or \"SOFT:HARD\" (such as \"1024:65536\")"
        )
    };
    let (soft, hard) = match s.split_once(':') {
        Some((a, b)) => (
            one(a).map_err(|_| expected())?,
            one(b).map_err(|_| expected())?,
        ),
        None => {
            let v = one(s).map_err(|_| expected())?;
            (v, v)
        }
    };
    match (soft, hard) {
        (None, Some(_)) => Err(format!("'{s}': the soft limit is above the hard one")),
        (Some(a), Some(b)) if a > b => Err(format!("'{s}': the soft limit is above the hard one")),
        _ => Ok((soft, hard)),
    }
}

fn parse_ready(s: &str) -> Result<Ready, String> {
    match s {
        "started" => Ok(Ready::Started),
        "notify" => Ok(Ready::Notify),
        "exited" => Ok(Ready::Exited),
        _ => match s.strip_prefix("fd:").map(str::parse::<i32>) {
            Some(Ok(n)) if (3..=1023).contains(&n) => Ok(Ready::Fd(n)),
            Some(_) => Err(format!("'{s}': the fd of \"fd:N\" is a number from 3 to 1023 (0 to 2 are the standard streams)")),
            None => Err(format!("'{s}' is not one of \"started\", \"notify\", \"fd:N\", \"exited\"")),
        },
    }
}
