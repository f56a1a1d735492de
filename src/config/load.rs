//! Loading: the main file, its `include` globs, every table and key, then the checks
//! that need the whole config (`after` names, cycles, leases).

use super::read;
use super::walk::{FileCtx, Value};
use super::*;
use std::fmt;
use std::path::{Path, PathBuf};
use toml::de::DeTable;
use toml::Spanned;

/// One problem in a config file, at a position.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    pub file: PathBuf,
    /// 1-based; 0 when the error is about the file as a whole.
    pub line: usize,
    pub column: usize,
    pub key: String,
    pub message: String,
}

/// One error, one line: whatever the file's name, a key or a quoted value holds (a
/// newline in a quoted TOML key, a control character in a name) is shown escaped.
impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let file = Escaped(&self.file.to_string_lossy());
        let (key, message) = (Escaped(&self.key), Escaped(&self.message));
        match (self.line, self.key.is_empty()) {
            (0, _) => write!(f, "{file}: {message}"),
            (_, true) => write!(f, "{file}:{}:{}: {message}", self.line, self.column),
            (_, false) => write!(f, "{file}:{}:{}: {key}: {message}", self.line, self.column),
        }
    }
}

/// Text with its control characters written as Rust escapes (`\n`, `\u{1b}`).
struct Escaped<'a>(&'a str);

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in self.0.chars() {
            if c.is_control() {
                write!(f, "{}", c.escape_default())?;
            } else {
                write!(f, "{c}")?;
            }
        }
        Ok(())
    }
}

const SUPD_KEYS: &[&str] = &[
    "socket",
    "socket_group",
    "state_dir",
    "tools_dir",
    "log_dir",
    "log_file",
    "log_max_size",
    "log_keep",
    "include",
    "shutdown_timeout",
    "mode",
    "cgroups",
    "nice",
    "realtime",
];
const SERVICE_KEYS: &[&str] = &[
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
];
const HEALTH_KEYS: &[&str] = &[
    "command",
    "tcp",
    "http",
    "interval",
    "timeout",
    "failures",
    "start_delay",
];

/// Reads `path` and every file it includes. Returns the config, or every error found.
pub fn load(path: &Path) -> Result<Config, Vec<ConfigError>> {
    load_from(path, &mut |p| read::read_config_file(p), false)
}

/// The text of a file of the config, or why it is not read (`lastgood.rs` gives a
/// broken file's last good copy, or nothing, in its place).
pub(super) type TextOf<'a> = dyn FnMut(&Path) -> Result<String, String> + 'a;

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
    for (pattern, at) in std::mem::take(&mut seen.includes) {
        for file in glob(&pattern) {
            cfg.files.push(file.clone());
            read_file(&file, &at, &mut source, &mut cfg, &mut seen, &mut errors);
        }
    }
    check_whole(&cfg, &seen.services, &mut errors);
    let counts = instance_counts(&seen.services, &mut errors);
    super::instances::expand(&mut cfg.services, &counts);
    // Tables iterate by key; people read a file from the top.
    let file_rank = |f: &PathBuf| cfg.files.iter().position(|g| g == f).unwrap_or(usize::MAX);
    errors.sort_by_key(|e| (file_rank(&e.file), e.line, e.column));
    if errors.is_empty() {
        Ok(cfg)
    } else {
        Err(errors)
    }
}

/// A position in a file.
#[derive(Clone)]
struct Place {
    file: PathBuf,
    line: usize,
    column: usize,
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file.display(), self.line, self.column)
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
    };
    let mut seen = Seen::default();
    read_text(path, text, true, &mut cfg, &mut seen, &mut errors);
    check_whole(&cfg, &seen.services, &mut errors);
    let counts = instance_counts(&seen.services, &mut errors);
    super::instances::expand(&mut cfg.services, &counts);
    if errors.is_empty() {
        Ok(cfg)
    } else {
        Err(errors)
    }
}

/// Where a service was defined, for errors found after all files are read.
#[derive(Clone)]
struct Origin {
    file: PathBuf,
    line: usize,
    column: usize,
    after: Vec<(String, usize, usize)>,
    leader_only: Option<(String, usize, usize)>,
    /// `instances = N`: checked, 1 unless written.
    instances: u32,
}

