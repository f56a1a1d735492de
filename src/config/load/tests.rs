use super::*;
use crate::scratch::Scratch;

/// A fresh directory under the system temp dir for one test.
fn scratch() -> Scratch {
    Scratch::new("config")
}

fn load_text(text: &str) -> (Scratch, Result<Config, Vec<ConfigError>>) {
    let dir = scratch();
    let file = dir.join("sup.toml");
    std::fs::write(&file, text).expect("write config");
    let r = load(&file);
    (dir, r)
}

fn errors_of(text: &str) -> Vec<String> {
    let (dir, r) = load_text(text);
    let prefix = format!("{}/", dir.display());
    match r {
        Ok(_) => Vec::new(),
        Err(es) => es
            .iter()
            .map(|e| e.to_string().replace(&prefix, ""))
            .collect(),
    }
}

#[test]
fn full_service_table_parses_into_typed_values() {
    let (dir, r) = load_text(
        r#"
[supd]
socket = "run/sup.sock"
state_dir = "state"
shutdown_timeout = "5s"

[service.agent]
tool = "agent"
command = ["bin/agent", "--data-dir", "/var/lib/agent"]
cwd = "work"
env = { AGENT_MODE = "prod" }
user = "agent"
restart = "on-failure"
success_codes = [0, 3]
restart_delay = "10ms"
restart_delay_max = "1s"
stable_after = "2s"
crash_loop = { restarts = 4, window = "1m" }
on_crash_loop = "stop"
cooldown = "1m"
probation = "2s"
regression_window = "30s"
ready = "fd:3"
ready_timeout = "5s"
stop_signal = "INT"
stop_timeout = "250ms"
after = ["db"]
autostart = false
log = "null"
log_max_size = "1MiB"
log_keep = 2
leader_only = "engine"

[service.db]
command = ["/bin/db"]
ready = "notify"

[lease.engine]
tool = "agent"
"#,
    );
    let cfg = r.expect("valid config");
    assert_eq!(cfg.supd.socket, dir.join("run/sup.sock"));
    assert_eq!(cfg.supd.state_dir, dir.join("state"));
    assert_eq!(cfg.supd.shutdown_timeout, Duration::from_secs(5));
    let a = &cfg.services["agent"];
    assert_eq!(a.tool.as_deref(), Some("agent"));
    assert_eq!(a.command, ["bin/agent", "--data-dir", "/var/lib/agent"]);
    assert_eq!(a.cwd, Some(dir.join("work")));
    assert_eq!(a.env.get("AGENT_MODE").map(String::as_str), Some("prod"));
    assert_eq!(a.policy.restart, RestartMode::OnFailure);
    assert_eq!(a.policy.success_codes, [0, 3]);
    assert_eq!(a.policy.restart_delay, Duration::from_millis(10));
    assert_eq!(
        a.policy.crash_loop,
        CrashLoop {
            restarts: 4,
            window: Duration::from_secs(60)
        }
    );
    assert_eq!(a.policy.on_crash_loop, OnCrashLoop::Stop);
    assert_eq!(a.ready, Ready::Fd(3));
    assert_eq!(a.stop_signal, Signal::SIGINT);
    assert_eq!(a.stop_timeout, Duration::from_millis(250));
    assert_eq!(a.after, ["db"]);
    assert!(!a.autostart);
    assert_eq!(a.log, LogMode::Null);
    assert_eq!(a.log_max_size, 1 << 20);
    assert_eq!(a.leader_only.as_deref(), Some("engine"));
    assert_eq!(a.regression_window, Duration::from_secs(30));
    assert_eq!(cfg.services["db"].ready, Ready::Notify);
    assert_eq!(cfg.leases["engine"].tool.as_deref(), Some("agent"));
}

