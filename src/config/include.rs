//! The `include` key's patterns: a directory and a last component that may hold `*`
//! and `?`.

use std::path::{Path, PathBuf};

/// Expands a pattern whose last component may hold `*` and `?`; sorted.
pub(super) fn glob(pattern: &Path) -> Vec<PathBuf> {
    let (Some(dir), Some(name)) = (
        pattern.parent(),
        pattern.file_name().and_then(|n| n.to_str()),
    ) else {
        return Vec::new();
    };
    if !name.contains(['*', '?']) {
        return if pattern.exists() {
            vec![pattern.to_path_buf()]
        } else {
            Vec::new()
        };
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| !n.starts_with('.') && wildcard(name.as_bytes(), n.as_bytes()))
        })
        .map(|e| e.path())
        .collect();
    out.sort();
    out
}

/// Shell-style match of `*` and `?`, in time proportional to the pattern's length times
/// the name's (the last `*` is the only one ever backtracked to).
fn wildcard(p: &[u8], s: &[u8]) -> bool {
    let (mut pi, mut si) = (0, 0);
    // After a `*`: where in the pattern to resume, and the name position it then matches.
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        match p.get(pi) {
            Some(b'*') => {
                star = Some((pi + 1, si));
                pi += 1;
            }
            Some(&c) if c == b'?' || c == s[si] => {
                pi += 1;
                si += 1;
            }
            _ => match star {
                Some((sp, ss)) => {
                    star = Some((sp, ss + 1));
                    pi = sp;
                    si = ss + 1;
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::wildcard;

    #[test]
    fn wildcards() {
        assert!(wildcard(b"*.toml", b"a.toml"));
        assert!(wildcard(b"a?c", b"abc"));
        assert!(!wildcard(b"*.toml", b"a.txt"));
        assert!(wildcard(b"*", b""));
    }

    #[test]
    fn wildcards_with_many_stars_are_linear() {
        let name = [b'a'; 4000];
        let mut pattern = b"*a".repeat(30);
        pattern.push(b'b');
        // Backtracking over every star would take 4000^30 steps.
        assert!(!wildcard(&pattern, &name));
        assert!(wildcard(b"*a*a*", &name));
        assert!(wildcard(b"a*?", b"ab"));
        assert!(!wildcard(b"a*?", b"a"));
        assert!(wildcard(b"**", b""));
    }
}
