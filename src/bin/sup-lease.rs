//! sup-lease: campaigns for a lease on behalf of this node and tells supd when it leads;
//! follows a fleet's target version; and the operator's commands on both.
//!   sup-lease [--lease L] [--fleet TOOL] --node NAME --store STORE [--socket S] [--ttl 10s]
//!   sup-lease --lease L --store STORE status
//!   sup-lease --lease L --store STORE policy show|pin VERSION|unpin|oldest|newest|floor VERSION
//!   sup-lease --store STORE fleet set|status|halt|resume|forget ...

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use std::os::fd::AsFd;
use std::process::ExitCode;
use std::time::Duration;
use sup::lease::node::{snapshot, write_policy, Node};
use sup::lease::record::Strategy;
use sup::lease::store;
use sup::time::Boot;

/// `println!` into a `String`, written once by `emit`, which cannot panic.
/// `eprintln!` that cannot panic (stderr on a full disk): there is no one left to tell.
macro_rules! errln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

macro_rules! outln {
    ($o:expr, $($arg:tt)*) => {{
        $o.push_str(&format!($($arg)*));
        $o.push('\n');
    }};
}

const USAGE: &str =
    "usage: sup-lease [--lease L] [--fleet TOOL] --node NAME --store STORE [--socket S]
                 [--ttl 10s] [--staging DIR] [--ca-file PEM] [--state-dir DIR]
       sup-lease --lease L --store STORE status
       sup-lease --lease L --store STORE policy show|pin VERSION|unpin|oldest|newest|floor VERSION
       sup-lease --store STORE fleet set TOOL VERSION --url URL --sha256 HEX [--canary N]
                 [--max-parallel N] [--irreversible] [--force] [--epoch N]
       sup-lease --store STORE fleet status TOOL [--json]
       sup-lease --store STORE fleet halt TOOL [--epoch N]
       sup-lease --store STORE fleet resume TOOL [--force] [--epoch N]
       sup-lease --store STORE fleet forget TOOL NODE
       sup-lease fleet fetch TOOL VERSION --url URL --sha256 HEX [--staging DIR] [--socket S]
STORE is file:PATH or etcd:URL[,URL...], each URL http://HOST:PORT or https://HOST:PORT;
every command that opens an etcd store takes [--cacert PEM] [--cert PEM --key PEM]
[--user NAME --password-file FILE]";

/// Where a node stages what it fetches, unless `--staging` says otherwise.
const STAGING: &str = "/var/tmp/sup-lease";

/// Where a node keeps what it remembers of its leases, with the default socket.
const STATE_DIR: &str = "/var/lib/sup/lease";

struct Args {
    lease: Option<String>,
    fleet: Option<String>,
    node: Option<String>,
    store: Option<String>,
    socket: String,
    ttl: Duration,
    staging: String,
    state_dir: Option<String>,
    ca_file: Option<String>,
    /// How the etcd store is reached (TLS, authentication).
    store_opts: store::StoreOptions,
    set: sup::fleet::admin::SetArgs,
    epoch: Option<u64>,
    json: bool,
    words: Vec<String>,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        lease: None,
        fleet: None,
        node: None,
        store: None,
        socket: std::env::var("SUP_SOCKET").unwrap_or_else(|_| sup::config::DEFAULT_SOCKET.into()),
        ttl: Duration::from_secs(10),
        staging: STAGING.into(),
        state_dir: None,
        ca_file: None,
        store_opts: Default::default(),
        set: Default::default(),
        epoch: None,
        json: false,
        words: Vec::new(),
    };
    let number = |name: &str, v: String| {
        v.parse::<u32>()
            .map_err(|_| format!("{name} takes a number, not '{v}'"))
    };
    let mut it = std::env::args().skip(1);
    while let Some(w) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match w.as_str() {
            "--lease" => a.lease = Some(value("--lease")?),
            "--node" => a.node = Some(value("--node")?),
            "--store" => a.store = Some(value("--store")?),
            "--socket" | "-s" => a.socket = value("--socket")?,
            "--ttl" => a.ttl = sup::time::parse_duration(&value("--ttl")?)?,
            "--fleet" => a.fleet = Some(value("--fleet")?),
            "--staging" => a.staging = value("--staging")?,
            "--state-dir" => a.state_dir = Some(value("--state-dir")?),
            "--ca-file" => a.ca_file = Some(value("--ca-file")?),
            "--cacert" => a.store_opts.cacert = Some(value("--cacert")?.into()),
            "--cert" => a.store_opts.cert = Some(value("--cert")?.into()),
            "--key" => a.store_opts.key = Some(value("--key")?.into()),
            "--user" => a.store_opts.user = Some(value("--user")?),
            "--password-file" => {
                a.store_opts.password_file = Some(value("--password-file")?.into())
            }
            "--url" => a.set.url = value("--url")?,
            "--sha256" => a.set.sha256 = value("--sha256")?,
            "--canary" => a.set.canary = Some(number("--canary", value("--canary")?)?),
            "--max-parallel" => {
                a.set.max_parallel = Some(number("--max-parallel", value("--max-parallel")?)?)
            }
            "--epoch" => a.epoch = Some(number("--epoch", value("--epoch")?)?.into()),
            "--irreversible" => a.set.irreversible = true,
            "--force" => a.set.force = true,
            "--json" => a.json = true,
            "-h" | "--help" => {
                let _ = emit(&format!("{USAGE}\n"));
                std::process::exit(0);
            }
            "--version" => {
                let _ = emit(&format!("sup-lease {}\n", sup::VERSION));
                std::process::exit(0);
            }
            other if other.starts_with("--") => return Err(format!("unknown option '{other}'")),
            other => a.words.push(other.to_string()),
        }
    }
    if a.ttl < Duration::from_millis(300) {
        return Err("--ttl must be at least 300ms".into());
    }
    Ok(a)
}