#[test]
fn defaults_are_the_spec_values() {
    let (_, r) = load_text("[service.x]\ncommand = [\"/bin/true\"]\n");
    let cfg = r.expect("valid");
    let x = &cfg.services["x"];
    assert_eq!(x.policy, Policy::default());
    assert_eq!(
        x.policy.crash_loop,
        CrashLoop {
            restarts: 10,
            window: Duration::from_secs(300)
        }
    );
    assert_eq!(x.probation, Duration::from_secs(300));
    assert_eq!(x.regression_window, Duration::ZERO);
    assert_eq!(x.stop_timeout, Duration::from_secs(10));
    assert_eq!(x.ready_timeout, Duration::from_secs(60));
    assert_eq!(cfg.supd.socket, PathBuf::from(DEFAULT_SOCKET));
    assert_eq!(cfg.supd.socket_group.as_deref(), Some("sup"));
    assert_eq!(cfg.supd.control_group, None);
}

#[test]
fn every_error_is_reported_at_once_with_its_position() {
    let cases: &[(&str, &[&str])] = &[
        (
            "[service.a]\ncommand = [\"/bin/a\"]\nrestart = \"sometimes\"\nrestart_delay = \"soon\"\nbogus = 1\n",
            &[
                "sup.toml:3:11: service.a.restart: 'sometimes' is not one of \"always\", \"on-failure\", \"never\"",
                "sup.toml:4:17: service.a.restart_delay: 'soon' is not a duration: expected a number before the unit (\"250ms\", \"10s\", \"5m\", \"1h\")",
                "sup.toml:5:1: service.a.bogus: unknown key",
            ],
        ),
        ("[service.a]\nuser = \"x\"\n", &["sup.toml:1:10: service.a.command: missing"]),
        ("[service.a]\ncommand = []\n", &["sup.toml:2:11: service.a.command: expected a non-empty array"]),
        ("[service.a]\ncommand = \"/bin/a\"\n", &["sup.toml:2:11: service.a.command: expected an array, found a string"]),
        ("[service.a]\ncommand = [\"/a\"]\nafter = [\"ghost\"]\n", &["sup.toml:3:10: service.a.after: no service named 'ghost'"]),
        (
            "[service.a]\ncommand = [\"/a\"]\nafter = [\"b\"]\n[service.b]\ncommand = [\"/b\"]\nafter = [\"a\"]\n",
            &["service.a.after: `after` makes a cycle: a -> b -> a"],
        ),
        ("[service.a]\ncommand = [\"/a\"]\nready = \"fd:1\"\n", &["service.a.ready: 'fd:1': the fd of \"fd:N\" is a number from 3"]),
        ("[service.a]\ncommand = [\"/a\"]\nready = \"exited\"\n", &["service.a.ready: ready = \"exited\" is for one-shot tasks"]),
        ("[service.a]\ncommand = [\"/a\"]\nstop_signal = \"NOPE\"\n", &["service.a.stop_signal: 'NOPE' is not a signal name"]),
        ("[service.a]\ncommand = [\"/a\"]\nleader_only = \"engine\"\n", &["service.a.leader_only: no [lease.engine] table"]),
        ("[service.a]\ncommand = [\"/a\"]\ncrash_loop = { restarts = 0 }\n", &["service.a.crash_loop.restarts: expected a number of restarts from 1"]),
        ("[service.a]\ncommand = [\"/a\"]\nsuccess_codes = [300]\n", &["service.a.success_codes: an exit code is from 0 to 255"]),
        ("[service.a]\ncommand = [\"/a\"]\ntool = \"../x\"\n", &["service.a.tool: '../x' is not a tool name"]),
        ("[service.\"a/b\"]\ncommand = [\"/a\"]\n", &["service.a/b: a service name is"]),
        ("[supd]\nsockett = \"x\"\n", &["sup.toml:2:1: supd.sockett: unknown key; did you mean `socket`?"]),
        ("[supd]\nbogus = 1\n", &["sup.toml:2:1: supd.bogus: unknown key (expected one of: socket,"]),
        ("[supd]\ncontrol_group = 5\n", &["sup.toml:2:17: supd.control_group: expected a string"]),
        ("[supd]\ncontrol_group = \"sup ops\"\n", &["sup.toml:2:17: supd.control_group: expected a group's name"]),
        ("[service.a]\ncommand = [\"/a\"]\nbogus = 1\n", &["sup.toml:3:1: service.a.bogus: unknown key (not a key of this table: sup.toml(5) lists them)"]),
        ("[daemon]\nx = 1\n", &["sup.toml:1:2: daemon: unknown table"]),
        ("[service.a\ncommand = [\"/a\"]\n", &["sup.toml:1:11: TOML syntax:"]),
        (
            "[service.a]\ncommand = [\"/a\"]\nrestart_delay = \"2s\"\nrestart_delay_max = \"1s\"\n",
            &["service.a.restart_delay_max: must not be shorter than restart_delay"],
        ),
    ];
    for (text, expected) in cases {
        let got = errors_of(text);
        assert_eq!(got.len(), expected.len(), "config:\n{text}\ngot: {got:#?}");
        for (g, e) in got.iter().zip(expected.iter()) {
            assert!(
                g.contains(e),
                "config:\n{text}\nexpected an error containing {e:?}\ngot {g:?}"
            );
        }
    }
}

