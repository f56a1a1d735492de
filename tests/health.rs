//! Health against real processes: a watchdog and health checks (command, HTTP) that
//! catch a version that hangs or fails after getting ready (rolled back, marked bad with
//! the reason), a healthy version committed only once its check passed, a failure
//! below the threshold forgiven, a check that hangs timed out while supd answers, and
//! an unhealthy service restarted under the crash-loop rule outside probation.

mod common;
use common::files::wait_file;
use common::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// The agent of the watchdog tests, in Python: `ping` sends `WATCHDOG=1` every 100ms
/// forever; `hang` sends it three times, then blocks forever. It writes its
/// environment's watchdog variables and its pid to ENV_FILE first.
const WATCHDOG_AGENT: &str = r#"#!/usr/bin/python3
import os, socket, sys, time
mode, env_file = sys.argv[1], sys.argv[2]
with open(env_file + ".tmp", "w") as f:
    f.write("%s %s %s\n" % (os.environ.get("WATCHDOG_USEC"), os.environ.get("WATCHDOG_PID"), os.getpid()))
os.rename(env_file + ".tmp", env_file)
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
n = 0
while True:
    if mode == "ping" or n < 3:
        s.sendto(b"WATCHDOG=1", os.environ["NOTIFY_SOCKET"])
    n += 1
    time.sleep(0.1)
"#;

/// A loopback HTTP server answering every GET with STATUS.
const HTTP_SERVER: &str = r#"#!/usr/bin/python3
import http.server, sys
port, status = int(sys.argv[1]), int(sys.argv[2])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer.allow_reuse_address = True
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"#;

fn agent(sb: &Sandbox, extra: &str) {
    agent_on_probation(sb, "2s", extra);
}

fn agent_on_probation(sb: &Sandbox, probation: &str, extra: &str) {
    sb.config(&format!(
        r#"
[service.agent]
tool = "agent"
command = ["bin/agent"]
restart_delay = "10ms"
crash_loop = {{ restarts = 5, window = "1m" }}
on_crash_loop = "cooldown"
cooldown = "1h"
probation = "{probation}"
stop_timeout = "2s"
{extra}
"#
    ));
}

fn versions(sb: &Sandbox) -> Value {
    sb.ok(json!({"cmd": "versions", "tool": "agent"}))
}

