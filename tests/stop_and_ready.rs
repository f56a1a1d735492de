//! Stopping a service's whole process group, escalation to SIGKILL, and readiness
//! (`notify`, `fd:N`, `exited`) ordering `after` services. Who may say READY=1: notify.rs.

mod common;
use common::*;
use serde_json::json;

#[test]
fn stop_ends_the_services_grandchildren() {
    let mut sb = Sandbox::new();
    let gc = sb.path("grandchild.pid");
    let script = sb.script(
        "parent.sh",
        &format!(
            "/bin/sleep {tag} &\necho $! > {gc}.tmp\nmv {gc}.tmp {gc}\necho >&3\nwait",
            tag = sb.tag,
            gc = gc.display()
        ),
    );
    sb.config(&format!(
        "[service.tree]\ncommand = [\"{script}\"]\nready = \"fd:3\"\nstop_timeout = \"5s\"\n"
    ));
    sb.start();
    sb.wait_state("tree", "running");
    let pid: i32 = std::fs::read_to_string(&gc)
        .expect("grandchild pid")
        .trim()
        .parse()
        .expect("pid");
    assert!(alive(pid));
    let fd = sup::sys::pidfd_open(pid).expect("pidfd of the grandchild");
    let st = sb.ok(json!({"cmd": "stop", "service": "tree"}));
    assert_eq!(
        st["state"], "stopped",
        "stop answers once the service is down: {st}"
    );
    drop(fd);
    assert!(
        wait_exit(pid, DEADLINE).is_some(),
        "grandchild {pid} survived the stop"
    );
    assert!(processes_with_cmdline(&["/bin/sleep", &sb.tag.to_string()]).is_empty());
}

#[test]
fn stop_escalates_to_sigkill_when_term_is_ignored() {
    let mut sb = Sandbox::new();
    let script = sb.script(
        "stubborn.sh",
        "trap '' TERM\necho >&3\nwhile :; do /bin/sleep 1; done",
    );
    sb.config(&format!("[service.stubborn]\ncommand = [\"{script}\"]\nready = \"fd:3\"\nstop_timeout = \"300ms\"\n"));
    sb.start();
    sb.wait_state("stubborn", "running");
    let started = std::time::Instant::now();
    let st = sb.ok(json!({"cmd": "stop", "service": "stubborn"}));
    let took = started.elapsed();
    assert_eq!(st["state"], "stopped");
    assert_eq!(st["last_exit"], json!({"signal": "KILL"}), "{st}");
    assert!(
        took >= std::time::Duration::from_millis(300),
        "killed after {took:?}, before stop_timeout"
    );
}

#[test]
fn stop_signal_is_followed_by_cont_for_a_stopped_group() {
    let mut sb = Sandbox::new();
    sb.config("[service.frozen]\ncommand = [\"/bin/sleep\", \"3600\"]\nstop_signal = \"INT\"\nstop_timeout = \"5s\"\n");
    sb.start();
    let st = sb.wait_state("frozen", "running");
    let pid = st["pid"].as_i64().expect("pid") as i32;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGSTOP,
    )
    .expect("SIGSTOP");
    let st = sb.ok(json!({"cmd": "stop", "service": "frozen"}));
    assert_eq!(
        st["last_exit"],
        json!({"signal": "INT"}),
        "a stopped process gets stop_signal and CONT: {st}"
    );
}

#[test]
fn after_waits_for_notify_readiness() {
    let mut sb = Sandbox::new();
    let marker = sb.path("db-ready");
    let db = sb.file(
        "db.py",
        &format!(
            "#!/usr/bin/env python3\nimport os, socket, time\n\
             s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n\
             p = os.environ['NOTIFY_SOCKET']\n\
             s.sendto(b'STATUS=warming up', p)\n\
             time.sleep(0.3)\n\
             open('{}', 'w').close()\n\
             s.sendto(b'READY=1\\nSTATUS=serving', p)\n\
             time.sleep(3600)\n",
            marker.display()
        ),
    );
    let web = sb.script(
        "web.sh",
        &format!(
            "test -e {} || exit 9\nexec /bin/sleep 3600",
            marker.display()
        ),
    );
    sb.config(&format!(
        "[service.db]\ncommand = [\"{db}\"]\nready = \"notify\"\nready_timeout = \"10s\"\n\n\
         [service.web]\ncommand = [\"{web}\"]\nafter = [\"db\"]\nrestart = \"never\"\n"
    ));
    sb.start();
    // web exits 9 (and is not restarted) if it starts before db's READY=1.
    let web_st = sb.wait_state("web", "running");
    assert_eq!(
        (web_st["restarts"].clone(), web_st["last_exit"].clone()),
        (json!(0), json!(null)),
        "{web_st}"
    );
    let db_st = sb.status("db");
    assert_eq!(db_st["state"], "running");
    assert_eq!(db_st["status"], "serving", "STATUS= is shown: {db_st}");
}

#[test]
fn ready_timeout_counts_as_a_failed_start() {
    let mut sb = Sandbox::new();
    sb.config(
        "[service.slow]\ncommand = [\"/bin/sleep\", \"3600\"]\nready = \"fd:3\"\nready_timeout = \"200ms\"\nstop_timeout = \"1s\"\n\
         restart_delay = \"10ms\"\ncrash_loop = { restarts = 1, window = \"1m\" }\non_crash_loop = \"stop\"\n",
    );
    sb.start();
    let st = sb.wait_state("slow", "failed");
    assert!(
        st["reason"]
            .as_str()
            .unwrap_or("")
            .contains("not ready within 200ms"),
        "{st}"
    );
    assert_eq!(st["restarts"], 1);
}

#[test]
fn one_shot_tasks_order_the_services_after_them() {
    let mut sb = Sandbox::new();
    let mark = sb.path("mounted");
    let task = sb.script(
        "mount.sh",
        &format!("/bin/sleep 0.2\ntouch {}", mark.display()),
    );
    let svc = sb.script(
        "svc.sh",
        &format!("test -e {} || exit 9\nexec /bin/sleep 3600", mark.display()),
    );
    sb.config(&format!(
        "[service.mount]\ncommand = [\"{task}\"]\nready = \"exited\"\nrestart = \"never\"\n\n\
         [service.svc]\ncommand = [\"{svc}\"]\nafter = [\"mount\"]\nrestart = \"never\"\n"
    ));
    sb.start();
    let st = sb.wait_state("svc", "running");
    assert_eq!(st["restarts"], 0);
    assert_eq!(sb.status("mount")["state"], "exited");
}