#[test]
fn includes_are_read_relative_to_the_file_and_report_their_own_names() {
    let dir = scratch();
    std::fs::create_dir_all(dir.join("services.d")).expect("mkdir");
    std::fs::write(
        dir.join("sup.toml"),
        "[supd]\ninclude = [\"services.d/*.toml\"]\n",
    )
    .expect("write");
    std::fs::write(
        dir.join("services.d/a.toml"),
        "[service.a]\ncommand = [\"bin/a\"]\n",
    )
    .expect("write");
    std::fs::write(
        dir.join("services.d/b.toml"),
        "[service.b]\ncommand = [\"/b\"]\nwhat = 1\n",
    )
    .expect("write");
    std::fs::write(dir.join("services.d/ignored.txt"), "not toml").expect("write");
    let errs = load(&dir.join("sup.toml")).expect_err("b.toml has an unknown key");
    assert_eq!(errs.len(), 1);
    assert_eq!(errs[0].file, dir.join("services.d/b.toml"));
    assert_eq!((errs[0].line, errs[0].column), (3, 1));

    std::fs::write(
        dir.join("services.d/b.toml"),
        "[service.b]\ncommand = [\"/b\"]\n",
    )
    .expect("write");
    let cfg = load(&dir.join("sup.toml")).expect("valid now");
    assert_eq!(cfg.services.keys().collect::<Vec<_>>(), ["a", "b"]);
    assert_eq!(cfg.services["a"].base_dir, dir.join("services.d"));
    assert_eq!(cfg.files.len(), 3);

    std::fs::write(
        dir.join("services.d/c.toml"),
        "[service.a]\ncommand = [\"/a\"]\n",
    )
    .expect("write");
    let errs = load(&dir.join("sup.toml")).expect_err("a is defined twice");
    assert!(
        errs[0]
            .to_string()
            .contains("service 'a' is already defined at"),
        "{}",
        errs[0]
    );
}

#[test]
fn an_unreadable_file_is_one_error() {
    let errs = load(Path::new("/nonexistent/sup.toml")).expect_err("missing file");
    assert_eq!(errs.len(), 1);
    assert!(
        errs[0]
            .to_string()
            .starts_with("/nonexistent/sup.toml: cannot read:"),
        "{}",
        errs[0]
    );
}

