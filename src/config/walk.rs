//! Reading typed values out of one parsed TOML file, collecting every error with its
//! position instead of stopping at the first.

use super::error::ConfigError;
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;
use toml::de::{DeTable, DeValue};
use toml::Spanned;

pub type Value<'i> = Spanned<DeValue<'i>>;

/// A position in a file.
#[derive(Clone)]
pub struct Place {
    pub file: PathBuf,
    pub line: usize,
    pub column: usize,
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file.display(), self.line, self.column)
    }
}

/// Puts a value read without error into its slot; a bad one leaves the default.
pub fn set<T>(slot: &mut T, value: Option<T>) {
    if let Some(v) = value {
        *slot = v;
    }
}

/// One file being read: its name, its text, and where its errors go.
pub struct FileCtx<'a> {
    pub path: &'a Path,
    pub text: &'a str,
    pub lines: Lines,
    pub errors: &'a mut Vec<ConfigError>,
    /// Where relative paths start, when not in this file's directory (an override's
    /// start where its service's defining file is).
    pub base: Option<PathBuf>,
}

impl<'a> FileCtx<'a> {
    pub fn new(path: &'a Path, text: &'a str, errors: &'a mut Vec<ConfigError>) -> Self {
        FileCtx {
            path,
            text,
            lines: Lines::new(text),
            errors,
            base: None,
        }
    }

