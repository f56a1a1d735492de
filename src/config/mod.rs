//! The config file as typed values.
//!
//! [`load`] reads a file and its includes and returns either a whole [`Config`] or every
//! error found, each with `file:line:column`. Nothing here starts or touches anything:
//! user names, tool directories and programs are looked up when a service starts; only
//! `supd --check` looks them up beforehand ([`lint`]).

mod checks;
mod error;
mod health_table;
mod include;
mod instances;
pub mod lastgood;
mod lease_table;
pub mod lint;
pub mod listen;
mod load;
mod origins;
mod overrides;
mod read;
pub mod resources;
pub mod runtime_dir;
mod service_table;
pub mod show;
mod supd_table;
mod walk;

pub use error::ConfigError;
pub use load::{load, load_supd_only, load_text};
pub use origins::Origins;
pub use read::{read_env_file, MAX_ENV_FILE_SIZE, MAX_FILE_SIZE};
pub use show::Setting;

use nix::sys::signal::Signal;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

/// Where the default config lives.
pub const DEFAULT_CONFIG: &str = "/etc/sup/sup.toml";
/// Where the control socket lives unless the config says otherwise.
pub const DEFAULT_SOCKET: &str = "/run/sup/sup.sock";

/// A whole, valid configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// The `[supd]` table.
    pub supd: SupdConfig,
    /// Every `[service.NAME]`, by name.
    pub services: BTreeMap<String, ServiceConfig>,
    /// Every `[lease.NAME]`, by name.
    pub leases: BTreeMap<String, LeaseConfig>,
    /// The files read: the main one first, then the included ones, then the overrides.
    pub files: Vec<PathBuf>,
    /// Where each service's keys were set (`show.rs`), by service name: apart from the
    /// services, so that a moved line changes no service.
    pub origins: BTreeMap<String, Origins>,
}

impl Config {
    /// The services whose `kill_mode` is narrower than `"cgroup"`, with it: what ending
    /// a killed supd's leftovers must not reach past (`leftovers::Cleanup`).
    pub fn narrow_kill_modes(&self) -> Vec<(String, KillMode)> {
        (self.services.values())
            .filter(|s| s.kill_mode != KillMode::Cgroup)
            .map(|s| (s.name.clone(), s.kill_mode))
            .collect()
    }
}

/// Whether supd is a container's init or a whole system's (see supd(8)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mode {
    /// SIGTERM/SIGINT stop services and exit.
    Container,
    /// Power-off, reboot and halt through `reboot(2)`.
    System,
}

/// The `[supd]` table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SupdConfig {
    pub socket: PathBuf,
    /// Members of this group may use the read-only commands.
    pub socket_group: Option<String>,
    /// Members of this group may also start, stop, restart, reload and signal services.
    #[serde(default)]
    pub control_group: Option<String>,
    pub state_dir: PathBuf,
    pub tools_dir: PathBuf,
    pub log_dir: PathBuf,
    /// supd's own messages go here too (rotated), besides stderr.
    pub log_file: Option<PathBuf>,
    /// Rotation of `log_file`.
    pub log_max_size: u64,
    pub log_keep: u32,
    /// Include patterns, already made absolute.
    pub include: Vec<PathBuf>,
    pub shutdown_timeout: Duration,
    pub mode: Mode,
    /// Whether services get a cgroup each, where the machine allows it.
    pub cgroups: bool,
    /// supd's own nice value (`sys::set_own_nice`): at most that of its services.
    pub nice: Option<i32>,
    /// supd runs under the real-time round-robin policy (`sys::set_own_realtime`).
    pub realtime: bool,
    /// The syslog listener's socket (`syslog.rs`), when supd has one.
    #[serde(default)]
    pub syslog: Option<PathBuf>,
    /// Where the metrics are written for node_exporter's textfile collector, if set
    /// (`metrics/file.rs`: at most once per 10 s, only after a change).
    #[serde(default)]
    pub metrics_file: Option<PathBuf>,
}

