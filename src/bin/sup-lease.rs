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
use sup::time::Mono;

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
                println!("{USAGE}");
                std::process::exit(0);
            }
            "--version" => {
                println!("sup-lease {}", env!("CARGO_PKG_VERSION"));
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
            eprintln!("sup-lease: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let (Some(lease), Some(spec)) = (args.lease.clone(), args.store.clone()) else {
        eprintln!("sup-lease: --lease and --store are needed\n{USAGE}");
        return ExitCode::from(2);
    };
    // A call to the store must not hold a tick up for longer than a tick.
    let store = match store::open(&spec, (args.ttl / 3).min(Duration::from_secs(2))) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("sup-lease: {e}");
            return ExitCode::from(2);
        }
    };
    let words: Vec<&str> = args.words.iter().map(String::as_str).collect();
    match words.as_slice() {
        [] => campaign(args, lease, store),
        ["status"] => status(store, &lease),
        ["policy", rest @ ..] => policy(store, &lease, rest),
        _ => {
            eprintln!("sup-lease: unknown command {words:?}\n{USAGE}");
            ExitCode::from(2)
        }
    }
}

/// The campaign: a tick every T/3 until SIGTERM or SIGINT.
fn campaign(args: Args, lease: String, store: Box<dyn store::Store>) -> ExitCode {
    let Some(name) = args.node.clone() else {
        eprintln!("sup-lease: --node is needed to campaign\n{USAGE}");
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
            eprintln!("sup-lease: signals: {e}");
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
    let mut next = Mono::now();
    loop {
        let now = Mono::now();
        if now >= next {
            node.tick(now);
            next = next.plus(period).max(now);
        }
        let left = next.since(Mono::now());
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
            eprintln!("sup-lease: {e}");
            return ExitCode::from(1);
        }
    };
    match &snap.leader {
        Some((l, term, _)) => println!(
            "leader: {} ({}), term {term}",
            l.node,
            l.version.as_deref().unwrap_or("-")
        ),
        None => println!("leader: none"),
    }
    print_policy(&snap.policy);
    let eligible = |m| sup::lease::rule::eligible(m, &snap.policy);
    for m in &snap.members {
        let marks = [
            (m.committed, "committed"),
            (!m.committed, "in probation"),
            (m.irreversible, "irreversible"),
            (eligible(m), "eligible"),
        ];
        let marks: Vec<&str> = marks.iter().filter(|(b, _)| *b).map(|(_, s)| *s).collect();
        println!(
            "member {}: {} ({})",
            m.node,
            m.version.as_deref().unwrap_or("-"),
            marks.join(", ")
        );
    }
    ExitCode::SUCCESS
}

fn print_policy(p: &sup::lease::record::Policy) {
    let strategy = match p.strategy {
        Strategy::Newest => "newest".to_string(),
        Strategy::Oldest => "oldest".to_string(),
        Strategy::Pinned => format!("pinned to {}", p.target.as_deref().unwrap_or("?")),
    };
    println!(
        "policy: {strategy}, floor {}, epoch {}",
        p.floor.as_deref().unwrap_or("none"),
        p.epoch
    );
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
            eprintln!("sup-lease: {e}");
            return ExitCode::from(2);
        }
    };
    let snap = match snapshot(store.as_mut(), lease) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("sup-lease: {e}");
            return ExitCode::from(1);
        }
    };
    let Some(change) = change else {
        print_policy(&snap.policy);
        return ExitCode::SUCCESS;
    };
    match write_policy(store.as_mut(), lease, &snap, |p| change.apply(p)) {
        Ok(p) => {
            print_policy(&p);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("sup-lease: {e}");
            ExitCode::from(1)
        }
    }
}
