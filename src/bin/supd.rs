//! supd: args → logging → signals → config → lock → sockets → leftovers (ended by the loop) → the loop.

use std::path::PathBuf;
use std::process::ExitCode;
use sup::config::{self, Config};
use sup::control::{Server, SocketGroup};
use sup::notify::NotifySocket;
use sup::signals::Signals;
use sup::supervisor::{Found, Supervisor};

/// The first wait before a socket that could not be bound is tried again; it doubles
/// up to a minute.
const SOCKET_RETRY_FIRST: std::time::Duration = std::time::Duration::from_secs(1);

const USAGE: &str = "usage: supd [-c FILE] [--check] [--system] [--version]";

struct Args {
    config: PathBuf,
    check: bool,
    system: bool,
    /// Take over from a previous image (`reexec`).
    handoff: Option<PathBuf>,
    /// With `--check` or `--handshake`: also say whether this program reads handoffs of
    /// this format.
    handoff_format: Option<u32>,
    /// `reexec`'s handshake (handshake.rs): answer this nonce if the handoff and the
    /// config can be read.
    handshake: Option<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        config: config::DEFAULT_CONFIG.into(),
        check: false,
        system: false,
        handoff: None,
        handoff_format: None,
        handshake: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "-c" | "--config" => args.config = it.next().ok_or("-c needs a file")?.into(),
            "--check" => args.check = true,
            "--system" => args.system = true,
            "--handoff" => args.handoff = Some(it.next().ok_or("--handoff needs a file")?.into()),
            "--handoff-format" => {
                args.handoff_format = Some(
                    it.next()
                        .and_then(|n| n.parse().ok())
                        .ok_or("--handoff-format needs a number")?,
                )
            }
            "--handshake" => args.handshake = Some(it.next().ok_or("--handshake needs a nonce")?),
            "--version" | "-V" => {
                println!("supd {}", sup::VERSION);
                std::process::exit(0);
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument '{other}'")),
        }
    }
    Ok(args)
}

fn main() -> ExitCode {
    // The log writer is this program too (`log_writer.rs`).
    let mut args = std::env::args().skip(1);
    match args.next().as_deref() {
        Some(sup::log_writer::ARG) => {
            return ExitCode::from(sup::log_writer::serve(&args.next().unwrap_or_default()))
        }
        // The process that forks services for supd (`spawner.rs`).
        Some(sup::spawner::ARG) => return ExitCode::from(sup::spawner::serve()),
        _ => {}
    }
    // Nothing supd inherited may leak into a service; then signals, before any child
    // exists (catatonit's rule).
    sup::sys::cloexec_inherited();
    let signals = Signals::block();
    if std::process::id() == 1 {
        sup::sys::ignore_tty_stops();
    }
    sup::sys::raise_nofile();
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("supd: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    if let Some(nonce) = &args.handshake {
        sup::logging::init();
        return handshake(&args.config, nonce, args.handoff_format);
    }
    if args.check {
        sup::logging::init();
        if let Some(Err(e)) = args.handoff_format.map(sup::handoff::check_format) {
            eprintln!("supd: {e}");
            return ExitCode::from(1);
        }
        // A reexec's check of its new program is not the operator's lint.
        return check(&args.config, args.handoff_format.is_none());
    }
    sup::logging::init_supd();
    let signals = match signals {
        Ok(s) => s,
        Err(e) => {
            eprintln!("supd: cannot set up signal handling: {e}");
            return ExitCode::from(1);
        }
    };
    let code = match run(args, signals) {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            log::error!("{e}");
            ExitCode::from(1)
        }
    };
    // What still waits for stderr (never written with a wait: logging.rs), for a
    // bounded time.
    sup::logging::finish_stderr(std::time::Duration::from_secs(1));
    code
}