    /// 1-based line and column of a byte offset of this file.
    pub fn pos(&self, offset: usize) -> (usize, usize) {
        self.lines.line_col(self.text, offset)
    }
    /// The directory relative paths in this file start from.
    pub fn dir(&self) -> PathBuf {
        if let Some(base) = &self.base {
            return base.clone();
        }
        self.path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| ".".into())
    }

    /// Records an error at `span` for `key`.
    pub fn err(&mut self, span: Range<usize>, key: &str, message: impl Into<String>) {
        let (line, column) = self.pos(span.start);
        self.errors.push(ConfigError {
            file: self.path.to_path_buf(),
            line,
            column,
            key: key.to_string(),
            message: message.into(),
        });
    }

    fn wrong_type(&mut self, v: &Value, key: &str, expected: &str) {
        let found = match v.get_ref() {
            DeValue::String(_) => "a string",
            DeValue::Integer(_) => "an integer",
            DeValue::Float(_) => "a float",
            DeValue::Boolean(_) => "a boolean",
            DeValue::Datetime(_) => "a date",
            DeValue::Array(_) => "an array",
            DeValue::Table(_) => "a table",
        };
        self.err(v.span(), key, format!("expected {expected}, found {found}"));
    }

    pub fn table<'v, 'i>(&mut self, v: &'v Value<'i>, key: &str) -> Option<&'v DeTable<'i>> {
        match v.get_ref() {
            DeValue::Table(t) => Some(t),
            _ => {
                self.wrong_type(v, key, "a table");
                None
            }
        }
    }

    pub fn string(&mut self, v: &Value, key: &str) -> Option<String> {
        match v.get_ref() {
            DeValue::String(s) => Some(s.to_string()),
            _ => {
                self.wrong_type(v, key, "a string");
                None
            }
        }
    }

    pub fn boolean(&mut self, v: &Value, key: &str) -> Option<bool> {
        match v.get_ref() {
            DeValue::Boolean(b) => Some(*b),
            _ => {
                self.wrong_type(v, key, "true or false");
                None
            }
        }
    }

    pub fn integer(&mut self, v: &Value, key: &str) -> Option<i64> {
        match v.get_ref() {
            DeValue::Integer(i) => match i64::from_str_radix(i.as_str(), i.radix()) {
                Ok(n) => Some(n),
                Err(_) => {
                    self.err(v.span(), key, "integer out of range");
                    None
                }
            },
            _ => {
                self.wrong_type(v, key, "an integer");
                None
            }
        }
    }

    /// A string parsed by `parse`, whose error message says what was expected.
    pub fn parsed<T>(
        &mut self,
        v: &Value,
        key: &str,
        parse: impl Fn(&str) -> Result<T, String>,
    ) -> Option<T> {
        let s = self.string(v, key)?;
        match parse(&s) {
            Ok(t) => Some(t),
            Err(e) => {
                self.err(v.span(), key, e);
                None
            }
        }
    }

    pub fn duration(&mut self, v: &Value, key: &str) -> Option<Duration> {
        self.parsed(v, key, crate::time::parse_duration)
    }

    /// A string among `choices`.
    pub fn choice<T: Copy>(&mut self, v: &Value, key: &str, choices: &[(&str, T)]) -> Option<T> {
        self.parsed(v, key, |s| {
            choices
                .iter()
                .find(|(name, _)| *name == s)
                .map(|(_, t)| *t)
                .ok_or_else(|| {
                    let names: Vec<String> =
                        choices.iter().map(|(n, _)| format!("\"{n}\"")).collect();
                    format!("'{s}' is not one of {}", names.join(", "))
                })
        })
    }

    pub fn array<'v, 'i>(&mut self, v: &'v Value<'i>, key: &str) -> Option<&'v [Value<'i>]> {
        match v.get_ref() {
            DeValue::Array(a) => Some(&a[..]),
            _ => {
                self.wrong_type(v, key, "an array");
                None
            }
        }
    }

    pub fn strings(&mut self, v: &Value, key: &str) -> Option<Vec<String>> {
        let items = self.array(v, key)?;
        let mut out = Vec::with_capacity(items.len());
        let mut ok = true;
        for item in items {
            match self.string(item, key) {
                Some(s) => out.push(s),
                None => ok = false,
            }
        }
        ok.then_some(out)
    }

    /// A path, made absolute against this file's directory.
    pub fn path(&mut self, v: &Value, key: &str) -> Option<PathBuf> {
        let s = self.string(v, key)?;
        if s.is_empty() {
            self.err(v.span(), key, "expected a path, found an empty string");
            return None;
        }
        Some(self.dir().join(s))
    }

    /// Reports a key that this table does not have: the nearest known one when one is
    /// near enough to be a slip (`comand`, `stop-timeout`), else the known keys when
    /// they are few; a table of many (a service's) points to sup.toml(5) instead.
    pub fn unknown(&mut self, span: Range<usize>, key: &str, known: &[&str]) {
        let name = key.rsplit('.').next().unwrap_or(key);
        let message = match nearest(name, known) {
            Some(near) => format!("unknown key; did you mean `{near}`?"),
            None if known.len() <= MAX_LISTED => {
                format!("unknown key (expected one of: {})", known.join(", "))
            }
            None => "unknown key (not a key of this table: sup.toml(5) lists them)".into(),
        };
        self.err(span, key, message);
    }
}

/// A table with at most this many keys lists them for an unknown key nothing is near.
const MAX_LISTED: usize = 20;

/// The known name nearest `name` by edit distance (case and `-` for `_` forgiven), when
/// it is near enough to be a slip: at most 1 edit for a name of up to 4 characters, 2
/// up to 8, else 3. The first known one among equals.
pub fn nearest<'k>(name: &str, known: &[&'k str]) -> Option<&'k str> {
    let norm = name.to_ascii_lowercase().replace('-', "_");
    let limit = match norm.chars().count() {
        0..=4 => 1,
        5..=8 => 2,
        _ => 3,
    };
    known
        .iter()
        .map(|k| (distance(&norm, k), *k))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// The optimal string alignment distance: insertions, deletions, substitutions and
/// swaps of two neighbours, one edit each.
fn distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    // Rows i-2, i-1 and i of the table.
    let mut before: Vec<usize> = vec![0; b.len() + 1];
    let mut last: Vec<usize> = (0..=b.len()).collect();
    for i in 1..=a.len() {
        let mut row = vec![i; b.len() + 1];
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            row[j] = (last[j] + 1).min(row[j - 1] + 1).min(last[j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                row[j] = row[j].min(before[j - 2] + 1);
            }
        }
        before = std::mem::replace(&mut last, row);
    }
    last[b.len()]
}