#[test]
fn a_lease_defined_twice_across_files_names_both_places() {
    let dir = scratch();
    std::fs::write(
        dir.join("sup.toml"),
        "[supd]\ninclude = [\"*.inc\"]\n\n[lease.engine]\ntool = \"a\"\n",
    )
    .expect("write");
    std::fs::write(dir.join("b.inc"), "\n[lease.engine]\ntool = \"b\"\n").expect("write");
    let errs = load(&dir.join("sup.toml")).expect_err("engine is declared twice");
    let got: Vec<String> = errs.iter().map(ToString::to_string).collect();
    assert_eq!(
        got,
        [format!(
            "{d}/b.inc:2:8: lease.engine: lease 'engine' is already defined at {d}/sup.toml:4:8",
            d = dir.display()
        )]
    );
}

#[test]
fn control_characters_in_quoted_names_stay_on_one_line() {
    let got = errors_of(
        "[service.\"a\\nb\"]\ncommand = [\"/a\"]\n[service.c]\ncommand = [\"/c\"]\nafter = [\"x\\ny\\u001b[31m\"]\n\"k\\r\\n\" = 1\n",
    );
    assert_eq!(got.len(), 3, "{got:#?}");
    for line in &got {
        assert!(!line.chars().any(char::is_control), "{line:?}");
    }
    assert!(got[0].starts_with("sup.toml:1:10: service.a\\nb: a service name is"));
    assert!(
        got[1].contains("no service named 'x\\ny\\u{1b}[31m'"),
        "{}",
        got[1]
    );
    assert!(
        got[2].contains("service.c.k\\r\\n: unknown key"),
        "{}",
        got[2]
    );
}

#[test]
fn an_include_that_is_not_a_regular_file_is_refused_at_its_pattern() {
    let dir = scratch();
    std::fs::write(
        dir.join("sup.toml"),
        "[supd]\ninclude = [\"a.toml\", \"/dev/zero\", \"sub\"]\n",
    )
    .expect("write");
    std::fs::write(dir.join("a.toml"), "[service.a]\ncommand = [\"/a\"]\n").expect("write");
    std::fs::create_dir(dir.join("sub")).expect("mkdir");
    let errs = load(&dir.join("sup.toml")).expect_err("not regular files");
    let got: Vec<String> = errs.iter().map(ToString::to_string).collect();
    let d = dir.display();
    assert_eq!(
        got,
        [
            format!("{d}/sup.toml:2:22: supd.include: /dev/zero: cannot read: a character device; only regular files are read as config"),
            format!("{d}/sup.toml:2:35: supd.include: {d}/sub: cannot read: a directory; only regular files are read as config"),
        ]
    );
}

#[test]
fn a_file_over_the_limit_is_refused_without_reading_it_all() {
    let dir = scratch();
    let big = dir.join("sup.toml");
    let f = std::fs::File::create(&big).expect("create");
    f.set_len(crate::config::MAX_FILE_SIZE + 1)
        .expect("sparse file");
    let errs = load(&big).expect_err("too large");
    assert_eq!(
        errs[0].to_string(),
        format!(
            "{}: cannot read: larger than 4 MiB, the most a config file may hold",
            big.display()
        )
    );
}

#[test]
fn umask_nice_and_limits_parse() {
    let (_dir, r) = load_text(
        r#"
[service.a]
command = ["/bin/true"]
umask = "027"
nice = -5
reload_signal = "USR2"
limits = { nofile = 65536, core = "0:unlimited", cpu = "unlimited" }
"#,
    );
    let cfg = r.expect("valid");
    let a = &cfg.services["a"];
    assert_eq!(a.umask, Some(0o027));
    assert_eq!(a.nice, Some(-5));
    assert_eq!(a.reload_signal, nix::sys::signal::Signal::SIGUSR2);
    let lim = |name: &str, soft, hard| Rlimit {
        name: name.into(),
        soft,
        hard,
    };
    assert_eq!(
        a.limits,
        [
            lim("core", Some(0), None),
            lim("cpu", None, None),
            lim("nofile", Some(65536), Some(65536)),
        ]
    );
    let b = ServiceConfig::new("b", vec![], "/".into());
    assert_eq!((b.umask, b.nice, b.limits.len()), (None, None, 0));
    assert_eq!(b.reload_signal, nix::sys::signal::Signal::SIGHUP);
    let bad = errors_of("[service.a]\ncommand = [\"/bin/true\"]\nreload_signal = \"NOPE\"\n");
    assert!(
        bad[0].starts_with("sup.toml:3:17: service.a.reload_signal: 'NOPE' is not a signal name"),
        "{bad:?}"
    );
}

