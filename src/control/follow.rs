//! What a client of `log -f` follows: which services, and which of their lines.

/// What a client follows (`log -f`): which services' lines, and which of them.
#[derive(Debug)]
pub struct Follow {
    /// The services followed; `None`: every service, those a reload adds too.
    pub services: Option<Vec<String>>,
    /// Only the lines of stderr kept apart.
    pub stderr: bool,
    /// Only the lines whose text (not its stamp) matches.
    pub grep: Option<crate::sys::Regex>,
}

impl Follow {
    /// Whether the lines of `service` are followed.
    pub fn follows(&self, service: &str) -> bool {
        self.services
            .as_ref()
            .is_none_or(|s| s.iter().any(|n| n == service))
    }

    /// Whether a stored line of a followed service is sent.
    pub fn takes(&self, line: &str) -> bool {
        let (text, err) = crate::logs::text_of(line);
        (!self.stderr || err) && self.grep.as_ref().is_none_or(|re| re.is_match(text))
    }
}
