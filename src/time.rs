//! Time values: a monotonic instant that survives `exec`, and the duration and size
//! syntax of the config file ("250ms", "10s", "5m", "1h"; "10MiB").
//!
//! The pure cores (service machine, restart policy) take a [`Mono`] as a parameter and
//! never read a clock; only the shell calls [`Mono::now`].

use std::fmt;
use std::time::Duration;

/// A point on `CLOCK_MONOTONIC`, as nanoseconds since boot.
///
/// Unlike `std::time::Instant` it is plain data: it can be built in tests, compared,
/// and written down (the clock is the same for a re-executed `supd`).
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct Mono(pub u64);

impl Mono {
    /// Reads `CLOCK_MONOTONIC`.
    pub fn now() -> Mono {
        Mono(nanos(nix::time::ClockId::CLOCK_MONOTONIC))
    }

    /// The instant `d` after this one.
    pub fn plus(self, d: Duration) -> Mono {
        Mono(
            self.0
                .saturating_add(d.as_nanos().min(u64::MAX as u128) as u64),
        )
    }

    /// How long after `earlier` this instant is (zero if it is before).
    pub fn since(self, earlier: Mono) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

/// A point on `CLOCK_BOOTTIME`, as nanoseconds since boot: [`Mono`]'s twin that also
/// counts the time the host spent suspended.
///
/// Leases use it, and only leases: sup-lease, supd and the file store run on one host
/// and must agree on one clock that never steps (not the wall clock: `date -s` or NTP
/// would shorten or lengthen a store lease) and that counts suspend (a host resumed
/// after an hour must find its grant and its store lease an hour older, as the rest of
/// the cluster does). supd's own timers (backoff, stop escalation, probation) stay on
/// `Mono`: they are about this host alone, where a suspended hour is no hour of uptime.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct Boot(pub u64);

impl Boot {
    /// Reads `CLOCK_BOOTTIME`.
    pub fn now() -> Boot {
        Boot(nanos(nix::time::ClockId::CLOCK_BOOTTIME))
    }

    /// The instant `ms` milliseconds after boot.
    pub fn from_ms(ms: u64) -> Boot {
        Boot(ms.saturating_mul(1_000_000))
    }

    /// Milliseconds since boot, rounded down.
    pub fn as_ms(self) -> u64 {
        self.0 / 1_000_000
    }

    /// The instant `d` after this one.
    pub fn plus(self, d: Duration) -> Boot {
        Boot(
            self.0
                .saturating_add(d.as_nanos().min(u64::MAX as u128) as u64),
        )
    }

    /// How long after `earlier` this instant is (zero if it is before).
    pub fn since(self, earlier: Boot) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

/// What is told at most once a second (refusals of a flood, which must not flood supd's
/// log in turn): how many happened since it was last told, and when that was.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Throttle {
    count: usize,
    told: Option<Mono>,
}

impl Throttle {
    /// `n` more now: how many to tell (these and those kept back), when a second has
    /// passed since the last telling (told at `now`); `None` to keep counting.
    pub fn hit(&mut self, n: usize, now: Mono) -> Option<usize> {
        self.count += n;
        if self
            .told
            .is_some_and(|t| now.since(t) < Duration::from_secs(1))
        {
            return None;
        }
        self.told = Some(now);
        Some(std::mem::take(&mut self.count))
    }
}

/// The longest duration supd accepts anywhere (config and protocol): 366 days. Every
/// deadline is an instant plus a duration; a bound keeps that sum far from overflow, and
/// nothing supd waits for is meant to take longer than a year.
pub const MAX_DURATION: Duration = Duration::from_secs(366 * 86_400);

/// Nanoseconds on `clock`. It cannot fail on Linux for these clock ids; a zero instant
/// is still a usable (if early) value, so there is nothing to crash over.
fn nanos(clock: nix::time::ClockId) -> u64 {
    let ts = nix::time::clock_gettime(clock).unwrap_or(nix::sys::time::TimeSpec::new(0, 0));
    ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64
}

/// Parses "250ms", "10s", "5m", "1h", "1h30m", "0s" (a bare "0" too); refuses anything
/// longer than [`MAX_DURATION`].
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.is_empty() {
        return Err("a duration such as \"250ms\", \"10s\", \"5m\" or \"1h\"".into());
    }
    let mut total = Duration::ZERO;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return Err(format!("'{s}' is not a duration: expected a number before the unit (\"250ms\", \"10s\", \"5m\", \"1h\")"));
        }
        let too_long = || format!("'{s}' is too long: at most 366 days (\"8784h\")");
        let n: u64 = rest[..digits].parse().map_err(|_| too_long())?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let part = match unit {
            "ms" => Duration::from_millis(n),
            "s" => Duration::from_secs(n),
            "m" | "min" => Duration::from_secs(n.saturating_mul(60)),
            "h" => Duration::from_secs(n.saturating_mul(3600)),
            "" => {
                return Err(format!(
                    "'{s}' is not a duration: a unit is missing (ms, s, m or h)"
                ))
            }
            other => {
                return Err(format!(
                    "'{s}' is not a duration: unknown unit '{other}' (use ms, s, m or h)"
                ))
            }
        };
        total = total.saturating_add(part);
        if total > MAX_DURATION {
            return Err(too_long());
        }
    }
    Ok(total)
}