#[test]
fn bad_umask_nice_and_limits_say_where_and_what_was_expected() {
    let got = errors_of(
        "[service.a]\ncommand = [\"/bin/true\"]\numask = \"0988\"\nnice = 20\nlimits = { nofile = -1, rss = 5, core = \"10:5\", stack = \"lots\" }\n",
    );
    assert_eq!(got.len(), 6, "{got:#?}");
    assert!(
        got[0].starts_with(
            "sup.toml:3:9: service.a.umask: '0988' is not a umask: expected an octal string"
        ),
        "{}",
        got[0]
    );
    assert!(
        got[1].starts_with("sup.toml:4:8: service.a.nice: expected a nice value from -20 to 19"),
        "{}",
        got[1]
    );
    assert!(
        got[2].starts_with("sup.toml:5:21: service.a.limits.nofile: a limit is not negative"),
        "{}",
        got[2]
    );
    assert!(
        got[3].starts_with("sup.toml:5:25: service.a.limits.rss:"),
        "{}",
        got[3]
    );
    assert!(got[3].contains("nofile, nproc, core"), "{}", got[3]);
    assert!(
        got[4].contains("service.a.limits.core: '10:5': the soft limit is above the hard one"),
        "{}",
        got[4]
    );
    assert!(
        got[5].contains("service.a.limits.stack: 'lots': expected a number, \"unlimited\""),
        "{}",
        got[5]
    );
    let int = errors_of("[service.a]\ncommand = [\"/bin/true\"]\numask = 27\n");
    assert!(
        int[0].contains("service.a.umask: expected a string"),
        "{int:?}"
    );
}

#[test]
fn env_files_resolve_relative_to_their_config_and_may_be_optional() {
    let (dir, r) = load_text(
        "[service.a]\ncommand = [\"/bin/true\"]\nenv_file = [\"/etc/default/a\", \"-local.env\"]\n",
    );
    let a = &r.expect("valid").services["a"];
    assert_eq!(
        a.env_file,
        [
            EnvFile {
                path: "/etc/default/a".into(),
                optional: false
            },
            EnvFile {
                path: dir.join("local.env"),
                optional: true
            }
        ]
    );
    let got = errors_of("[service.a]\ncommand = [\"/bin/true\"]\nenv_file = [\"-\", 3]\n");
    assert_eq!(got.len(), 2, "{got:#?}");
    assert!(
        got[0].starts_with("sup.toml:3:13: service.a.env_file: expected a file name"),
        "{}",
        got[0]
    );
    assert!(
        got[1].starts_with("sup.toml:3:18: service.a.env_file: expected a string"),
        "{}",
        got[1]
    );
}

#[test]
fn watchdog_and_health_checks_parse_with_their_defaults() {
    let (_, r) = load_text(
        r#"
[service.a]
command = ["/bin/a"]
watchdog = "30s"
health = { http = "http://127.0.0.1:8080/healthz", interval = "5s", failures = 2 }

[service.b]
command = ["/bin/b"]
health = { tcp = "[::1]:9000" }

[service.c]
tool = "c"
command = ["bin/c"]
health = { command = ["bin/c", "check"], timeout = "1s", start_delay = "3s" }
"#,
    );
    let cfg = r.expect("valid");
    let a = &cfg.services["a"];
    assert_eq!(a.watchdog, Some(Duration::from_secs(30)));
    let h = a.health.as_ref().expect("health");
    assert_eq!(
        h.check,
        Check::Http {
            addr: "127.0.0.1:8080".parse().expect("addr"),
            path: "/healthz".into()
        }
    );
    assert_eq!(
        (h.interval, h.timeout, h.failures),
        (Duration::from_secs(5), Duration::from_secs(2), 2)
    );
    let b = cfg.services["b"].health.as_ref().expect("health");
    assert_eq!(b.check, Check::Tcp("[::1]:9000".parse().expect("addr")));
    assert_eq!(b.start_delay, Duration::ZERO);
    assert_eq!(cfg.services["b"].watchdog, None);
    let c = cfg.services["c"].health.as_ref().expect("health");
    assert_eq!(
        c.check,
        Check::Command(vec!["bin/c".into(), "check".into()])
    );
    assert_eq!(
        (c.timeout, c.start_delay),
        (Duration::from_secs(1), Duration::from_secs(3))
    );
}