impl Default for SupdConfig {
    fn default() -> Self {
        SupdConfig {
            socket: DEFAULT_SOCKET.into(),
            socket_group: Some("sup".into()),
            control_group: None,
            state_dir: "/var/lib/sup".into(),
            tools_dir: "/var/lib/sup/tools".into(),
            log_dir: "/var/log/sup".into(),
            log_file: None,
            log_max_size: 10 << 20,
            log_keep: 5,
            include: Vec::new(),
            shutdown_timeout: Duration::from_secs(30),
            mode: Mode::Container,
            cgroups: true,
            nice: None,
            realtime: false,
            syslog: None,
            metrics_file: None,
        }
    }
}

/// When a service that exited is started again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RestartMode {
    Always,
    OnFailure,
    Never,
}

/// What a crash loop leads to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum OnCrashLoop {
    /// Wait `cooldown`, then try again.
    Cooldown,
    /// Give up: state `failed`.
    Stop,
    /// Stop everything; supd exits 1.
    Shutdown,
}

/// When a started service counts as ready.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Ready {
    /// At exec.
    Started,
    /// On `READY=1` over `NOTIFY_SOCKET`.
    Notify,
    /// On a newline written to this fd.
    Fd(i32),
    /// Once it exited with a success code (one-shot tasks).
    Exited,
}

/// Where a service's output goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LogMode {
    File,
    Inherit,
    Null,
}

/// What becomes of a service's stderr.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LogStderr {
    /// A pipe of its own: its lines are marked in the file, kept apart for
    /// `log --stderr`, and go to supd's stderr with `log = "inherit"`.
    Marked,
    /// The same pipe as stdout: both streams alike, in the order written.
    Merged,
}

/// Defined in records.rs, which writes it into each run's pid record, so that file
/// needs nothing of the config.
pub use crate::records::KillMode;

/// `crash_loop = { restarts = N, window = "5m" }`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CrashLoop {
    pub restarts: u32,
    pub window: Duration,
}

/// The restart policy, the part of a service the pure restart rule needs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Policy {
    pub restart: RestartMode,
    pub success_codes: Vec<i32>,
    pub restart_delay: Duration,
    pub restart_delay_max: Duration,
    pub stable_after: Duration,
    pub crash_loop: CrashLoop,
    pub on_crash_loop: OnCrashLoop,
    pub cooldown: Duration,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            restart: RestartMode::Always,
            success_codes: vec![0],
            restart_delay: Duration::from_millis(100),
            restart_delay_max: Duration::from_secs(30),
            stable_after: Duration::from_secs(10),
            crash_loop: CrashLoop {
                restarts: 10,
                window: Duration::from_secs(300),
            },
            on_crash_loop: OnCrashLoop::Cooldown,
            cooldown: Duration::from_secs(300),
        }
    }
}

