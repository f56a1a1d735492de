//! `runtime_dir = "NAME"` (issue 24): /run/NAME made at each start, owned by the
//! service's `user`, mode 0755, kept when the service stops. Without the key a daemon
//! that writes its pidfile or socket under /run needed a one-shot service of its own.

mod common;
use common::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;

/// A name under /run of this test's own, removed again when dropped.
struct RunDir(PathBuf);

impl RunDir {
    fn new(what: &str) -> RunDir {
        let d = PathBuf::from(format!("/run/sup-test-{what}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let _ = std::fs::remove_file(&d);
        RunDir(d)
    }
    fn name(&self) -> String {
        self.0
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned()
    }
    fn owner_and_mode(&self) -> (u32, u32) {
        let m = std::fs::symlink_metadata(&self.0).expect("the runtime directory");
        assert!(m.is_dir(), "{} is a directory", self.0.display());
        (m.uid(), m.permissions().mode() & 0o7777)
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
        let _ = std::fs::remove_file(&self.0);
    }
}

fn nobody() -> u32 {
    nix::unistd::User::from_name("nobody")
        .expect("passwd")
        .expect("nobody")
        .uid
        .as_raw()
}

#[test]
fn a_runtime_dir_is_made_at_each_start_for_the_user() {
    if !is_root() {
        eprintln!("skipped: needs root to make directories in /run and run as nobody");
        return;
    }
    let own = RunDir::new("own");
    let root = RunDir::new("root");
    let mut sb = Sandbox::new();
    // A one-shot as nobody that writes into its directory: it exits 0 only if it could.
    sb.config(&format!(
        "[service.own]\ncommand = [\"/bin/sh\", \"-c\", \"echo $$ > /run/{own}/pid\"]\n\
         user = \"nobody\"\nruntime_dir = \"{own}\"\nrestart = \"never\"\nready = \"exited\"\n\
         [service.byroot]\ncommand = [\"/bin/sleep\", \"3600\"]\nruntime_dir = \"{root}\"\n",
        own = own.name(),
        root = root.name()
    ));
    sb.start();
    let st = sb.wait_state("own", "exited");
    assert_eq!(st["last_exit"]["code"], 0, "{st}");
    assert_eq!(own.owner_and_mode(), (nobody(), 0o755));
    assert!(own.0.join("pid").exists(), "the service wrote into it");
    sb.wait_state("byroot", "running");
    assert_eq!(root.owner_and_mode(), (0, 0o755), "without a user: root's");

    // Kept at stop, with what it holds.
    sb.ok(serde_json::json!({"cmd": "stop", "service": "byroot"}));
    sb.wait_state("byroot", "stopped");
    assert_eq!(
        root.owner_and_mode(),
        (0, 0o755),
        "kept when the service stops"
    );

    // Another start sets its owner and mode again, whatever they became.
    std::fs::set_permissions(&own.0, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    nix::unistd::chown(&own.0, Some(0.into()), Some(0.into())).expect("chown");
    std::fs::remove_file(own.0.join("pid")).expect("rm");
    sb.ok(serde_json::json!({"cmd": "start", "service": "own"}));
    let st = sb.wait_state("own", "exited");
    assert_eq!(st["last_exit"]["code"], 0, "{st}");
    assert_eq!(own.owner_and_mode(), (nobody(), 0o755));
    assert!(
        own.0.join("pid").exists(),
        "the service wrote into it again"
    );
}

#[test]
fn a_runtime_dir_that_is_not_a_directory_fails_the_start_with_the_reason() {
    if !is_root() {
        eprintln!("skipped: needs root to make directories in /run");
        return;
    }
    let link = RunDir::new("link");
    std::os::unix::fs::symlink("/etc", &link.0).expect("symlink");
    let mut sb = Sandbox::new();
    sb.config(&format!(
        "[service.s]\ncommand = [\"/bin/sleep\", \"3600\"]\nuser = \"nobody\"\n\
         runtime_dir = \"{}\"\nrestart = \"never\"\n",
        link.name()
    ));
    sb.start();
    let st = sb.wait_state("s", "failed");
    let reason = st["reason"].as_str().unwrap_or_default().to_string();
    assert!(
        reason.contains("is not a directory") && reason.contains(&link.name()),
        "{st}"
    );
    let etc = std::fs::metadata("/etc").expect("/etc");
    assert_eq!(etc.uid(), 0, "/etc was not given to nobody");
}
