//! Per-service keys that shape the process (issue 12): `umask`, `nice`, `limits`. Each
//! is looked at from outside, in /proc of the running service, against a second service
//! without the key, so a key that were ignored fails its test.

mod common;
use common::*;

/// The value of a "Key:\tvalue" line of /proc/PID/status.
fn status_field(pid: i32, key: &str) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .map(|v| v.trim().to_string())
        .unwrap_or_default()
}

fn pid_of(sb: &Sandbox, service: &str) -> i32 {
    sb.wait_state(service, "running")["pid"]
        .as_i64()
        .expect("pid") as i32
}

/// The soft and hard values of a line of /proc/PID/limits ("Max open files").
fn limit(pid: i32, what: &str) -> (String, String) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("limits");
    let line = text
        .lines()
        .find(|l| l.starts_with(what))
        .unwrap_or_else(|| panic!("no {what} in {text}"));
    let mut fields = line[what.len()..].split_whitespace();
    (
        fields.next().unwrap_or("").to_string(),
        fields.next().unwrap_or("").to_string(),
    )
}

/// The nice value: field 19 of /proc/PID/stat (counted after the command's parenthesis).
fn nice_of(pid: i32) -> i32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let rest = &stat[stat.rfind(')').expect("comm") + 2..];
    rest.split_whitespace()
        .nth(16)
        .expect("nice field")
        .parse()
        .expect("a number")
}

#[test]
fn umask_is_set_in_the_child() {
    let mut sb = Sandbox::new();
    sb.config(
        "[service.masked]\ncommand = [\"/bin/sleep\", \"3600\"]\numask = \"027\"\n\
         [service.plain]\ncommand = [\"/bin/sleep\", \"3600\"]\n",
    );
    let mut cmd = std::process::Command::new("/bin/sh");
    cmd.args(["-c", "umask 0002; exec \"$0\" \"$@\"", SUPD]);
    sb.start_with(cmd, &["-c"]);
    assert_eq!(status_field(pid_of(&sb, "masked"), "Umask:"), "0027");
    assert_eq!(
        status_field(pid_of(&sb, "plain"), "Umask:"),
        "0002",
        "without the key, supd's own umask"
    );
}

#[test]
fn nice_is_set_in_the_child() {
    let mut sb = Sandbox::new();
    sb.config(
        "[service.low]\ncommand = [\"/bin/sleep\", \"3600\"]\nnice = 7\n\
         [service.plain]\ncommand = [\"/bin/sleep\", \"3600\"]\n",
    );
    sb.start();
    assert_eq!(nice_of(pid_of(&sb, "low")), 7);
    assert_eq!(nice_of(pid_of(&sb, "plain")), nice_of(sb.supd_pid()));
}

#[test]
fn limits_are_set_in_the_child_and_a_configured_nofile_wins() {
    let mut sb = Sandbox::new();
    sb.config(
        "[service.limited]\ncommand = [\"/bin/sleep\", \"3600\"]\n\
         limits = { nofile = 300, core = 0, fsize = \"4096:unlimited\", cpu = \"unlimited\" }\n\
         [service.plain]\ncommand = [\"/bin/sleep\", \"3600\"]\n",
    );
    // supd starts with soft limits the service's differ from (`ulimit -c` counts blocks
    // of 512 bytes; supd raises its own
    // open-files limit and gives its children the original one back).
    let mut cmd = std::process::Command::new("/bin/sh");
    cmd.args([
        "-c",
        "ulimit -Sn 512; ulimit -Sc 2; exec \"$0\" \"$@\"",
        SUPD,
    ]);
    sb.start_with(cmd, &["-c"]);
    let pid = pid_of(&sb, "limited");
    assert_eq!(limit(pid, "Max open files"), ("300".into(), "300".into()));
    assert_eq!(limit(pid, "Max core file size"), ("0".into(), "0".into()));
    assert_eq!(
        limit(pid, "Max file size"),
        ("4096".into(), "unlimited".into()),
        "\"SOFT:HARD\" sets each"
    );
    assert_eq!(limit(pid, "Max cpu time").0, "unlimited");
    let plain = pid_of(&sb, "plain");
    assert_eq!(limit(plain, "Max open files").0, "512");
    assert_eq!(limit(plain, "Max core file size").0, "1024");
}

#[test]
fn a_limit_that_cannot_be_set_is_a_failed_start_with_the_reason() {
    let mut sb = Sandbox::new();
    // Above fs.nr_open: refused even to root.
    sb.config(
        "[service.toomany]\ncommand = [\"/bin/sleep\", \"3600\"]\nrestart = \"never\"\n\
         limits = { core = 0, nofile = \"1024:4294967295\" }\n",
    );
    sb.start();
    let st = sb.wait_state("toomany", "failed");
    assert!(
        st["reason"]
            .as_str()
            .unwrap_or("")
            .contains("cannot set its limit nofile"),
        "{st}"
    );
}

