//! `runtime_dir = "NAME"`: a directory under /run that supd makes for a service at each
//! of its starts, owned by the service's `user` (as systemd's RuntimeDirectory=). Here
//! only the name is checked; supervisor::spawn makes the directory.

/// Where runtime directories are made.
pub const RUN: &str = "/run";

/// Checks a `runtime_dir` value: one directory name (no '/', not "." or ".."), so that
/// the directory is always a child of /run, a directory only root writes to.
pub fn parse(s: &str) -> Result<String, String> {
    let bad = |why: &str| {
        Err(format!(
            "'{s}' {why}: expected one directory name, made under {RUN}, such as \"redis\""
        ))
    };
    if s.is_empty() {
        return bad("is empty");
    }
    if s.starts_with('/') {
        return bad("is an absolute path");
    }
    if s.contains('/') {
        return bad("holds a '/'");
    }
    if s == "." || s == ".." {
        return bad("is not a name");
    }
    if s.contains('\0') || s.chars().any(char::is_control) {
        return bad("holds a control character");
    }
    Ok(s.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_name_under_run_only() {
        assert_eq!(parse("redis"), Ok("redis".to_string()));
        assert_eq!(parse("php8.2-fpm"), Ok("php8.2-fpm".to_string()));
        for s in ["", "/run/redis", "a/b", "..", ".", "../etc", "a\nb"] {
            assert!(parse(s).is_err(), "{s:?} was taken");
        }
    }

    #[test]
    fn a_bad_name_is_a_config_error_at_its_place() {
        let dir = crate::scratch::Scratch::new("runtime-dir");
        let file = dir.join("sup.toml");
        let text = "[service.a]\ncommand = [\"/bin/true\"]\nruntime_dir = \"../etc\"\n";
        std::fs::write(&file, text).expect("write");
        let errors = crate::config::load(&file).expect_err("refused");
        let got = errors[0].to_string();
        let want = format!(
            "{}:3:15: service.a.runtime_dir: '../etc' holds a '/'",
            file.display()
        );
        assert!(got.starts_with(&want), "{got}");
        std::fs::write(&file, text.replace("../etc", "redis")).expect("write");
        let cfg = crate::config::load(&file).expect("valid");
        assert_eq!(cfg.services["a"].runtime_dir.as_deref(), Some("redis"));
    }
}
