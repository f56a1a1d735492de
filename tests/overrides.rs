//! Overrides (`NAME.d/*.toml` beside the file that defines NAME) and `supctl show`
//! (issue 27): an override's keys win, the later file by name order over the earlier;
//! `show` names the file:line of each key; a reload applies added, changed and removed
//! overrides, restarting only a service whose settings changed; a broken override is a
//! broken file that takes nothing else down.

mod common;
use common::files::wait_file;
use common::*;
use serde_json::{json, Value};
use std::fs;

const INCLUDE: &str = "include = [\"services.d/*.toml\"]";

fn write(sb: &Sandbox, name: &str, text: &str) {
    let path = sb.path(name);
    fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    fs::write(path, text).expect("write");
}

/// `web`: writes its GREETING to `seen`, then sleeps.
fn web(sb: &Sandbox) -> String {
    format!(
        "[service.web]\ncommand = [\"/bin/sh\", \"-c\", \"echo \\\"$GREETING\\\" > {seen}; exec sleep {tag}\"]\n\
         env = {{ GREETING = \"base\", OTHER = \"x\" }}\nstop_timeout = \"2s\"\n",
        seen = sb.path("seen").display(),
        tag = sb.tag
    )
}

fn seen(sb: &Sandbox, greeting: &str) {
    let want = format!("{greeting}\n");
    wait_file(&sb.path("seen"), |t| t == want);
}

fn pid_of(v: &Value) -> i64 {
    v["pid"].as_i64().expect("a pid")
}

/// The setting `key` of a `show` answer: (value, origin).
fn setting(shown: &Value, key: &str) -> (String, String) {
    let s = (shown["settings"].as_array().expect("settings").iter())
        .find(|s| s["key"] == key)
        .unwrap_or_else(|| panic!("no {key} in {shown}"));
    let text = |k: &str| s[k].as_str().expect("a string").to_string();
    (text("value"), text("origin"))
}

fn at(sb: &Sandbox, file: &str, line: usize) -> String {
    format!("{}:{line}", sb.path(file).display())
}

