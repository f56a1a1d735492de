//! One problem in a config file, at a position, and how a person reads it. Its own
//! module so that loading (`load.rs`), walking a table (`walk.rs`) and the lint all name
//! it without importing one another.

use std::fmt;
use std::path::PathBuf;

/// One problem in a config file, at a position.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    pub file: PathBuf,
    /// 1-based; 0 when the error is about the file as a whole.
    pub line: usize,
    pub column: usize,
    pub key: String,
    pub message: String,
}

/// One error, one line: whatever the file's name, a key or a quoted value holds (a
/// newline in a quoted TOML key, a control character in a name) is shown escaped.
impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let file = Escaped(&self.file.to_string_lossy());
        let (key, message) = (Escaped(&self.key), Escaped(&self.message));
        match (self.line, self.key.is_empty()) {
            (0, _) => write!(f, "{file}: {message}"),
            (_, true) => write!(f, "{file}:{}:{}: {message}", self.line, self.column),
            (_, false) => write!(f, "{file}:{}:{}: {key}: {message}", self.line, self.column),
        }
    }
}

/// Text with its control characters written as Rust escapes (`\n`, `\u{1b}`).
struct Escaped<'a>(&'a str);

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in self.0.chars() {
            if c.is_control() {
                write!(f, "{}", c.escape_default())?;
            } else {
                write!(f, "{c}")?;
            }
        }
        Ok(())
    }
}
