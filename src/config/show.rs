//! Where each effective key of a service was set (`Origins`), and its settings as
//! `supctl show` prints them: each key with its value as TOML writes it and the
//! file:line that set it, or "default".
//!
//! Origins are plain data kept beside the services (`Config::origins`), never inside a
//! `ServiceConfig`: whether a service changed on reload is decided by its settings
//! alone, so a line moved in its file restarts nothing.

use super::service_table::SERVICE_KEYS;
use super::{signal_name, Check, LogMode, LogStderr, OnCrashLoop, Ready, RestartMode};
use super::{KillMode, Origins, ServiceConfig};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// One effective setting of a service.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Setting {
    pub key: String,
    /// As TOML writes it: `"10s"`, `["/bin/web", "-v"]`, `true`.
    pub value: String,
    /// "file:line", or "default".
    pub origin: String,
}

/// Every effective setting of `svc`, in the order sup.toml(5) lists the keys; `env` and
/// `limits` one line per entry. A key that is not set and has no default (`user`,
/// `health`, ...) is left out.
pub fn settings(svc: &ServiceConfig, origins: &Origins) -> Vec<Setting> {
    let mut out = Vec::new();
    // The key as shown, the key in `origins`, the value.
    let mut put_as = |key: String, at: &str, value: String| {
        let origin = origins.of(at);
        out.push(Setting { key, value, origin });
    };
    let p = &svc.policy;
    for &key in SERVICE_KEYS {
        let value = match key {
            "tool" => svc.tool.as_deref().map(quote),
            "command" => Some(strings(&svc.command)),
            "cwd" => svc.cwd.as_ref().map(|c| quote(&c.to_string_lossy())),
            "env" if !svc.env.is_empty() => {
                for (k, v) in &svc.env {
                    put_as(
                        format!("env.{}", bare_key(k)),
                        &format!("env.{k}"),
                        quote(v),
                    );
                }
                None
            }
            "env" => Some("{}".into()),
            "user" => svc.user.as_deref().map(quote),
            "group" => svc.group.as_deref().map(quote),
            "restart" => Some(quote(match p.restart {
                RestartMode::Always => "always",
                RestartMode::OnFailure => "on-failure",
                RestartMode::Never => "never",
            })),
            "success_codes" => Some(format!(
                "[{}]",
                (p.success_codes.iter())
                    .map(i32::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
            "restart_delay" => Some(duration(p.restart_delay)),
            "restart_delay_max" => Some(duration(p.restart_delay_max)),
            "stable_after" => Some(duration(p.stable_after)),
            "crash_loop" => Some(format!(
                "{{ restarts = {}, window = {} }}",
                p.crash_loop.restarts,
                duration(p.crash_loop.window)
            )),
            "on_crash_loop" => Some(quote(match p.on_crash_loop {
                OnCrashLoop::Cooldown => "cooldown",
                OnCrashLoop::Stop => "stop",
                OnCrashLoop::Shutdown => "shutdown",
            })),
            "cooldown" => Some(duration(p.cooldown)),
            "probation" => Some(duration(svc.probation)),
            "regression_window" => Some(duration(svc.regression_window)),
            "ready" => Some(quote(&match svc.ready {
                Ready::Started => "started".to_string(),
                Ready::Notify => "notify".into(),
                Ready::Fd(n) => format!("fd:{n}"),
                Ready::Exited => "exited".into(),
            })),
            "ready_timeout" => Some(duration(svc.ready_timeout)),
            "stop_signal" => Some(quote(signal_name(svc.stop_signal))),
            "stop_timeout" => Some(duration(svc.stop_timeout)),
            "after" => Some(strings(&svc.after)),
            "autostart" => Some(svc.autostart.to_string()),
            "log" => Some(quote(match svc.log {
                LogMode::File => "file",
                LogMode::Inherit => "inherit",
                LogMode::Null => "null",
            })),
            "log_max_size" => Some(size(svc.log_max_size)),
            "log_keep" => Some(svc.log_keep.to_string()),
            "log_stderr" => Some(quote(match svc.log_stderr {
                LogStderr::Marked => "marked",
                LogStderr::Merged => "merged",
            })),
            "leader_only" => svc.leader_only.as_deref().map(quote),
            "umask" => svc.umask.map(|u| quote(&format!("{u:03o}"))),
            "nice" => svc.nice.map(|n| n.to_string()),
            "instances" => Some(origins.instances.to_string()),
            "limits" if svc.limits.is_empty() => Some("{}".into()),
            "limits" => {
                for l in &svc.limits {
                    let one = |v: Option<u64>| v.map_or("unlimited".into(), |n| n.to_string());
                    let value = match (l.soft, l.hard) {
                        (Some(s), Some(h)) if s == h => s.to_string(),
                        (s, h) if s == h => quote(&one(s)),
                        (s, h) => quote(&format!("{}:{}", one(s), one(h))),
                    };
                    let key = format!("limits.{}", l.name);
                    put_as(key.clone(), &key, value);
                }
                None
            }
            "env_file" => Some(format!(
                "[{}]",
                (svc.env_file.iter())
                    .map(|e| {
                        let dash = if e.optional { "-" } else { "" };
                        quote(&format!("{dash}{}", e.path.display()))
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
            "reload_signal" => Some(quote(signal_name(svc.reload_signal))),
            "watchdog" => svc.watchdog.map(duration),
            "health" => svc.health.as_ref().map(|h| {
                let check = match &h.check {
                    Check::Command(argv) => format!("command = {}", strings(argv)),
                    Check::Tcp(a) => format!("tcp = {}", quote(&a.to_string())),
                    Check::Http { .. } => format!("http = {}", quote(&h.check.target())),
                };
                format!(
                    "{{ {check}, interval = {}, timeout = {}, failures = {}, start_delay = {} }}",
                    duration(h.interval),
                    duration(h.timeout),
                    h.failures,
                    duration(h.start_delay)
                )
            }),
            "kill_mode" => Some(quote(match svc.kill_mode {
                KillMode::Cgroup => "cgroup",
                KillMode::Group => "group",
                KillMode::Main => "main",
            })),
            "runtime_dir" => svc.runtime_dir.as_deref().map(quote),
            "listen" if !svc.listen.is_empty() => {
                let items: Vec<String> = svc.listen.iter().map(|a| a.to_string()).collect();
                Some(strings(&items))
            }
            "fd_store" if svc.fd_store > 0 => Some(svc.fd_store.to_string()),
            k if super::resources::KEYS.contains(&k) => svc.resources.shown(k),
            _ => None,
        };
        if let Some(v) = value {
            put_as(key.to_string(), key, v);
        }
    }
    out
}

/// A TOML basic string.
fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A key as TOML writes it: bare when it may be, else quoted.
fn bare_key(k: &str) -> String {
    let bare = !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if bare {
        k.to_string()
    } else {
        quote(k)
    }
}

fn strings(items: &[String]) -> String {
    let items: Vec<String> = items.iter().map(|s| quote(s)).collect();
    format!("[{}]", items.join(", "))
}

/// A duration as the config writes it: `"5m"`, `"10s"`, `"250ms"`.
fn duration(d: Duration) -> String {
    let ms = d.as_millis();
    let text = match ms {
        0 => "0s".to_string(),
        ms if ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
        ms if ms % 60_000 == 0 => format!("{}m", ms / 60_000),
        ms if ms % 1000 == 0 => format!("{}s", ms / 1000),
        ms => format!("{ms}ms"),
    };
    quote(&text)
}

/// A size as the config writes it: `"10MiB"`, `"512KiB"`, `"100B"`.
fn size(n: u64) -> String {
    let text = match n {
        0 => "0B".to_string(),
        n if n % (1 << 30) == 0 => format!("{}GiB", n >> 30),
        n if n % (1 << 20) == 0 => format!("{}MiB", n >> 20),
        n if n % (1 << 10) == 0 => format!("{}KiB", n >> 10),
        n => format!("{n}B"),
    };
    quote(&text)
}
