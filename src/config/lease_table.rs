//! A `[lease.NAME]` table, and the tool name that a service's or a lease's `tool` key
//! holds.

use super::walk::{FileCtx, Place, Value};
use super::*;
use toml::Spanned;

pub(super) fn tool_name(s: &str) -> Result<String, String> {
    if valid_name(s) {
        Ok(s.to_string())
    } else {
        Err(format!(
            "'{s}' is not a tool name: letters, digits, '-', '_', '.', not starting with '.'"
        ))
    }
}

pub(super) fn read_lease(
    ctx: &mut FileCtx,
    name: &Spanned<std::borrow::Cow<str>>,
    def: &Value,
    cfg: &mut Config,
    seen: &mut BTreeMap<String, Place>,
) {
    let n = name.get_ref().to_string();
    let prefix = format!("lease.{n}");
    if !valid_name(&n) {
        ctx.err(
            name.span(),
            &prefix,
            "a lease name is letters, digits, '-', '_', '.', not starting with '.'",
        );
        return;
    }
    let (line, column) = ctx.pos(name.span().start);
    if let Some(first) = seen.get(&n) {
        ctx.err(
            name.span(),
            &prefix,
            format!("lease '{n}' is already defined at {first}"),
        );
        return;
    }
    let file = ctx.path.to_path_buf();
    seen.insert(n.clone(), Place { file, line, column });
    let Some(table) = ctx.table(def, &prefix) else {
        return;
    };
    let mut lease = LeaseConfig {
        name: n.clone(),
        tool: None,
    };
    for (key, v) in table.iter() {
        let full = format!("{prefix}.{}", key.get_ref());
        match key.get_ref().as_ref() {
            "tool" => lease.tool = ctx.parsed(v, &full, tool_name),
            _ => ctx.unknown(key.span(), &full, &["tool"]),
        }
    }
    cfg.leases.insert(n, lease);
}