/// The tables that run several instances, with their number; an error at the table
/// that takes the whole config's instances past [`MAX_TOTAL_INSTANCES`].
fn instance_counts(
    origin: &BTreeMap<String, Origin>,
    errors: &mut Vec<ConfigError>,
) -> BTreeMap<String, u32> {
    let mut total = 0;
    let mut counts = BTreeMap::new();
    for (name, o) in origin.iter().filter(|(_, o)| o.instances > 1) {
        total += o.instances as usize;
        if total > super::instances::MAX_TOTAL_INSTANCES {
            errors.push(ConfigError {
                file: o.file.clone(),
                line: o.line,
                column: o.column,
                key: format!("service.{name}.instances"),
                message: format!(
                    "the config's tables ask for more than {} instances in all",
                    super::instances::MAX_TOTAL_INSTANCES
                ),
            });
            break;
        }
        counts.insert(name.clone(), o.instances);
    }
    counts
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

fn read_supd(
    ctx: &mut FileCtx,
    value: &Value,
    supd: &mut SupdConfig,
    includes: &mut Vec<(PathBuf, Place)>,
) {
    let Some(table) = ctx.table(value, "supd") else {
        return;
    };
    for (key, v) in table.iter() {
        let k = key.get_ref().as_ref();
        let full = format!("supd.{k}");
        let full = full.as_str();
        match k {
            "socket" => set(&mut supd.socket, ctx.path(v, full)),
            "socket_group" => {
                supd.socket_group = ctx.string(v, full).filter(|s| !s.is_empty());
            }
            "state_dir" => set(&mut supd.state_dir, ctx.path(v, full)),
            "tools_dir" => set(&mut supd.tools_dir, ctx.path(v, full)),
            "log_dir" => set(&mut supd.log_dir, ctx.path(v, full)),
            "log_file" => supd.log_file = ctx.path(v, full),
            "log_max_size" => set(
                &mut supd.log_max_size,
                ctx.parsed(v, full, crate::time::parse_size),
            ),
            "log_keep" => match ctx.integer(v, full) {
                Some(n) if (0..=1000).contains(&n) => supd.log_keep = n as u32,
                Some(_) => ctx.err(v.span(), full, "expected a number of files from 0 to 1000"),
                None => {}
            },
            "include" => {
                if let Some(list) = ctx.strings(v, full) {
                    supd.include = list.iter().map(|p| ctx.dir().join(p)).collect();
                    let items = ctx.array(v, full).unwrap_or(&[]);
                    includes.clear();
                    for (pattern, item) in supd.include.iter().zip(items) {
                        let (line, column) = ctx.pos(item.span().start);
                        let file = ctx.path.to_path_buf();
                        includes.push((pattern.clone(), Place { file, line, column }));
                    }
                }
            }
            "shutdown_timeout" => set(&mut supd.shutdown_timeout, ctx.duration(v, full)),
            "mode" => set(
                &mut supd.mode,
                ctx.choice(
                    v,
                    full,
                    &[("container", Mode::Container), ("system", Mode::System)],
                ),
            ),
            "cgroups" => set(
                &mut supd.cgroups,
                ctx.choice(v, full, &[("auto", true), ("off", false)]),
            ),
            "nice" => match ctx.integer(v, full) {
                Some(n) if (-20..=0).contains(&n) => supd.nice = Some(n as i32),
                Some(_) => ctx.err(
                    v.span(),
                    full,
                    "expected a nice value from -20 to 0 (supd's priority is never below its services')",
                ),
                None => {}
            },
            "realtime" => set(&mut supd.realtime, ctx.boolean(v, full)),
            _ => ctx.unknown(key.span(), full, SUPD_KEYS),
        }
    }
    if let Err(e) = crate::versions::check_layout(&supd.state_dir, &supd.tools_dir) {
        if let Some((k, v)) = ["tools_dir", "state_dir"]
            .iter()
            .find_map(|k| table.get_key_value(*k))
        {
            ctx.err(v.span(), &format!("supd.{}", k.get_ref()), e);
        }
    }
}

fn set<T>(slot: &mut T, value: Option<T>) {
    if let Some(v) = value {
        *slot = v;
    }
}

fn read_service(
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
        leader_only: None,
        instances: 1,
    };
    let mut saw_command = false;
    for (key, v) in table.iter() {
        let k = key.get_ref().as_ref();
        let full = format!("{prefix}.{k}");
        let f = full.as_str();
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
            "env" => svc.env = read_env(ctx, v, f),
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
                    svc.leader_only = Some(s);
                }
            }
            "umask" => svc.umask = ctx.parsed(v, f, parse_umask),
            "nice" => match ctx.integer(v, f) {
                Some(n) if (-20..=19).contains(&n) => svc.nice = Some(n as i32),
                Some(_) => ctx.err(v.span(), f, "expected a nice value from -20 to 19"),
                None => {}
            },
            "limits" => svc.limits = read_limits(ctx, v, f),
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
            "instances" => match ctx
                .integer(v, f)
                .map(|count| super::instances::count(&n, count))
            {
                Some(Ok(count)) => org.instances = count,
                Some(Err(why)) => ctx.err(v.span(), f, why),
                None => {}
            },
            "env_file" => {
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
            _ => ctx.unknown(key.span(), f, SERVICE_KEYS),
        }
    }
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
    check_service(ctx, def, &prefix, &svc);
    origin.insert(n.clone(), org);
    cfg.services.insert(n, svc);
}

