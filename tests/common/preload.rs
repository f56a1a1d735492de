//! LD_PRELOAD libraries for tests, built from C source with `cc` at test time.

use super::Sandbox;
use std::fs;
use std::path::PathBuf;
use std::process::Command;

/// Writes `c_source` to `NAME.c` in the sandbox and builds it with `cc` into the
/// shared library `NAME.so` (linked with libdl), returning the library's path; fails
/// the test with cc's message when it does not build.
pub fn build(sb: &Sandbox, name: &str, c_source: &str) -> PathBuf {
    let src = sb.path(&format!("{name}.c"));
    fs::write(&src, c_source).expect("write shim");
    let so = sb.path(&format!("{name}.so"));
    let out = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&so)
        .arg(&src)
        .arg("-ldl")
        .output()
        .expect("run cc");
    assert!(
        out.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    so
}