/// `--handshake NONCE`: the answer `reexec` waits for (handshake.rs), when this
/// program reads the running supd's handoff format, then the files of the config it
/// would not run as they are (a broken file: its last good copy or nothing, as at any
/// start), which the running supd weighs; else why not, on stderr, and 1.
fn handshake(path: &std::path::Path, nonce: &str, format: Option<u32>) -> ExitCode {
    let Some(format) = format else {
        eprintln!("supd: --handshake needs --handoff-format");
        return ExitCode::from(2);
    };
    if let Err(e) = sup::handoff::check_format(format) {
        eprintln!("supd: {e}");
        return ExitCode::from(1);
    }
    let loaded = sup::config::lastgood::load_at_start(path);
    for e in &loaded.errors {
        eprintln!("{e}");
    }
    println!("{}", sup::handshake::answer(nonce, sup::handoff::FORMAT));
    for b in &loaded.broken {
        println!("{}", sup::handshake::broken_line(b.has_copy(), &b.file));
    }
    ExitCode::SUCCESS
}

/// `--check`: every error, then 0 or 1.
fn check(path: &std::path::Path, lint: bool) -> ExitCode {
    match config::load(path) {
        // Then the lint: what would fail every start (programs, users, env_files, cwd).
        Ok(cfg) if lint && !config::lint::report(&cfg, path) => ExitCode::from(1),
        Ok(cfg) => {
            println!(
                "{}: ok ({} services, {} files)",
                path.display(),
                cfg.services.len(),
                cfg.files.len()
            );
            ExitCode::SUCCESS
        }
        Err(errs) => {
            for e in &errs {
                eprintln!("{e}");
            }
            eprintln!(
                "{}: {} error{}",
                path.display(),
                errs.len(),
                if errs.len() == 1 { "" } else { "s" }
            );
            ExitCode::from(1)
        }
    }
}

