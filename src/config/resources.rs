//! A service's cgroup limits (`memory_max`, `memory_high`, `cpu_weight`, `cpu_max`,
//! `pids_max`, `io_weight`): their values, read and written as the config says them.
//! What they become in a cgroup is `cgroup/limits.rs`'s.

use super::walk::{FileCtx, Value};
use serde::{Deserialize, Serialize};

/// The keys, in the order `show` and the man page give them.
pub const KEYS: [&str; 6] = [
    "memory_max",
    "memory_high",
    "cpu_weight",
    "cpu_max",
    "pids_max",
    "io_weight",
];

/// The limits of one service; `None`: not set (the kernel's default: no limit).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceLimits {
    /// Bytes: the run is OOM-killed past it.
    pub memory_max: Option<u64>,
    /// Bytes: the run is throttled and reclaimed past it.
    pub memory_high: Option<u64>,
    /// 1 to 10000 (100: the default share).
    pub cpu_weight: Option<u32>,
    /// Percent of one CPU (150: one and a half).
    pub cpu_max: Option<u32>,
    /// Processes and threads at once.
    pub pids_max: Option<u64>,
    /// 1 to 10000 (100: the default share).
    pub io_weight: Option<u32>,
}

impl ResourceLimits {
    /// Whether any limit is set.
    pub fn any(&self) -> bool {
        *self != ResourceLimits::default()
    }

    /// The keys that are set.
    pub fn set_keys(&self) -> Vec<&'static str> {
        KEYS.into_iter()
            .filter(|k| self.shown(k).is_some())
            .collect()
    }

    /// A key's value as the config writes it (`"64MiB"`, `"20%"`, `100`), if set.
    pub fn shown(&self, key: &str) -> Option<String> {
        let quote = |s: String| format!("\"{s}\"");
        match key {
            "memory_max" => self.memory_max.map(|b| quote(bytes(b))),
            "memory_high" => self.memory_high.map(|b| quote(bytes(b))),
            "cpu_weight" => self.cpu_weight.map(|w| w.to_string()),
            "cpu_max" => self.cpu_max.map(|p| quote(format!("{p}%"))),
            "pids_max" => self.pids_max.map(|n| n.to_string()),
            "io_weight" => self.io_weight.map(|w| w.to_string()),
            _ => None,
        }
    }
}

/// A size in its largest exact binary unit: `"64MiB"`, `"1GiB"`, `"1000"` (bytes).
pub fn bytes(n: u64) -> String {
    for (unit, shift) in [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)] {
        if n != 0 && n % (1u64 << shift) == 0 {
            return format!("{}{unit}", n >> shift);
        }
    }
    n.to_string()
}

/// `"512MiB"`, `"64M"`, `"1G"`, `"4096"`: K, M, G, T and KiB, MiB, GiB, TiB, all
/// binary (a memory limit is in pages: 1000-based units would only round).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let expected = || {
        format!(
            "'{s}' is not a size: expected a number of bytes with an optional unit \
             K, M, G, T or KiB, MiB, GiB, TiB (binary), such as \"512MiB\""
        )
    };
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    if digits == 0 {
        return Err(expected());
    }
    let n: u64 = t[..digits]
        .parse()
        .map_err(|_| format!("'{s}' is too large"))?;
    let shift = match t[digits..].trim() {
        "" | "B" => 0,
        "K" | "KiB" => 10,
        "M" | "MiB" => 20,
        "G" | "GiB" => 30,
        "T" | "TiB" => 40,
        _ => return Err(expected()),
    };
    let v = n
        .checked_mul(1u64 << shift)
        .ok_or_else(|| format!("'{s}' is too large"))?;
    if v == 0 {
        return Err(format!("'{s}': a memory limit is more than 0 bytes"));
    }
    Ok(v)
}

/// `"20%"` of one CPU; more than 100% is more than one CPU (`"150%"`), up to 100000%.
pub fn parse_percent(s: &str) -> Result<u32, String> {
    let expected = || {
        format!(
            "'{s}' is not a CPU share: expected a whole percentage of one CPU from 1% to \
             100000%, such as \"20%\" (\"150%\" is one and a half CPUs)"
        )
    };
    let n: u32 = s
        .trim()
        .strip_suffix('%')
        .and_then(|n| n.trim().parse().ok())
        .ok_or_else(expected)?;
    if (1..=100_000).contains(&n) {
        Ok(n)
    } else {
        Err(expected())
    }
}

