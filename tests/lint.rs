//! `supd --check` as a lint (issue 24, item 4): what would fail every start at run time
//! (a missing or non-executable program, an unknown user or group, a missing required
//! env_file, a missing cwd) is an error of `--check`, at the place of its key, with what
//! to do; a good config still checks, with its `instances` and includes.

mod common;
use common::*;
use std::process::Command;

/// `supd --check -c sup.toml` of the sandbox: its exit code, stdout and stderr.
fn check(sb: &Sandbox) -> (Option<i32>, String, String) {
    let out = Command::new(SUPD)
        .args(["--check", "-c"])
        .arg(sb.path("sup.toml"))
        .output()
        .expect("run supd --check");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `FILE:LINE:COLUMN` of the first `needle` in the file `name` of the sandbox.
fn at(sb: &Sandbox, name: &str, needle: &str) -> String {
    let path = sb.path(name);
    let text = std::fs::read_to_string(&path).expect("read config");
    let offset = text
        .find(needle)
        .unwrap_or_else(|| panic!("{needle} not in {text}"));
    let line = text[..offset].matches('\n').count() + 1;
    let column = offset - text[..offset].rfind('\n').map_or(0, |i| i + 1) + 1;
    format!("{}:{line}:{column}", path.display())
}

/// The one line of `stderr` at `place`.
fn line_at<'a>(stderr: &'a str, place: &str) -> &'a str {
    let found: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with(&format!("{place}: ")))
        .collect();
    assert_eq!(found.len(), 1, "one line at {place} in:\n{stderr}");
    found[0]
}

// see: issue 24, item 4 — `supd --check` accepted a missing program, an unknown user, a
// missing env_file; each then failed at run time for ever.
#[test]
fn check_reports_what_would_fail_every_start_at_its_key() {
    let sb = Sandbox::new();
    std::fs::write(sb.path("plain"), "#!/bin/sh\n").expect("write");
    let plain = sb.path("plain").display().to_string();
    sb.provision_version("1.0.0", "exec sleep 3600");
    sb.config(&format!(
        "[service.noprog]\ncommand = [\"/nonexistent/sup-lint/prog\", \"-x\"]\n\
         [service.noexec]\ncommand = [\"{plain}\"]\n\
         [service.nouser]\ncommand = [\"/bin/true\"]\nuser = \"no-such-user-sup-lint\"\n\
         [service.nogroup]\ncommand = [\"/bin/true\"]\ngroup = \"no-such-group-sup-lint\"\n\
         [service.noenv]\ncommand = [\"/bin/true\"]\nenv_file = [\"-optional.env\", \"required.env\"]\n\
         [service.nocwd]\ncommand = [\"/bin/true\"]\ncwd = \"no-such-dir\"\n\
         [service.nopath]\ncommand = [\"sup-lint-no-such-program\"]\n\
         [service.noversioned]\ntool = \"agent\"\ncommand = [\"bin/gone\"]\n\
         [service.nocheck]\ncommand = [\"/bin/true\"]\n\
         health = {{ command = [\"/nonexistent/sup-lint/check\"], interval = \"1s\" }}\n"
    ));
    let (code, _, err) = check(&sb);
    assert_eq!(code, Some(1), "{err}");
    let cases = [
        (
            "[service.noprog]\ncommand",
            "service.noprog.command: program /nonexistent/sup-lint/prog does not exist",
            "install it",
        ),
        (
            "[service.noexec]\ncommand",
            "service.noexec.command:",
            "chmod",
        ),
        (
            "user = \"no-such",
            "service.nouser.user: no user 'no-such-user-sup-lint'",
            "create it",
        ),
        (
            "group = \"no-such",
            "service.nogroup.group: no group 'no-such-group-sup-lint'",
            "create it",
        ),
        (
            "\"required.env\"",
            "service.noenv.env_file: env_file ",
            "\"-",
        ),
        (
            "cwd = \"no-such-dir\"",
            "service.nocwd.cwd: directory ",
            "mkdir",
        ),
        (
            "[service.nopath]\ncommand",
            "service.nopath.command: program 'sup-lint-no-such-program' is not found in PATH",
            "absolute path",
        ),
        (
            "command = [\"bin/gone\"]",
            "service.noversioned.command: program bin/gone does not exist in version 1.0.0 of tool 'agent'",
            "",
        ),
        (
            "command = [\"/nonexistent/sup-lint/check\"]",
            "service.nocheck.health.command: program /nonexistent/sup-lint/check does not exist",
            "",
        ),
    ];
    for (needle, says, hint) in cases {
        // A key's place is its name: the needle's last line.
        let key_at = match needle.rsplit_once('\n') {
            Some((_, key)) => {
                let text = std::fs::read_to_string(sb.path("sup.toml")).expect("read");
                let start = text.find(needle).expect("needle") + needle.len() - key.len();
                let line = text[..start].matches('\n').count() + 1;
                format!("{}:{line}:1", sb.path("sup.toml").display())
            }
            None => at(&sb, "sup.toml", needle),
        };
        let line = line_at(&err, &key_at);
        assert!(line.contains(says), "{key_at}: {says}: {line}");
        assert!(line.contains(hint), "{key_at}: {hint}: {line}");
    }
    // Nothing else: the optional env_file is no error, and each error is said once.
    assert!(!err.contains("optional.env"), "{err}");
    assert!(err.ends_with("sup.toml: 9 errors\n"), "{err}");
}

