//! `supctl log [SERVICE...] [-n N] [-f] [--since TIME] [--grep RE] [--stderr]`: the
//! request, the lines in local time and named, and `-f`'s following, through a `reexec`
//! of supd too.

use super::{emit, note, Conn, Failure};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// How long `log -f` waits for a supd that went away to answer again on its socket (a
/// `reexec`) before it gives up.
pub const COME_BACK: Duration = Duration::from_secs(5);

/// The forms `--since` takes, for its usage error.
const SINCE_FORMS: &str = "a duration ago (\"10m\", \"2h\"), a local date and time (\"2026-12-02 10:00\", \"10:00:05\" for today), RFC 3339 (\"2026-12-02T10:00:00+01:00\") or @EPOCH seconds";

/// The request for `log`'s arguments.
pub fn request(rest: &[String]) -> Result<Value, Failure> {
    let usage = |m: String| Failure::Usage(m);
    let mut services: Vec<String> = Vec::new();
    let (mut lines, mut follow, mut stderr) = (10usize, false, false);
    let (mut since, mut grep) = (None, None);
    let mut it = rest.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-f" | "--follow" => follow = true,
            "--stderr" => stderr = true,
            "-n" => {
                lines = it
                    .next()
                    .and_then(|n| n.parse().ok())
                    .ok_or_else(|| usage("-n needs a number".into()))?
            }
            "--since" => {
                let t = it
                    .next()
                    .ok_or_else(|| usage(format!("--since needs a TIME: {SINCE_FORMS}")))?;
                let now = now_ms();
                let ms = parse_since(t, now, &|s| sup::sys::utc_offset(s))
                    .map_err(|e| usage(format!("--since '{t}': {e}: use {SINCE_FORMS}")))?;
                since = Some(ms);
            }
            "--grep" => {
                grep = Some(
                    it.next()
                        .ok_or_else(|| usage("--grep needs a regular expression".into()))?
                        .clone(),
                )
            }
            other if other.starts_with('-') => {
                return Err(usage(format!("log: unexpected '{other}'")))
            }
            s => services.push(s.to_string()),
        }
    }
    let mut req = json!({"cmd": "log", "services": services, "lines": lines, "follow": follow, "stderr": stderr});
    if let Some(ms) = since {
        req["since_ms"] = json!(ms);
    }
    if let Some(re) = grep {
        req["grep"] = json!(re);
    }
    Ok(req)
}

/// The clock now, in Unix milliseconds.
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// `--since TIME` as Unix milliseconds, `now_ms` being now and `offset` the local zone's
/// offset east of UTC at a Unix second: a duration ago ("10m"), "@EPOCH" seconds, RFC
/// 3339 with its offset ("2026-12-02T10:00:00Z", "...+01:00"), or a local date and time
/// ("2026-12-02 10:00", "2026-12-02T10:00:05", "2026-12-02", or "10:00:05" for today).
pub fn parse_since(t: &str, now_ms: u64, offset: &dyn Fn(i64) -> i64) -> Result<u64, String> {
    let t = t.trim();
    let non_neg = |ms: i64| u64::try_from(ms).map_err(|_| "before 1970".to_string());
    if let Some(epoch) = t.strip_prefix('@') {
        let (secs, frac) = epoch.split_once('.').unwrap_or((epoch, ""));
        let secs: i64 = secs.parse().map_err(|_| "not a number of seconds")?;
        return non_neg(secs.saturating_mul(1000).saturating_add(fraction_ms(frac)?));
    }
    if let Ok(d) = sup::time::parse_duration(t) {
        return Ok(now_ms.saturating_sub(d.as_millis() as u64));
    }
    // A date, with or without a time of day and a zone; or a time of day alone.
    let (date, rest) = match t.get(..10).filter(|d| d.as_bytes().get(4) == Some(&b'-')) {
        Some(d) => (Some(d), &t[10..]),
        None => (None, t),
    };
    let rest = match (date, rest.chars().next()) {
        (Some(_), Some('T' | 't' | ' ')) => &rest[1..],
        (Some(_), None) => "00:00",
        (Some(_), Some(_)) => return Err("not a time".into()),
        (None, _) => rest,
    };
    // The zone: "Z", "+HH:MM" or "-HH:MM" at the end; none means local time.
    let (clock, zone) = match rest.find(['Z', 'z', '+', '-']) {
        Some(i) => (&rest[..i], Some(&rest[i..])),
        None => (rest, None),
    };
    let secs_of_day = time_of_day(clock)?;
    let frac_ms = clock
        .split_once('.')
        .map_or(Ok(0), |(_, f)| fraction_ms(f))?;
    let days = match date {
        Some(d) => days_of(d)?,
        None if zone.is_some() => return Err("a zone needs a date".into()),
        None => {
            let now_s = (now_ms / 1000) as i64;
            (now_s + offset(now_s)).div_euclid(86_400)
        }
    };
    let naive = days * 86_400 + secs_of_day;
    let utc_s = match zone {
        Some(z) => naive - zone_offset(z)?,
        None => {
            // The local time's instant: its offset is the zone's at that instant.
            let guess = naive - offset(naive);
            naive - offset(guess)
        }
    };
    non_neg(utc_s.saturating_mul(1000) + frac_ms)
}