/// Reads the limit `key` of a `[service.NAME]` table into `limits`; a bad value is an
/// error at its place that says what is accepted.
pub(super) fn read(ctx: &mut FileCtx, key: &str, v: &Value, f: &str, limits: &mut ResourceLimits) {
    let integer = matches!(v.get_ref(), toml::de::DeValue::Integer(_));
    match key {
        "memory_max" | "memory_high" => {
            let value = if integer {
                match ctx.integer(v, f) {
                    Some(n) if n > 0 => Some(n as u64),
                    Some(_) => {
                        ctx.err(
                            v.span(),
                            f,
                            "a memory limit is more than 0 bytes, such as \"512MiB\"",
                        );
                        None
                    }
                    None => None,
                }
            } else {
                ctx.parsed(v, f, parse_bytes)
            };
            if value.is_some() {
                match key {
                    "memory_max" => limits.memory_max = value,
                    _ => limits.memory_high = value,
                }
            }
        }
        "cpu_weight" | "io_weight" => match ctx.integer(v, f) {
            Some(n) if (1..=10_000).contains(&n) => match key {
                "cpu_weight" => limits.cpu_weight = Some(n as u32),
                _ => limits.io_weight = Some(n as u32),
            },
            Some(_) => ctx.err(
                v.span(),
                f,
                "expected a weight from 1 to 10000 (100 is the default share)",
            ),
            None => {}
        },
        "cpu_max" => {
            if integer {
                ctx.err(
                    v.span(),
                    f,
                    "expected a percentage of one CPU as a string, such as \"20%\"",
                );
            } else if let Some(p) = ctx.parsed(v, f, parse_percent) {
                limits.cpu_max = Some(p);
            }
        }
        "pids_max" => match ctx.integer(v, f) {
            Some(n) if n >= 1 => limits.pids_max = Some(n as u64),
            Some(_) => ctx.err(
                v.span(),
                f,
                "expected a number of processes of at least 1, such as 256",
            ),
            None => {}
        },
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_binary_with_or_without_the_i() {
        assert_eq!(parse_bytes("512MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("64M"), Ok(64 << 20));
        assert_eq!(parse_bytes("1G"), Ok(1 << 30));
        assert_eq!(parse_bytes("2T"), Ok(2 << 40));
        assert_eq!(parse_bytes("3KiB"), Ok(3 << 10));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        for bad in [
            "",
            "MiB",
            "12MB",
            "1.5G",
            "-1",
            "0",
            "99999999999999999999T",
        ] {
            assert!(parse_bytes(bad).is_err(), "{bad}");
        }
        assert!(parse_bytes("12MB")
            .unwrap_err()
            .contains("KiB, MiB, GiB, TiB"));
    }

    #[test]
    fn sizes_show_in_their_largest_exact_unit() {
        assert_eq!(bytes(32 << 20), "32MiB");
        assert_eq!(bytes(1 << 30), "1GiB");
        assert_eq!(bytes(1536 << 10), "1536KiB");
        assert_eq!(bytes(1000), "1000");
    }

    #[test]
    fn cpu_shares_are_percent_of_one_cpu() {
        assert_eq!(parse_percent("20%"), Ok(20));
        assert_eq!(parse_percent("150%"), Ok(150));
        for bad in ["20", "0%", "x%", "1.5%", "100001%"] {
            assert!(parse_percent(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn shown_as_the_config_writes_them() {
        let l = ResourceLimits {
            memory_max: Some(64 << 20),
            cpu_max: Some(20),
            pids_max: Some(8),
            ..Default::default()
        };
        assert_eq!(l.set_keys(), vec!["memory_max", "cpu_max", "pids_max"]);
        assert_eq!(l.shown("memory_max").as_deref(), Some("\"64MiB\""));
        assert_eq!(l.shown("cpu_max").as_deref(), Some("\"20%\""));
        assert!(l.any() && !ResourceLimits::default().any());
    }
}