#[test]
fn a_good_config_checks_with_its_instances_and_includes_and_a_tool_not_installed_warns() {
    let sb = Sandbox::new();
    sb.provision_version("1.0.0", "exec sleep 3600");
    std::fs::create_dir_all(sb.path("services.d")).expect("mkdir");
    std::fs::create_dir_all(sb.path("work")).expect("mkdir");
    std::fs::write(sb.path("agent.env"), "A=1\n").expect("write");
    let worker = sb.script("worker", "exec sleep 3600");
    std::fs::write(
        sb.path("services.d/web.toml"),
        format!(
            "[service.web]\ncommand = [\"{worker}\"]\ninstances = 3\nuser = \"root\"\n\
             group = \"root\"\ncwd = \"../work\"\n"
        ),
    )
    .expect("write");
    sb.config_with(
        "include = [\"services.d/*.toml\"]",
        "[service.agent]\ntool = \"agent\"\ncommand = [\"bin/agent\"]\n\
         env_file = [\"agent.env\", \"-agent.local.env\"]\n\
         health = { command = [\"bin/agent\", \"check\"] }\n\
         [service.sleeper]\ncommand = [\"sleep\", \"3600\"]\nuser = \"nobody\"\n\
         [service.later]\ntool = \"later\"\ncommand = [\"bin/later\"]\n\
         [service.logs]\ncommand = [\"/bin/true\"]\ncwd = \"log\"\n\
         [service.rundir]\ncommand = [\"/bin/true\"]\nruntime_dir = \"sup-lint-never-made\"\n\
         cwd = \"/run/sup-lint-never-made\"\n",
    );
    let (code, out, err) = check(&sb);
    assert_eq!(code, Some(0), "{out}{err}");
    // A cwd in the service's runtime_dir is made at its start: no error.
    assert!(out.contains("ok (8 services, 2 files)"), "{out}");
    // A tool with no version installed yet: its services wait for one, no error.
    let line = line_at(&err, &at(&sb, "sup.toml", "tool = \"later\""));
    assert!(
        line.contains("warning") && line.contains("no version of tool 'later' is installed"),
        "{line}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}

// see: issue 24, item 4 — an unknown key listed all 34 keys instead of the nearest one.
#[test]
fn an_unknown_key_names_the_nearest_known_one() {
    let sb = Sandbox::new();
    sb.config("[service.a]\ncomand = [\"/bin/true\"]\nstop-timeout = \"1s\"\nfrobnicate = 1\n");
    let (code, _, err) = check(&sb);
    assert_eq!(code, Some(1), "{err}");
    let line = line_at(&err, &at(&sb, "sup.toml", "comand"));
    assert!(
        line.ends_with("service.a.comand: unknown key; did you mean `command`?"),
        "{line}"
    );
    let line = line_at(&err, &at(&sb, "sup.toml", "stop-timeout"));
    assert!(line.ends_with("did you mean `stop_timeout`?"), "{line}");
    let line = line_at(&err, &at(&sb, "sup.toml", "frobnicate"));
    assert!(
        !line.contains("did you mean") && !line.contains("restart_delay_max"),
        "nothing near: no guess, no list of every key: {line}"
    );
}

#[test]
fn a_mistake_in_an_included_table_of_instances_is_said_once_in_its_file() {
    let sb = Sandbox::new();
    std::fs::create_dir_all(sb.path("services.d")).expect("mkdir");
    std::fs::write(
        sb.path("services.d/web.toml"),
        "[service.web]\ninstances = 4\ncommand = [\"/nonexistent/sup-lint/web\"]\n",
    )
    .expect("write");
    sb.config_with("include = [\"services.d/*.toml\"]", "");
    let (code, _, err) = check(&sb);
    assert_eq!(code, Some(1), "{err}");
    let line = line_at(&err, &at(&sb, "services.d/web.toml", "command"));
    assert!(
        line.contains("service.web.command: program /nonexistent/sup-lint/web does not exist"),
        "{line}"
    );
    assert!(err.ends_with("sup.toml: 1 error\n"), "{err}");
}

// A reexec checks its new program with `--check --handoff-format N`: that check is
// whether the new program reads this config and its handoff, not the lint. A service
// that cannot start (its program gone) must not keep supd from replacing itself, and
// nothing there may wait on the user database.
#[test]
fn a_reexec_is_not_refused_for_what_the_lint_finds() {
    let mut sb = Sandbox::new();
    sb.config(
        "[service.a]\ncommand = [\"/bin/sleep\", \"3600\"]\n\
         [service.b]\ncommand = [\"/nonexistent/sup-lint/b\"]\nautostart = false\n",
    );
    let (code, _, err) = check(&sb);
    assert_eq!(code, Some(1), "the lint finds b's program missing: {err}");
    sb.start();
    let pid = sb.wait_state("a", "running")["pid"].clone();
    sb.reexec();
    assert_eq!(sb.wait_state("a", "running")["pid"], pid);
}

// Adversary: a tool whose `current` names a version that is gone (removed by hand, a
// half-finished prune) is said as such, at `tool`, not as a program missing from it.
#[test]
fn a_dangling_current_is_said_as_a_version_not_installed() {
    let sb = Sandbox::new();
    std::fs::create_dir_all(sb.path("tools/agent")).expect("mkdir");
    std::os::unix::fs::symlink("9.9.9", sb.path("tools/agent/current")).expect("ln");
    sb.config("[service.agent]\ntool = \"agent\"\ncommand = [\"bin/agent\"]\n");
    let (code, _, stderr) = check(&sb);
    assert_eq!(code, Some(1), "{stderr}");
    let line = line_at(&stderr, &at(&sb, "sup.toml", "tool = "));
    assert!(
        line.contains("service.agent.tool") && line.contains("9.9.9 is not installed"),
        "{line}"
    );
}

// Issue 29: a Unix socket of `listen` in a directory that is not there fails every
// start; one in the service's own runtime_dir (made before the bind) does not.
#[test]
fn a_listen_socket_in_a_missing_directory_is_an_error_of_check() {
    let sb = Sandbox::new();
    sb.config(&format!(
        "[service.web]\ncommand = [\"/bin/sleep\", \"1\"]\n\
         listen = [\"tcp:127.0.0.1:8080\", \"unix:{dir}/none/web.sock\"]\n\
         [service.app]\ncommand = [\"/bin/sleep\", \"1\"]\nruntime_dir = \"sup-lint-app\"\n\
         listen = [\"unix:/run/sup-lint-app/app.sock\"]\n",
        dir = sb.dir.display()
    ));
    let (code, _, err) = check(&sb);
    assert_eq!(code, Some(1), "{err}");
    let line = line_at(&err, &at(&sb, "sup.toml", "listen = [\"tcp"));
    assert!(
        line.contains("service.web.listen: unix:") && line.contains("does not exist"),
        "{line}"
    );
    assert!(!err.contains("service.app"), "{err}");
}
