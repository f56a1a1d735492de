//! The `[supd]` table: supd's own settings, in the main file only.

use super::walk::{set, FileCtx, Place, Value};
use super::*;
use std::path::PathBuf;

const SUPD_KEYS: &[&str] = &[
    "socket",
    "socket_group",
    "state_dir",
    "tools_dir",
    "log_dir",
    "log_file",
    "log_max_size",
    "log_keep",
    "include",
    "shutdown_timeout",
    "mode",
    "cgroups",
    "nice",
    "realtime",
    "control_group",
    "syslog",
    "metrics_file",
];

pub(super) fn read_supd(
    ctx: &mut FileCtx,
    value: &Value,
    supd: &mut SupdConfig,
    includes: &mut Vec<(PathBuf, Place)>,
) {
    let Some(table) = ctx.table(value, "supd") else {
        return;
    };
    for (key, v) in table.iter() {
        let k = key.get_ref().as_ref();
        let full = format!("supd.{k}");
        let full = full.as_str();
        match k {
            "socket" => set(&mut supd.socket, ctx.path(v, full)),
            "socket_group" => {
                supd.socket_group = ctx.string(v, full).filter(|s| !s.is_empty());
            }
            "control_group" => match ctx.string(v, full) {
                Some(s) if s.is_empty() => supd.control_group = None,
                Some(s) if s.contains(|c: char| c == ':' || c == '/' || c.is_whitespace()) => {
                    ctx.err(v.span(), full, "expected a group's name (no ':', '/' or spaces)")
                }
                Some(s) => supd.control_group = Some(s),
                None => {}
            },
            "state_dir" => set(&mut supd.state_dir, ctx.path(v, full)),
            "tools_dir" => set(&mut supd.tools_dir, ctx.path(v, full)),
            "log_dir" => set(&mut supd.log_dir, ctx.path(v, full)),
            "log_file" => supd.log_file = ctx.path(v, full),
            "log_max_size" => set(
                &mut supd.log_max_size,
                ctx.parsed(v, full, crate::time::parse_size),
            ),
            "log_keep" => match ctx.integer(v, full) {
                Some(n) if (0..=1000).contains(&n) => supd.log_keep = n as u32,
                Some(_) => ctx.err(v.span(), full, "expected a number of files from 0 to 1000"),
                None => {}
            },
            "include" => {
                if let Some(list) = ctx.strings(v, full) {
                    supd.include = list.iter().map(|p| ctx.dir().join(p)).collect();
                    let items = ctx.array(v, full).unwrap_or(&[]);
                    includes.clear();
                    for (pattern, item) in supd.include.iter().zip(items) {
                        let (line, column) = ctx.pos(item.span().start);
                        let file = ctx.path.to_path_buf();
                        includes.push((pattern.clone(), Place { file, line, column }));
                    }
                }
            }
            "shutdown_timeout" => set(&mut supd.shutdown_timeout, ctx.duration(v, full)),
            "mode" => set(
                &mut supd.mode,
                ctx.choice(
                    v,
                    full,
                    &[("container", Mode::Container), ("system", Mode::System)],
                ),
            ),
            "cgroups" => set(
                &mut supd.cgroups,
                ctx.choice(v, full, &[("auto", true), ("off", false)]),
            ),
            "nice" => match ctx.integer(v, full) {
                Some(n) if (-20..=0).contains(&n) => supd.nice = Some(n as i32),
                Some(_) => ctx.err(
                    v.span(),
                    full,
                    "expected a nice value from -20 to 0 (supd's priority is never below its services')",
                ),
                None => {}
            },
            "realtime" => set(&mut supd.realtime, ctx.boolean(v, full)),
            "syslog" => supd.syslog = ctx.path(v, full),
            "metrics_file" => supd.metrics_file = ctx.path(v, full),
            _ => ctx.unknown(key.span(), full, SUPD_KEYS),
        }
    }
    if let Err(e) = crate::versions::check_layout(&supd.state_dir, &supd.tools_dir) {
        if let Some((k, v)) = ["tools_dir", "state_dir"]
            .iter()
            .find_map(|k| table.get_key_value(*k))
        {
            ctx.err(v.span(), &format!("supd.{}", k.get_ref()), e);
        }
    }
}