/// The service's environment, as its process sees it.
fn environ(pid: i32) -> Vec<String> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).expect("environ");
    let mut env: Vec<String> = environ
        .split(|b| *b == 0)
        .filter(|v| !v.is_empty())
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .collect();
    env.sort();
    env
}

#[test]
fn env_files_are_read_at_each_start_and_env_wins() {
    let mut sb = Sandbox::new();
    sb.file(
        "agent.env",
        "# defaults\n\nMODE=file\nGREETING=\"hello there\"\nQUOTED='single'\n",
    );
    sb.config(
        "[service.probe]\ncommand = [\"/bin/sleep\", \"3600\"]\n\
         env_file = [\"agent.env\", \"-absent.env\"]\nenv = { MODE = \"env\" }\n",
    );
    sb.start();
    let env = environ(pid_of(&sb, "probe"));
    for want in ["GREETING=hello there", "QUOTED=single", "MODE=env"] {
        assert!(env.iter().any(|e| e == want), "{want} in {env:?}");
    }
    assert!(!env.iter().any(|e| e == "MODE=file"), "env wins: {env:?}");
    // Edited: the next start reads it anew.
    sb.file("agent.env", "GREETING=again\n");
    sb.ok(serde_json::json!({"cmd": "restart", "service": "probe"}));
    let env = environ(pid_of(&sb, "probe"));
    assert!(env.iter().any(|e| e == "GREETING=again"), "{env:?}");
    assert!(!env.iter().any(|e| e.starts_with("QUOTED=")), "{env:?}");
}

#[test]
fn a_required_env_file_that_cannot_be_read_is_a_failed_start_with_the_reason() {
    let mut sb = Sandbox::new();
    let fifo = sb.path("fifo.env");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
    sb.config(
        "[service.missing]\ncommand = [\"/bin/sleep\", \"3600\"]\nrestart = \"never\"\n\
         env_file = [\"no-such.env\"]\n\
         [service.fifo]\ncommand = [\"/bin/sleep\", \"3600\"]\nrestart = \"never\"\n\
         env_file = [\"fifo.env\"]\n\
         [service.fine]\ncommand = [\"/bin/sleep\", \"3600\"]\n",
    );
    sb.start();
    let st = sb.wait_state("missing", "failed");
    let reason = st["reason"].as_str().unwrap_or("").to_string();
    assert!(
        reason.contains("env_file") && reason.contains("no-such.env: cannot read: No such file"),
        "{st}"
    );
    // A FIFO nobody writes to is refused at once, not waited on.
    let st = sb.wait_state("fifo", "failed");
    assert!(
        st["reason"].as_str().unwrap_or("").contains("a FIFO"),
        "{st}"
    );
    pid_of(&sb, "fine");
}

#[test]
fn reload_with_a_service_sends_its_reload_signal_to_its_group() {
    let mut sb = Sandbox::new();
    // Each service says, through a FIFO of its own, that its traps are set, then which
    // signal it got: the test's blocking reads wait for it, without polling.
    let script = |name: &str| {
        let fifo = sb.path(&format!("{name}.fifo"));
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600))
            .expect("mkfifo");
        let path = sb.script(
            name,
            &format!(
                "trap 'echo HUP > {f}' HUP\ntrap 'echo USR2 > {f}' USR2\n\
                 echo up > {f}\nwhile :; do sleep 3600 & wait $!; done\n",
                f = fifo.display()
            ),
        );
        (path, fifo)
    };
    let ((usr2, usr2_fifo), (default, default_fifo)) = (script("usr2"), script("default"));
    sb.config(&format!(
        "[service.usr2]\ncommand = [\"/bin/sh\", \"{usr2}\"]\nreload_signal = \"USR2\"\n\
         [service.default]\ncommand = [\"/bin/sh\", \"{default}\"]\n"
    ));
    sb.start();
    let said = |fifo: &std::path::Path| std::fs::read_to_string(fifo).expect("read fifo");
    assert_eq!(said(&usr2_fifo), "up\n");
    assert_eq!(said(&default_fifo), "up\n");
    let r = sb.ok(serde_json::json!({"cmd": "reload", "service": "usr2"}));
    assert_eq!(r["signal"], "USR2", "{r}");
    assert_eq!(said(&usr2_fifo), "USR2\n");
    let r = sb.ok(serde_json::json!({"cmd": "reload", "service": "default"}));
    assert_eq!(r["signal"], "HUP", "{r}");
    assert_eq!(said(&default_fifo), "HUP\n");
    // A reload is not a restart.
    assert_eq!(sb.status("usr2")["state"], "running");
    let unknown = sb.request(serde_json::json!({"cmd": "reload", "service": "nope"}));
    assert_eq!(unknown["ok"], false, "{unknown}");
}
