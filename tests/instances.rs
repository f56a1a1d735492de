//! `instances = N` (issue 12): one table, N services of their own, each with its own
//! name, index, log file, pid and restarts; supctl addresses them all by the table's
//! name and one by its own.

mod common;
use common::files::wait_file;
use common::*;
use serde_json::{json, Value};

/// A worker that says who it is, then waits.
fn worker(sb: &Sandbox) -> String {
    sb.script(
        "worker",
        "echo \"instance $SUP_INSTANCE of $SUP_SERVICE\"\nexec sleep 3600",
    )
}

fn config(sb: &Sandbox, n: u32) {
    let w = worker(sb);
    sb.config(&format!(
        "[service.web]\ncommand = [\"{w}\"]\ninstances = {n}\nrestart_delay = \"0s\"\n"
    ));
}

fn pid(st: &Value) -> i32 {
    st["pid"]
        .as_i64()
        .unwrap_or_else(|| panic!("no pid in {st}")) as i32
}

/// The statuses `status web` lists, by name.
fn statuses(sb: &Sandbox, name: &str) -> Vec<Value> {
    sb.ok(json!({"cmd": "status", "service": name}))["services"]
        .as_array()
        .expect("a list")
        .clone()
}

fn names(list: &[Value]) -> Vec<&str> {
    list.iter()
        .map(|s| s["name"].as_str().unwrap_or("?"))
        .collect()
}

/// Starts supd on `web` with three instances, each running; their pids.
fn three(sb: &mut Sandbox) -> Vec<i32> {
    config(sb, 3);
    sb.start();
    (0..3)
        .map(|i| pid(&sb.wait_state(&format!("web@{i}"), "running")))
        .collect()
}

#[test]
fn each_instance_runs_with_its_index_its_name_and_its_own_log() {
    let mut sb = Sandbox::new();
    let pids = three(&mut sb);
    for (i, pid) in pids.iter().enumerate() {
        let environ = std::fs::read(format!("/proc/{pid}/environ")).expect("environ");
        let environ = String::from_utf8_lossy(&environ);
        let vars: Vec<&str> = environ.split('\0').collect();
        assert!(
            vars.contains(&format!("SUP_INSTANCE={i}").as_str()),
            "{vars:?}"
        );
        assert!(
            vars.contains(&format!("SUP_SERVICE=web@{i}").as_str()),
            "{vars:?}"
        );
        let log = sb.path(&format!("log/web@{i}.log"));
        let text = wait_file(&log, |t| t.contains("instance"));
        assert!(
            text.contains(&format!("instance {i} of web@{i}"))
                && text
                    .lines()
                    .filter(|l| !l.contains(" --- started: "))
                    .count()
                    == 1,
            "web@{i}'s log holds its own line only:\n{text}"
        );
    }
    let mut unique = pids.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), 3, "three processes: {pids:?}");
    assert!(
        !sb.path("log/web.log").exists(),
        "no service named web runs"
    );
}

#[test]
fn killing_one_instance_restarts_that_one_only() {
    let mut sb = Sandbox::new();
    let pids = three(&mut sb);
    let mut w = sb.watch();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pids[1]),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill web@1");
    let back = w.until(&sb, |e| {
        e["event"] == "state"
            && e["service"] == "web@1"
            && e["to"] == "running"
            && e["pid"] != pids[1]
    });
    assert_ne!(back["pid"], pids[1]);
    let now = statuses(&sb, "web");
    assert_eq!(names(&now), ["web@0", "web@1", "web@2"]);
    assert_eq!(pid(&now[0]), pids[0]);
    assert_eq!(pid(&now[2]), pids[2]);
    assert_eq!(now[1]["restarts"], 1, "{:?}", now[1]);
    assert_eq!(now[0]["restarts"], 0);
    assert_eq!(now[2]["restarts"], 0);
    assert!(
        w.seen
            .iter()
            .all(|e| e["service"] == "web@1" || e["event"] != "state"),
        "only web@1 changed state: {:#?}",
        w.seen
    );
}

