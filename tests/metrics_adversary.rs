//! `[supd] metrics_file` under faults (issue 28): its directory replaced by a file while
//! supd runs, and the end of a restart storm, after which an idle supd must not wake
//! for the file.

mod common;
use common::metrics_file::{assert_idle_past, stamp, wait_text};
use common::*;
use std::time::Duration;

/// The directory of `metrics_file` is replaced by a plain file while supd runs: supd
/// goes on serving, says so once however many writes fail, and writes the file again
/// once the directory is back.
#[test]
fn metrics_file_whose_directory_goes_away_is_written_again_when_it_comes_back() {
    let mut sb = Sandbox::new();
    std::fs::create_dir(sb.path("m")).expect("mkdir");
    sb.config_with(
        "metrics_file = \"m/sup.prom\"",
        "[service.a]\ncommand = [\"/bin/sleep\", \"3600\"]\n\
         [service.b]\ncommand = [\"/bin/sleep\", \"3600\"]\nautostart = false\n",
    );
    sb.start();
    let file = sb.path("m/sup.prom");
    wait_text(
        &file,
        "sup_service_state{service=\"a\",state=\"running\"} 1",
        DEADLINE,
    );
    std::fs::remove_dir_all(sb.path("m")).expect("rm m");
    std::fs::write(sb.path("m"), "in the way\n").expect("a file in the way");
    // Changes while the file cannot be written: b started and stopped, twice.
    for _ in 0..2 {
        assert!(sb.supctl(&["start", "b"]).status.success());
        assert!(sb.supctl(&["stop", "b"]).status.success());
    }
    // The first write after them fails (10 s after the last write), and is said.
    files::wait_file(&sb.path("supd.stderr"), |t| {
        t.contains("cannot write metrics_file")
    });
    assert_eq!(sb.status("a")["state"], "running");
    std::fs::remove_file(sb.path("m")).expect("rm the file");
    std::fs::create_dir(sb.path("m")).expect("mkdir again");
    assert!(sb.supctl(&["start", "b"]).status.success());
    // The retry comes at most 20 s after the failure.
    wait_text(
        &file,
        "sup_service_state{service=\"b\",state=\"running\"} 1",
        Duration::from_secs(45),
    );
    // Said just after the rename the test saw.
    files::wait_file(&sb.path("supd.stderr"), |t| t.contains("written again"));
    let said = sb.supd_log().matches("cannot write metrics_file").count();
    assert_eq!(said, 1, "{}", sb.supd_log());
}

/// A restart storm (a service that fails at once, restarted at once until the crash
/// loop rule stops it): once the file says how it ended, an idle supd does not wake.
#[test]
fn after_a_restart_storm_an_idle_supd_does_not_wake_for_metrics_file() {
    let mut sb = Sandbox::new();
    sb.config_with(
        "metrics_file = \"sup.prom\"",
        "[service.storm]\ncommand = [\"/bin/false\"]\nrestart_delay = \"0s\"\n\
         crash_loop = { restarts = 20, window = \"1m\" }\non_crash_loop = \"stop\"\n",
    );
    sb.start();
    let file = sb.path("sup.prom");
    let st = sb.wait_state("storm", "failed");
    assert!(
        st["restarts_total"].as_u64().is_some_and(|n| n >= 20),
        "{st}"
    );
    let text = wait_text(
        &file,
        "sup_service_state{service=\"storm\",state=\"failed\"} 1",
        Duration::from_secs(25),
    );
    assert!(
        text.contains("sup_supd_service_restarts_total 20"),
        "{text}"
    );
    let last = stamp(&file).expect("the file");
    assert_idle_past(&sb, &file, last);
}

/// `metrics_file` moved by a reload within node_exporter's textfile directory, then
/// taken away: the file supd wrote before goes each time. Left, it would say stale
/// values forever, and beside the new one the same series twice, which fails the
/// textfile collector.
#[test]
fn metrics_file_moved_or_taken_away_by_reload_leaves_no_stale_file() {
    let mut sb = Sandbox::new();
    let services = "[service.a]\ncommand = [\"/bin/sleep\", \"3600\"]\n";
    sb.config_with("metrics_file = \"tf/one.prom\"", services);
    std::fs::create_dir(sb.path("tf")).expect("mkdir");
    sb.start();
    let one = sb.path("tf/one.prom");
    let two = sb.path("tf/two.prom");
    let running = "sup_service_state{service=\"a\",state=\"running\"} 1";
    wait_text(&one, running, Duration::from_secs(25));
    sb.config_with("metrics_file = \"tf/two.prom\"", services);
    let a = sb.request(serde_json::json!({"cmd": "reload"}));
    assert_eq!(a["ok"], true, "{a}");
    wait_text(&two, running, Duration::from_secs(25));
    assert!(
        !one.exists(),
        "{} is left beside {}",
        one.display(),
        two.display()
    );
    sb.config(services);
    let a = sb.request(serde_json::json!({"cmd": "reload"}));
    assert_eq!(a["ok"], true, "{a}");
    files::wait_gone(&two);
}