fn main() -> ExitCode {
    sup::logging::init();
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            errln!("sup-lease: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let words: Vec<String> = args.words.clone();
    let words: Vec<&str> = words.iter().map(String::as_str).collect();
    if let ["fleet", "fetch", tool, version] = words.as_slice() {
        return fetch(&args, tool, version);
    }
    let Some(spec) = args.store.clone() else {
        errln!("sup-lease: --store is needed\n{USAGE}");
        return ExitCode::from(2);
    };
    // A call to the store must not hold a tick up for longer than a tick; an operator's
    // command may wait a little longer.
    let timeout = match words.as_slice() {
        [] => (args.ttl / 3).min(Duration::from_secs(2)),
        _ => Duration::from_secs(5),
    };
    let store = match sup::lease::open_with(&spec, timeout, &args.store_opts) {
        Ok(s) => s,
        Err(e) => {
            errln!("sup-lease: {e}");
            return ExitCode::from(2);
        }
    };
    let lease = || {
        let l = args.lease.clone();
        if l.is_none() {
            errln!("sup-lease: --lease is needed\n{USAGE}");
        }
        l
    };
    match words.as_slice() {
        [] => campaign(args, store),
        ["status"] => match lease() {
            Some(l) => status(store, &l),
            None => ExitCode::from(2),
        },
        ["policy", rest @ ..] => match lease() {
            Some(l) => policy(store, &l, rest),
            None => ExitCode::from(2),
        },
        ["fleet", rest @ ..] => fleet(&args, store, rest),
        _ => {
            errln!("sup-lease: unknown command {words:?}\n{USAGE}");
            ExitCode::from(2)
        }
    }
}

/// The operator's fleet commands.
fn fleet(args: &Args, mut store: Box<dyn store::Store>, words: &[&str]) -> ExitCode {
    use sup::fleet::admin;
    // The store as given, for the commands a status names.
    let spec = args.store.as_deref().unwrap_or("STORE");
    let s = store.as_mut();
    let done = match words {
        ["set", tool, version] => {
            let mut a = args.set.clone();
            a.version = version.to_string();
            if a.url.is_empty() || a.sha256.is_empty() {
                errln!("sup-lease: fleet set needs --url and --sha256\n{USAGE}");
                return ExitCode::from(2);
            }
            admin::set(s, tool, &a, args.epoch)
        }
        ["status", tool] => match sup::fleet::node::snapshot(s, tool) {
            Ok(snap) if args.json => Ok(format!("{}\n", admin::status_json(tool, &snap, spec))),
            Ok(snap) => Ok(admin::status_text(tool, &snap, spec)),
            Err(e) => Err(format!("cannot read the fleet of {tool}: {e}")),
        },
        ["halt", tool] => admin::halt(s, tool, args.epoch),
        ["resume", tool] => admin::resume(s, tool, args.set.force, args.epoch),
        ["forget", tool, node] => admin::forget(s, tool, node),
        _ => {
            errln!("sup-lease: fleet set|status|halt|resume|forget ...\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match done {
        Ok(text) => emit(&text),
        Err(e) => {
            errln!("sup-lease: {e}");
            ExitCode::from(1)
        }
    }
}

/// `fleet fetch`: fetches, verifies and installs one version through supd (what a node
/// runs in a child process; an operator may run it by hand). A failure's reason is the
/// one line on standard output, for the node to publish.
fn fetch(args: &Args, tool: &str, version: &str) -> ExitCode {
    let a = &args.set;
    if a.url.is_empty() || a.sha256.is_empty() {
        errln!("sup-lease: fleet fetch needs --url and --sha256\n{USAGE}");
        return ExitCode::from(2);
    }
    if sup::fleet::node::parent_gone() {
        errln!("sup-lease: the node that started this fetch is gone; nothing fetched");
        return ExitCode::from(1);
    }
    let opts = sup::fleet::install::Options {
        staging: args.staging.clone().into(),
        ca_file: args.ca_file.clone().map(Into::into),
        socket: args.socket.clone().into(),
    };
    match sup::fleet::install::fetch_and_install(tool, version, &a.url, &a.sha256, &opts) {
        Ok(said) => {
            log::info!("{said}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            errln!("sup-lease: {e}");
            let _ = emit(&format!("{e}\n"));
            ExitCode::from(1)
        }
    }
}

/// The campaign: a tick every T/3 until SIGTERM or SIGINT.
fn campaign(args: Args, store: Box<dyn store::Store>) -> ExitCode {
    let Some(name) = args.node.clone() else {
        errln!("sup-lease: --node is needed to campaign\n{USAGE}");
        return ExitCode::from(2);
    };
    if args.lease.is_none() && args.fleet.is_none() {
        errln!("sup-lease: --lease or --fleet (or both) is needed to run\n{USAGE}");
        return ExitCode::from(2);
    }
    let mut set = SigSet::empty();
    for s in [Signal::SIGTERM, Signal::SIGINT] {
        set.add(s);
    }
    let signals = nix::sys::signal::sigprocmask(SigmaskHow::SIG_BLOCK, Some(&set), None)
        .and_then(|()| SignalFd::with_flags(&set, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC));
    let signals = match signals {
        Ok(s) => s,
        Err(e) => {
            errln!("sup-lease: signals: {e}");
            return ExitCode::from(1);
        }
    };
    let mut fleet = match &args.fleet {
        None => None,
        Some(tool) => match fleet_node(&args, tool, &name) {
            Ok(f) => Some(f),
            Err(e) => {
                errln!("sup-lease: {e}");
                return ExitCode::from(2);
            }
        },
    };
    let mut node = args.lease.clone().map(|lease| {
        log::info!(
            "{lease}: {name} campaigns (ttl {}, supd at {})",
            sup::time::Human(args.ttl),
            args.socket
        );
        let mut node = Node::new(
            lease,
            name.clone(),
            args.ttl,
            store,
            args.socket.clone().into(),
        );
        node.remember_in(&state_dir(&args));
        node
    });
    let period = args.ttl / 3;
    // The watch of the lease's keys: a tick at once when `leader` changes.
    let wake = node.as_mut().and_then(|n| {
        let (spec, ttl, opts) = (spec_of(&args), args.ttl, args.store_opts.clone());
        let open =
            move || sup::lease::open_with(&spec, (ttl / 3).min(Duration::from_secs(2)), &opts).ok();
        let prefix = sup::lease::record::prefix(&n.lease);
        match sup::lease::watch::start(open, prefix, args.ttl) {
            Ok((wake, seen)) => {
                n.seen = Some(seen);
                Some(wake)
            }
            Err(e) => {
                log::warn!("{name}: cannot watch the lease ({e}); ticking only");
                None
            }
        }
    });
    // Ticks on CLOCK_BOOTTIME, the clock of the grants: after a suspend, at once; and at
    // once when the leader key changed (the watcher says so).
    let mut next = Boot::now();
    let mut woken = false;
    loop {
        let now = Boot::now();
        if now >= next || woken {
            if let Some(node) = node.as_mut() {
                node.tick();
            }
            if now >= next {
                if let Some(f) = fleet.as_mut() {
                    let leads = node.as_ref().is_some_and(|n| n.leads_tool(&f.tool));
                    f.tick(leads);
                }
                next = next.plus(period).max(now);
            }
            woken = false;
        }
        let left = next.since(Boot::now());
        let timeout =
            PollTimeout::try_from(left.as_millis().min(60_000) as i32).unwrap_or(PollTimeout::MAX);
        let mut fds = vec![PollFd::new(signals.as_fd(), PollFlags::POLLIN)];
        if let Some(w) = wake.as_ref() {
            fds.push(PollFd::new(w.as_fd(), PollFlags::POLLIN));
        }
        // A step-down's answer (its services exited) ticks at once too.
        let release = node.as_ref().and_then(|n| n.release_fd());
        if let Some(fd) = release {
            fds.push(PollFd::new(fd, PollFlags::POLLIN));
        }
        match poll(&mut fds, timeout) {
            Ok(n) if n > 0 => {
                if let Ok(Some(_)) = signals.read_signal() {
                    log::info!("{name}: leaving");
                    if let Some(f) = fleet.as_mut() {
                        f.leave();
                    }
                    if let Some(node) = node.as_mut() {
                        node.leave();
                    }
                    return ExitCode::SUCCESS;
                }
                let answered = fds
                    .last()
                    .filter(|_| release.is_some())
                    .and_then(|f| f.revents());
                if answered.is_some_and(|r| !r.is_empty()) {
                    if let Some(node) = node.as_mut() {
                        node.finish_release();
                    }
                }
                if let Some(w) = wake.as_ref() {
                    woken = drain(w);
                }
            }
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => log::warn!("poll: {e}"),
        }
    }
}

/// Where a node keeps what it remembers of its leases (the highest term, the store's
/// identity, the policy): `--state-dir`; else /var/lib/sup/lease beside the default
/// socket; else, for a supd of its own (another `--socket`), that socket's directory,
/// so that two supds on one host, or two tests, never share it.
fn state_dir(args: &Args) -> std::path::PathBuf {
    if let Some(d) = &args.state_dir {
        return d.into();
    }
    let socket = std::path::Path::new(&args.socket);
    if socket == std::path::Path::new(sup::config::DEFAULT_SOCKET) {
        return STATE_DIR.into();
    }
    socket
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."))
        .into()
}

fn spec_of(args: &Args) -> String {
    args.store.clone().unwrap_or_default()
}

/// Empties the watch's pipe; whether it held a wake.
fn drain(mut pipe: &std::fs::File) -> bool {
    use std::io::Read as _;
    let mut buf = [0u8; 64];
    let mut any = false;
    while let Ok(n) = pipe.read(&mut buf) {
        if n == 0 {
            break;
        }
        any = true;
    }
    any
}

/// The fleet part of a node, with a store connection of its own.
fn fleet_node(args: &Args, tool: &str, name: &str) -> Result<sup::fleet::node::FleetNode, String> {
    sup::versions::check_tool(tool)?;
    let spec = args.store.clone().unwrap_or_default();
    let timeout = (args.ttl / 3).min(Duration::from_secs(2));
    let store =
        sup::lease::open_with(&spec, timeout, &args.store_opts).map_err(|e| e.to_string())?;
    let program = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let fetch = sup::fleet::node::FetchConfig {
        program,
        staging: args.staging.clone().into(),
        ca_file: args.ca_file.clone().map(Into::into),
        socket: args.socket.clone().into(),
    };
    log::info!(
        "fleet {tool}: {name} follows the fleet's target (ttl {}, supd at {}, staging in {})",
        sup::time::Human(args.ttl),
        args.socket,
        args.staging
    );
    Ok(sup::fleet::node::FleetNode::new(
        tool.to_string(),
        name.to_string(),
        args.ttl,
        store,
        fetch,
    ))
}

fn status(mut store: Box<dyn store::Store>, lease: &str) -> ExitCode {
    let snap = match snapshot(store.as_mut(), lease) {
        Ok(s) => s,
        Err(e) => {
            errln!("sup-lease: {e}");
            return ExitCode::from(1);
        }
    };
    let mut o = String::new();
    match &snap.leader {
        Some((l, _, _)) => outln!(
            o,
            "leader: {} ({}), term {}",
            l.node,
            l.version.as_deref().unwrap_or("-"),
            snap.term().unwrap_or(0)
        ),
        None => outln!(o, "leader: none"),
    }
    o.push_str(&policy_line(&snap.policy));
    let eligible = |m| sup::lease::rule::eligible(m, &snap.policy);
    for m in &snap.members {
        let unhealthy = format!(
            "unhealthy: {}",
            m.reason.as_deref().unwrap_or("no reason given")
        );
        let failing = format!("failing: {}", m.failing.as_deref().unwrap_or(""));
        let marks = [
            (m.committed, "committed"),
            (!m.committed && m.trial, "on trial"),
            (!m.committed && !m.trial, "in probation"),
            (m.irreversible, "irreversible"),
            (m.healthy, "healthy"),
            (!m.healthy, unhealthy.as_str()),
            (m.failing.is_some(), failing.as_str()),
            (eligible(m), "eligible"),
        ];
        let marks: Vec<&str> = marks.iter().filter(|(b, _)| *b).map(|(_, s)| *s).collect();
        outln!(
            o,
            "member {}: {} ({})",
            m.node,
            m.version.as_deref().unwrap_or("-"),
            marks.join(", ")
        );
    }
    emit(&o)
}

/// Writes to standard output: a closed reader (`sup-lease status | head -1`) ends it
/// quietly, any other error (a full disk) is a failure.
fn emit(text: &str) -> ExitCode {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            let _ = writeln!(
                std::io::stderr(),
                "sup-lease: cannot write to standard output: {e}"
            );
            ExitCode::from(1)
        }
    }
}

fn policy_line(p: &sup::lease::record::Policy) -> String {
    let strategy = match p.strategy {
        Strategy::Newest => "newest".to_string(),
        Strategy::Oldest => "oldest".to_string(),
        Strategy::Pinned => format!("pinned to {}", p.target.as_deref().unwrap_or("?")),
    };
    format!(
        "policy: {strategy}, floor {}, epoch {}\n",
        p.floor.as_deref().unwrap_or("none"),
        p.epoch
    )
}

/// An operator's change of the policy.
enum Change {
    Pin(String),
    Strategy(Strategy),
    Floor(String),
}

impl Change {
    fn parse(words: &[&str]) -> Result<Option<Change>, String> {
        let version = |v: &str| sup::versions::check_version(v).map(|()| v.to_string());
        Ok(Some(match words {
            ["show"] => return Ok(None),
            ["pin", v] => Change::Pin(version(v)?),
            ["unpin"] | ["newest"] => Change::Strategy(Strategy::Newest),
            ["oldest"] => Change::Strategy(Strategy::Oldest),
            ["floor", v] => Change::Floor(version(v)?),
            _ => return Err("policy show|pin VERSION|unpin|oldest|newest|floor VERSION".into()),
        }))
    }

    fn apply(self, p: &mut sup::lease::record::Policy) {
        match self {
            Change::Pin(v) => {
                p.strategy = Strategy::Pinned;
                p.target = Some(v);
            }
            Change::Strategy(s) => {
                p.strategy = s;
                p.target = None;
            }
            Change::Floor(v) => p.floor = Some(v),
        }
    }
}

fn policy(mut store: Box<dyn store::Store>, lease: &str, words: &[&str]) -> ExitCode {
    let change = match Change::parse(words) {
        Ok(c) => c,
        Err(e) => {
            errln!("sup-lease: {e}");
            return ExitCode::from(2);
        }
    };
    let snap = match snapshot(store.as_mut(), lease) {
        Ok(s) => s,
        Err(e) => {
            errln!("sup-lease: {e}");
            return ExitCode::from(1);
        }
    };
    let Some(change) = change else {
        return emit(&policy_line(&snap.policy));
    };
    match write_policy(store.as_mut(), lease, &snap, |p| change.apply(p)) {
        Ok(p) => emit(&policy_line(&p)),
        Err(e) => {
            errln!("sup-lease: {e}");
            ExitCode::from(1)
        }
    }
}