#[test]
fn a_reload_from_three_to_two_stops_the_last_instance_only() {
    let mut sb = Sandbox::new();
    let pids = three(&mut sb);
    config(&sb, 2);
    let answer = sb.ok(json!({"cmd": "reload"}));
    assert_eq!(answer["removed"], json!(["web@2"]), "{answer}");
    assert_eq!(answer["changed"], json!([]), "{answer}");
    assert_eq!(answer["added"], json!([]), "{answer}");
    assert!(
        wait_exit(pids[2], DEADLINE).is_some(),
        "web@2 still runs\n{}",
        sb.supd_log()
    );
    let now = statuses(&sb, "web");
    assert_eq!(names(&now), ["web@0", "web@1"]);
    assert_eq!([pid(&now[0]), pid(&now[1])], [pids[0], pids[1]]);
    assert!(alive(pids[0]) && alive(pids[1]));

    // And up again: web@2 is a new service, the others untouched.
    config(&sb, 3);
    let answer = sb.ok(json!({"cmd": "reload"}));
    assert_eq!(answer["added"], json!(["web@2"]), "{answer}");
    assert_eq!(answer["changed"], json!([]), "{answer}");
    sb.wait_state("web@2", "running");
    let now = statuses(&sb, "web");
    assert_eq!([pid(&now[0]), pid(&now[1])], [pids[0], pids[1]]);
}

#[test]
fn a_reload_from_one_to_three_replaces_the_plain_service_by_the_instances() {
    let mut sb = Sandbox::new();
    config(&sb, 1);
    sb.start();
    let plain = pid(&sb.wait_state("web", "running"));
    assert!(sb.status("web")["name"] == "web");
    config(&sb, 3);
    let answer = sb.ok(json!({"cmd": "reload"}));
    assert_eq!(answer["removed"], json!(["web"]), "{answer}");
    assert_eq!(
        answer["added"],
        json!(["web@0", "web@1", "web@2"]),
        "{answer}"
    );
    assert!(wait_exit(plain, DEADLINE).is_some(), "web still runs");
    for i in 0..3 {
        sb.wait_state(&format!("web@{i}"), "running");
    }
}

