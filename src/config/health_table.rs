//! A service's `health = { ... }` table: one check (command, tcp or http) and its
//! timing.

use super::walk::{set, FileCtx, Value};
use super::*;

const HEALTH_KEYS: &[&str] = &[
    "command",
    "tcp",
    "http",
    "interval",
    "timeout",
    "failures",
    "start_delay",
];

/// `health = { http = "http://127.0.0.1:8080/healthz", interval = "10s", ... }`.
pub(super) fn read_health(ctx: &mut FileCtx, v: &Value, key: &str) -> Option<HealthConfig> {
    let table = ctx.table(v, key)?;
    let mut checks: Vec<Check> = Vec::new();
    let mut named = 0;
    let mut h = HealthConfig::new(Check::Command(Vec::new()));
    for (k, item) in table.iter() {
        let full = format!("{key}.{}", k.get_ref());
        let f = full.as_str();
        match k.get_ref().as_ref() {
            "command" => {
                named += 1;
                if let Some(argv) = ctx.strings(item, f) {
                    if argv.first().is_none_or(|a| a.is_empty()) {
                        ctx.err(
                            item.span(),
                            f,
                            "expected a non-empty array whose first item is the program",
                        );
                    } else {
                        checks.push(Check::Command(argv));
                    }
                }
            }
            "tcp" => {
                named += 1;
                if let Some(addr) = ctx.parsed(item, f, parse_tcp) {
                    checks.push(Check::Tcp(addr));
                }
            }
            "http" => {
                named += 1;
                if let Some((addr, path)) = ctx.parsed(item, f, parse_http) {
                    checks.push(Check::Http { addr, path });
                }
            }
            "interval" => set(&mut h.interval, ctx.duration(item, f)),
            "timeout" => set(&mut h.timeout, ctx.duration(item, f)),
            "start_delay" => set(&mut h.start_delay, ctx.duration(item, f)),
            "failures" => match ctx.integer(item, f) {
                Some(n) if (1..=1000).contains(&n) => h.failures = n as u32,
                Some(_) => ctx.err(
                    item.span(),
                    f,
                    "expected a number of failures from 1 to 1000",
                ),
                None => {}
            },
            _ => ctx.unknown(k.span(), f, HEALTH_KEYS),
        }
    }
    for (d, name) in [(h.interval, "interval"), (h.timeout, "timeout")] {
        if d.is_zero() {
            ctx.err(
                v.span(),
                &format!("{key}.{name}"),
                "expected a duration longer than 0, such as \"2s\"",
            );
        }
    }
    match named {
        0 => {
            ctx.err(
                v.span(),
                key,
                "missing the check: one of command = [...], tcp = \"127.0.0.1:8080\" or http = \"http://127.0.0.1:8080/healthz\"",
            );
            None
        }
        1 => {
            h.check = checks.pop()?;
            Some(h)
        }
        _ => {
            ctx.err(
                v.span(),
                key,
                "expected exactly one of command, tcp and http, found several",
            );
            None
        }
    }
}

/// What an address must look like: supd never resolves names (a hung resolver would
/// block it).
const NUMERIC: &str =
    "a numeric IP address and port, such as \"127.0.0.1:8080\" or \"[::1]:8080\" (supd looks up no host names: a resolver that hangs would block it)";

/// `tcp = "127.0.0.1:8080"`.
fn parse_tcp(s: &str) -> Result<std::net::SocketAddr, String> {
    s.parse()
        .map_err(|_| format!("'{s}' is not an address: expected {NUMERIC}"))
}

/// `http = "http://127.0.0.1:8080/healthz"`: the address and the path (`/` when absent).
fn parse_http(s: &str) -> Result<(std::net::SocketAddr, String), String> {
    let Some(rest) = s.strip_prefix("http://") else {
        return Err(format!(
            "'{s}' is not an http:// URL: expected one such as \"http://127.0.0.1:8080/healthz\" (https is not supported)"
        ));
    };
    let (host, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if path.bytes().any(|b| b.is_ascii_control() || b == b' ') {
        return Err(format!(
            "'{s}': the path must not hold spaces or control characters"
        ));
    }
    let addr = host
        .parse()
        .map_err(|_| format!("'{s}': '{host}' is not an address: expected {NUMERIC}"))?;
    Ok((addr, path.to_string()))
}
