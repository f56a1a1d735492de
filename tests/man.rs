//! The manual pages stay `mandoc -Tlint` clean (style level, except for cross references
//! to our own pages, which are not installed where the test runs).

use std::process::Command;

#[test]
fn man_pages_are_lint_clean() {
    let pages = [
        "man/supd.8",
        "man/supctl.8",
        "man/sup.toml.5",
        "man/sup-lease.8",
    ];
    let Ok(out) = Command::new("mandoc")
        .args(["-Tlint", "-W", "style"])
        .args(pages)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
    else {
        assert!(
            std::env::var_os("CI").is_none(),
            "mandoc is missing: .ci/run installs it"
        );
        eprintln!("skipped: mandoc is not installed (apt-get install mandoc)");
        return;
    };
    // -Tlint writes its messages to standard output.
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let problems: Vec<&str> = text
        .lines()
        .filter(|l| {
            !l.contains("referenced manual not found")
                && !l.contains("mandoc.db")
                && !l.contains("makewhatis")
        })
        .collect();
    assert!(
        problems.is_empty(),
        "mandoc -Tlint:\n{}",
        problems.join("\n")
    );
}
