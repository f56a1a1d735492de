//! A broken file never takes the others down (issue 24, items 1 and 6b): at start the
//! services of the files that load run, a broken file's last good copy (kept in
//! state_dir) stands in for it, a service of a broken file left running by a killed
//! supd is kept, `status` names each broken file, a reload with a broken file changes
//! nothing, and one bad key of `[supd]` keeps the others.

mod common;
use common::*;
use nix::sys::signal::Signal;
use serde_json::{json, Value};
use std::fs;

const INCLUDE: &str = "include = [\"services.d/*.toml\"]";

fn drop_in(sb: &Sandbox, name: &str, text: &str) {
    fs::create_dir_all(sb.path("services.d")).expect("mkdir services.d");
    fs::write(sb.path(&format!("services.d/{name}")), text).expect("write drop-in");
}

fn sleeper(name: &str, tag: u64) -> String {
    format!("[service.{name}]\ncommand = [\"/bin/sleep\", \"{tag}\"]\nstop_timeout = \"2s\"\n")
}

/// Starts supd armed to panic on `hello` (and so re-execute itself with its state,
/// the way `reexec` does, past the new image's `--check`) when told to.
fn start_panicky(sb: &mut Sandbox) {
    let mut cmd = std::process::Command::new(SUPD);
    cmd.env("SUP_FAILPOINT", "panic-on-hello");
    sb.start_with(cmd, &["-c"]);
}

/// The re-execution with its state, through a panic.
fn reexec_by_panic(sb: &Sandbox) {
    fs::write(sb.path("state/panic-now"), "").expect("arm the panic");
    let mut c = sb.client();
    c.send_raw(b"{\"cmd\":\"hello\"}\n");
    assert!(c.read().is_none(), "the panicking image answers nothing");
    assert!(sb.supd_log().contains("supd panicked; re-executing"));
}

fn pid_of(v: &Value) -> i32 {
    v["pid"].as_i64().expect("a pid") as i32
}

/// The `broken_files` entry of `file` (a name under the sandbox).
fn broken<'a>(st: &'a Value, sb: &Sandbox, file: &str) -> &'a Value {
    let path = sb.path(file).to_string_lossy().into_owned();
    let list = st["broken_files"]
        .as_array()
        .expect("broken_files in status");
    list.iter()
        .find(|b| b["file"] == path.as_str())
        .unwrap_or_else(|| panic!("{file} is not among the broken files: {st}"))
}

#[test]
fn a_broken_drop_in_costs_only_its_own_services_at_a_fresh_start() {
    let mut sb = Sandbox::new();
    sb.config_with(INCLUDE, "");
    drop_in(
        &sb,
        "good.toml",
        &(sleeper("g1", sb.tag) + &sleeper("g2", sb.tag)),
    );
    drop_in(
        &sb,
        "bad.toml",
        "[service.b]\ncommand = [\"/bin/sleep\", \"1\"\n",
    );
    sb.start();
    sb.wait_state("g1", "running");
    sb.wait_state("g2", "running");
    let st = sb.ok(json!({"cmd": "status"}));
    assert!(
        st["services"].as_array().expect("services").len() == 2,
        "nothing of bad.toml runs: {st}"
    );
    let b = broken(&st, &sb, "services.d/bad.toml");
    assert_eq!(b["using"], "nothing", "{st}");
    assert!(
        b["error"].as_str().is_some_and(|e| e.contains("bad.toml:")),
        "{st}"
    );
    let errs = st["config_errors"].to_string();
    assert!(errs.contains("services.d/bad.toml:"), "{errs}");
    assert_eq!(st["broken_files"].as_array().map(Vec::len), Some(1), "{st}");
    // supctl's table names the broken file too.
    let out = sb.supctl(&["status"]);
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("bad.toml") && text.contains("nothing of it runs"),
        "{text}"
    );

    // A reload with the file still broken changes nothing, even with good.toml edited.
    drop_in(&sb, "good.toml", &sleeper("g1", sb.second_tag()));
    let g2 = pid_of(&sb.status("g2"));
    let a = sb.request(json!({"cmd": "reload"}));
    assert_eq!(a["ok"], false, "{a}");
    assert!(
        a["error"]["message"].to_string().contains("bad.toml"),
        "{a}"
    );
    assert_eq!(pid_of(&sb.status("g2")), g2, "g2 untouched");
    let st = sb.ok(json!({"cmd": "status"}));
    assert_eq!(broken(&st, &sb, "services.d/bad.toml")["using"], "nothing");

    // Mended: the reload adds b, and nothing is broken any more.
    drop_in(&sb, "bad.toml", &sleeper("b", sb.tag));
    let r = sb.ok(json!({"cmd": "reload"}));
    assert_eq!(r["added"], json!(["b"]), "{r}");
    sb.wait_state("b", "running");
    let st = sb.ok(json!({"cmd": "status"}));
    assert_eq!(st["broken_files"], json!([]), "{st}");
    assert_eq!(st["config_errors"], json!([]), "{st}");
}