fn run(args: Args, signals: Signals) -> Result<i32, String> {
    // Which newer system calls the kernel has, learned once before any fork.
    sup::sys::probe_kernel();
    let subreaper = std::process::id() == 1
        || match nix::sys::prctl::set_child_subreaper(true) {
            Ok(()) => true,
            Err(e) => {
                log::warn!("cannot become a child subreaper ({e}): orphans of services go to init");
                false
            }
        };
    // How a run without a cgroup is found, decided once (said with the cgroups).
    sup::subtree::init(subreaper);
    let mut handoff = match args.handoff.as_deref().map(sup::handoff::read) {
        Some(Ok(h)) => Some(h),
        Some(Err(e)) => return Err(format!("{e}; cannot take over")),
        None => None,
    };
    // Absolute: helpers (a reexec's check) run elsewhere, and a reexec must find it.
    let path = handoff
        .as_ref()
        .map(|h| h.config_path.clone())
        .unwrap_or(args.config);
    let path = std::path::absolute(&path).unwrap_or(path);
    let loaded = load_config(&path);
    let cfg = loaded.cfg;
    // The system's init never exits on its own: it waits for a state lock it cannot take.
    let init = std::process::id() == 1 && (args.system || cfg.supd.mode == config::Mode::System);
    let (server, notify, lock) = match &handoff {
        Some(h) => take_over(h, &cfg)?,
        None => fresh(&cfg, init)?,
    };
    // What a killed predecessor left is ended by the loop, which serves meanwhile; no
    // service starts until it is gone. (A reexec hands over its own running services.)
    let carried = handoff.as_mut().and_then(|h| h.leftovers.take());
    // The copies of the files that loaded as they are, refreshed now that the state
    // lock is held.
    sup::config::lastgood::keep(&cfg.supd.state_dir, &loaded.good, loaded.broken.is_empty());
    // A file with nothing to stand for it may have defined any service left running
    // that the config does not have: such a run is kept, never ended for its file's
    // sake (a service of a file whose last good copy stands in is ended and started
    // anew, as any other).
    let unknown = |s: &str| !cfg.services.contains_key(s);
    let spare = |s: &str| loaded.broken.iter().any(|b| !b.has_copy()) && unknown(s);
    let mut kept = Vec::new();
    let mut taken_sockets = std::collections::BTreeMap::new();
    let cleanup = if let Some(c) = carried {
        sup::leftovers::Cleanup::resume(&cfg.supd.state_dir, c, sup::time::Mono::now())
    } else if handoff.is_none() {
        let grace = cfg
            .services
            .values()
            .map(|s| s.stop_timeout)
            .max()
            .unwrap_or(std::time::Duration::from_secs(10));
        kept = sup::leftovers::spared(&cfg.supd.state_dir, &spare);
        // Before they are ended: the sockets the left runs serve on are copied out of
        // them, so that no client is refused while they end and the next runs start.
        let want = (cfg.services.iter())
            .filter(|(n, s)| !s.listen.is_empty() && !spare(n))
            .map(|(n, s)| (n.clone(), s.listen.clone()))
            .collect();
        taken_sockets = sup::kept::take::from_left_runs(&cfg.supd.state_dir, &want);
        let narrow = cfg.narrow_kill_modes();
        let now = sup::time::Mono::now();
        sup::leftovers::Cleanup::begin(&cfg.supd.state_dir, grace, narrow, now, &spare)
    } else {
        None
    };
    let socket = cfg.supd.socket.clone();
    log::info!(
        "supd {} serving {} ({} services)",
        sup::VERSION,
        socket.display(),
        cfg.services.len()
    );
    // A forked child closes these first: they keep a second supd out.
    if let Some(l) = &lock {
        sup::sys::set_lock_fd(std::os::fd::AsRawFd::as_raw_fd(&**l));
    }
    sup::sys::set_listener_fd(std::os::fd::AsRawFd::as_raw_fd(&server.fd()));
    let cgroups = use_cgroups(&cfg);
    sup::sys::set_own_nice(cfg.supd.nice);
    sup::sys::set_own_realtime(cfg.supd.realtime);
    let fdset = sup::fdset::FdSet::new()
        .map_err(|e| format!("cannot make the epoll set of the services' fds: {e}"))?;
    let handed_over = handoff.is_some();
    let stand_in = server.is_stand_in();
    let mut sup = Supervisor::new(cfg, path, server, notify, signals, fdset, handed_over);
    let system = args.system || sup.mode() == config::Mode::System;
    sup.take_found(Found {
        config_errors: loaded.errors.iter().map(ToString::to_string).collect(),
        broken_files: loaded.broken,
        kept,
        lock,
        cgroups,
        socket_retry: stand_in.then(|| {
            (
                sup::time::Mono::now().plus(SOCKET_RETRY_FIRST),
                SOCKET_RETRY_FIRST,
            )
        }),
        cleanup,
        system,
        taken_sockets,
    });
    if system {
        sup::pid1::setup();
    }
    if let Some(h) = handoff {
        sup.restore(h);
        sup.end_kept(sup::time::Mono::now());
    }
    sup.open_syslog();
    tell_service_manager();
    let code = run_loop(&mut sup);
    sup.end(&socket);
    Ok(code)
}

/// The services' cgroups, or why there are none, and how a run without one is found
/// (said once: services that daemonize can then escape, see supd(8)).
fn use_cgroups(cfg: &Config) -> Option<sup::cgroup::Cgroups> {
    let without = sup::subtree::describe(sup::subtree::tracking());
    if !cfg.supd.cgroups {
        log::info!("cgroups = \"off\": {without}");
        return None;
    }
    match sup::cgroup::Cgroups::setup(&cfg.supd.state_dir) {
        Ok(c) => {
            log::info!(
                "services run in cgroups ({}) under {} ({without})",
                c.describe(),
                c.root.display()
            );
            // '+' is in no service's name: the probe's cgroup is no service's.
            // clone3 forks into cgroup2 cgroups alone.
            let probe = c
                .is_v2()
                .then(|| sup::sys::probe_born_in(&c.root.join("probe+fork")));
            match probe.unwrap_or(sup::sys::BornIn::Never) {
                sup::sys::BornIn::Always => {}
                sup::sys::BornIn::UnlessKilled => log::info!(
                    "this kernel kills a child forked into a cgroup that was killed: \
                     such a cgroup is made anew before the next start"
                ),
                sup::sys::BornIn::Never => log::info!(
                    "services' processes move into their cgroups (no clone3 into a cgroup)"
                ),
            }
            Some(c)
        }
        Err(e) => {
            log::warn!("{e}: services run without cgroups: {without}");
            None
        }
    }
}