fn version_entry(v: &Value, version: &str) -> Value {
    v["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|x| x["version"] == version)
        .cloned()
        .unwrap_or(Value::Null)
}

fn link(sb: &Sandbox) -> String {
    std::fs::read_link(sb.path("tools/agent/current"))
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Asserts that VERSION was rolled back from and marked bad with a reason holding
/// `reason`, and that `current` is `back` again.
fn assert_rolled_back(sb: &Sandbox, version: &str, back: &str, reason: &str) {
    let v = versions(sb);
    let e = version_entry(&v, version);
    assert_eq!(e["bad"], true, "{v:#}");
    let why = e["bad_reason"].as_str().unwrap_or("");
    assert!(why.contains(reason), "bad reason {why:?} lacks {reason:?}");
    assert_eq!(v["phase"], "rolled-back", "{v:#}");
    assert_eq!(v["current"], back);
    assert_eq!(link(sb), back);
    let st = sb.wait_state("agent", "running");
    assert_eq!(st["version"], back);
}

#[test]
fn the_watchdog_catches_a_version_that_hangs_after_ready_and_it_is_rolled_back() {
    let mut sb = Sandbox::new();
    let py = sb.file("wd-agent.py", WATCHDOG_AGENT);
    // A watchdog with room for a Python start on a loaded machine, and a probation with
    // room for it to run out.
    agent_on_probation(&sb, "6s", "watchdog = \"1500ms\"");
    sb.start();
    let env_file = sb.path("wd-env");
    sb.install_version("1.0.0", &format!("exec {py} ping {}", env_file.display()));
    sb.upgrade_wait("1.0.0", true);
    // As systemd: the timeout in microseconds and the main pid.
    let st = sb.wait_state("agent", "running");
    let env = wait_file(&env_file, |t| t.ends_with('\n'));
    let words: Vec<&str> = env.split_whitespace().collect();
    assert_eq!(words[0], "1500000", "WATCHDOG_USEC: {env}");
    assert_eq!(words[1], words[2], "WATCHDOG_PID is its own pid: {env}");
    assert_eq!(st["pid"].to_string(), words[2], "{st}");
    assert_eq!(st["health"], "healthy", "pinging: {st}");

    sb.install_version("1.1.0", &format!("exec {py} hang {}", env_file.display()));
    let mut w = sb.watch();
    sb.upgrade_wait("1.1.0", false);
    assert_rolled_back(
        &sb,
        "1.1.0",
        "1.0.0",
        "watchdog: no WATCHDOG=1 within 1500ms",
    );
    let e = w.until(&sb, |e| e["event"] == "health" && e["to"] == "unhealthy");
    assert_eq!(e["service"], "agent");
    assert_eq!(e["reason"], "watchdog: no WATCHDOG=1 within 1500ms");
}

#[test]
fn a_command_check_catches_a_version_that_hangs_and_its_hung_checks_are_killed() {
    let mut sb = Sandbox::new();
    let mark = format!("{}", sb.tag);
    // A timeout a good check meets on a loaded machine; three of them fit the probation.
    agent_on_probation(
        &sb,
        "8s",
        r#"health = { command = ["bin/agent", "check"], interval = "200ms", timeout = "1s", failures = 3 }"#,
    );
    sb.start();
    // The check asks the agent; a hung agent leaves it hanging too.
    sb.install_version(
        "1.0.0",
        "case \"$1\" in check) exit 0;; esac\nexec sleep 3600",
    );
    sb.upgrade_wait("1.0.0", true);
    sb.install_version(
        "1.1.0",
        &format!("case \"$1\" in check) exec sleep {mark};; esac\nexec sleep 3600"),
    );
    sb.upgrade_wait("1.1.0", false);
    assert_rolled_back(
        &sb,
        "1.1.0",
        "1.0.0",
        "agent: health: 3 failures: check command timed out after 1s",
    );
    // Each hung check was killed at its timeout, none left behind.
    wait_gone(&["sleep", &mark], "a hung check outlived its timeout");
}

#[test]
fn an_http_check_catches_a_version_that_answers_500_and_a_healthy_one_commits_only_once_checked() {
    let mut sb = Sandbox::new();
    let py = sb.file("serve-status.py", HTTP_SERVER);
    let port = etcd::free_port();
    agent(
        &sb,
        &format!(
            r#"health = {{ http = "http://127.0.0.1:{port}/healthz", interval = "200ms", timeout = "1s", failures = 3, start_delay = "2500ms" }}"#
        ),
    );
    sb.start();
    sb.install_version("1.0.0", &format!("exec {py} {port} 200"));
    // The probation is 2s, the first check comes at 2.5s: no commit before it passed.
    let started = Instant::now();
    sb.upgrade_wait("1.0.0", true);
    assert!(
        started.elapsed() >= Duration::from_millis(2500),
        "committed after {:?}, before the first check",
        started.elapsed()
    );
    let st = sb.status("agent");
    assert_eq!(st["health"], "healthy", "{st}");
    assert_eq!(st["health_failures"], 0);

    sb.install_version("1.1.0", &format!("exec {py} {port} 500"));
    let mut w = sb.watch();
    let out = sb.supctl(&["upgrade", "agent", "1.1.0"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // In probation, before the first check: its health is shown as unknown.
    let v = versions(&sb);
    assert_eq!(v["phase"], "probation", "{v:#}");
    assert_eq!(
        v["health"],
        json!([{"service": "agent", "health": "unknown"}]),
        "{v:#}"
    );
    let want = format!("health: 3 failures: HTTP 500 from 127.0.0.1:{port}/healthz");
    let e = w.until(&sb, |e| e["event"] == "health" && e["to"] == "unhealthy");
    assert_eq!(e["reason"], want.as_str());
    w.until(&sb, |e| e["event"] == "rollback" && e["from"] == "1.1.0");
    assert_rolled_back(&sb, "1.1.0", "1.0.0", &want);
    // The old version is healthy again once checked.
    let mut w = sb.watch();
    if sb.status("agent")["health"] != "healthy" {
        w.until(&sb, |e| e["event"] == "health" && e["to"] == "healthy");
    }
    let st = sb.status("agent");
    assert_eq!(
        st["health_last_failure"]["reason"],
        want.replace("health: 3 failures: ", "")
    );
}

#[test]
fn a_version_that_fails_its_check_once_is_committed_and_not_restarted() {
    let mut sb = Sandbox::new();
    agent(
        &sb,
        r#"health = { command = ["bin/agent", "check"], interval = "150ms", timeout = "1s", failures = 2 }"#,
    );
    sb.start();
    let once = sb.path("failed-once");
    sb.install_version(
        "1.0.0",
        &format!(
            "case \"$1\" in check) if [ -e {0} ]; then exit 0; fi; : > {0}; exit 1;; esac\nexec sleep 3600",
            once.display()
        ),
    );
    sb.upgrade_wait("1.0.0", true);
    assert!(once.exists(), "the check ran and failed once");
    let st = sb.status("agent");
    assert_eq!(st["restarts"], 0, "{st}");
    assert_eq!(st["health"], "healthy", "{st}");
    assert_eq!(st["health_failures"], 0, "{st}");
    assert_eq!(
        st["health_last_failure"]["reason"], "check command exited with code 1",
        "{st}"
    );
    assert_eq!(versions(&sb)["phase"], "committed");
}

#[test]
fn a_hung_check_times_out_and_supd_answers_meanwhile() {
    let mut sb = Sandbox::new();
    let mark = format!("{}", sb.tag + 1_000_000);
    let check = sb.script("hang-check", &format!("exec sleep {mark}"));
    sb.config(&format!(
        r#"
[service.a]
command = ["/bin/sleep", "3600"]
health = {{ command = ["{check}"], interval = "10s", timeout = "8s", failures = 100 }}
"#
    ));
    sb.start();
    wait_present(&["sleep", &mark], "the check never ran");
    // The check hangs: supd answers all the same. (A supd that waited for its check
    // would answer after the 8 s timeout; 3 s leaves a loaded machine room.)
    for _ in 0..5 {
        let t = Instant::now();
        let st = sb.status("a");
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "status took {:?}",
            t.elapsed()
        );
        assert_eq!(st["health"], "unknown", "{st}");
    }
    wait_gone(&["sleep", &mark], "the hung check was never killed");
    let end = Instant::now() + DEADLINE;
    loop {
        let st = sb.status("a");
        if st["health_failures"] == 1 {
            assert_eq!(
                st["health_last_failure"]["reason"], "check command timed out after 8s",
                "{st}"
            );
            assert_eq!(st["state"], "running");
            break;
        }
        assert!(Instant::now() < end, "no failure counted: {st}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn outside_probation_an_unhealthy_service_is_restarted_and_counted_for_the_crash_loop() {
    let mut sb = Sandbox::new();
    let check = sb.script("failing-check", "exit 1");
    sb.config(&format!(
        r#"
[service.a]
command = ["/bin/sleep", "3600"]
restart_delay = "10ms"
crash_loop = {{ restarts = 2, window = "1m" }}
on_crash_loop = "stop"
stop_timeout = "2s"
health = {{ command = ["{check}"], interval = "100ms", timeout = "1s", failures = 2, start_delay = "300ms" }}
"#
    ));
    let mut w = {
        sb.start();
        sb.watch()
    };
    let e = w.until(&sb, |e| e["event"] == "health" && e["to"] == "unhealthy");
    assert_eq!(e["service"], "a");
    assert_eq!(
        e["reason"],
        "health: 2 failures: check command exited with code 1"
    );
    let st = sb.wait_state("a", "failed");
    let reason = st["reason"].as_str().unwrap_or("");
    assert!(
        reason.starts_with("crash loop: 2 restarts within")
            && reason.contains("health: 2 failures: check command exited with code 1"),
        "{st}"
    );
    assert_eq!(st["restarts"], 2, "{st}");
    // Nothing runs to be healthy or not (issue 27): the failures stay told.
    assert_eq!(st["health"], Value::Null, "{st}");
    assert!(st["unhealthy_since_ms"].as_u64().is_some(), "{st}");
    // supctl's table has a HEALTH column (a service with a check), its watch a health line.
    let out = sb.supctl(&["status"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines();
    assert!(lines.next().unwrap_or("").contains("HEALTH"), "{text}");
    assert!(text.contains("a     failed  -"), "{text}");
    assert!(text.contains("last health failure at"), "{text}");
}

#[test]
fn without_checks_supd_stays_idle_and_with_one_it_wakes_per_run_only() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let mut sb = Sandbox::new();
    sb.config(&format!(
        r#"
[service.plain]
command = ["/bin/sleep", "3600"]

[service.checked]
command = ["/bin/sleep", "3600"]
autostart = false
health = {{ tcp = "{addr}", interval = "200ms", timeout = "1s" }}
"#
    ));
    sb.start();
    sb.wait_state("plain", "running");
    let pid = sb.supd_pid();
    // Nothing is due: supd sleeps in poll. A window of one second with no wake-up at
    // all, among five (what the requests above set going may take a moment to end).
    let quiet = (0..5).any(|_| {
        let before = voluntary_switches(pid);
        std::thread::sleep(Duration::from_secs(1));
        voluntary_switches(pid) == before
    });
    assert!(quiet, "an idle supd kept waking up");

    sb.ok(json!({"cmd": "start", "service": "checked"}));
    let mut w = sb.watch();
    if sb.status("checked")["health"] != "healthy" {
        w.until(&sb, |e| e["event"] == "health" && e["to"] == "healthy");
    }
    drop(w);
    std::thread::sleep(Duration::from_millis(300));
    let before = voluntary_switches(pid);
    std::thread::sleep(Duration::from_secs(2));
    let woke = voluntary_switches(pid) - before;
    // About ten runs: each is one wake-up when due and one when its connect is done.
    assert!((5..=25).contains(&woke), "{woke} wake-ups for ten runs");
    drop(listener);
}

#[test]
fn watchdog_trigger_is_a_failure_at_once_and_the_service_is_restarted() {
    let mut sb = Sandbox::new();
    let py = sb.file(
        "trigger.py",
        "#!/usr/bin/python3\nimport os, socket, time\n\
         socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(b\"WATCHDOG=trigger\", os.environ[\"NOTIFY_SOCKET\"])\n\
         time.sleep(3600)\n",
    );
    sb.config(&format!(
        r#"
[service.a]
command = ["{py}"]
watchdog = "1h"
restart_delay = "10ms"
"#
    ));
    let mut w = {
        sb.start();
        sb.watch()
    };
    let e = w.until(&sb, |e| e["event"] == "health" && e["to"] == "unhealthy");
    assert_eq!(e["reason"], "watchdog: WATCHDOG=trigger");
    w.until(&sb, |e| e["event"] == "state" && e["to"] == "stopping");
    let e = w.until(&sb, |e| e["event"] == "state" && e["to"] == "backoff");
    assert!(
        e["reason"]
            .as_str()
            .unwrap_or("")
            .starts_with("watchdog: WATCHDOG=trigger"),
        "{e}"
    );
}

#[test]
fn a_check_command_runs_as_the_service_user_in_its_cwd_and_env() {
    if !is_root() {
        eprintln!("skipped: needs root to run a service as another user");
        return;
    }
    let mut sb = Sandbox::new();
    let work = sb.path("work");
    std::fs::create_dir(&work).expect("mkdir");
    let check = sb.script(
        "as-user-check",
        &format!(
            "[ \"$(id -un)\" = nobody ] && [ \"$(pwd)\" = {} ] && [ \"$MODE\" = checked ] && [ \"$SUP_SERVICE\" = a ]",
            work.display()
        ),
    );
    sb.config(&format!(
        r#"
[service.a]
command = ["/bin/sleep", "3600"]
user = "nobody"
cwd = "{}"
env = {{ MODE = "checked" }}
health = {{ command = ["{check}"], interval = "100ms", timeout = "2s", failures = 1 }}
"#,
        work.display()
    ));
    let mut w = {
        sb.start();
        sb.watch()
    };
    if sb.status("a")["health"] != "healthy" {
        let e = w.until(&sb, |e| e["event"] == "health");
        assert_eq!(e["to"], "healthy", "{e}");
    }
}

/// A check that hangs when supd is killed dies with supd (what it started is ended by
/// the next supd from its record: health_faults.rs).
#[test]
fn a_hung_check_dies_with_a_killed_supd() {
    let mut sb = Sandbox::new();
    let mark = format!("{}", sb.tag + 2_000_000);
    let check = sb.script("hang-check", &format!("exec sleep {mark}"));
    sb.config(&format!(
        r#"
[service.a]
command = ["/bin/sleep", "3600"]
health = {{ command = ["{check}"], interval = "1h", timeout = "1h" }}
"#
    ));
    sb.start();
    wait_present(&["sleep", &mark], "the check never ran");
    sb.stop_supd(nix::sys::signal::Signal::SIGKILL);
    wait_gone(&["sleep", &mark], "the check outlived supd");
}

/// A watchdog longer than the probation: a version that never pings is not committed when
/// the probation's time is up, but held until its watchdog fails it, then rolled back.
#[test]
fn a_version_that_never_pings_is_not_committed_before_its_watchdog_tells() {
    let mut sb = Sandbox::new();
    let py = sb.file("wd-agent.py", WATCHDOG_AGENT);
    agent(&sb, "watchdog = \"4s\"");
    sb.start();
    let env_file = sb.path("wd-env");
    sb.install_version("1.0.0", &format!("exec {py} ping {}", env_file.display()));
    sb.upgrade_wait("1.0.0", true);
    sb.install_version("1.1.0", "exec /bin/sleep 3600");
    sb.upgrade_wait("1.1.0", false);
    assert_rolled_back(&sb, "1.1.0", "1.0.0", "watchdog: no WATCHDOG=1 within 4s");
}