/// Checks that need several keys of one service.
fn check_service(ctx: &mut FileCtx, def: &Value, prefix: &str, svc: &ServiceConfig) {
    let p = &svc.policy;
    if p.restart_delay_max < p.restart_delay {
        ctx.err(
            def.span(),
            &format!("{prefix}.restart_delay_max"),
            "must not be shorter than restart_delay",
        );
    }
    if svc.ready == Ready::Exited && p.restart == RestartMode::Always {
        ctx.err(
            def.span(),
            &format!("{prefix}.ready"),
            "ready = \"exited\" is for one-shot tasks: set restart = \"never\" or \"on-failure\"",
        );
    }
    if let (Some(cmd), None) = (svc.command.first(), &svc.tool) {
        if !cmd.starts_with('/') && cmd.contains('/') && !svc.base_dir.join(cmd).exists() {
            // Not an error: the program may be installed later. It is reported at start.
            log::debug!("{prefix}: {cmd} does not exist yet");
        }
    }
}

fn read_env(ctx: &mut FileCtx, v: &Value, key: &str) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
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
            env.insert(n, s);
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

/// `health = { http = "http://127.0.0.1:8080/healthz", interval = "10s", ... }`.
fn read_health(ctx: &mut FileCtx, v: &Value, key: &str) -> Option<HealthConfig> {
    let table = ctx.table(v, key)?;
    let mut checks: Vec<Check> = Vec::new();
    let mut named = 0;
    let mut h = HealthConfig::new(Check::Command(Vec::new()));
    for (k, item) in table.iter() {
        let full = format!("{key}.{}", k.get_ref());
        let f = full.as_str();
        match k.get_ref().as_ref() {
            "command" => {
                named += 1;
                if let Some(argv) = ctx.strings(item, f) {
                    if argv.first().is_none_or(|a| a.is_empty()) {
                        ctx.err(
                            item.span(),
                            f,
                            "expected a non-empty array whose first item is the program",
                        );
                    } else {
                        checks.push(Check::Command(argv));
                    }
                }
            }
            "tcp" => {
                named += 1;
                if let Some(addr) = ctx.parsed(item, f, parse_tcp) {
                    checks.push(Check::Tcp(addr));
                }
            }
            "http" => {
                named += 1;
                if let Some((addr, path)) = ctx.parsed(item, f, parse_http) {
                    checks.push(Check::Http { addr, path });
                }
            }
            "interval" => set(&mut h.interval, ctx.duration(item, f)),
            "timeout" => set(&mut h.timeout, ctx.duration(item, f)),
            "start_delay" => set(&mut h.start_delay, ctx.duration(item, f)),
            "failures" => match ctx.integer(item, f) {
                Some(n) if (1..=1000).contains(&n) => h.failures = n as u32,
                Some(_) => ctx.err(
                    item.span(),
                    f,
                    "expected a number of failures from 1 to 1000",
                ),
                None => {}
            },
            _ => ctx.unknown(k.span(), f, HEALTH_KEYS),
        }
    }
    for (d, name) in [(h.interval, "interval"), (h.timeout, "timeout")] {
        if d.is_zero() {
            ctx.err(
                v.span(),
                &format!("{key}.{name}"),
                "expected a duration longer than 0, such as \"2s\"",
            );
        }
    }
    match named {
        0 => {
            ctx.err(
                v.span(),
                key,
                "missing the check: one of command = [...], tcp = \"127.0.0.1:8080\" or http = \"http://127.0.0.1:8080/healthz\"",
            );
            None
        }
        1 => {
            h.check = checks.pop()?;
            Some(h)
        }
        _ => {
            ctx.err(
                v.span(),
                key,
                "expected exactly one of command, tcp and http, found several",
            );
            None
        }
    }
}