/// Where each line of a text starts, so that a position is found by binary search:
/// reading a file with many errors or many services stays linear in its size.
pub struct Lines {
    /// Byte offsets of the first byte of each line; `starts[0] == 0`.
    starts: Vec<usize>,
}

impl Lines {
    pub fn new(text: &str) -> Lines {
        let mut starts = vec![0];
        starts.extend(
            text.bytes()
                .enumerate()
                .filter(|(_, b)| *b == b'\n')
                .map(|(i, _)| i + 1),
        );
        Lines { starts }
    }

    /// 1-based line and column (in characters) of a byte offset of `text`.
    pub fn line_col(&self, text: &str, offset: usize) -> (usize, usize) {
        let offset = floor_char_boundary(text, offset.min(text.len()));
        // The last line starting at or before `offset`.
        let line = self.starts.partition_point(|&s| s <= offset);
        let start = self.starts[line - 1];
        (line, text[start..offset].chars().count() + 1)
    }
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions() {
        let text = "a = 1\nbé = 2\n";
        let lines = Lines::new(text);
        assert_eq!(lines.line_col(text, 0), (1, 1));
        assert_eq!(lines.line_col(text, 5), (1, 6));
        assert_eq!(lines.line_col(text, 6), (2, 1));
        assert_eq!(lines.line_col(text, 8), (2, 2), "inside é: its start");
        assert_eq!(lines.line_col(text, 10), (2, 4));
        assert_eq!(lines.line_col(text, 999), (3, 1));
        assert_eq!(Lines::new("").line_col("", 0), (1, 1));
    }

    // see: issue 24, item 4 — an unknown key listed all 34 keys instead of the nearest.
    #[test]
    fn the_nearest_key_is_named_only_when_near_enough() {
        let keys = [
            "command",
            "cwd",
            "user",
            "group",
            "stop_timeout",
            "stop_signal",
        ];
        assert_eq!(nearest("comand", &keys), Some("command"));
        assert_eq!(
            nearest("comamnd", &keys),
            Some("command"),
            "a swap is one edit"
        );
        assert_eq!(nearest("Command", &keys), Some("command"));
        assert_eq!(nearest("stop-timeout", &keys), Some("stop_timeout"));
        assert_eq!(nearest("stop_timout", &keys), Some("stop_timeout"));
        assert_eq!(nearest("usr", &keys), Some("user"));
        assert_eq!(
            nearest("uid", &keys),
            None,
            "two edits is too far for a short name"
        );
        assert_eq!(nearest("frobnicate", &keys), None);
        assert_eq!(nearest("", &keys), None);
        assert_eq!(distance("abc", "abc"), 0);
        assert_eq!(distance("", "abc"), 3);
        assert_eq!(distance("ca", "abc"), 3);
    }

    #[test]
    fn an_unknown_key_says_the_nearest_else_lists_a_short_table() {
        let mut errors = Vec::new();
        let mut ctx = FileCtx::new(Path::new("x.toml"), "k = 1\n", &mut errors);
        ctx.unknown(0..1, "service.a.comand", &["tool", "command"]);
        ctx.unknown(0..1, "service.a.health.bogus", &["tcp", "http"]);
        let many: Vec<String> = (0..=MAX_LISTED).map(|i| format!("key{i:02}long")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        ctx.unknown(0..1, "service.a.zzz", &many);
        let said: Vec<&str> = errors.iter().map(|e| e.message.as_str()).collect();
        assert_eq!(
            said,
            [
                "unknown key; did you mean `command`?",
                "unknown key (expected one of: tcp, http)",
                "unknown key (not a key of this table: sup.toml(5) lists them)",
            ]
        );
    }
}