/// One `[service.NAME]` table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ServiceConfig {
    pub name: String,
    /// Versioned tool this service runs from.
    pub tool: Option<String>,
    pub command: Vec<String>,
    /// The directory of the file that defined the service: relative paths start here.
    pub base_dir: PathBuf,
    pub cwd: Option<PathBuf>,
    pub env: BTreeMap<String, String>,
    pub user: Option<String>,
    pub group: Option<String>,
    pub policy: Policy,
    pub probation: Duration,
    /// After a commit, how long a crash loop or an unhealthy verdict still rolls back.
    #[serde(default)]
    pub regression_window: Duration,
    pub ready: Ready,
    pub ready_timeout: Duration,
    #[serde(with = "signal_number")]
    pub stop_signal: Signal,
    pub stop_timeout: Duration,
    /// What `reload NAME` sends to the service's process group.
    #[serde(with = "signal_number")]
    pub reload_signal: Signal,
    pub after: Vec<String>,
    pub autostart: bool,
    pub log: LogMode,
    pub log_max_size: u64,
    pub log_keep: u32,
    pub log_stderr: LogStderr,
    pub leader_only: Option<String>,
    /// The file mode creation mask (`umask = "027"`); supd's own when absent.
    pub umask: Option<u32>,
    /// The scheduling priority, -20 to 19; supd's own when absent.
    pub nice: Option<i32>,
    /// Resource limits set in the child, in the order written.
    pub limits: Vec<Rlimit>,
    /// Files of KEY=VALUE lines read at each start, in order; `env` wins over them.
    pub env_file: Vec<EnvFile>,
    /// Which instance of an `instances = N` table this service is (N > 1).
    #[serde(default)]
    pub instance: Option<Instance>,
    /// `watchdog = "30s"`: sd_notify `WATCHDOG=1` must come this often.
    #[serde(default)]
    pub watchdog: Option<Duration>,
    /// `health = { ... }`: a check supd runs itself (boxed: most services have none).
    #[serde(default)]
    pub health: Option<Box<HealthConfig>>,
    /// `kill_mode`: what a stop, a restart, a crash and a new supd end.
    #[serde(default)]
    pub kill_mode: KillMode,
    /// `runtime_dir = "NAME"`: /run/NAME, made at each start and given to `user`.
    #[serde(default)]
    pub runtime_dir: Option<String>,
    /// `memory_max`, `cpu_max`, ...: its cgroup limits (`cgroup/limits.rs`).
    #[serde(default)]
    pub resources: resources::ResourceLimits,
    /// `listen = [...]`: the sockets supd binds and hands to each run (`kept.rs`).
    #[serde(default)]
    pub listen: Vec<listen::ListenAddr>,
    /// `fd_store = N`: how many fds the service may keep in supd (`FDSTORE=1`).
    #[serde(default)]
    pub fd_store: u32,
}

/// `health = { command | tcp | http, interval, timeout, failures, start_delay }`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthConfig {
    pub check: Check,
    /// From the start of one run to the start of the next.
    pub interval: Duration,
    /// A run longer than this is a failure (its process group killed, its socket closed).
    pub timeout: Duration,
    /// This many consecutive failures make the service unhealthy.
    pub failures: u32,
    /// The first run comes this long after the start (exec) of the service.
    pub start_delay: Duration,
}

impl HealthConfig {
    /// A check with the default interval, timeout, failures and start delay.
    pub fn new(check: Check) -> HealthConfig {
        HealthConfig {
            check,
            interval: Duration::from_secs(10),
            timeout: Duration::from_secs(2),
            failures: 3,
            start_delay: Duration::ZERO,
        }
    }
}

/// What a health check does.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Check {
    /// A program run like the service (its user, cwd, env; a relative argv[0] inside
    /// its version directory): exit 0 is healthy.
    Command(Vec<String>),
    /// A TCP connect to a numeric address.
    Tcp(std::net::SocketAddr),
    /// `GET path HTTP/1.0` to a numeric address: a 2xx status is healthy.
    Http {
        addr: std::net::SocketAddr,
        path: String,
    },
}

impl Check {
    /// What the check looks at, for messages: "127.0.0.1:8080/healthz".
    pub fn target(&self) -> String {
        match self {
            Check::Command(argv) => argv.first().cloned().unwrap_or_default(),
            Check::Tcp(a) => a.to_string(),
            Check::Http { addr, path } => format!("{addr}{path}"),
        }
    }
}

/// Instance `index` of table `table`: the service `table@index`, run with
/// `SUP_INSTANCE=index`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Instance {
    pub table: String,
    pub index: u32,
}

/// One entry of `env_file`: `"-/etc/x"` is optional (missing or unreadable: skipped).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvFile {
    /// Absolute: a relative one is joined to the directory of the file that named it.
    pub path: PathBuf,
    pub optional: bool,
}