#[test]
fn a_broken_file_runs_from_its_last_good_copy_sup_toml_included() {
    let mut sb = Sandbox::new();
    sb.config_with(INCLUDE, &sleeper("main", sb.tag));
    drop_in(&sb, "good.toml", &sleeper("g", sb.tag));
    drop_in(&sb, "bad.toml", &sleeper("b", sb.tag));
    sb.start();
    for s in ["main", "g", "b"] {
        sb.wait_state(s, "running");
    }
    sb.stop_supd(Signal::SIGTERM);

    // A typo in a drop-in and one in sup.toml itself, then a reboot.
    drop_in(
        &sb,
        "bad.toml",
        "[service.b]\ncommand = [\"/bin/sleep\", \"1\"]\nrestart = \"maybe\"\n",
    );
    sb.config_with(&format!("{INCLUDE}\nbogus = 1"), &sleeper("main", sb.tag));
    start_panicky(&mut sb);
    for s in ["main", "g", "b"] {
        sb.wait_state(s, "running");
    }
    let st = sb.ok(json!({"cmd": "status"}));
    assert_eq!(
        broken(&st, &sb, "services.d/bad.toml")["using"],
        "last good copy"
    );
    assert_eq!(broken(&st, &sb, "sup.toml")["using"], "last good copy");
    let errs = st["config_errors"].to_string();
    assert!(errs.contains("bad.toml:3:11: service.b.restart"), "{errs}");
    assert!(errs.contains("sup.toml:8:1: supd.bogus"), "{errs}");

    // The broken state survives a re-execution of supd.
    reexec_by_panic(&sb);
    let st = sb.ok(json!({"cmd": "status"}));
    assert_eq!(
        broken(&st, &sb, "services.d/bad.toml")["using"],
        "last good copy"
    );
    assert!(
        st["config_errors"].to_string().contains("bad.toml:3:11"),
        "{st}"
    );
    sb.wait_state("b", "running");
}