/// What an address must look like: supd never resolves names (a hung resolver would
/// block it).
const NUMERIC: &str =
    "a numeric IP address and port, such as \"127.0.0.1:8080\" or \"[::1]:8080\" (supd looks up no host names: a resolver that hangs would block it)";

/// `tcp = "127.0.0.1:8080"`.
fn parse_tcp(s: &str) -> Result<std::net::SocketAddr, String> {
    s.parse()
        .map_err(|_| format!("'{s}' is not an address: expected {NUMERIC}"))
}

/// `http = "http://127.0.0.1:8080/healthz"`: the address and the path (`/` when absent).
fn parse_http(s: &str) -> Result<(std::net::SocketAddr, String), String> {
    let Some(rest) = s.strip_prefix("http://") else {
        return Err(format!(
            "'{s}' is not an http:// URL: expected one such as \"http://127.0.0.1:8080/healthz\" (https is not supported)"
        ));
    };
    let (host, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if path.bytes().any(|b| b.is_ascii_control() || b == b' ') {
        return Err(format!(
            "'{s}': the path must not hold spaces or control characters"
        ));
    }
    let addr = host
        .parse()
        .map_err(|_| format!("'{s}': '{host}' is not an address: expected {NUMERIC}"))?;
    Ok((addr, path.to_string()))
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

/// `limits = { nofile = 65536, core = "0:unlimited" }`.
fn read_limits(ctx: &mut FileCtx, v: &Value, key: &str) -> Vec<Rlimit> {
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
            Ok((soft, hard)) => out.push(Rlimit { name, soft, hard }),
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

fn tool_name(s: &str) -> Result<String, String> {
    if valid_name(s) {
        Ok(s.to_string())
    } else {
        Err(format!(
            "'{s}' is not a tool name: letters, digits, '-', '_', '.', not starting with '.'"
        ))
    }
}

fn read_lease(
    ctx: &mut FileCtx,
    name: &Spanned<std::borrow::Cow<str>>,
    def: &Value,
    cfg: &mut Config,
    seen: &mut BTreeMap<String, Place>,
) {
    let n = name.get_ref().to_string();
    let prefix = format!("lease.{n}");
    if !valid_name(&n) {
        ctx.err(
            name.span(),
            &prefix,
            "a lease name is letters, digits, '-', '_', '.', not starting with '.'",
        );
        return;
    }
    let (line, column) = ctx.pos(name.span().start);
    if let Some(first) = seen.get(&n) {
        ctx.err(
            name.span(),
            &prefix,
            format!("lease '{n}' is already defined at {first}"),
        );
        return;
    }
    let file = ctx.path.to_path_buf();
    seen.insert(n.clone(), Place { file, line, column });
    let Some(table) = ctx.table(def, &prefix) else {
        return;
    };
    let mut lease = LeaseConfig {
        name: n.clone(),
        tool: None,
    };
    for (key, v) in table.iter() {
        let full = format!("{prefix}.{}", key.get_ref());
        match key.get_ref().as_ref() {
            "tool" => lease.tool = ctx.parsed(v, &full, tool_name),
            _ => ctx.unknown(key.span(), &full, &["tool"]),
        }
    }
    cfg.leases.insert(n, lease);
}

/// Checks across services: `after` names existing services and makes no cycle;
/// `leader_only` names a lease.
fn check_whole(cfg: &Config, origin: &BTreeMap<String, Origin>, errors: &mut Vec<ConfigError>) {
    let err = |o: &Origin, line, column, key: String, message: String| ConfigError {
        file: o.file.clone(),
        line,
        column,
        key,
        message,
    };
    for (name, o) in origin {
        for (dep, line, column) in &o.after {
            if !cfg.services.contains_key(dep) {
                let message = match super::instances::split(dep) {
                    Some((table, _)) if origin.get(table).is_some_and(|t| t.instances > 1) => format!("'{dep}' is an instance of [service.{table}]: name the table ('{table}'), which means all its instances"),
                    _ => format!("no service named '{dep}'"),
                };
                errors.push(err(
                    o,
                    *line,
                    *column,
                    format!("service.{name}.after"),
                    message,
                ));
            } else if dep == name {
                errors.push(err(
                    o,
                    *line,
                    *column,
                    format!("service.{name}.after"),
                    "a service cannot start after itself".into(),
                ));
            }
        }
        if let Some((lease, line, column)) = &o.leader_only {
            if !cfg.leases.contains_key(lease) {
                let msg =
                    format!("no [lease.{lease}] table: declare the lease this service follows");
                errors.push(err(
                    o,
                    *line,
                    *column,
                    format!("service.{name}.leader_only"),
                    msg,
                ));
            }
        }
    }
    if let Some(cycle) = find_cycle(cfg) {
        let o = &origin[&cycle[0]];
        let msg = format!("`after` makes a cycle: {}", cycle.join(" -> "));
        errors.push(err(
            o,
            o.line,
            o.column,
            format!("service.{}.after", cycle[0]),
            msg,
        ));
    }
}

/// A cycle among `after` edges, as the list of names around it.
fn find_cycle(cfg: &Config) -> Option<Vec<String>> {
    // Colors: absent = unvisited, 1 = on the current path, 2 = done.
    fn visit(
        cfg: &Config,
        n: &str,
        color: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match color.get(n) {
            Some(2) => return None,
            Some(_) => {
                let start = path.iter().position(|p| p == n).unwrap_or(0);
                let mut cycle = path[start..].to_vec();
                cycle.push(n.to_string());
                return Some(cycle);
            }
            None => {}
        }
        color.insert(n.to_string(), 1);
        path.push(n.to_string());
        for dep in cfg
            .services
            .get(n)
            .map(|s| s.after.as_slice())
            .unwrap_or(&[])
        {
            if dep != n && cfg.services.contains_key(dep) {
                if let Some(c) = visit(cfg, dep, color, path) {
                    return Some(c);
                }
            }
        }
        path.pop();
        color.insert(n.to_string(), 2);
        None
    }
    let mut color = BTreeMap::new();
    for name in cfg.services.keys() {
        if let Some(c) = visit(cfg, name, &mut color, &mut Vec::new()) {
            return Some(c);
        }
    }
    None
}

/// Expands a pattern whose last component may hold `*` and `?`; sorted.
fn glob(pattern: &Path) -> Vec<PathBuf> {
    let (Some(dir), Some(name)) = (
        pattern.parent(),
        pattern.file_name().and_then(|n| n.to_str()),
    ) else {
        return Vec::new();
    };
    if !name.contains(['*', '?']) {
        return if pattern.exists() {
            vec![pattern.to_path_buf()]
        } else {
            Vec::new()
        };
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| !n.starts_with('.') && wildcard(name.as_bytes(), n.as_bytes()))
        })
        .map(|e| e.path())
        .collect();
    out.sort();
    out
}

/// Shell-style match of `*` and `?`, in time proportional to the pattern's length times
/// the name's (the last `*` is the only one ever backtracked to).
fn wildcard(p: &[u8], s: &[u8]) -> bool {
    let (mut pi, mut si) = (0, 0);
    // After a `*`: where in the pattern to resume, and the name position it then matches.
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        match p.get(pi) {
            Some(b'*') => {
                star = Some((pi + 1, si));
                pi += 1;
            }
            Some(&c) if c == b'?' || c == s[si] => {
                pi += 1;
                si += 1;
            }
            _ => match star {
                Some((sp, ss)) => {
                    star = Some((sp, ss + 1));
                    pi = sp;
                    si = ss + 1;
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
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