/// Defined in sys/plan.rs, which sets the limits in the child, so that file needs
/// nothing of the config.
pub use crate::sys::Rlimit;

/// The resources `limits` may name.
pub const LIMIT_NAMES: &[&str] = &[
    "nofile", "nproc", "core", "memlock", "as", "fsize", "stack", "cpu",
];

impl ServiceConfig {
    /// A service with every default, for `name` running `command`.
    pub fn new(name: &str, command: Vec<String>, base_dir: PathBuf) -> Self {
        ServiceConfig {
            name: name.into(),
            tool: None,
            command,
            base_dir,
            cwd: None,
            env: BTreeMap::new(),
            user: None,
            group: None,
            policy: Policy::default(),
            probation: Duration::from_secs(300),
            regression_window: Duration::ZERO,
            ready: Ready::Started,
            ready_timeout: Duration::from_secs(60),
            stop_signal: Signal::SIGTERM,
            stop_timeout: Duration::from_secs(10),
            reload_signal: Signal::SIGHUP,
            after: Vec::new(),
            autostart: true,
            log: LogMode::File,
            log_max_size: 10 << 20,
            log_keep: 5,
            log_stderr: LogStderr::Marked,
            leader_only: None,
            umask: None,
            nice: None,
            limits: Vec::new(),
            env_file: Vec::new(),
            instance: None,
            watchdog: None,
            health: None,
            kill_mode: KillMode::Cgroup,
            runtime_dir: None,
            resources: Default::default(),
            listen: Vec::new(),
            fd_store: 0,
        }
    }
}

/// One `[lease.NAME]` table: a lease this node is a candidate for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LeaseConfig {
    pub name: String,
    /// The candidacy's version is this tool's version.
    pub tool: Option<String>,
}

/// A signal as its number, for the reload helper's answer (`reload.rs`).
mod signal_number {
    use nix::sys::signal::Signal;
    use serde::{de::Error, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(sig: &Signal, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_i32(*sig as i32)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Signal, D::Error> {
        let n = i32::deserialize(d)?;
        Signal::try_from(n).map_err(|_| D::Error::custom(format!("no signal {n}")))
    }
}

/// Parses a signal by name ("TERM", "SIGTERM", "term") or number ("15").
pub fn parse_signal(s: &str) -> Result<Signal, String> {
    let s = s.trim();
    if let Ok(n) = s.parse::<i32>() {
        return Signal::try_from(n).map_err(|_| format!("'{s}' is not a signal number"));
    }
    let upper = s.to_ascii_uppercase();
    let name = if upper.starts_with("SIG") {
        upper
    } else {
        format!("SIG{upper}")
    };
    Signal::from_str(&name)
        .map_err(|_| format!("'{s}' is not a signal name (such as TERM, INT, HUP, KILL, USR1)"))
}

/// A signal's short name, as shown to people: "TERM", "KILL".
pub fn signal_name(sig: Signal) -> &'static str {
    let s = sig.as_str();
    s.strip_prefix("SIG").unwrap_or(s)
}

/// Whether `name` is fit to be a service, tool or lease name: it becomes a file name.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '@'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals() {
        assert_eq!(parse_signal("TERM"), Ok(Signal::SIGTERM));
        assert_eq!(parse_signal("sigkill"), Ok(Signal::SIGKILL));
        assert_eq!(parse_signal("1"), Ok(Signal::SIGHUP));
        assert!(parse_signal("NOPE").is_err());
        assert!(parse_signal("99").is_err());
        assert_eq!(signal_name(Signal::SIGUSR1), "USR1");
    }

    #[test]
    fn names() {
        for good in ["agent", "web-1", "a.b", "x_y", "getty@tty1"] {
            assert!(valid_name(good), "{good}");
        }
        for bad in ["", ".hidden", "a/b", "../x", "sp ace"] {
            assert!(!valid_name(bad), "{bad}");
        }
    }
}
