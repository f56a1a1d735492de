//! One instance at a time, seen from the service's side: a service script that holds a
//! lock and writes down every start, and every start that found the lock held.

use super::Sandbox;
use std::fs;

/// A service script that runs `pre`, holds `lock` (recording in `dups` a start that
/// finds another instance holding it), appends its pid to `starts`, then runs `then`.
pub fn locking_service(sb: &Sandbox, pre: &str, then: &str) -> String {
    let d = sb.dir.display();
    sb.script(
        "svc",
        &format!(
            "{pre}\nexec 9>>{d}/lock\nflock -n 9 || {{ echo \"dup $$\" >> {d}/dups; exit 1; }}\necho $$ >> {d}/starts\n{then}"
        ),
    )
}

/// The lines of the sandbox's file `name` (none when it is missing).
pub fn lines(sb: &Sandbox, name: &str) -> Vec<String> {
    fs::read_to_string(sb.path(name))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// Fails unless no start of the locking service found another instance running.
pub fn assert_no_dups(sb: &Sandbox) {
    assert!(
        lines(sb, "dups").is_empty(),
        "two instances: {:?}\n{}",
        lines(sb, "dups"),
        sb.supd_log()
    );
}

/// The pid a process wrote (as a line) to `path`, waited for with the deadline.
pub fn wait_pid_file(path: &std::path::Path) -> i32 {
    super::files::wait_file(path, |t| t.ends_with('\n'))
        .trim()
        .parse()
        .expect("a pid")
}
