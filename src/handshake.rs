//! The handshake a program must pass before `reexec` executes it.
//!
//! The running supd runs `BINARY --handshake NONCE --handoff-format N -c CONFIG`. A
//! supd that reads handoffs of format N loads the config and answers one line on its
//! standard output, `supd handoff FORMAT NONCE`, then exits 0; anything else is refused
//! and supd goes on unchanged: a program that exits 0 without answering (`/bin/true`),
//! one that echoes its arguments (`/bin/echo` prints the nonce, never this line), an
//! older supd (no `--handshake`: a usage error), one that never ends (killed at
//! [`DEADLINE`]). Exit status alone proved nothing: `supctl reexec --binary /bin/true`
//! used to be accepted, and supd exec'd into it and was gone.

use nix::errno::Errno;
use nix::fcntl::AtFlags;
use std::fs::File;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The handoff format (handoff.rs) this supd writes and answers the handshake with.
///
/// It reads every format up to it. 2: a notify socket
/// per service (`ServiceState::notify`); format 1 had the one `Handoff::notify`. 3: a
/// stderr pipe per service (`ServiceState::output_err`): an older image would leave it
/// unread (and the service blocked on a full pipe), so it is refused one. 4: held stops
/// and restarts (`Handoff::queued`) and each service's health state
/// (`ServiceState::health`): an older image would drop them, so it is refused one.
/// 5: grant boards (`Handoff::boards`). 6: the ending of what a killed supd left, when
/// it is still under way (`Handoff::leftovers`): an older image would start the held
/// services beside what is left of them, so it is refused one. 7: the runs of a broken
/// file's services kept from a killed supd (`Handoff::kept`): an older image would
/// forget them and a later reload start a second instance beside one, so it is refused
/// one. (Also the kill_mode of each run, `ServiceState`, read with a default.) 8: each
/// service's held `listen` sockets and stored fds (`ServiceState::kept`): an older
/// image would close them (its clients refused, its port taken by the run that holds
/// a copy), so it is refused one.
pub const FORMAT: u32 = 8;

/// How long the program has to answer (it reads a config; a loaded machine is slow).
pub const DEADLINE: Duration = Duration::from_secs(30);

/// [`DEADLINE`], or for tests `SUP_HANDSHAKE_DEADLINE_MS` (as `SUP_FAILPOINT`, nobody
/// sets it in production), so a test of a program that never answers takes no 30 s.
pub fn deadline() -> Duration {
    static D: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *D.get_or_init(|| {
        std::env::var("SUP_HANDSHAKE_DEADLINE_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .map_or(DEADLINE, Duration::from_millis)
    })
}

/// The most of its output read: the answer is one short line.
pub const MAX_ANSWER: usize = 4096;

/// A value no program prints by accident: the running supd's pid and monotonic and
/// wall clocks, in hex. Not a secret: whoever may reexec supd chooses its program.
pub fn nonce() -> String {
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    format!(
        "{:x}-{:x}-{:x}",
        std::process::id(),
        crate::time::Mono::now().0,
        wall
    )
}

/// The line a program that reads handoffs of `format` (its newest) answers.
pub fn answer(nonce: &str, format: u32) -> String {
    format!("supd handoff {format} {nonce}")
}

/// The line that follows the answer for each file the program would not run as it
/// is: `broken copy PATH` (its last good copy stands in) or `broken nothing PATH`.
pub fn broken_line(has_copy: bool, file: &Path) -> String {
    let using = if has_copy { "copy" } else { "nothing" };
    format!("broken {using} {}", file.display())
}

/// Whether `out` (the program's standard output) answers the handshake `nonce` for
/// handoff `format`: its first line must be `supd handoff F NONCE` with F ≥ `format`.
/// Then the files it would run nothing of (`broken nothing PATH` lines).
pub fn verify(out: &[u8], nonce: &str, format: u32) -> Result<Vec<PathBuf>, String> {
    let text = String::from_utf8_lossy(out);
    let mut lines = text.lines();
    let first = lines.next().unwrap_or("").trim_end();
    let words: Vec<&str> = first.split(' ').collect();
    match words.as_slice() {
        ["supd", "handoff", f, n] if *n == nonce => match f.parse::<u32>() {
            Ok(f) if f >= format => Ok(lines
                .filter_map(|l| l.strip_prefix("broken nothing "))
                .map(PathBuf::from)
                .collect()),
            _ => Err(format!(
                "it reads handoff format {f}, not {format}: it is older than the running supd"
            )),
        },
        _ if first.is_empty() => Err("it did not answer the handshake: it is not a supd that reads this one's handoff".into()),
        _ => Err(format!(
            "it answered {:?} to the handshake, not \"supd handoff {format} …\": it is not a supd that reads this one's handoff",
            first.chars().take(80).collect::<String>()
        )),
    }
}

/// Why a program whose handshake named `nothing` (the files it would run nothing of)
/// must not take over from a supd that runs nothing only of `running_nothing`: it would
/// end the services of a file the running one runs (from the file or its copy). A file
/// broken since the last reload is no reason: its copy, what runs now, stands in.
pub fn weigh(nothing: &[PathBuf], running_nothing: &[&Path]) -> Result<(), String> {
    let lost: Vec<String> = (nothing.iter())
        .filter(|f| !running_nothing.contains(&f.as_path()))
        .map(|f| f.display().to_string())
        .collect();
    if lost.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "it cannot read {} (nor a last good copy), which the running supd runs: its services would stop (its errors are in supd's log)",
            lost.join(", ")
        ))
    }
}