/// supctl's exit status and its output.
fn supctl(sb: &Sandbox, args: &[&str]) -> (Option<i32>, String, String) {
    let out = sb.supctl(args);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn supctl_addresses_every_instance_by_the_tables_name_and_one_by_its_own() {
    let mut sb = Sandbox::new();
    let pids = three(&mut sb);

    let (code, out, err) = supctl(&sb, &["status", "web"]);
    assert_eq!(code, Some(0), "{out}{err}");
    for i in 0..3 {
        assert!(out.contains(&format!("web@{i}")), "{out}");
    }
    assert_eq!(
        out.lines().filter(|l| l.contains("web@")).count(),
        3,
        "{out}"
    );

    // One instance by its name.
    let (code, out, err) = supctl(&sb, &["stop", "web@1"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(wait_exit(pids[1], DEADLINE).is_some());
    assert!(alive(pids[0]) && alive(pids[2]), "only web@1 stopped");
    let (code, out, _) = supctl(&sb, &["status", "web"]);
    assert_eq!(code, Some(3), "an instance is down: {out}");

    // All of them by the table's name: stop answers once each is gone.
    let (code, out, err) = supctl(&sb, &["stop", "web"]);
    assert_eq!(code, Some(0), "{out}{err}");
    for p in &pids {
        assert!(!alive(*p), "pid {p} outlived stop web");
    }
    assert!(statuses(&sb, "web").iter().all(|s| s["state"] == "stopped"));

    let (code, out, err) = supctl(&sb, &["start", "web"]);
    assert_eq!(code, Some(0), "{out}{err}");
    let started: Vec<i32> = (0..3)
        .map(|i| pid(&sb.wait_state(&format!("web@{i}"), "running")))
        .collect();

    let (code, out, err) = supctl(&sb, &["restart", "web"]);
    assert_eq!(code, Some(0), "{out}{err}");
    let restarted: Vec<i32> = (0..3)
        .map(|i| pid(&sb.wait_state(&format!("web@{i}"), "running")))
        .collect();
    for (a, b) in started.iter().zip(&restarted) {
        assert_ne!(a, b, "every instance restarted: {started:?} {restarted:?}");
        assert!(!alive(*a));
    }

    // What needs one service says so.
    let (code, _, err) = supctl(&sb, &["signal", "web", "HUP"]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("'web' runs as instances: name one of them, such as web@0"),
        "{err}"
    );
}

#[test]
fn an_upgrade_restarts_every_instance_and_probation_watches_them_all() {
    let mut sb = Sandbox::new();
    sb.config(
        "[service.agent]\ntool = \"agent\"\ncommand = [\"bin/agent\"]\ninstances = 3\n\
         restart_delay = \"10ms\"\ncrash_loop = { restarts = 3, window = \"1m\" }\n\
         cooldown = \"1h\"\nprobation = \"1s\"\nstop_timeout = \"2s\"\n",
    );
    sb.start();
    sb.install_version("1.0.0", "exec /bin/sleep 3600");
    sb.upgrade_wait("1.0.0", true);
    let at = |sb: &Sandbox| -> Vec<(i32, Value)> {
        (0..3)
            .map(|i| {
                let st = sb.wait_state(&format!("agent@{i}"), "running");
                (pid(&st), st["version"].clone())
            })
            .collect()
    };
    let before = at(&sb);

    sb.install_version("1.1.0", "exec /bin/sleep 3600");
    sb.upgrade_wait("1.1.0", true);
    let after = at(&sb);
    for ((old, _), (new, version)) in before.iter().zip(&after) {
        assert_ne!(old, new, "every instance restarted on the new version");
        assert_eq!(version, "1.1.0");
    }

    // One instance of three crash-loops on 2.0.0: the upgrade is rolled back.
    sb.install_version(
        "2.0.0",
        "[ \"$SUP_INSTANCE\" = 2 ] && exit 3\nexec /bin/sleep 3600",
    );
    let out = sb.supctl(&["upgrade", "agent", "2.0.0", "--wait"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("rolled back to 1.1.0"), "{err}");
    for (_, version) in at(&sb) {
        assert_eq!(version, "1.1.0");
    }
}

#[test]
fn status_lists_instances_by_index() {
    let mut sb = Sandbox::new();
    config(&sb, 12);
    sb.start();
    let expected: Vec<String> = (0..12).map(|i| format!("web@{i}")).collect();
    let all = sb.ok(json!({"cmd": "status"}))["services"]
        .as_array()
        .expect("a list")
        .clone();
    assert_eq!(names(&all), expected, "web@2 before web@10");
    assert_eq!(names(&statuses(&sb, "web")), expected);
}

#[test]
fn after_an_instanced_table_waits_for_every_instance_to_be_ready() {
    let mut sb = Sandbox::new();
    let armed = sb.path("armed");
    // web@0 is ready at once; web@1 once it gets USR1 (its trap set first).
    let web = sb.script(
        "web",
        &format!(
            "if [ \"$SUP_INSTANCE\" = 1 ]; then\n\
             trap 'echo ready >&3' USR1\n\
             echo armed > {armed}\n\
             /bin/sleep 3600 & wait $!\n\
             else echo ready >&3; fi\n\
             exec /bin/sleep 3600",
            armed = armed.display()
        ),
    );
    sb.config(&format!(
        "[service.web]\ncommand = [\"{web}\"]\ninstances = 2\nready = \"fd:3\"\n\
         [service.front]\ncommand = [\"/bin/sleep\", \"3600\"]\nafter = [\"web\"]\n"
    ));
    sb.start();
    sb.wait_state("web@0", "running");
    wait_file(&armed, |t| t.contains("armed"));
    assert_eq!(sb.status("web@1")["state"], "starting");
    assert_eq!(
        sb.status("front")["state"],
        "stopped",
        "front waits for web@1 too"
    );
    let (code, _, err) = supctl(&sb, &["signal", "web@1", "USR1"]);
    assert_eq!(code, Some(0), "{err}");
    sb.wait_state("web@1", "running");
    sb.wait_state("front", "running");
}

#[test]
fn every_instance_of_a_leader_only_table_runs_while_the_lease_is_held() {
    let mut sb = Sandbox::new();
    let w = worker(&sb);
    sb.config(&format!(
        "[lease.engine]\n[service.engine]\ncommand = [\"{w}\"]\ninstances = 2\n\
         leader_only = \"engine\"\n"
    ));
    sb.start();
    for st in statuses(&sb, "engine") {
        assert_eq!(st["state"], "stopped", "{st}");
    }
    sb.ok(json!({"cmd": "lease-grant", "lease": "engine", "holder": "n1", "term": 1, "valid_for": "1h"}));
    let pids: Vec<i32> = (0..2)
        .map(|i| pid(&sb.wait_state(&format!("engine@{i}"), "running")))
        .collect();
    sb.ok(json!({"cmd": "lease-release", "lease": "engine"}));
    for p in pids {
        assert!(!alive(p), "pid {p} outlived the release");
    }
}