/// "HH:MM" or "HH:MM:SS" (a fraction after the seconds is read apart) to seconds.
fn time_of_day(s: &str) -> Result<i64, String> {
    let s = s.split_once('.').map_or(s, |(w, _)| w);
    let parts: Vec<&str> = s.split(':').collect();
    let num = |p: &str, max: i64| -> Result<i64, String> {
        match p.parse::<i64>() {
            Ok(n) if p.len() == 2 && (0..=max).contains(&n) => Ok(n),
            _ => Err("not a time".into()),
        }
    };
    match parts.as_slice() {
        [h, m] => Ok(num(h, 23)? * 3600 + num(m, 59)? * 60),
        [h, m, sec] => Ok(num(h, 23)? * 3600 + num(m, 59)? * 60 + num(sec, 60)?),
        _ => Err("not a time".into()),
    }
}

/// The digits after a decimal point as milliseconds (more than three are cut).
fn fraction_ms(f: &str) -> Result<i64, String> {
    if f.is_empty() {
        return Ok(0);
    }
    if !f.bytes().all(|b| b.is_ascii_digit()) {
        return Err("not a fraction of a second".into());
    }
    let three: String = f.chars().chain("000".chars()).take(3).collect();
    three
        .parse()
        .map_err(|_| "not a fraction of a second".into())
}

/// "2026-12-02" to days since 1970-01-01.
fn days_of(d: &str) -> Result<i64, String> {
    let bad = || "not a date".to_string();
    let mut it = d.split('-');
    let (Some(y), Some(m), Some(day), None) = (it.next(), it.next(), it.next(), it.next()) else {
        return Err(bad());
    };
    let y: i64 = y.parse().map_err(|_| bad())?;
    let m: u32 = m.parse().map_err(|_| bad())?;
    let day: u32 = day.parse().map_err(|_| bad())?;
    if !(1..=12).contains(&m) || !(1..=31).contains(&day) {
        return Err(bad());
    }
    Ok(sup::time::days_from_civil(y, m, day))
}

/// "Z", "+01:00", "-0500" to seconds east of UTC.
fn zone_offset(z: &str) -> Result<i64, String> {
    if z.eq_ignore_ascii_case("z") {
        return Ok(0);
    }
    let bad = || "not a zone offset".to_string();
    let (sign, hm) = match z.split_at(1) {
        ("+", hm) => (1, hm),
        ("-", hm) => (-1, hm),
        _ => return Err(bad()),
    };
    let digits: String = hm.chars().filter(|c| *c != ':').collect();
    if digits.len() != 4 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let h: i64 = digits[..2].parse().map_err(|_| bad())?;
    let m: i64 = digits[2..].parse().map_err(|_| bad())?;
    Ok(sign * (h * 3600 + m * 60))
}

/// A stored line's stamp ("2026-12-02T10:00:05.123Z") as Unix milliseconds.
pub fn stamp_ms(stamp: &str) -> Option<u64> {
    parse_since(stamp, 0, &|_| 0)
        .ok()
        .filter(|_| stamp.ends_with('Z'))
}

/// One line as `log` shows it: `TIME NAME: TEXT`, the time local as `watch` shows it
/// (`offset` of the zone at a Unix second), the date before it when it is not today's;
/// a line whose stamp cannot be read is shown as it is.
pub fn human_line(service: &str, line: &str, now_ms: u64, offset: &dyn Fn(i64) -> i64) -> String {
    let (stamp, text) = line.split_once(' ').unwrap_or((line, ""));
    let Some(ms) = stamp_ms(stamp) else {
        return format!("{service}: {line}");
    };
    let off = offset((ms / 1000) as i64);
    let clock = sup::time::clock_stamp(ms, off);
    let day = sup::time::date_stamp(ms, off);
    let now_s = (now_ms / 1000) as i64;
    if day == sup::time::date_stamp(now_ms, offset(now_s)) {
        format!("{clock} {service}: {text}")
    } else {
        format!("{day} {clock} {service}: {text}")
    }
}