/// The program a handshake runs, opened before it runs (`O_PATH`): the file that
/// answers is the file executed. Its path may name another file by the end of the
/// handshake (a package upgrade or a deploy renaming a new file over it, a symlink
/// moved): that is refused ([`same_file`]), and the exec goes through this fd
/// ([`exec_opened`]), so what the path names meanwhile is never what runs.
pub fn open(binary: &Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
        .open(binary)
}

/// Whether `binary` still names the file `opened` (held open since before the
/// handshake, so its inode number cannot have gone to another file).
pub fn same_file(opened: &File, binary: &Path) -> Result<(), String> {
    let was = opened.metadata().map_err(|e| e.to_string())?;
    match std::fs::metadata(binary) {
        Ok(now) if (now.dev(), now.ino()) == (was.dev(), was.ino()) => Ok(()),
        Ok(_) => Err(
            "its path changed during the handshake (another file was put there): the program that answered is not the one that would run; ask again"
                .into(),
        ),
        Err(e) => Err(format!("its path changed during the handshake ({e})")),
    }
}

/// Replaces this process's image with the program `opened` (argv as given, the
/// environment kept), through the fd: not the path, which may name another file by
/// now. A script cannot run so (its interpreter would be given a path to an fd closed
/// by the exec), nor can anything on a kernel without `execveat` (before 3.19): then
/// by `argv[0]`, while it still names the same file. Returns only on failure.
pub fn exec_opened(opened: &File, argv: &[String]) -> String {
    use std::os::unix::ffi::OsStrExt;
    let c = |b: &[u8]| std::ffi::CString::new(b.to_vec());
    let args: Result<Vec<_>, _> = argv.iter().map(|a| c(a.as_bytes())).collect();
    let env: Result<Vec<_>, _> = std::env::vars_os()
        .map(|(k, v)| c(&[k.as_bytes(), b"=", v.as_bytes()].concat()))
        .collect();
    let (Ok(args), Ok(env)) = (args, env) else {
        return "bad program name, arguments or environment".into();
    };
    let Some(program) = argv.first() else {
        return "no program".into();
    };
    let empty = std::ffi::CString::default();
    let e = match nix::unistd::execveat(opened, &empty, &args, &env, AtFlags::AT_EMPTY_PATH) {
        Ok(never) => match never {},
        Err(e) => e,
    };
    if !matches!(e, Errno::ENOENT | Errno::ENOSYS) {
        return format!("cannot execute {program}: {}", e.desc());
    }
    if let Err(why) = same_file(opened, Path::new(program)) {
        return format!("not executing {program}: {why}");
    }
    crate::sys::exec(argv)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_answer_with_the_nonce_passes() {
        let n = nonce();
        assert!(verify(answer(&n, 7).as_bytes(), &n, 7).is_ok());
        assert!(verify(format!("{}\nmore\n", answer(&n, 7)).as_bytes(), &n, 1).is_ok());
        // Nothing at all (/bin/true).
        assert!(verify(b"", &n, 1).unwrap_err().contains("did not answer"));
        // Its arguments echoed (/bin/echo).
        let echoed = format!("--handshake {n} --handoff-format 6 -c /etc/sup/sup.toml\n");
        assert!(verify(echoed.as_bytes(), &n, 6).is_err());
        // Another nonce (an answer meant for another supd).
        assert!(verify(answer("other", 7).as_bytes(), &n, 1).is_err());
        // An older format.
        let old = format!("supd handoff 3 {n}");
        assert!(verify(old.as_bytes(), &n, 6).unwrap_err().contains("older"));
        // Two calls give two nonces.
        assert_ne!(nonce(), nonce());
    }

    #[test]
    fn files_it_would_run_nothing_of_are_weighed_against_the_running_supd() {
        let n = nonce();
        let out = format!(
            "{}\n{}\n{}\n",
            answer(&n, 7),
            broken_line(true, Path::new("/etc/sup/services.d/a.toml")),
            broken_line(false, Path::new("/etc/sup/services.d/b c.toml"))
        );
        let nothing = verify(out.as_bytes(), &n, 1).expect("answered");
        assert_eq!(nothing, vec![PathBuf::from("/etc/sup/services.d/b c.toml")]);
        // The running supd runs nothing of it either: no loss.
        assert!(weigh(&nothing, &[Path::new("/etc/sup/services.d/b c.toml")]).is_ok());
        // It runs it: the new program would stop its services.
        let why = weigh(&nothing, &[]).unwrap_err();
        assert!(
            why.contains("b c.toml") && why.contains("would stop"),
            "{why}"
        );
        assert!(weigh(&[], &[]).is_ok());
    }
}