/// The loop, and what a panic in it leads to: supd re-executes itself with its state
/// (the services keep running and stay supervised); if even that fails, the loop goes on.
fn run_loop(sup: &mut Supervisor) -> i32 {
    loop {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            sup::supervisor::event_loop::run(sup)
        })) {
            Ok(code) => return code,
            Err(_) => {
                let program = sup.program().to_path_buf();
                log::error!(
                    "supd panicked; re-executing {} with its state",
                    program.display()
                );
                let why = sup.exec_handoff(&program, None);
                log::error!("re-executing after a panic failed: {why}; going on in this image");
            }
        }
    }
}

/// The config: of a file that does not load, its last good copy or nothing
/// (`config/lastgood.rs`); supd stays up whatever is broken.
fn load_config(path: &std::path::Path) -> sup::config::lastgood::Loaded {
    let loaded = sup::config::lastgood::load_at_start(path);
    for e in &loaded.errors {
        log::error!("{e}");
    }
    for b in &loaded.broken {
        match b.has_copy() {
            true => log::error!(
                "{} does not load: its last good copy stands in for it until a reload brings a valid config",
                b.file.display()
            ),
            false => match loaded.unusable_copies.iter().find(|(f, _)| *f == b.file) {
                Some((_, why)) => log::error!(
                    "{} does not load, and its last good copy does not load either ({why}): nothing of it runs until a reload brings a valid config",
                    b.file.display()
                ),
                None => log::error!(
                    "{} does not load and never did here: nothing of it runs until a reload brings a valid config",
                    b.file.display()
                ),
            },
        }
    }
    loaded
}

type Edges = (
    Server,
    Option<NotifySocket>,
    Option<nix::fcntl::Flock<std::fs::File>>,
);

/// A first start: the lock, the end of what a killed supd left, the sockets.
fn fresh(cfg: &Config, init: bool) -> Result<Edges, String> {
    // log_dir is made by the log writer (a hung one must not block supd).
    if let Err(e) = sup::records::create_dirs(&cfg.supd.state_dir, sup::records::STATE_DIR) {
        log::warn!("cannot create {}: {e}", cfg.supd.state_dir.display());
    }
    sup::statedir::make_private(&cfg.supd.state_dir);
    let lock = sup::statedir::lock_at_start(&cfg.supd.state_dir, init)?;
    // Looked up here, before the loop, once (the loop never reads the user database).
    let group = cfg
        .supd
        .socket_group
        .as_deref()
        .and_then(|g| SocketGroup::lookup(&cfg.supd.socket, g));
    let group = group.as_ref();
    let control = cfg
        .supd
        .control_group
        .as_deref()
        .and_then(SocketGroup::lookup_control);
    let control = control.as_ref();
    let server = match Server::bind(&cfg.supd.socket, group, control) {
        Ok(s) => s,
        // Another supd serving there is a reason to leave, except for an init.
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && std::process::id() != 1 => {
            return Err(format!("cannot serve {}: {e}", cfg.supd.socket.display()))
        }
        Err(e) => {
            log::error!(
                "cannot serve {}: {e}; supervising without a control socket, and trying again",
                cfg.supd.socket.display()
            );
            Server::stand_in(&cfg.supd.socket, group, control).map_err(|e2| {
                format!(
                    "cannot serve {}: {e}; nor stand in for it: {e2}",
                    cfg.supd.socket.display()
                )
            })?
        }
    };
    // The services' notify sockets: what a previous supd left goes (the single
    // `SOCKET.notify` of older versions too); each is made at its service's first start.
    let _ = std::fs::remove_file(format!("{}.notify", cfg.supd.socket.display()));
    let notify_dir = sup::notify::dir_for(&cfg.supd.socket);
    if let Err(e) = sup::notify::prepare_dir(&notify_dir, true) {
        log::warn!("{e}: ready = \"notify\" services cannot start until it can be made");
    }
    Ok((server, None, Some(lock)))
}

