//! Overrides' unit tests.
// Test code: an `expect` here fails a test, never supd.

use super::super::lastgood;
use super::super::{load, show, Config, ConfigError};
use std::path::Path;

/// A config directory for one test: sup.toml including services.d/*.toml.
fn dir(name: &str) -> crate::scratch::Scratch {
    let d = crate::scratch::Scratch::new(&format!("overrides-{name}"));
    std::fs::create_dir_all(d.join("services.d")).expect("mkdir");
    let main = format!(
        "[supd]\nstate_dir = \"{}\"\ninclude = [\"services.d/*.toml\"]\n",
        d.join("state").display()
    );
    std::fs::write(d.join("sup.toml"), main).expect("write");
    d
}

fn write(d: &Path, name: &str, text: &str) {
    let path = d.join(name);
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    std::fs::write(path, text).expect("write");
}

fn load_ok(d: &Path) -> Config {
    load(&d.join("sup.toml")).unwrap_or_else(|es| panic!("{es:?}"))
}

fn errors(d: &Path) -> Vec<String> {
    let prefix = format!("{}/", d.display());
    match load(&d.join("sup.toml")) {
        Ok(_) => panic!("loaded"),
        Err(es) => es
            .iter()
            .map(|e: &ConfigError| e.to_string().replace(&prefix, ""))
            .collect(),
    }
}

fn origin(cfg: &Config, name: &str, key: &str, d: &Path) -> String {
    let prefix = format!("{}/", d.display());
    cfg.origins[name].of(key).replace(&prefix, "")
}

const WEB: &str = "[service.web]\ncommand = [\"/bin/web\"]\nenv = { A = \"1\", B = \"2\" }\n\
                   limits = { nofile = 100 }\nafter = [\"db\"]\nstop_timeout = \"3s\"\n\
                   [service.db]\ncommand = [\"/bin/db\"]\n";

#[test]
fn overrides_win_key_by_key_in_name_order_and_env_and_limits_merge() {
    let d = dir("merge");
    write(&d, "services.d/web.toml", WEB);
    // Read in name order: 20 after 10, whatever order they were written in.
    write(
        &d,
        "services.d/web.d/20-late.toml",
        "[service.web]\nstop_timeout = \"9s\"\nenv = { B = \"late\" }\n",
    );
    write(
        &d,
        "services.d/web.d/10-early.toml",
        "[service.web]\nstop_timeout = \"5s\"\nenv = { B = \"early\", C = \"3\" }\n\
         limits = { core = 0 }\nafter = []\n",
    );
    let cfg = load_ok(&d);
    let web = &cfg.services["web"];
    assert_eq!(web.stop_timeout, std::time::Duration::from_secs(9));
    let env: Vec<(&str, &str)> = (web.env.iter())
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(env, [("A", "1"), ("B", "late"), ("C", "3")]);
    let limits: Vec<&str> = web.limits.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(limits, ["nofile", "core"], "limits merge by name");
    assert!(web.after.is_empty(), "an array is replaced whole");
    assert_eq!(web.command, ["/bin/web"]);
    // Where each key was set.
    assert_eq!(origin(&cfg, "web", "command", &d), "services.d/web.toml:2");
    assert_eq!(origin(&cfg, "web", "env.A", &d), "services.d/web.toml:3");
    assert_eq!(
        origin(&cfg, "web", "env.B", &d),
        "services.d/web.d/20-late.toml:3"
    );
    assert_eq!(
        origin(&cfg, "web", "env.C", &d),
        "services.d/web.d/10-early.toml:3"
    );
    assert_eq!(
        origin(&cfg, "web", "stop_timeout", &d),
        "services.d/web.d/20-late.toml:2"
    );
    assert_eq!(
        origin(&cfg, "web", "limits.core", &d),
        "services.d/web.d/10-early.toml:4"
    );
    assert_eq!(origin(&cfg, "web", "restart", &d), "default");
    let files: Vec<String> = (cfg.origins["web"].files.iter())
        .map(|f| f.strip_prefix(&d).expect("in d").display().to_string())
        .collect();
    assert_eq!(
        files,
        [
            "services.d/web.toml",
            "services.d/web.d/10-early.toml",
            "services.d/web.d/20-late.toml"
        ]
    );
    // The overrides are files of the config (their last good copies are kept).
    assert!(cfg.files.contains(&d.join("services.d/web.d/20-late.toml")));
    assert_eq!(cfg.origins["db"].files, [d.join("services.d/web.toml")]);
}

#[test]
fn show_writes_values_as_toml_with_their_origin() {
    let d = dir("show");
    write(&d, "services.d/web.toml", WEB);
    write(
        &d,
        "services.d/web.d/a.toml",
        "[service.web]\n\n\nenv = { \"ODD KEY\" = \"q\\\"uote\" }\n",
    );
    let cfg = load_ok(&d);
    let settings = show::settings(&cfg.services["web"], &cfg.origins["web"]);
    let line = |k: &str| {
        let s = (settings.iter().find(|s| s.key == k)).unwrap_or_else(|| panic!("{k}"));
        format!("{} = {}   # {}", s.key, s.value, s.origin)
            .replace(&format!("{}/", d.display()), "")
    };
    assert_eq!(
        line("command"),
        "command = [\"/bin/web\"]   # services.d/web.toml:2"
    );
    assert_eq!(
        line("env.\"ODD KEY\""),
        "env.\"ODD KEY\" = \"q\\\"uote\"   # services.d/web.d/a.toml:4"
    );
    assert_eq!(
        line("stop_timeout"),
        "stop_timeout = \"3s\"   # services.d/web.toml:6"
    );
    assert_eq!(
        line("restart_delay"),
        "restart_delay = \"100ms\"   # default"
    );
    assert_eq!(line("cooldown"), "cooldown = \"5m\"   # default");
    assert_eq!(line("log_max_size"), "log_max_size = \"10MiB\"   # default");
    assert_eq!(line("stop_signal"), "stop_signal = \"TERM\"   # default");
    assert_eq!(
        line("limits.nofile"),
        "limits.nofile = 100   # services.d/web.toml:4"
    );
    assert!(
        settings.iter().all(|s| s.key != "user"),
        "not set, no default"
    );
}