/// Parses a byte size: "1048576", "512KiB", "10MiB", "1GiB" (also KB/MB/GB as powers of ten).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    if digits == 0 {
        return Err(format!("'{s}' is not a size such as \"10MiB\""));
    }
    let n: u64 = s[..digits]
        .parse()
        .map_err(|_| format!("'{s}' is too large"))?;
    let mult: u64 = match s[digits..].trim() {
        "" | "B" => 1,
        "K" | "KiB" => 1 << 10,
        "M" | "MiB" => 1 << 20,
        "G" | "GiB" => 1 << 30,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        other => {
            return Err(format!(
                "'{s}' is not a size: unknown unit '{other}' (use B, KiB, MiB or GiB)"
            ))
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("'{s}' is too large"))
}

/// The clocks a decision that must survive a restart reads. The wall clock is for
/// display only: it may be stepped (a board without an RTC before NTP, an operator's
/// `date -s`). Deadlines use `CLOCK_BOOTTIME`, which only ever moves forward within one
/// boot (suspend included), with the boot id that says which boot it belongs to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Clocks {
    /// Milliseconds since the Unix epoch (display only).
    pub wall_ms: u64,
    /// `/proc/sys/kernel/random/boot_id`; empty when unreadable (then nothing resumes).
    pub boot_id: String,
    /// `CLOCK_BOOTTIME` in milliseconds.
    pub boot_ms: u64,
}

impl Clocks {
    /// Reads the three.
    pub fn now() -> Clocks {
        let boot = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
            .map(|ts| ts.tv_sec() as u64 * 1000 + ts.tv_nsec() as u64 / 1_000_000)
            .unwrap_or(0);
        // Read once: a boot id does not change under a running process, and this is
        // asked at events of versioned services.
        static BOOT_ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        let boot_id = match BOOT_ID.get() {
            Some(id) => id.clone(),
            None => {
                let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
                    .map(|s| s.trim().to_string())
                    .unwrap_or_default();
                if !id.is_empty() {
                    let _ = BOOT_ID.set(id.clone());
                }
                id
            }
        };
        Clocks {
            wall_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
            boot_id,
            boot_ms: boot,
        }
    }
}

/// Formats a duration the way the config writes it: "250ms", "10s", "5m", "1h30m".
pub struct Human(pub Duration);

impl fmt::Display for Human {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.as_millis();
        if ms == 0 {
            return write!(f, "0s");
        }
        if ms < 1000 || ms % 1000 != 0 && ms < 60_000 {
            return write!(f, "{ms}ms");
        }
        let mut secs = self.0.as_secs();
        let h = secs / 3600;
        secs %= 3600;
        let m = secs / 60;
        secs %= 60;
        if h > 0 {
            write!(f, "{h}h")?;
        }
        if m > 0 {
            write!(f, "{m}m")?;
        }
        if secs > 0 || (h == 0 && m == 0) {
            write!(f, "{secs}s")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        let ok = [
            ("250ms", 250),
            ("10s", 10_000),
            ("5m", 300_000),
            ("1h", 3_600_000),
            ("1h30m", 5_400_000),
            ("0s", 0),
            ("0", 0),
        ];
        for (s, ms) in ok {
            assert_eq!(parse_duration(s), Ok(Duration::from_millis(ms)), "{s}");
        }
        for bad in ["", "10", "ms", "10x", "-1s", "1.5s"] {
            assert!(parse_duration(bad).is_err(), "{bad} should be refused");
        }
        // Bounded where it is read: no sum of a deadline can overflow.
        assert_eq!(parse_duration("8784h"), Ok(MAX_DURATION));
        for huge in [
            "18446744073709551615s",
            "99999999999999999999999s",
            "8784h1ms",
            "307445734561825860m",
        ] {
            let e = parse_duration(huge).expect_err(huge);
            assert!(e.contains("at most 366 days"), "{huge}: {e}");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("10MiB"), Ok(10 << 20));
        assert_eq!(parse_size("512KiB"), Ok(512 << 10));
        assert_eq!(parse_size("100"), Ok(100));
        assert!(parse_size("10 parsecs").is_err());
        assert!(parse_size("MiB").is_err());
    }