#[test]
fn a_health_check_needs_exactly_one_numeric_target() {
    let errs = errors_of(
        r#"
[service.a]
command = ["/bin/a"]
health = { http = "http://localhost:8080/healthz" }

[service.b]
command = ["/bin/b"]
health = { tcp = "127.0.0.1:1", http = "http://127.0.0.1:1/" }

[service.c]
command = ["/bin/c"]
health = { interval = "1s" }

[service.d]
command = ["/bin/d"]
health = { http = "https://127.0.0.1/", bogus = 1, failures = 0 }
watchdog = "0s"
"#,
    );
    let all = errs.join("\n");
    assert!(
        all.contains("sup.toml:4:19: service.a.health.http: 'http://localhost:8080/healthz': 'localhost:8080' is not an address")
            && all.contains("supd looks up no host names"),
        "{all}"
    );
    assert!(
        all.contains("service.b.health: expected exactly one of command, tcp and http"),
        "{all}"
    );
    assert!(all.contains("service.c.health: missing the check"), "{all}");
    assert!(
        all.contains("service.d.health.http: 'https://127.0.0.1/' is not an http:// URL"),
        "{all}"
    );
    assert!(all.contains("service.d.health.bogus: unknown key"), "{all}");
    assert!(
        all.contains("service.d.health.failures: expected a number of failures"),
        "{all}"
    );
    assert!(
        all.contains("service.d.watchdog: expected a duration longer than 0"),
        "{all}"
    );
}

#[test]
fn supds_own_nice_is_never_below_its_services() {
    let got = errors_of("[supd]\nnice = 5\n");
    assert_eq!(got.len(), 1, "{got:#?}");
    assert!(
        got[0].starts_with("sup.toml:2:8: supd.nice: expected a nice value from -20 to 0"),
        "{}",
        got[0]
    );
    let (_dir, r) = load_text("[supd]\nnice = -10\n");
    assert_eq!(r.expect("a valid config").supd.nice, Some(-10));
    let (_dir, r) = load_text("");
    assert_eq!(r.expect("a valid config").supd.nice, None);
}

#[test]
fn supds_realtime_is_a_boolean_off_by_default() {
    let got = errors_of("[supd]\nrealtime = \"yes\"\n");
    assert_eq!(got.len(), 1, "{got:#?}");
    assert!(
        got[0].starts_with("sup.toml:2:12: supd.realtime: expected"),
        "{}",
        got[0]
    );
    let (_dir, r) = load_text("[supd]\nrealtime = true\n");
    assert!(r.expect("a valid config").supd.realtime);
    let (_dir, r) = load_text("");
    assert!(!r.expect("a valid config").supd.realtime);
}

#[test]
fn control_group_is_a_group_name_none_by_default() {
    let (_dir, r) = load_text("[supd]\ncontrol_group = \"supops\"\n");
    let cfg = r.expect("a valid config");
    assert_eq!(cfg.supd.control_group.as_deref(), Some("supops"));
    let (_dir, r) = load_text("[supd]\ncontrol_group = \"\"\n");
    assert_eq!(r.expect("a valid config").supd.control_group, None);
}
