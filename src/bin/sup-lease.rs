//! sup-lease: campaigns for a lease on behalf of this node and tells supd when it leads.
//!   sup-lease --lease L --node NAME --store STORE [--socket S] [--ttl 10s]
//!   sup-lease --lease L --store STORE status
//!   sup-lease --lease L --store STORE policy show|pin VERSION|unpin|oldest|newest|floor VERSION

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

const USAGE: &str = "usage: sup-lease --lease L --node NAME --store STORE [--socket S] [--ttl 10s]
       sup-lease --lease L --store STORE status
       sup-lease --lease L --store STORE policy show|pin VERSION|unpin|oldest|newest|floor VERSION
STORE is file:PATH or etcd:http://HOST:PORT";

struct Args {
    lease: Option<String>,
    node: Option<String>,
    store: Option<String>,
    socket: String,
    ttl: Duration,
    words: Vec<String>,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        lease: None,
        node: None,
        store: None,
        socket: std::env::var("SUP_SOCKET").unwrap_or_else(|_| sup::config::DEFAULT_SOCKET.into()),
        ttl: Duration::from_secs(10),
        words: Vec::new(),
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
    let (Some(lease), Some(spec)) = (args.lease.clone(), args.store.clone()) else {
        errln!("sup-lease: --lease and --store are needed\n{USAGE}");
        return ExitCode::from(2);
    };
    // A call to the store must not hold a tick up for longer than a tick.
    let store = match store::open(&spec, (args.ttl / 3).min(Duration::from_secs(2))) {
        Ok(s) => s,
        Err(e) => {
            errln!("sup-lease: {e}");
            return ExitCode::from(2);
        }
    };
    let words: Vec<&str> = args.words.iter().map(String::as_str).collect();
    match words.as_slice() {
        [] => campaign(args, lease, store),
        ["status"] => status(store, &lease),
        ["policy", rest @ ..] => policy(store, &lease, rest),
        _ => {
            errln!("sup-lease: unknown command {words:?}\n{USAGE}");
            ExitCode::from(2)
        }
    }
}

/// The campaign: a tick every T/3 until SIGTERM or SIGINT.
fn campaign(args: Args, lease: String, store: Box<dyn store::Store>) -> ExitCode {
    let Some(name) = args.node.clone() else {
        errln!("sup-lease: --node is needed to campaign\n{USAGE}");
        return ExitCode::from(2);
    };
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
    log::info!(
        "{lease}: {name} campaigns (ttl {}, supd at {})",
        sup::time::Human(args.ttl),
        args.socket
    );
    let mut node = Node::new(lease, name, args.ttl, store, args.socket.into());
    let period = args.ttl / 3;
    // Ticks on CLOCK_BOOTTIME, the clock of the grants: after a suspend, at once.
    let mut next = Boot::now();
    loop {
        let now = Boot::now();
        if now >= next {
            node.tick();
            next = next.plus(period).max(now);
        }
        let left = next.since(Boot::now());
        let timeout =
            PollTimeout::try_from(left.as_millis().min(60_000) as i32).unwrap_or(PollTimeout::MAX);
        let mut fds = [PollFd::new(signals.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, timeout) {
            Ok(n) if n > 0 => {
                if let Ok(Some(_)) = signals.read_signal() {
                    log::info!("{}: leaving", node.lease);
                    node.leave();
                    return ExitCode::SUCCESS;
                }
            }
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => log::warn!("poll: {e}"),
        }
    }
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
        Some((l, term, _)) => outln!(
            o,
            "leader: {} ({}), term {term}",
            l.node,
            l.version.as_deref().unwrap_or("-")
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
        let marks = [
            (m.committed, "committed"),
            (!m.committed, "in probation"),
            (m.irreversible, "irreversible"),
            (m.healthy, "healthy"),
            (!m.healthy, unhealthy.as_str()),
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