#[test]
fn an_override_sets_what_the_service_sees_and_show_names_where_each_key_was_set() {
    let mut sb = Sandbox::new();
    sb.config_with(INCLUDE, "");
    write(&sb, "services.d/web.toml", &web(&sb));
    // Name order: 20-b wins over 10-a, whatever order they were written in.
    write(
        &sb,
        "services.d/web.d/20-b.toml",
        "[service.web]\n# the operator's\nenv = { GREETING = \"second\" }\n",
    );
    write(
        &sb,
        "services.d/web.d/10-a.toml",
        "[service.web]\nenv = { GREETING = \"first\" }\nrestart_delay = \"250ms\"\n",
    );
    sb.start();
    sb.wait_state("web", "running");
    seen(&sb, "second");

    let shown = sb.ok(json!({"cmd": "show", "service": "web"}));
    assert_eq!(
        setting(&shown, "env.GREETING"),
        (
            "\"second\"".into(),
            at(&sb, "services.d/web.d/20-b.toml", 3)
        )
    );
    assert_eq!(
        setting(&shown, "restart_delay"),
        ("\"250ms\"".into(), at(&sb, "services.d/web.d/10-a.toml", 3))
    );
    assert_eq!(
        setting(&shown, "env.OTHER"),
        ("\"x\"".into(), at(&sb, "services.d/web.toml", 3))
    );
    assert_eq!(
        setting(&shown, "stop_timeout"),
        ("\"2s\"".into(), at(&sb, "services.d/web.toml", 4))
    );
    assert_eq!(
        setting(&shown, "command").1,
        at(&sb, "services.d/web.toml", 2)
    );
    assert_eq!(
        setting(&shown, "restart"),
        ("\"always\"".into(), "default".into())
    );
    let files: Vec<String> = ["web.toml", "web.d/10-a.toml", "web.d/20-b.toml"]
        .iter()
        .map(|f| sb.path(&format!("services.d/{f}")).display().to_string())
        .collect();
    assert_eq!(shown["files"], json!(files), "{shown}");

    // supctl: one line per key, TOML-ish, the origin as a comment; --json as is.
    let out = sb.supctl(&["show", "web"]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let greeting = format!(
        "env.GREETING = \"second\"   # {}",
        at(&sb, "services.d/web.d/20-b.toml", 3)
    );
    assert!(text.lines().any(|l| l == greeting), "{text}");
    assert!(
        text.lines()
            .any(|l| l == "restart = \"always\"   # default"),
        "{text}"
    );
    let out = sb.supctl(&["--json", "show", "web"]);
    let as_json: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(as_json, shown);

    // An unknown service is an error naming it.
    let out = sb.supctl(&["show", "nosuch"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("nosuch"),
        "{out:?}"
    );
}

#[test]
fn a_reload_applies_added_and_removed_overrides_and_restarts_only_what_changed() {
    let mut sb = Sandbox::new();
    sb.config_with(INCLUDE, "");
    write(&sb, "services.d/web.toml", &web(&sb));
    sb.start();
    sb.wait_state("web", "running");
    seen(&sb, "base");
    let first = pid_of(&sb.status("web"));

    // Added: the service restarts with it.
    write(
        &sb,
        "services.d/web.d/a.toml",
        "[service.web]\nenv = { GREETING = \"added\" }\n",
    );
    let r = sb.ok(json!({"cmd": "reload"}));
    assert_eq!(r["changed"], json!(["web"]), "{r}");
    seen(&sb, "added");
    let second = pid_of(&sb.wait_state("web", "running"));
    assert_ne!(second, first);

    // The same settings on other lines: no restart, but show follows the lines.
    write(
        &sb,
        "services.d/web.d/a.toml",
        "# moved down\n[service.web]\n\nenv = { GREETING = \"added\" }\n",
    );
    let r = sb.ok(json!({"cmd": "reload"}));
    assert_eq!(r["changed"], json!([]), "{r}");
    assert_eq!(pid_of(&sb.status("web")), second, "not restarted");
    let shown = sb.ok(json!({"cmd": "show", "service": "web"}));
    assert_eq!(
        setting(&shown, "env.GREETING").1,
        at(&sb, "services.d/web.d/a.toml", 4)
    );

    // Removed: back to the file's own settings.
    fs::remove_file(sb.path("services.d/web.d/a.toml")).expect("rm");
    let r = sb.ok(json!({"cmd": "reload"}));
    assert_eq!(r["changed"], json!(["web"]), "{r}");
    seen(&sb, "base");
    let shown = sb.ok(json!({"cmd": "show", "service": "web"}));
    assert_eq!(
        setting(&shown, "env.GREETING").1,
        at(&sb, "services.d/web.toml", 3)
    );
}

#[test]
fn a_broken_override_takes_nothing_else_down_and_status_names_it() {
    let mut sb = Sandbox::new();
    sb.config_with(INCLUDE, "");
    write(&sb, "services.d/web.toml", &web(&sb));
    write(
        &sb,
        "services.d/db.toml",
        &format!(
            "[service.db]\ncommand = [\"/bin/sleep\", \"{}\"]\nstop_timeout = \"2s\"\n",
            sb.tag
        ),
    );
    write(
        &sb,
        "services.d/web.d/a.toml",
        "[service.web]\nenv = { GREETING = 3 }\n",
    );
    sb.start();
    sb.wait_state("db", "running");
    sb.wait_state("web", "running");
    // Never loaded, so no last good copy: web runs without it.
    seen(&sb, "base");
    let st = sb.ok(json!({"cmd": "status"}));
    let broken = st["broken_files"].as_array().expect("broken_files");
    assert_eq!(broken.len(), 1, "{st}");
    assert_eq!(
        broken[0]["file"],
        sb.path("services.d/web.d/a.toml").display().to_string()
    );
    assert_eq!(broken[0]["using"], "nothing");
    assert!(
        (broken[0]["error"].as_str()).is_some_and(|e| e.contains("a.toml:2:")),
        "{st}"
    );
    assert_eq!(sb.supctl(&["status"]).status.code(), Some(5));

    // Removed and reloaded: nothing broken, web as it was (not restarted).
    let pid = pid_of(&sb.status("web"));
    fs::remove_file(sb.path("services.d/web.d/a.toml")).expect("rm");
    let r = sb.ok(json!({"cmd": "reload"}));
    assert_eq!(r["changed"], json!([]), "{r}");
    let st = sb.ok(json!({"cmd": "status"}));
    assert_eq!(st["broken_files"], json!([]), "{st}");
    assert_eq!(sb.supctl(&["status"]).status.code(), Some(0));
    assert_eq!(pid_of(&sb.status("web")), pid);
}