    #[test]
    fn human() {
        let cases = [
            (250, "250ms"),
            (10_000, "10s"),
            (300_000, "5m"),
            (5_400_000, "1h30m"),
            (0, "0s"),
            (1500, "1500ms"),
        ];
        for (ms, s) in cases {
            assert_eq!(Human(Duration::from_millis(ms)).to_string(), s);
        }
    }

    #[test]
    fn mono_arithmetic() {
        let t = Mono(1_000);
        assert_eq!(t.plus(Duration::from_nanos(5)), Mono(1_005));
        assert_eq!(Mono(1_005).since(t), Duration::from_nanos(5));
        assert_eq!(t.since(Mono(2_000)), Duration::ZERO);
    }
}

/// "2026-11-29T17:20:01.123Z" for a wall-clock time (UTC, no time zone files needed).
pub fn utc_stamp(t: std::time::SystemTime) -> String {
    let d = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, day) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_millis()
    )
}

/// "14:03:07.123": the time of day of `unix_ms`, `offset_s` seconds east of UTC.
pub fn clock_stamp(unix_ms: u64, offset_s: i64) -> String {
    let ms = (unix_ms as i64).saturating_add(offset_s.saturating_mul(1000));
    let day_ms = ms.rem_euclid(86_400_000);
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        day_ms / 3_600_000,
        day_ms / 60_000 % 60,
        day_ms / 1000 % 60,
        day_ms % 1000
    )
}

/// "2026-12-01": the date of `unix_ms`, `offset_s` seconds east of UTC.
pub fn date_stamp(unix_ms: u64, offset_s: i64) -> String {
    let ms = (unix_ms as i64).saturating_add(offset_s.saturating_mul(1000));
    let (y, m, d) = civil_from_days(ms.div_euclid(86_400_000));
    format!("{y:04}-{m:02}-{d:02}")
}

/// (year, month, day) to days since 1970-01-01, proleptic Gregorian: the inverse of
/// `civil_from_days` (H. Hinnant's method).
pub fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (H. Hinnant's method).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    (y, m, d)
}

#[cfg(test)]
mod stamp_tests {
    use super::*;

    #[test]
    fn utc_stamps() {
        let at = |s: u64| std::time::UNIX_EPOCH + Duration::from_millis(s);
        assert_eq!(utc_stamp(at(0)), "1970-01-01T00:00:00.000Z");
        assert_eq!(utc_stamp(at(951_782_400_123)), "2000-02-29T00:00:00.123Z");
        assert_eq!(utc_stamp(at(1_796_059_201_000)), "2026-11-30T17:20:01.000Z");
    }

    #[test]
    fn dates_both_ways() {
        assert_eq!(date_stamp(1_796_059_201_123, 0), "2026-11-30");
        assert_eq!(date_stamp(1_796_000_400_005, -5 * 3600), "2026-11-29");
        for (y, m, d) in [(1970, 1, 1), (2000, 2, 29), (2026, 12, 2), (1969, 12, 31)] {
            let days = days_from_civil(y, m, d);
            assert_eq!(civil_from_days(days), (y, m, d));
        }
        assert_eq!(days_from_civil(1970, 1, 2), 1);
    }

    #[test]
    fn clock_stamps() {
        assert_eq!(clock_stamp(1_796_059_201_123, 0), "17:20:01.123");
        assert_eq!(clock_stamp(1_796_059_201_123, 3600), "18:20:01.123");
        // West of UTC across midnight: the day before.
        assert_eq!(clock_stamp(1_796_000_400_005, -5 * 3600), "20:00:00.005");
        assert_eq!(clock_stamp(0, -1), "23:59:59.000");
    }
}