/// Prints `log`'s answer: the new shape (`lines` of objects) or an old supd's (one
/// service, lines as strings); what was skipped goes to stderr.
pub fn print(o: &mut String, err: &mut String, data: &Value) {
    let now = now_ms();
    let offset = |s| sup::sys::utc_offset(s);
    let old_name = data["service"].as_str().unwrap_or("?");
    for l in data["lines"].as_array().into_iter().flatten() {
        let (service, line) = match l {
            Value::String(line) => (old_name, line.as_str()),
            _ => (
                l["service"].as_str().unwrap_or("?"),
                l["line"].as_str().unwrap_or(""),
            ),
        };
        o.push_str(&human_line(service, line, now, &offset));
        o.push('\n');
    }
    for s in data["skipped"].as_array().into_iter().flatten() {
        err.push_str(&format!(
            "supctl: skipped {}: {}\n",
            s["service"].as_str().unwrap_or("?"),
            s["why"].as_str().unwrap_or("?")
        ));
    }
}

/// What `-f` has shown last: the latest stamp, and the lines shown with it, so that
/// the lines asked again after a `reexec` (from that stamp on) are not shown twice.
#[derive(Default)]
pub struct Seen {
    stamp: String,
    at_stamp: Vec<(String, String)>,
}

impl Seen {
    /// Notes a line shown.
    pub fn shown(&mut self, service: &str, line: &str) {
        let stamp = line.split_once(' ').map_or(line, |(s, _)| s);
        if stamp != self.stamp {
            self.stamp = stamp.to_string();
            self.at_stamp.clear();
        }
        self.at_stamp.push((service.to_string(), line.to_string()));
    }

    /// Whether a line asked again (from the last stamp on) was shown already.
    pub fn already(&self, service: &str, line: &str) -> bool {
        let stamp = line.split_once(' ').map_or(line, |(s, _)| s);
        stamp < self.stamp.as_str()
            || (stamp == self.stamp && self.at_stamp.iter().any(|(s, l)| s == service && l == line))
    }
}

/// `log -f`: prints the first answer, then each followed line. When supd goes away it
/// says so and waits up to [`COME_BACK`] for supd to answer again on its socket (a
/// `reexec`): then it asks for the lines from the last stamp seen on, shows those not
/// shown yet, and follows again; else it fails as "cannot reach supd" (exit 4).
pub fn follow(
    mut conn: Conn,
    socket: &str,
    request: &Value,
    first: Value,
    json: bool,
) -> Result<(), Failure> {
    let mut seen = Seen::default();
    let mut since_ms = now_ms();
    show_answer(&first, json, &mut seen, false)?;
    loop {
        conn.wait_for_ever();
        let why = loop {
            match conn.next(None) {
                Ok(Some(event)) => {
                    let (service, line) = (
                        event["service"].as_str().unwrap_or("?"),
                        event["line"].as_str().unwrap_or(""),
                    );
                    seen.shown(service, line);
                    if json {
                        emit(&format!("{event}\n"))?;
                    } else {
                        let offset = |s| sup::sys::utc_offset(s);
                        emit(&format!(
                            "{}\n",
                            human_line(service, line, now_ms(), &offset)
                        ))?;
                    }
                }
                Ok(None) => break "it closed the connection".to_string(),
                Err(Failure::Unreachable(m)) => break m,
                Err(other) => return Err(other),
            }
        };
        note(&format!(
            "supctl: supd went away ({why}); waiting up to {}s for it to come back",
            COME_BACK.as_secs()
        ));
        if let Some(ms) = stamp_ms(&seen.stamp) {
            since_ms = ms;
        }
        let mut again = request.clone();
        again["since_ms"] = json!(since_ms);
        again["lines"] = json!(1_000_000_000u64);
        let (c, data) = come_back(socket, &again).ok_or_else(|| {
            Failure::Unreachable(format!(
                "supd went away ({why}) and did not come back within {}s",
                COME_BACK.as_secs()
            ))
        })??;
        note("supctl: supd is back; following again");
        show_answer(&data, json, &mut seen, true)?;
        conn = c;
    }
}

