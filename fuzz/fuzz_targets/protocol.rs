//! The control protocol's decoder on any line: it never panics, and what it cannot
//! decode gets an error answer that is one JSON line.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err((id, e)) = sup::protocol::decode(data) {
        let answer = sup::protocol::encode_err(&id, &e);
        assert_eq!(answer.last(), Some(&b'\n'));
        assert!(!answer[..answer.len() - 1].contains(&b'\n'));
        let v: serde_json::Value = serde_json::from_slice(&answer).expect("an answer is JSON");
        assert_eq!(v["ok"], false);
    }
});