#[test]
fn an_override_of_a_service_nobody_defines_and_foreign_tables_are_errors_at_their_place() {
    let d = dir("errors");
    write(&d, "services.d/web.toml", WEB);
    write(
        &d,
        "services.d/web.d/x.toml",
        "[service.web]\nstop_timeout = \"1s\"\n[service.db]\ncommand = [\"/bin/x\"]\n\
         [supd]\nsocket = \"/x\"\n",
    );
    write(
        &d,
        "services.d/ghost.d/y.toml",
        "# no such service\n[service.ghost]\nenv = { A = \"1\" }\n",
    );
    write(
        &d,
        "services.d/web.d/z.toml",
        "[service.web]\nstop_timeout = \"soon\"\n",
    );
    assert_eq!(
        errors(&d),
        [
            "services.d/web.d/x.toml:3:10: service.db: [service.db]: an override file in web.d/ holds only a [service.web] table".to_string(),
            "services.d/web.d/x.toml:5:2: supd: [supd]: an override file in web.d/ holds only a [service.web] table".into(),
            "services.d/web.d/z.toml:2:16: service.web.stop_timeout: 'soon' is not a duration: expected a number before the unit (\"250ms\", \"10s\", \"5m\", \"1h\")".into(),
            "services.d/ghost.d/y.toml:2:10: service.ghost: an override of service 'ghost', which no file in services.d defines".into(),
        ]
    );
}

#[test]
fn an_override_that_makes_the_service_wrong_is_its_own_error() {
    let d = dir("whole");
    write(&d, "services.d/web.toml", WEB);
    write(
        &d,
        "services.d/web.d/a.toml",
        "[service.web]\nrestart_delay = \"1m\"\nafter = [\"nobody\"]\n",
    );
    let es = errors(&d);
    assert_eq!(es.len(), 2, "{es:?}");
    assert!(
        es[0].starts_with("services.d/web.d/a.toml:1:1: service.web.restart_delay_max:"),
        "{es:?}"
    );
    assert!(
        es[1].starts_with(
            "services.d/web.d/a.toml:3:10: service.web.after: no service named 'nobody'"
        ),
        "{es:?}"
    );
}

#[test]
fn a_service_of_the_main_file_takes_its_overrides_beside_the_main_file() {
    let d = dir("main");
    let main = std::fs::read_to_string(d.join("sup.toml")).expect("read");
    write(
        &d,
        "sup.toml",
        &format!("{main}[service.top]\ncommand = [\"/bin/top\"]\ninstances = 2\n"),
    );
    write(&d, "top.d/a.toml", "[service.top]\ncwd = \"work\"\n");
    let cfg = load_ok(&d);
    for name in ["top@0", "top@1"] {
        assert_eq!(
            cfg.services[name].cwd,
            Some(d.join("work")),
            "from the main file's directory"
        );
        assert_eq!(origin(&cfg, name, "cwd", &d), "top.d/a.toml:2");
        assert_eq!(origin(&cfg, name, "instances", &d), "sup.toml:6");
    }
}

#[test]
fn a_broken_override_stands_in_for_itself_alone_at_start() {
    let d = dir("broken");
    write(&d, "services.d/web.toml", WEB);
    write(
        &d,
        "services.d/web.d/a.toml",
        "[service.web]\nenv = { B = \"good\" }\n",
    );
    write(
        &d,
        "services.d/web.d/b.toml",
        "[service.web]\nstop_timeout = \"7s\"\n",
    );
    // Both load: their copies are kept.
    lastgood::load_and_keep(&d.join("sup.toml")).expect("loads");
    write(
        &d,
        "services.d/web.d/a.toml",
        "[service.web]\nenv = { B = 3 }\n",
    );
    write(&d, "services.d/web.d/c.toml", "[service.web\n");
    let loaded = lastgood::load_at_start(&d.join("sup.toml"));
    let broken: Vec<(String, &str)> = (loaded.broken.iter())
        .map(|b| {
            let f = b.file.strip_prefix(&d).expect("in d").display().to_string();
            (f, b.using.as_str())
        })
        .collect();
    assert_eq!(
        broken,
        [
            ("services.d/web.d/a.toml".to_string(), "last good copy"),
            ("services.d/web.d/c.toml".to_string(), "nothing"),
        ]
    );
    let web = &loaded.cfg.services["web"];
    assert_eq!(web.env["B"], "good", "a's last good copy");
    assert_eq!(
        web.stop_timeout,
        std::time::Duration::from_secs(7),
        "b as it is"
    );
    assert!(loaded.cfg.services.contains_key("db"));
}