/// Connects again within [`COME_BACK`] and asks `request`; `None` if supd did not answer.
#[allow(clippy::type_complexity)]
fn come_back(socket: &str, request: &Value) -> Option<Result<(Conn, Value), Failure>> {
    let until = Instant::now() + COME_BACK;
    while Instant::now() < until {
        let left = until.saturating_duration_since(Instant::now());
        if let Ok(mut c) = Conn::open(socket, Some(left.max(Duration::from_millis(100)))) {
            match c.call(request) {
                Ok(data) => return Some(Ok((c, data))),
                Err(Failure::Unreachable(_)) => {}
                Err(other) => return Some(Err(other)),
            }
        }
        // Not listening yet: a new try soon (supd's exec takes milliseconds).
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

/// Prints an answer's lines (`again`: those not shown yet); as JSON, the answer itself.
fn show_answer(data: &Value, json: bool, seen: &mut Seen, again: bool) -> Result<(), Failure> {
    let fresh: Vec<Value> = data["lines"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|l| {
            let (service, line) = match l {
                Value::String(line) => (data["service"].as_str().unwrap_or("?"), line.as_str()),
                _ => (
                    l["service"].as_str().unwrap_or("?"),
                    l["line"].as_str().unwrap_or(""),
                ),
            };
            let fresh = !(again && seen.already(service, line));
            if fresh {
                seen.shown(service, line);
            }
            fresh
        })
        .cloned()
        .collect();
    let mut shown = data.clone();
    shown["lines"] = Value::Array(fresh);
    if json {
        return emit(&format!("{shown}\n"));
    }
    let (mut o, mut err) = (String::new(), String::new());
    print(&mut o, &mut err, &shown);
    emit(&o)?;
    if !err.is_empty() {
        note(err.trim_end());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-12-02T10:00:00Z.
    const AT: u64 = 1_796_205_600_000;

    #[test]
    fn since_takes_every_form() {
        let utc = |_: i64| 0;
        let east5 = |_: i64| 5 * 3600;
        let now = AT + 3_600_000; // 11:00Z
        assert_eq!(parse_since("10m", now, &utc), Ok(now - 600_000));
        assert_eq!(parse_since("2h", now, &utc), Ok(now - 7_200_000));
        assert_eq!(parse_since("@1796205600", now, &utc), Ok(AT));
        assert_eq!(parse_since("@1796205600.25", now, &utc), Ok(AT + 250));
        assert_eq!(parse_since("2026-12-02T10:00:00Z", now, &east5), Ok(AT));
        assert_eq!(
            parse_since("2026-12-02T10:00:00.123Z", now, &utc),
            Ok(AT + 123)
        );
        assert_eq!(parse_since("2026-12-02T11:00:00+01:00", now, &utc), Ok(AT));
        assert_eq!(parse_since("2026-12-02T05:00:00-05:00", now, &utc), Ok(AT));
        // Local: in a zone 5 hours east, 15:00 local is 10:00Z.
        assert_eq!(parse_since("2026-12-02 15:00", now, &east5), Ok(AT));
        assert_eq!(parse_since("2026-12-02T15:00:00", now, &east5), Ok(AT));
        assert_eq!(parse_since("2026-12-02 10:00", now, &utc), Ok(AT));
        assert_eq!(parse_since("2026-12-02", now, &utc), Ok(AT - 36_000_000));
        // A time alone is today's (local).
        assert_eq!(parse_since("10:00:00", now, &utc), Ok(AT));
        assert_eq!(parse_since("15:00", now, &east5), Ok(AT));
        for bad in [
            "yesterday",
            "25:00",
            "10:00Z",
            "2026-13-01",
            "2026-12-02X10:00",
            "@x",
            "10:0",
            "",
        ] {
            assert!(parse_since(bad, now, &utc).is_err(), "{bad} was taken");
        }
    }

    #[test]
    fn lines_show_local_time_and_their_service() {
        let line = "2026-12-02T10:00:05.123Z --- started: pid 7";
        let east5 = |_: i64| 5 * 3600;
        let same_day = human_line("web", line, AT, &east5);
        assert_eq!(same_day, "15:00:05.123 web: --- started: pid 7");
        let next_day = human_line("web", line, AT + 86_400_000, &|_| 0);
        assert_eq!(next_day, "2026-12-02 10:00:05.123 web: --- started: pid 7");
        assert_eq!(stamp_ms("2026-12-02T10:00:05.123Z"), Some(AT + 5123));
        assert_eq!(human_line("a", "garbled", AT, &|_| 0), "a: garbled");
    }

    #[test]
    fn lines_asked_again_are_shown_once() {
        let mut seen = Seen::default();
        seen.shown("a", "2026-12-02T10:00:04.000Z zero");
        seen.shown("a", "2026-12-02T10:00:05.123Z one");
        seen.shown("b", "2026-12-02T10:00:05.123Z two");
        // Asked again from that stamp on: the same lines are not shown, new ones are.
        assert!(seen.already("a", "2026-12-02T10:00:05.123Z one"));
        assert!(seen.already("b", "2026-12-02T10:00:05.123Z two"));
        assert!(!seen.already("b", "2026-12-02T10:00:05.123Z one"));
        assert!(!seen.already("a", "2026-12-02T10:00:05.123Z three"));
        assert!(seen.already("a", "2026-12-02T10:00:04.000Z zero"));
        assert!(!seen.already("a", "2026-12-02T10:00:06.000Z four"));
    }
}
