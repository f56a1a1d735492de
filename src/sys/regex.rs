//! POSIX extended regular expressions through libc's `regcomp`/`regexec` (`supctl log
//! --grep`): supd matches its kept lines and followed lines with them, no crate needed.

use std::ffi::CString;

/// A compiled POSIX extended regular expression (`REG_EXTENDED | REG_NOSUB`).
pub struct Regex {
    /// Boxed: the compiled pattern stays at one address from `regcomp` to `regfree`.
    re: Box<libc::regex_t>,
}

impl Regex {
    /// Compiles `pattern`; an error says `regerror`'s words for it.
    pub fn new(pattern: &str) -> Result<Regex, String> {
        let c = CString::new(pattern).map_err(|_| "it holds a NUL byte".to_string())?;
        // SAFETY: `regex_t` is plain data that regcomp fills; an all-zero value is a
        // valid (unused) one to hand it.
        let mut re: Box<libc::regex_t> = Box::new(unsafe { std::mem::zeroed() });
        // SAFETY: `re` points to a live, writable regex_t and `c` to a NUL-terminated
        // string, both outliving the call; regcomp keeps no pointer to `c`.
        let rc =
            unsafe { libc::regcomp(&mut *re, c.as_ptr(), libc::REG_EXTENDED | libc::REG_NOSUB) };
        if rc != 0 {
            let mut buf = [0u8; 256];
            // SAFETY: regerror writes at most `buf.len()` bytes (NUL included) into
            // `buf`, which outlives the call; `re` is the regex_t regcomp just failed
            // on, which regerror may read. A failed regcomp leaves nothing to free.
            let n = unsafe { libc::regerror(rc, &*re, buf.as_mut_ptr().cast(), buf.len()) };
            let len = n.min(buf.len()).saturating_sub(1);
            let words = String::from_utf8_lossy(&buf[..len]).into_owned();
            return Err(if words.is_empty() {
                format!("error {rc}")
            } else {
                words
            });
        }
        Ok(Regex { re })
    }

    /// Whether `text` holds a match. A text with a NUL byte is matched up to it.
    pub fn is_match(&self, text: &str) -> bool {
        let upto = text.split('\0').next().unwrap_or("");
        let Ok(c) = CString::new(upto) else {
            return false;
        };
        // SAFETY: `self.re` was compiled by regcomp and not freed yet; `c` is a
        // NUL-terminated string outliving the call; with REG_NOSUB no match array is
        // written (nmatch 0, a null pmatch is allowed).
        let rc = unsafe { libc::regexec(&*self.re, c.as_ptr(), 0, std::ptr::null_mut(), 0) };
        rc == 0
    }
}

impl Drop for Regex {
    fn drop(&mut self) {
        // SAFETY: `self.re` was compiled by a successful regcomp (a `Regex` exists only
        // then) and is freed once, here.
        unsafe { libc::regfree(&mut *self.re) }
    }
}

impl std::fmt::Debug for Regex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Regex")
    }
}

#[cfg(test)]
mod tests {
    // Test code: an `expect` here fails a test, never supd.
    use super::*;

    #[test]
    fn extended_patterns_match_and_bad_ones_say_why() {
        let re = Regex::new("^(GET|POST) /a+$").expect("compiles");
        assert!(re.is_match("GET /aaa"));
        assert!(!re.is_match("PUT /a"));
        assert!(Regex::new("err|warn")
            .expect("alternation")
            .is_match("a warning"));
        let e = Regex::new("(unclosed").expect_err("a bad pattern");
        assert!(!e.is_empty() && !e.starts_with("error "), "{e}");
        assert!(Regex::new("a\0b").is_err());
    }
}