/// After `reexec`: the sockets and the lock of the previous image, never closed.
fn take_over(h: &sup::handoff::Handoff, cfg: &Config) -> Result<Edges, String> {
    let listener =
        sup::sys::adopt_fd(h.listener_fd).map_err(|e| format!("the handed-over socket: {e}"))?;
    // As the previous image looked it up, when it is the same group (else looked up
    // here, before the loop).
    let handed = h
        .socket_group
        .clone()
        .filter(|g| cfg.supd.socket_group.as_deref() == Some(g.name.as_str()));
    let group = handed.or_else(|| {
        cfg.supd
            .socket_group
            .as_deref()
            .and_then(|g| SocketGroup::lookup(&cfg.supd.socket, g))
    });
    let handed = h
        .control_group
        .clone()
        .filter(|g| cfg.supd.control_group.as_deref() == Some(g.name.as_str()));
    let control = handed.or_else(|| {
        cfg.supd
            .control_group
            .as_deref()
            .and_then(SocketGroup::lookup_control)
    });
    let server = Server::adopt(listener, &cfg.supd.socket, group.as_ref(), control.as_ref())
        .map_err(|e| format!("the handed-over socket: {e}"))?;
    let notify = h.notify.as_ref().and_then(|(fd, path)| {
        sup::sys::adopt_fd(*fd)
            .ok()
            .map(|fd| NotifySocket::adopt(fd, path.clone()))
    });
    // The flock belongs to the open file, which the exec kept: taking it again is a no-op,
    // and there was never a moment without it. An image that had lost it (its state_dir
    // replaced) hands none: this one tries to take it.
    let handed = h
        .lock_fd
        .and_then(|fd| sup::sys::adopt_fd(fd).ok())
        .map(|fd| {
            nix::fcntl::Flock::lock(
                std::fs::File::from(fd),
                nix::fcntl::FlockArg::LockExclusiveNonblock,
            )
        });
    let lock = match handed {
        Some(Ok(l)) => {
            // The directory's own lock went with the old image (close-on-exec): taken
            // again at once, while the carried file lock keeps others out.
            if let Err((_, e)) = sup::statedir::lock_dir(&cfg.supd.state_dir) {
                log::error!("{e}");
            }
            Some(l)
        }
        Some(Err((_, e))) => {
            log::error!("the handed-over state lock: {e}; taking it again");
            None
        }
        None => None,
    };
    let lock = lock.or_else(|| {
        sup::statedir::lock(&cfg.supd.state_dir, std::time::Duration::ZERO)
            .map_err(|e| {
                log::error!(
                    "{e}; the services handed over go on, and the lock is taken again at the next change of {}",
                    cfg.supd.state_dir.display()
                )
            })
            .ok()
    });
    Ok((server, notify, lock))
}

/// Tells a service manager that supd is up (sd_notify `READY=1`), when one asked by
/// setting `NOTIFY_SOCKET` (systemd's Type=notify, or a test harness).
fn tell_service_manager() {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let msg = format!("READY=1\nMAINPID={}\n", std::process::id());
    let Ok(sock) = std::os::unix::net::UnixDatagram::unbound() else {
        return;
    };
    let bytes = path.as_encoded_bytes();
    let sent = match bytes.strip_prefix(b"@") {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            std::os::unix::net::SocketAddr::from_abstract_name(name)
                .and_then(|a| sock.send_to_addr(msg.as_bytes(), &a))
        }
        None => sock.send_to(msg.as_bytes(), &path),
    };
    if let Err(e) = sent {
        log::warn!(
            "cannot tell {} that supd is ready: {e}",
            path.to_string_lossy()
        );
    }
    // Told once: a re-executed image must not tell a socket that may be gone (as
    // sd_notify's unset_environment). Single-threaded: nothing reads it meanwhile.
    std::env::remove_var("NOTIFY_SOCKET");
}