#[test]
fn after_a_kill_9_a_service_of_a_broken_file_is_kept_or_run_from_its_copy() {
    let mut sb = Sandbox::new();
    sb.config_with(INCLUDE, "");
    drop_in(&sb, "good.toml", &sleeper("g", sb.tag));
    drop_in(&sb, "copied.toml", &sleeper("c", sb.tag));
    drop_in(&sb, "lost.toml", &sleeper("l", sb.tag));
    sb.start();
    let g = pid_of(&sb.wait_state("g", "running"));
    let l = pid_of(&sb.wait_state("l", "running"));
    sb.wait_state("c", "running");
    sb.stop_supd(Signal::SIGKILL);

    // Both files broken; lost.toml's copy gone too, as if it never loaded (a supd of
    // before the copies).
    drop_in(&sb, "copied.toml", "[service.c\n");
    drop_in(&sb, "lost.toml", "[service.l\n");
    let copies = sb.path("state/last-good");
    let mut removed = 0;
    for e in fs::read_dir(&copies).expect("the copies are kept in state_dir/last-good") {
        let p = e.expect("entry").path();
        if p.to_string_lossy().contains("lost.toml") {
            fs::remove_file(&p).expect("remove the copy");
            removed += 1;
        }
    }
    assert_eq!(removed, 1, "one copy of lost.toml");
    start_panicky(&mut sb);
    // g as any service after a kill -9: what was left ended, then started anew.
    let g2 = pid_of(&sb.wait_state("g", "running"));
    assert!(g2 != g && !alive(g), "g ended and started again");
    // c from its copy, as one instance.
    sb.wait_state("c", "running");
    let tag = sb.tag.to_string();
    assert_eq!(
        processes_with_cmdline(&["/bin/sleep", &tag]).len(),
        3,
        "one g, one c and the kept l"
    );
    // l is kept running, never ended for its file's sake, and said.
    assert!(alive(l), "l left running\n{}", sb.supd_log());
    let st = sb.ok(json!({"cmd": "status"}));
    assert_eq!(broken(&st, &sb, "services.d/lost.toml")["using"], "nothing");
    assert_eq!(
        st["left_running"],
        json!([{"service": "l", "pid": l}]),
        "{st}"
    );
    assert!(sb
        .supd_log()
        .contains("l: a run of it left by a previous supd is kept"));
    let out = sb.supctl(&["status"]);
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(text.contains(&format!("l (pid {l})")), "{text}");
    // Kept across a re-execution of supd.
    reexec_by_panic(&sb);
    let st = sb.ok(json!({"cmd": "status"}));
    assert_eq!(
        st["left_running"],
        json!([{"service": "l", "pid": l}]),
        "{st}"
    );

    // lost.toml mended: the reload ends the kept run before l starts again, once.
    drop_in(&sb, "lost.toml", &sleeper("l", sb.tag));
    drop_in(&sb, "copied.toml", &sleeper("c", sb.tag));
    sb.ok(json!({"cmd": "reload"}));
    let l2 = pid_of(&sb.wait_state("l", "running"));
    assert!(l2 != l && !alive(l), "the kept run was ended first");
    assert_eq!(processes_with_cmdline(&["/bin/sleep", &tag]).len(), 3);
    let st = sb.ok(json!({"cmd": "status"}));
    assert_eq!(st["left_running"], json!([]), "{st}");
}

