//! The house's rules that the compiler does not keep (ARCHITECTURE.md, "Parts and the
//! coordinator"): a part imports neither another part nor the coordinator, and `unsafe`
//! lives in `src/sys/` alone, the programs of `src/bin/` included. Read from the sources,
//! so a new `use crate::supervisor` in a part fails here before review.

use std::fs;
use std::path::{Path, PathBuf};

/// Each part: its module's name under `crate::`, and the files that make it. (A service's
/// machine, `service.rs`, is not a part but a pure core below them: its `State` and
/// `Event` are what parts speak of.)
const PARTS: &[(&str, &[&str])] = &[
    ("leases", &["src/leases.rs"]),
    ("starts", &["src/starts.rs"]),
    (
        "control",
        &[
            "src/control.rs",
            "src/control/socket.rs",
            "src/control/parked.rs",
        ],
    ),
    (
        "health",
        &["src/health.rs", "src/health/run.rs", "src/health/watch.rs"],
    ),
    ("notify", &["src/notify.rs"]),
    ("tool_state", &["src/tool_state.rs"]),
    ("metrics", &["src/metrics.rs", "src/metrics/file.rs"]),
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The file's code without its comments (line comments and doc comments; block comments
/// are not used in this crate) and without the text of string literals, so that words
/// in prose are not taken for code.
fn code_of(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut out = String::new();
    for line in text.lines() {
        let mut in_str = false;
        let mut prev = ' ';
        let mut kept = String::new();
        let chars: Vec<char> = line.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            if !in_str && c == '/' && chars.get(i + 1) == Some(&'/') {
                break;
            }
            if c == '"' && prev != '\\' && prev != '\'' {
                in_str = !in_str;
                kept.push(c);
            } else if !in_str {
                kept.push(c);
            }
            prev = if prev == '\\' && c == '\\' { ' ' } else { c };
            i += 1;
        }
        out.push_str(&kept);
        out.push('\n');
    }
    out
}

/// The modules of the crate that `code` names: `crate::NAME` paths and the names in
/// `use crate::{A, B::..}` groups.
fn crate_modules_named(code: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let name: String = item
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    found.push(name);
                }
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            found.push(name);
        }
    }
    found
}

#[test]
fn no_part_imports_another_part_or_the_coordinator() {
    let mut broken = Vec::new();
    for (part, files) in PARTS {
        for file in *files {
            let code = code_of(&root().join(file));
            for named in crate_modules_named(&code) {
                let other_part = PARTS.iter().any(|(p, _)| *p == named && p != part);
                if named == "supervisor" || named == "commands" || other_part {
                    broken.push(format!("{file} (part {part}) names crate::{named}"));
                }
            }
            if code.contains("super::supervisor") {
                broken.push(format!("{file} (part {part}) names super::supervisor"));
            }
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

#[test]
fn the_checker_finds_a_named_module() {
    // The rule above can only fail if this finds what it looks for.
    let code = "use crate::{config::X, supervisor::Supervisor};\nfn f() { crate::leases::g(); }\n// crate::starts\nlet s = \"crate::tools\";";
    let text = std::env::temp_dir().join(format!("sup-arch-{}.rs", std::process::id()));
    fs::write(&text, code).expect("write");
    let named = crate_modules_named(&code_of(&text));
    let _ = fs::remove_file(&text);
    assert_eq!(named, ["config", "supervisor", "leases"]);
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn unsafe_lives_in_sys_alone() {
    let mut files = Vec::new();
    sources(&root().join("src"), &mut files);
    assert!(files.len() > 50, "the sources were found: {}", files.len());
    let sys = root().join("src/sys");
    let mut broken = Vec::new();
    for f in &files {
        if f.starts_with(&sys) || f == &root().join("src/sys.rs") {
            continue;
        }
        let code = code_of(f);
        let words = code.split(|c: char| !(c.is_alphanumeric() || c == '_'));
        if words.clone().any(|w| w == "unsafe") {
            broken.push(f.display().to_string());
        }
    }
    assert!(broken.is_empty(), "unsafe outside src/sys/: {broken:?}");
    let in_sys = code_of(&root().join("src/sys/processes.rs"));
    assert!(
        in_sys.contains("unsafe"),
        "the checker sees unsafe where it is"
    );
}

/// The files that may walk over every process of the host (`proc::all`): its
/// definition, and the sweep at start of what a killed predecessor left
/// (`leftovers.rs`). Nothing done per exit, stop or status may (SPEC, "Services":
/// finding what is left of a run never costs a walk over the host's processes); a run
/// without a cgroup is found below supd (`subtree.rs`).
const WALKS_ALLOWED: &[&str] = &["src/proc.rs", "src/leftovers.rs"];

/// Whether `code` calls or imports `proc::all`.
fn walks(code: &str) -> bool {
    let named = |rest: &str| {
        rest.strip_prefix("all")
            .is_some_and(|r| !r.starts_with(|c: char| c.is_alphanumeric() || c == '_'))
    };
    let mut rest = code;
    while let Some(at) = rest.find("proc::") {
        rest = &rest[at + "proc::".len()..];
        if named(rest) {
            return true;
        }
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            if group[..end].split(',').any(|i| named(i.trim())) {
                return true;
            }
        }
    }
    false
}

#[test]
fn only_the_start_up_sweep_walks_the_host_s_processes() {
    let mut files = Vec::new();
    sources(&root().join("src"), &mut files);
    let mut broken = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(root()).expect("under the root");
        if WALKS_ALLOWED.iter().any(|a| rel == Path::new(a)) {
            continue;
        }
        if walks(&code_of(f)) {
            broken.push(rel.display().to_string());
        }
    }
    assert!(
        broken.is_empty(),
        "proc::all (a walk over the host's processes) outside {WALKS_ALLOWED:?}: {broken:?}"
    );
    // The rule can fail: it sees the walk where it is, and in the forms it takes.
    assert!(walks(&code_of(&root().join("src/leftovers.rs"))));
    assert!(walks("let s = crate::proc::all();"));
    assert!(walks("use crate::proc::{self, all};"));
    assert!(!walks("crate::proc::stat(pid); crate::proc::all_x();"));
}
