//! `supctl versions`: a tool's versions, its upgrade's phase and what it waits for,
//! for people.

use super::*;

/// `versions`: a summary line, then one line per installed version with its marks.
pub(super) fn print_versions(o: &mut String, d: &Value) {
    let s = |k: &str| d[k].as_str().unwrap_or("-").to_string();
    outln!(
        o,
        "{}: current {}, previous {}, phase {}",
        s("tool"),
        s("current"),
        s("previous"),
        s("phase")
    );
    if d["phase"] == "probation" {
        let left = d["deadline_in_ms"]
            .as_u64()
            .map(|ms| Human(std::time::Duration::from_millis(ms)).to_string())
            .unwrap_or_else(|| "?".into());
        match d["probation_waits"].as_str() {
            Some(why) => outln!(
                o,
                "  probation of {} from {}: waits ({why}), {} left",
                s("proposed"),
                s("from"),
                d["probation_left_ms"]
                    .as_u64()
                    .map(|ms| Human(std::time::Duration::from_millis(ms)).to_string())
                    .unwrap_or_else(|| "?".into())
            ),
            None => outln!(
                o,
                "  probation of {} from {}: {left} left",
                s("proposed"),
                s("from")
            ),
        }
        let health: Vec<String> = d["health"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|h| {
                format!(
                    "{} {}",
                    h["service"].as_str().unwrap_or("?"),
                    h["health"].as_str().unwrap_or("?")
                )
            })
            .collect();
        if !health.is_empty() {
            outln!(o, "  health: {}", health.join(", "));
        }
    }
    if let Some(ms) = d["window_in_ms"].as_u64() {
        let left = Human(std::time::Duration::from_millis(ms));
        outln!(
            o,
            "  regression window: {left} left (a crash loop or an unhealthy verdict rolls back)"
        );
    }
    if let Some(r) = d["reason"].as_str() {
        outln!(o, "  last: {r}");
    }
    if let Some(e) = d["record_error"].as_str() {
        outln!(o, "  record: {e}");
    }
    if let Some(e) = d["write_error"].as_str() {
        let retry = d["retry_in_ms"]
            .as_u64()
            .map(|ms| Human(std::time::Duration::from_millis(ms)).to_string())
            .unwrap_or_else(|| "?".into());
        outln!(
            o,
            "  waiting: {}: {e}; nothing switched; retry in {retry}",
            s("pending")
        );
    }
    for v in d["versions"].as_array().into_iter().flatten() {
        let mut marks = Vec::new();
        for m in ["current", "previous", "probation", "irreversible"] {
            if v[m] == true {
                marks.push(m.to_string());
            }
        }
        if v["bad"] == true {
            let when = v["bad_time_ms"]
                .as_u64()
                .map(|ms| {
                    format!(
                        " at {}",
                        sup::time::utc_stamp(
                            std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms)
                        )
                    )
                })
                .unwrap_or_default();
            marks.push(format!(
                "bad{when}: {}",
                v["bad_reason"].as_str().unwrap_or("?")
            ));
        }
        if let Some(n) = v["attempts"].as_u64().filter(|n| *n > 0) {
            marks.push(format!("{n} attempt{}", if n == 1 { "" } else { "s" }));
        }
        outln!(
            o,
            "  {:<16} {}",
            v["version"].as_str().unwrap_or("?"),
            marks.join(", ")
        );
    }
}
