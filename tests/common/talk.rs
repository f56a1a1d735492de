//! A service that talks when told: `talk` says `first`, then `said LINE` for every line
//! written to the FIFO `go` in its sandbox; for tests of what becomes of its output.

use super::Sandbox;
use std::io::Write;
use std::path::PathBuf;

/// Configures the service `talk` (its echos redirected by `redirect`: `""` for stdout,
/// `">&2"` for stderr) and starts supd; returns the path of the FIFO `go`.
pub fn start_talk(sb: &mut Sandbox, redirect: &str) -> PathBuf {
    let go = sb.path("go");
    nix::unistd::mkfifo(&go, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
    let script = sb.script(
        "talk.sh",
        &format!(
            "echo first{redirect}\nexec 3<>{}\nwhile read x <&3; do echo \"said $x\"{redirect}; done",
            go.display()
        ),
    );
    sb.config(&format!("[service.talk]\ncommand = [\"{script}\"]\n"));
    sb.start();
    go
}

/// Tells the talk service to say `line` (it answers `said LINE`).
pub fn say(sb: &Sandbox, line: &str) {
    let mut go = std::fs::OpenOptions::new()
        .write(true)
        .open(sb.path("go"))
        .expect("open go");
    writeln!(go, "{line}").expect("write to go");
}
