//! The config loader on any text: it never panics, and every error it reports is one
//! line (`supd --check` prints one error per line, whatever a name holds).
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(errors) = sup::config::load_text(Path::new("/fuzz/sup.toml"), text) {
        assert!(!errors.is_empty());
        for e in &errors {
            let line = e.to_string();
            assert!(!line.chars().any(char::is_control), "{line:?}");
            assert!(line.starts_with("/fuzz/sup.toml"), "{line:?}");
        }
    }
});
