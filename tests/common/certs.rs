//! Certificates made by openssl for a test: a CA, and certificates it signs, all EC
//! P-256, valid two days, in a directory of the test's.

use std::path::Path;
use std::process::Command;

const EC: [&str; 5] = [
    "-newkey",
    "ec",
    "-pkeyopt",
    "ec_paramgen_curve:prime256v1",
    "-nodes",
];

/// Runs `args` in `dir`; it must succeed.
pub fn run(args: &[&str], dir: &Path) {
    let out = Command::new(args[0])
        .args(&args[1..])
        .current_dir(dir)
        .output()
        .expect("run a command");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA named `subj`: ca.key and ca.pem in `dir`.
pub fn make_ca(dir: &Path, subj: &str) {
    let mut ca = vec!["openssl", "req", "-x509"];
    ca.extend(EC);
    ca.extend([
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        subj,
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ]);
    run(&ca, dir);
}

/// A certificate for `subj` signed by the CA of `dir`, with the extensions `ext` (an
/// openssl extension file's text): NAME.key and NAME.pem (and NAME.csr, NAME.cnf).
pub fn sign(dir: &Path, name: &str, subj: &str, ext: &str) {
    let (key, csr, pem, cnf) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.pem"),
        format!("{name}.cnf"),
    );
    let mut req = vec!["openssl", "req"];
    req.extend(EC);
    req.extend(["-keyout", &key, "-out", &csr, "-subj", subj]);
    run(&req, dir);
    std::fs::write(dir.join(&cnf), ext).expect("write an extension file");
    run(
        &[
            "openssl",
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &pem,
            "-days",
            "2",
            "-extfile",
            &cnf,
        ],
        dir,
    );
}