#[test]
fn a_bad_key_in_supd_keeps_the_other_keys() {
    let mut sb = Sandbox::new();
    sb.socket = sb.path("custom.sock");
    let extra = "cgroups = false\nshutdown_timeout = 5";
    let text = format!(
        "[supd]\nsocket = \"custom.sock\"\nstate_dir = \"state\"\nlog_dir = \"log\"\ntools_dir = \"tools\"\n{extra}\n\n{}",
        sleeper("s", sb.tag)
    );
    fs::write(sb.path("sup.toml"), text).expect("write config");
    sb.start();
    let st = sb.ok(json!({"cmd": "status"}));
    let errs = st["config_errors"].to_string();
    assert!(errs.contains("sup.toml:6:11: supd.cgroups"), "{errs}");
    assert!(
        errs.contains("sup.toml:7:20: supd.shutdown_timeout"),
        "{errs}"
    );
    assert_eq!(broken(&st, &sb, "sup.toml")["using"], "nothing", "{st}");
    assert!(
        sb.path("state/supd.lock").exists(),
        "the configured state_dir"
    );
    let out = sb.supctl(&["status"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("supd.cgroups"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

// see: issue 24 item 5 × item 1 — `reexec` (a package upgrade's) is not refused for a
// broken file the running supd also runs nothing of, nor for one broken since the last
// reload (its copy stands in, as at any start); a program that would run nothing of a
// file the running supd runs is refused.
#[test]
fn a_broken_file_does_not_stop_a_reexec_but_a_program_that_would_lose_one_is_refused() {
    let mut sb = Sandbox::new();
    sb.config_with(INCLUDE, "");
    drop_in(&sb, "good.toml", &sleeper("g1", sb.tag));
    drop_in(&sb, "later.toml", &sleeper("l1", sb.tag));
    drop_in(
        &sb,
        "bad.toml",
        "[service.b]\ncommand = [\"/bin/sleep\", \"1\"\n",
    );
    sb.start();
    sb.wait_state("g1", "running");
    sb.wait_state("l1", "running");
    let g1 = pid_of(&sb.status("g1"));
    // later.toml broken after it loaded (no reload since): its copy stands in.
    drop_in(&sb, "later.toml", "[service.l1\n");
    let out = sb.supctl(&["reexec"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        pid_of(&sb.status("g1")),
        g1,
        "g1 kept its pid across the reexec"
    );
    sb.wait_state("l1", "running");
    // A program that answers, but would run nothing of good.toml: refused.
    let good = sb.path("services.d/good.toml");
    let losing = sb.script(
        "losing-supd",
        &format!(
            "echo \"supd handoff 8 $2\"\necho \"broken nothing {}\"\nexit 0",
            good.display()
        ),
    );
    let out = sb.supctl(&["reexec", "--binary", &losing]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("good.toml") && err.contains("would stop"),
        "{err}"
    );
    // One that runs nothing only of what the running supd runs nothing of would be
    // taken (not exec'd here: it is a script); the real one was, above.
    assert_eq!(pid_of(&sb.status("g1")), g1);
}

/// The copy of `file` (a name under the sandbox) in state/last-good.
fn copy_of(sb: &Sandbox, file: &str) -> std::path::PathBuf {
    let name = sb
        .path(file)
        .to_string_lossy()
        .replace('%', "%25")
        .replace('/', "%2F");
    sb.path("state/last-good").join(name)
}

// Adversary: a service moved out of a file into another while the first is broken: the
// good file that defines it now runs it, not the broken file's stale copy.
#[test]
fn a_service_moved_into_a_good_file_runs_from_it_not_from_a_broken_files_copy() {
    let mut sb = Sandbox::new();
    sb.config_with(INCLUDE, "");
    drop_in(
        &sb,
        "a.toml",
        &(sleeper("x", sb.tag) + &sleeper("y", sb.tag)),
    );
    sb.start();
    sb.wait_state("x", "running");
    sb.stop_supd(Signal::SIGTERM);
    assert!(copy_of(&sb, "services.d/a.toml").exists());
    // x moves to b.toml (read after a.toml), with a new argument; a.toml is broken.
    drop_in(&sb, "a.toml", "[service.y\n");
    drop_in(
        &sb,
        "b.toml",
        &(sleeper("x", sb.second_tag()) + &sleeper("z", sb.tag)),
    );
    sb.start();
    sb.wait_state("z", "running");
    let x = sb.wait_state("x", "running");
    let tag = sb.second_tag().to_string();
    assert_eq!(
        processes_with_cmdline(&["/bin/sleep", &tag]),
        vec![pid_of(&x)],
        "x as b.toml defines it\n{}",
        sb.supd_log()
    );
    let st = sb.ok(json!({"cmd": "status"}));
    let files: Vec<&str> = (st["broken_files"].as_array().expect("broken_files").iter())
        .filter_map(|b| b["file"].as_str())
        .collect();
    assert!(
        files.iter().all(|f| !f.ends_with("b.toml")),
        "b.toml loads: it is not broken: {st}"
    );
    broken(&st, &sb, "services.d/a.toml");
}

// Adversary: a copy corrupted on disk (a power cut, a bad sector, a hand edit) is not
// run as it is: the file then has nothing standing for it, and the log says its copy
// does not load rather than that it never loaded.
#[test]
fn a_corrupt_last_good_copy_runs_nothing_and_is_said() {
    let mut sb = Sandbox::new();
    sb.config_with(INCLUDE, "");
    drop_in(&sb, "good.toml", &sleeper("g", sb.tag));
    drop_in(&sb, "bad.toml", &sleeper("b", sb.tag));
    sb.start();
    sb.wait_state("b", "running");
    sb.stop_supd(Signal::SIGTERM);
    drop_in(&sb, "bad.toml", "[service.b\n");
    let copy = copy_of(&sb, "services.d/bad.toml");
    let text = fs::read_to_string(&copy).expect("the copy");
    // Cut mid-way, in the command's array.
    fs::write(&copy, &text[..text.find('"').expect("a quote") + 3]).expect("cut the copy");
    sb.start();
    sb.wait_state("g", "running");
    let st = sb.ok(json!({"cmd": "status"}));
    assert_eq!(st["services"].as_array().map(Vec::len), Some(1), "{st}");
    assert_eq!(broken(&st, &sb, "services.d/bad.toml")["using"], "nothing");
    let log = sb.supd_log();
    assert!(
        !log.contains("never did here") && log.contains("last good copy does not load"),
        "{log}"
    );
}

/// good.toml and lost.toml run; supd is killed; lost.toml is broken and its copy gone;
/// a new supd runs good.toml and keeps lost.toml's run. The sandbox, and that run's pid.
fn kept_after_a_kill() -> (Sandbox, i32) {
    let mut sb = Sandbox::new();
    sb.config_with(INCLUDE, "");
    drop_in(&sb, "good.toml", &sleeper("g", sb.tag));
    drop_in(&sb, "lost.toml", &sleeper("l", sb.tag));
    sb.start();
    let l = pid_of(&sb.wait_state("l", "running"));
    sb.stop_supd(Signal::SIGKILL);
    drop_in(&sb, "lost.toml", "[service.l\n");
    fs::remove_file(copy_of(&sb, "services.d/lost.toml")).expect("rm copy");
    sb.start();
    sb.wait_state("g", "running");
    (sb, l)
}

/// Once lost.toml is mended and read, its service runs anew and the kept run `l` is
/// gone: two sleeps in all, never three.
fn mended_ends_the_kept_run(sb: &Sandbox, l: i32) {
    let l2 = pid_of(&sb.wait_state("l", "running"));
    assert!(
        l2 != l && !alive(l),
        "the kept run ended\n{}",
        sb.supd_log()
    );
    let tag = sb.tag.to_string();
    assert_eq!(processes_with_cmdline(&["/bin/sleep", &tag]).len(), 2);
}

// Adversary: supd killed twice while a run of a broken file's service is kept: the
// third supd, with the file mended, still ends that run before starting the service.
#[test]
fn a_kept_run_survives_two_kills_of_supd_and_is_ended_before_its_mended_service_starts() {
    let (mut sb, l) = kept_after_a_kill();
    let st = sb.ok(json!({"cmd": "status"}));
    assert_eq!(
        st["left_running"],
        json!([{"service": "l", "pid": l}]),
        "{st}"
    );
    sb.stop_supd(Signal::SIGKILL);
    // Mended, and a fresh start.
    drop_in(&sb, "lost.toml", &sleeper("l", sb.tag));
    sb.start();
    mended_ends_the_kept_run(&sb, l);
}

// Adversary: a real `supctl reexec` while a run is kept: the new image keeps it, and
// the mended file's reload ends it before its service starts, once.
#[test]
fn a_reexec_while_a_run_is_kept_hands_it_over_and_the_mend_ends_it_first() {
    let (sb, l) = kept_after_a_kill();
    sb.reexec();
    let st = sb.ok(json!({"cmd": "status"}));
    assert_eq!(
        st["left_running"],
        json!([{"service": "l", "pid": l}]),
        "{st}"
    );
    drop_in(&sb, "lost.toml", &sleeper("l", sb.tag));
    sb.ok(json!({"cmd": "reload"}));
    mended_ends_the_kept_run(&sb, l);
}

// Adversary: a drop-in deleted (not broken) while another is broken: its copy, still
// kept, does not bring its services back at the next start.
#[test]
fn a_deleted_drop_in_is_not_resurrected_from_its_copy() {
    let mut sb = Sandbox::new();
    sb.config_with(INCLUDE, "");
    drop_in(&sb, "gone.toml", &sleeper("d", sb.tag));
    drop_in(&sb, "good.toml", &sleeper("g", sb.tag));
    sb.start();
    sb.wait_state("d", "running");
    sb.stop_supd(Signal::SIGTERM);
    fs::remove_file(sb.path("services.d/gone.toml")).expect("rm");
    drop_in(&sb, "bad.toml", "[service.b\n");
    sb.start();
    sb.wait_state("g", "running");
    let st = sb.ok(json!({"cmd": "status"}));
    assert_eq!(st["services"].as_array().map(Vec::len), Some(1), "{st}");
    sb.stop_supd(Signal::SIGTERM);
    sb.start();
    let st = sb.ok(json!({"cmd": "status"}));
    assert_eq!(st["services"].as_array().map(Vec::len), Some(1), "{st}");
}
