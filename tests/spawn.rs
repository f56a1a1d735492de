//! What a service's process inherits: a clean environment plus `env`, its `cwd`, fds 0-2
//! only, an empty signal mask and default dispositions, its own session; as another user
//! when supd is root. Looked at from outside, through /proc, so no shell gets in between.

mod common;
use common::*;
use std::process::Command;

/// The value of a "Key:\tvalue" line of /proc/PID/status.
fn status_field(pid: i32, key: &str) -> String {
    field_of(pid, key).unwrap_or_else(|| panic!("process {pid} is gone"))
}

/// The same, or None if the process is gone (another test's spawner may end between a
/// scan of the processes and this read).
fn field_of(pid: i32, key: &str) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    Some(
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .map(|v| v.trim().to_string())
            .unwrap_or_default(),
    )
}

#[test]
fn a_child_starts_clean_even_when_supd_did_not() {
    let mut sb = Sandbox::new();
    std::fs::create_dir_all(sb.path("work")).expect("mkdir");
    sb.config("[service.probe]\ncommand = [\"/bin/sleep\", \"3600\"]\ncwd = \"work\"\nenv = { MODE = \"test\" }\n");
    // supd itself starts dirty: SIGHUP ignored (nohup), an extra fd 7 open without
    // close-on-exec, and a variable in its environment.
    let mut cmd = Command::new("/bin/sh");
    cmd.env("LEAKY_SECRET", "from the parent");
    cmd.args([
        "-c",
        "exec 7</dev/null; ulimit -Sn 512; exec nohup \"$0\" \"$@\"",
        SUPD,
    ]);
    sb.start_with(cmd, &["-c"]);
    let pid = sb.wait_state("probe", "running")["pid"]
        .as_i64()
        .expect("pid") as i32;
    let environ = std::fs::read(format!("/proc/{pid}/environ")).expect("environ");
    let mut env: Vec<String> = environ
        .split(|b| *b == 0)
        .filter(|v| !v.is_empty())
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .collect();
    env.sort();
    assert_eq!(
        env,
        [
            "MODE=test",
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "SUP_SERVICE=probe"
        ]
    );
    assert_eq!(
        std::fs::read_link(format!("/proc/{pid}/cwd")).expect("cwd"),
        sb.path("work")
    );
    // Its program has started when it sleeps: until then the dynamic loader has its
    // libraries open (as fd 3) for a moment.
    let end = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !std::fs::read_to_string(format!("/proc/{pid}/syscall"))
        .is_ok_and(|s| s.starts_with("230 ") || s.starts_with("35 "))
    {
        assert!(std::time::Instant::now() < end, "probe never slept");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let mut fds: Vec<i32> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("fds")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    fds.sort();
    assert_eq!(fds, [0, 1, 2], "only the standard streams reach a service");
    assert_eq!(status_field(pid, "SigBlk:"), "0000000000000000");
    assert_eq!(status_field(pid, "SigIgn:"), "0000000000000000");
    assert_eq!(
        status_field(pid, "NSsid:"),
        pid.to_string(),
        "the service leads its own session"
    );
    assert_eq!(
        status_field(pid, "NSpgid:"),
        pid.to_string(),
        "and its own process group"
    );
}

#[test]
fn as_root_a_service_runs_as_its_user_with_its_groups() {
    if !is_root() {
        eprintln!("skipped: needs root to change users");
        return;
    }
    let mut sb = Sandbox::new();
    sb.config("[service.who]\ncommand = [\"/bin/sleep\", \"3600\"]\nuser = \"nobody\"\ngroup = \"daemon\"\ncwd = \"/\"\n");
    sb.start();
    let pid = sb.wait_state("who", "running")["pid"]
        .as_i64()
        .expect("pid") as i32;
    let uids: Vec<String> = status_field(pid, "Uid:")
        .split_whitespace()
        .map(str::to_string)
        .collect();
    let gids: Vec<String> = status_field(pid, "Gid:")
        .split_whitespace()
        .map(str::to_string)
        .collect();
    assert_eq!(uids, ["65534"; 4], "real, effective, saved and fs uid");
    assert_eq!(gids, ["1"; 4], "the group given by `group`");
    let groups = status_field(pid, "Groups:");
    assert!(
        !groups.split_whitespace().any(|g| g == "0"),
        "root's groups are dropped: {groups}"
    );
}

/// The pid of the process whose parent is `parent` and whose command line is `argv`.
fn child_with_cmdline(parent: i32, argv: &[&str]) -> Option<i32> {
    processes_with_cmdline(argv)
        .into_iter()
        .find(|p| field_of(*p, "PPid:") == Some(parent.to_string()))
}

/// supd's spawner (`/proc/self/exe --spawner`, its child).
fn spawner_of(sb: &Sandbox, supd: i32) -> i32 {
    child_with_cmdline(supd, &["/proc/self/exe", "--spawner"])
        .unwrap_or_else(|| panic!("no spawner child of supd\n{}", sb.supd_log()))
}

/// Once service `a` (pid `a`) has written its first line to `ran`: supd's spawner
/// SIGSTOPped, a watch opened, then `a` SIGKILLed. The spawner's pid and the watch.
fn spawner_stopped_and_a_killed(
    sb: &Sandbox,
    supd: i32,
    a: i32,
    ran: &std::path::Path,
) -> (i32, Watch) {
    use nix::sys::signal::{kill, Signal};
    let pid = nix::unistd::Pid::from_raw;
    let spawner = spawner_of(sb, supd);
    assert_eq!(
        lines_once_there(ran, 1).len(),
        1,
        "a's first run wrote its line"
    );
    kill(pid(spawner), Signal::SIGSTOP).expect("stop the spawner");
    let w = sb.watch();
    kill(pid(a), Signal::SIGKILL).expect("kill a");
    (spawner, w)
}

/// The lines of `path` once it has at least `n` (inotify, with the deadline): a
/// service's shell writes its line after its exec, which made it `running`.
fn lines_once_there(path: &std::path::Path, n: usize) -> Vec<String> {
    files::wait_file(path, |text| text.lines().count() >= n)
        .lines()
        .map(str::to_string)
        .collect()
}

/// SIGKILLs `pid`, `name`'s process, and waits for its restart; returns the new pid.
fn killed_and_back(sb: &Sandbox, name: &str, pid: i32) -> i32 {
    let mut w = sb.watch();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill");
    let again = w.until(sb, |e| {
        e["service"] == name && e["to"] == "running" && e["pid"].as_i64() != Some(pid as i64)
    });
    again["pid"].as_i64().expect("pid") as i32
}

/// Services are forked by the spawner (a small process, whose forks do not grow with
/// supd's services), yet they are supd's own children. A killed spawner costs nothing:
/// supd forks the next services itself, and a new spawner comes on a later start.
#[test]
fn services_are_forked_by_the_spawner_as_supds_own_children() {
    let mut sb = Sandbox::new();
    sb.config(
        r#"
[service.a]
command = ["/bin/sleep", "3601"]
restart_delay = "10ms"
"#,
    );
    sb.start();
    let supd = sb.supd_pid();
    let a = sb.wait_state("a", "running")["pid"].as_i64().expect("pid") as i32;
    assert_eq!(
        status_field(a, "PPid:"),
        supd.to_string(),
        "a is supd's child"
    );
    let exe = "/proc/self/exe";
    let spawner = child_with_cmdline(supd, &[exe, "--spawner"])
        .unwrap_or_else(|| panic!("no spawner child of supd\n{}", sb.supd_log()));
    // The spawner forked it: its log says so, and supd's own forks are not counted.
    let log = sb.supd_log();
    assert!(
        log.contains(&format!("spawner started: pid {spawner}")),
        "{log}"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(spawner),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the spawner");
    wait_exit(spawner, std::time::Duration::from_secs(10)).expect("the spawner is gone");
    // A restart right after: forked by supd itself, or by a new spawner; either way it
    // runs, as supd's child.
    let b = killed_and_back(&sb, "a", a);
    assert_eq!(
        status_field(b, "PPid:"),
        supd.to_string(),
        "still supd's child"
    );
    // After the retry delay (a second), the next start brings a new spawner.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut last = b;
    let fresh = loop {
        if let Some(p) = child_with_cmdline(supd, &[exe, "--spawner"]).filter(|p| *p != spawner) {
            break p;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no new spawner\n{}",
            sb.supd_log()
        );
        last = killed_and_back(&sb, "a", last);
    };
    assert!(
        sb.supd_log().contains("the spawner runs again"),
        "{}",
        sb.supd_log()
    );
    sb.stop_supd(nix::sys::signal::Signal::SIGTERM);
    wait_exit(fresh, std::time::Duration::from_secs(10)).expect("the spawner ends with supd");
}

/// A spawner that hangs (stopped) holds supd up for its answer's bound at most: supd
/// forks the child itself, ends the silent spawner, and says so.
#[test]
fn a_stopped_spawner_is_given_up_and_supd_forks_itself() {
    let mut sb = Sandbox::new();
    sb.config("[service.a]\ncommand = [\"/bin/sleep\", \"3602\"]\nrestart_delay = \"10ms\"\n");
    sb.start();
    let supd = sb.supd_pid();
    let a = sb.wait_state("a", "running")["pid"].as_i64().expect("pid") as i32;
    let spawner = spawner_of(&sb, supd);
    let pid = nix::unistd::Pid::from_raw;
    nix::sys::signal::kill(pid(spawner), nix::sys::signal::Signal::SIGSTOP).expect("stop it");
    let mut w = sb.watch();
    nix::sys::signal::kill(pid(a), nix::sys::signal::Signal::SIGKILL).expect("kill a");
    let again = w.until(&sb, |e| {
        e["service"] == "a" && e["to"] == "running" && e["pid"].as_i64() != Some(a as i64)
    });
    let b = again["pid"].as_i64().expect("pid") as i32;
    assert_eq!(status_field(b, "PPid:"), supd.to_string(), "supd's child");
    assert!(
        sb.supd_log()
            .contains(&format!("the spawner (pid {spawner}) did not answer")),
        "{}",
        sb.supd_log()
    );
    // The silent spawner was ended (killed, then reaped by supd).
    wait_exit(spawner, std::time::Duration::from_secs(10)).expect("the stopped spawner is gone");
    sb.stop_supd(nix::sys::signal::Signal::SIGTERM);
}

/// `/proc/PID/environ` of a fork on its way to exec, read by `sup::proc::environ`: it is
/// the environment from before the exec or the one after, never the first part of one.
/// (Read piecemeal, as `fs::read` does, the fault suite once took a service's fork for
/// an unexec'd fork of supd: its first variables named the run, its last, SUP_SERVICE,
/// was cut off by the exec. supd's own look for what a killed supd left reads it so.)
#[test]
fn an_environment_read_while_its_process_execs_is_whole() {
    // A shell whose environment begins with a tag and ends with SUP_SERVICE (a cleared
    // Command's environment is sorted by name) forks and forks, and each fork execs
    // programs whose environments carry neither. 100 KB of it: more than the first
    // buffer of `environ`, and many calls for a piecemeal read (which is then cut within
    // a tenth of a second).
    let mut cmd = Command::new("/bin/sh");
    cmd.env_clear()
        .env("A_TAG", "1")
        .env("SUP_SERVICE", "probe");
    for i in 0..400 {
        cmd.env(format!("B_PAD{i:02}"), "x".repeat(250));
    }
    let mut sh = cmd
        .args([
            "-c",
            "while :; do (exec /usr/bin/env -i A=1 /bin/true); done",
        ])
        .spawn()
        .expect("sh");
    let pid = sh.id();
    let children = format!("/proc/{pid}/task/{pid}/children");
    let (mut whole, mut cut) = (0u32, Vec::new());
    // Two seconds of reads, and longer until 100 forks were caught (a loaded machine
    // forks fewer), within the deadline.
    let begun = std::time::Instant::now();
    let enough = |whole: u32| whole > 100 && begun.elapsed() >= std::time::Duration::from_secs(2);
    while !enough(whole) && begun.elapsed() < DEADLINE && cut.is_empty() {
        let list = std::fs::read_to_string(&children).unwrap_or_default();
        for child in list
            .split_whitespace()
            .filter_map(|p| p.parse::<i32>().ok())
        {
            let Some(env) = sup::proc::environ(child) else {
                continue;
            };
            let vars: Vec<&[u8]> = env.split(|b| *b == 0).collect();
            match (
                vars.contains(&&b"A_TAG=1"[..]),
                vars.contains(&&b"SUP_SERVICE=probe"[..]),
            ) {
                (true, true) => whole += 1,
                (true, false) => cut.push(env.len()),
                _ => {}
            }
        }
    }
    let _ = sh.kill();
    let _ = sh.wait();
    assert!(
        cut.is_empty(),
        "an environment read cut short ({} bytes), after {whole} whole",
        cut[0]
    );
    assert!(
        whole > 100,
        "only {whole} forks caught before their exec: the race was not run"
    );
}

/// A service's fork is asked of the spawner without waiting for it: a spawner slow to
/// fork (frozen here) holds up no client. A restart whose fork is asked shows `stopped`
/// to a `status` meanwhile (supd answers at once, not after the spawner); a `restart`
/// meanwhile calls that start off and asks again: the child asked for first exits
/// without running its program once the spawner (thawed) makes it, and what runs is
/// what the restart asked for (here, the environment file as it is now: an upgrade's
/// restart likewise starts the version `current` names now).
#[test]
fn a_start_waiting_for_a_frozen_spawner_holds_up_no_client_and_a_restart_asks_again() {
    let mut sb = Sandbox::new();
    let (ran, env) = (sb.path("ran"), sb.path("a.env"));
    std::fs::write(&env, "V=old\n").expect("env file");
    sb.config(&format!(
        r#"
[service.a]
command = ["/bin/sh", "-c", "echo $$ $V >> {}; exec sleep 3605"]
env_file = ["{}"]
restart_delay = "10ms"

[service.b]
command = ["/bin/sleep", "3606"]
"#,
        ran.display(),
        env.display()
    ));
    // The spawner is frozen while this test acts: more than its 2 s on a loaded machine.
    let mut cmd = Command::new(SUPD);
    cmd.env("SUP_SPAWNER_ANSWER_MS", "15000");
    sb.start_with(cmd, &["-c"]);
    let supd = sb.supd_pid();
    let a = sb.wait_state("a", "running")["pid"].as_i64().expect("pid") as i32;
    sb.wait_state("b", "running");
    let (spawner, mut w) = spawner_stopped_and_a_killed(&sb, supd, a, &ran);
    let pid = nix::unistd::Pid::from_raw;
    use nix::sys::signal::{kill, Signal};
    // Its backoff is over: the next pass asks the spawner for its child, in the same
    // turn of supd's loop that sent this event.
    w.until(&sb, |e| {
        e["service"] == "a" && e["from"] == "backoff" && e["to"] == "stopped"
    });
    let st = sb.status("a");
    assert_eq!(
        (st["state"].as_str(), st["pid"].as_i64()),
        (Some("stopped"), None),
        "status answered while the spawner is frozen, the start still waiting: {st}\n{}",
        sb.supd_log()
    );
    // A restart of a (with b, whose stop shows that the restart was taken) before the
    // spawner answers, with a's environment changed.
    std::fs::write(&env, "V=new\n").expect("env file");
    let mut c = sb.client();
    c.send_raw(b"{\"cmd\":\"restart\",\"services\":[\"a\",\"b\"],\"id\":1}\n");
    w.until(&sb, |e| e["service"] == "b" && e["from"] == "running");
    assert!(alive(spawner), "the spawner is not given up yet");
    kill(pid(spawner), Signal::SIGCONT).expect("thaw the spawner");
    let answer = c.read().expect("the restart's answer");
    assert_eq!(answer["ok"], true, "{answer}\n{}", sb.supd_log());
    let log = sb.supd_log();
    let called_off = log
        .lines()
        .find_map(|l| {
            l.split_once("a: its start was called off: child ")
                .and_then(|(_, rest)| rest.split(' ').next()?.parse::<i32>().ok())
        })
        .unwrap_or_else(|| panic!("a's first start was not called off\n{log}"));
    wait_exit(called_off, std::time::Duration::from_secs(10)).expect("the unwanted child exits");
    let now = sb.status("a")["pid"].as_i64().expect("a runs") as i32;
    assert_eq!(
        lines_once_there(&ran, 2),
        [format!("{a} old"), format!("{now} new")],
        "the called-off child never ran its program; the restart's did\n{log}"
    );
    assert!(
        !log.contains("did not answer"),
        "the spawner was not given up\n{log}"
    );
    sb.stop_supd(Signal::SIGTERM);
}

/// The nice value of `pid` (field 19 of /proc/PID/stat).
fn nice_of(pid: i32) -> i32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let after = stat.rsplit_once(')').expect("comm").1;
    after
        .split_whitespace()
        .nth(16)
        .expect("nice")
        .parse()
        .expect("a number")
}

/// `[supd] nice`: supd runs at it and, leading its session, so does its autogroup (the
/// kernel's share of the CPU per session, one per service); its services get back the
/// nice value supd was started with, or their own `nice`. A reload without it puts
/// supd back.
#[test]
fn supd_runs_at_its_own_nice_and_its_services_at_theirs() {
    if !is_root() {
        eprintln!("skipped: needs root to lower a nice value");
        return;
    }
    let base = nice_of(std::process::id() as i32);
    let mut sb = Sandbox::new();
    let services = "[service.a]\ncommand = [\"/bin/sleep\", \"3607\"]\n\n[service.b]\ncommand = [\"/bin/sleep\", \"3608\"]\nnice = 3\n";
    sb.config_with("nice = -7\n", services);
    // A session of its own, as a daemon has (`setsid` execs it: its pid stays).
    let mut cmd = Command::new("setsid");
    cmd.arg(SUPD);
    sb.start_with(cmd, &["-c"]);
    let supd = sb.supd_pid();
    let a = sb.wait_state("a", "running")["pid"].as_i64().expect("pid") as i32;
    let b = sb.wait_state("b", "running")["pid"].as_i64().expect("pid") as i32;
    assert_eq!(nice_of(supd), -7, "supd's own\n{}", sb.supd_log());
    assert_eq!(
        nice_of(a),
        base,
        "a service setting none: supd's from its start"
    );
    assert_eq!(nice_of(b), 3, "a service's own");
    let autogroup = format!("/proc/{supd}/autogroup");
    if let Ok(text) = std::fs::read_to_string(&autogroup) {
        assert!(
            text.trim_end().ends_with("nice -7"),
            "supd's autogroup: {text}"
        );
    }
    // A reexec keeps both: supd's, and the one its services get back.
    sb.reexec();
    let a = killed_and_back(&sb, "a", a);
    assert_eq!(nice_of(supd), -7, "supd's own, after a reexec");
    assert_eq!(nice_of(a), base, "a restarted after a reexec");
    // Without the key, supd goes back to the value it was started with.
    sb.config_with("", services);
    sb.ok(serde_json::json!({"cmd": "reload"}));
    assert_eq!(nice_of(supd), base, "after the reload\n{}", sb.supd_log());
    // The spawner keeps -7, its fork's: a service forked by it after the reload is set
    // back all the same.
    let a = killed_and_back(&sb, "a", a);
    assert_eq!(nice_of(a), base, "a restarted after the reload");
    if let Ok(text) = std::fs::read_to_string(&autogroup) {
        assert!(
            text.trim_end().ends_with(&format!("nice {base}")),
            "supd's autogroup: {text}"
        );
    }
    sb.stop_supd(nix::sys::signal::Signal::SIGTERM);
}

/// Whether this process may take a real-time policy (root, and a real-time budget in
/// its cgroup): a `chrt` child tries.
fn may_be_realtime() -> bool {
    Command::new("chrt")
        .args(["-r", "1", "true"])
        .status()
        .is_ok_and(|s| s.success())
}

/// `[supd] realtime`: supd runs under SCHED_RR at priority 1 with reset-on-fork, kept by
/// a reexec; nothing it starts (its spawner, its services, after a reexec too) is
/// real-time, and its services keep the nice value supd was started with, negative or
/// positive (reset-on-fork alone gives a real-time parent's children 0). A reload
/// without it puts supd back under the normal policy; the spawner, forked while supd
/// was real-time, keeps 0, and a service it forks then still gets supd's value.
#[test]
fn supd_runs_realtime_and_nothing_it_starts_does() {
    if !is_root() || !may_be_realtime() {
        eprintln!("skipped: needs root and a real-time budget");
        return;
    }
    for started in [-5, 5] {
        realtime_started_at(started);
    }
}

fn realtime_started_at(started: i32) {
    use sup::sys::{sched_policy, REALTIME_PRIORITY};
    let normal = Some((libc::SCHED_OTHER, false, 0));
    let mut sb = Sandbox::new();
    let services = "[service.a]\ncommand = [\"/bin/sleep\", \"3610\"]\n\n[service.b]\ncommand = [\"/bin/sleep\", \"3611\"]\nnice = 3\n";
    sb.config_with("realtime = true\n", services);
    let mut cmd = Command::new("setsid");
    cmd.args(["nice", "-n", &started.to_string(), SUPD]);
    sb.start_with(cmd, &["-c"]);
    let supd = sb.supd_pid();
    let a = sb.wait_state("a", "running")["pid"].as_i64().expect("pid") as i32;
    let b = sb.wait_state("b", "running")["pid"].as_i64().expect("pid") as i32;
    let rr = Some((libc::SCHED_RR, true, REALTIME_PRIORITY));
    let at = format!("started at nice {started}");
    assert_eq!(sched_policy(supd), rr, "supd, {at}\n{}", sb.supd_log());
    assert_eq!(
        nice_of(supd),
        started,
        "supd keeps the nice value it was given"
    );
    assert_eq!(sched_policy(a), normal, "a service, {at}");
    assert_eq!(
        nice_of(a),
        started,
        "a service setting none: supd's from its start"
    );
    assert_eq!(
        (sched_policy(b), nice_of(b)),
        (normal, 3),
        "a service's own, {at}"
    );
    let spawner = spawner_of(&sb, supd);
    assert_eq!(sched_policy(spawner), normal, "the spawner, {at}");
    // A reexec keeps it; what starts after it is normal still.
    sb.reexec();
    let a = killed_and_back(&sb, "a", a);
    assert_eq!(sched_policy(supd), rr, "supd after a reexec, {at}");
    assert_eq!(
        (sched_policy(a), nice_of(a)),
        (normal, started),
        "a after a reexec"
    );
    // Without the key, supd is back under the normal policy, at its nice value.
    sb.config_with("", services);
    sb.ok(serde_json::json!({"cmd": "reload"}));
    assert_eq!(
        sched_policy(supd),
        normal,
        "after the reload, {at}\n{}",
        sb.supd_log()
    );
    assert_eq!(nice_of(supd), started);
    let a = killed_and_back(&sb, "a", a);
    assert_eq!(
        (sched_policy(a), nice_of(a)),
        (normal, started),
        "a after the reload"
    );
    sb.stop_supd(nix::sys::signal::Signal::SIGTERM);
}

/// `[supd] realtime` refused (no `CAP_SYS_NICE`: root without it, as in a container):
/// said in the log, and supd runs its services on under the normal policy; a reload
/// that asks again is refused again the same way.
#[test]
fn realtime_refused_is_said_and_supd_runs_on() {
    if !is_root() {
        eprintln!("skipped: needs root to drop CAP_SYS_NICE");
        return;
    }
    let mut sb = Sandbox::new();
    let services = "[service.a]\ncommand = [\"/bin/sleep\", \"3612\"]\n";
    sb.config_with("realtime = true\n", services);
    // Root without CAP_SYS_NICE, and no real-time limit to allow it otherwise.
    let mut cmd = Command::new("setpriv");
    cmd.args([
        "--bounding-set=-sys_nice",
        "--inh-caps=-sys_nice",
        "prlimit",
        "--rtprio=0",
    ]);
    cmd.arg(SUPD);
    sb.start_with(cmd, &["-c"]);
    let supd = sb.supd_pid();
    let a = sb.wait_state("a", "running")["pid"].as_i64().expect("pid") as i32;
    let normal = Some((libc::SCHED_OTHER, false, 0));
    assert_eq!(sup::sys::sched_policy(supd), normal, "supd");
    assert_eq!(sup::sys::sched_policy(a), normal, "a");
    let said = |n: usize| {
        sb.supd_log()
            .matches("cannot put supd under the real-time policy")
            .count()
            >= n
    };
    assert!(said(1), "the refusal is said\n{}", sb.supd_log());
    sb.ok(serde_json::json!({"cmd": "reload"}));
    assert!(said(2), "and said again\n{}", sb.supd_log());
    assert_eq!(sb.status("a")["pid"].as_i64(), Some(a as i64), "a ran on");
    sb.stop_supd(nix::sys::signal::Signal::SIGTERM);
}

/// A spawner that dies with a start waiting on its queue (stopped, then killed, so it
/// cannot have forked the child) is found at once by its queue's end, not after the
/// answer's bound: supd forks that start itself, once.
#[test]
fn a_spawner_killed_with_a_start_on_its_queue_is_replaced_by_supds_own_fork() {
    let mut sb = Sandbox::new();
    let ran = sb.path("ran");
    sb.config(&format!(
        "[service.a]\ncommand = [\"/bin/sh\", \"-c\", \"echo $$ >> {}; exec sleep 3609\"]\nrestart_delay = \"10ms\"\n",
        ran.display()
    ));
    // The spawner is frozen while this test acts: more than its 2 s on a loaded machine.
    let mut cmd = Command::new(SUPD);
    cmd.env("SUP_SPAWNER_ANSWER_MS", "15000");
    sb.start_with(cmd, &["-c"]);
    let supd = sb.supd_pid();
    let a = sb.wait_state("a", "running")["pid"].as_i64().expect("pid") as i32;
    let (spawner, mut w) = spawner_stopped_and_a_killed(&sb, supd, a, &ran);
    let pid = nix::unistd::Pid::from_raw;
    use nix::sys::signal::{kill, Signal};
    // Its start is on the queue (said in its reason) when the spawner is killed. No
    // event tells a reason: status is asked every 5 ms.
    let end = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let st = sb.status("a");
        if st["reason"]
            .as_str()
            .is_some_and(|r| r.contains("its fork by the spawner"))
        {
            break;
        }
        assert!(
            std::time::Instant::now() < end,
            "a never waited for the spawner: {st}"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    kill(pid(spawner), Signal::SIGKILL).expect("kill the spawner");
    let again = w.until(&sb, |e| {
        e["service"] == "a" && e["to"] == "running" && e["pid"].as_i64() != Some(a as i64)
    });
    let b = again["pid"].as_i64().expect("pid") as i32;
    assert_eq!(status_field(b, "PPid:"), supd.to_string(), "supd's child");
    let log = sb.supd_log();
    assert!(
        log.contains(&format!("the spawner (pid {spawner}) closed its queue")),
        "found by its queue's end, not by the bound\n{log}"
    );
    assert!(!log.contains("did not answer"), "{log}");
    assert_eq!(
        lines_once_there(&ran, 2),
        [a.to_string(), b.to_string()],
        "the lost start ran once"
    );
    sb.stop_supd(Signal::SIGTERM);
}
