//! The checks that need the whole config, made once every file is read: `after` names
//! services and makes no cycle, `leader_only` names a lease, and the instances in all
//! stay under the bound.

use super::error::ConfigError;
use super::service_table::Origin;
use super::*;

/// The tables that run several instances, with their number; an error at the table
/// that takes the whole config's instances past [`MAX_TOTAL_INSTANCES`].
pub(super) fn instance_counts(
    origin: &BTreeMap<String, Origin>,
    errors: &mut Vec<ConfigError>,
) -> BTreeMap<String, u32> {
    let mut total = 0;
    let mut counts = BTreeMap::new();
    for (name, o) in origin.iter().filter(|(_, o)| o.instances > 1) {
        total += o.instances as usize;
        if total > super::instances::MAX_TOTAL_INSTANCES {
            errors.push(ConfigError {
                file: o.file.clone(),
                line: o.line,
                column: o.column,
                key: format!("service.{name}.instances"),
                message: format!(
                    "the config's tables ask for more than {} instances in all",
                    super::instances::MAX_TOTAL_INSTANCES
                ),
            });
            break;
        }
        counts.insert(name.clone(), o.instances);
    }
    counts
}

/// Checks across services: `after` names existing services and makes no cycle;
/// `leader_only` names a lease.
pub(super) fn check_whole(
    cfg: &Config,
    origin: &BTreeMap<String, Origin>,
    errors: &mut Vec<ConfigError>,
) {
    let err = |file: &std::path::Path, line, column, key: String, message: String| ConfigError {
        file: file.to_path_buf(),
        line,
        column,
        key,
        message,
    };
    for (name, o) in origin {
        for (dep, line, column) in &o.after {
            if !cfg.services.contains_key(dep) {
                let message = match super::instances::split(dep) {
                    Some((table, _)) if origin.get(table).is_some_and(|t| t.instances > 1) => format!("'{dep}' is an instance of [service.{table}]: name the table ('{table}'), which means all its instances"),
                    _ => format!("no service named '{dep}'"),
                };
                errors.push(err(
                    &o.after_in,
                    *line,
                    *column,
                    format!("service.{name}.after"),
                    message,
                ));
            } else if dep == name {
                errors.push(err(
                    &o.after_in,
                    *line,
                    *column,
                    format!("service.{name}.after"),
                    "a service cannot start after itself".into(),
                ));
            }
        }
        if let Some((lease, line, column)) = &o.leader_only {
            if !cfg.leases.contains_key(lease) {
                let msg =
                    format!("no [lease.{lease}] table: declare the lease this service follows");
                errors.push(err(
                    &o.leader_only_in,
                    *line,
                    *column,
                    format!("service.{name}.leader_only"),
                    msg,
                ));
            }
        }
    }
    // Two services (or the instances of one table) cannot bind one address, nor one
    // the wildcard of another's port (`listen::clashes`).
    let mut bound: BTreeMap<listen::ListenAddr, Vec<(&listen::ListenAddr, &str)>> = BTreeMap::new();
    for (name, svc) in &cfg.services {
        let Some(o) = origin.get(name) else {
            continue;
        };
        let mut problem = None;
        for addr in &svc.listen {
            if o.instances > 1 {
                problem = Some(format!(
                    "'{addr}' cannot be bound by each of its {} instances: run one instance, or give each its own table and address",
                    o.instances
                ));
            } else {
                let near = bound.entry(listen::clash_key(addr)).or_default();
                match near.iter().find(|(a, _)| listen::clashes(a, addr)) {
                    Some((a, other)) if *a == addr => {
                        problem = Some(format!(
                            "'{addr}' is {other}'s too: one address, one service"
                        ))
                    }
                    Some((a, other)) => {
                        problem = Some(format!(
                            "'{addr}' cannot be bound beside {other}'s '{a}': a wildcard address (0.0.0.0, [::]) takes its port on every address of its family; one address, one service"
                        ))
                    }
                    None => near.push((addr, name)),
                }
            }
            if problem.is_some() {
                break;
            }
        }
        if let Some(message) = problem {
            errors.push(err(
                &o.file,
                o.line,
                o.column,
                format!("service.{name}.listen"),
                message,
            ));
        }
    }
    if let Some(cycle) = find_cycle(cfg) {
        let o = &origin[&cycle[0]];
        let msg = format!("`after` makes a cycle: {}", cycle.join(" -> "));
        errors.push(err(
            &o.file,
            o.line,
            o.column,
            format!("service.{}.after", cycle[0]),
            msg,
        ));
    }
}

/// A cycle among `after` edges, as the list of names around it.
fn find_cycle(cfg: &Config) -> Option<Vec<String>> {
    // Colors: absent = unvisited, 1 = on the current path, 2 = done.
    fn visit(
        cfg: &Config,
        n: &str,
        color: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match color.get(n) {
            Some(2) => return None,
            Some(_) => {
                let start = path.iter().position(|p| p == n).unwrap_or(0);
                let mut cycle = path[start..].to_vec();
                cycle.push(n.to_string());
                return Some(cycle);
            }
            None => {}
        }
        color.insert(n.to_string(), 1);
        path.push(n.to_string());
        for dep in cfg
            .services
            .get(n)
            .map(|s| s.after.as_slice())
            .unwrap_or(&[])
        {
            if dep != n && cfg.services.contains_key(dep) {
                if let Some(c) = visit(cfg, dep, color, path) {
                    return Some(c);
                }
            }
        }
        path.pop();
        color.insert(n.to_string(), 2);
        None
    }
    let mut color = BTreeMap::new();
    for name in cfg.services.keys() {
        if let Some(c) = visit(cfg, name, &mut color, &mut Vec::new()) {
            return Some(c);
        }
    }
    None
}

/// Each cgroup limit whose controller no cgroup hierarchy of this machine has (cgroup2
/// or that controller's v1 hierarchy; none at all with `cgroups = "off"`), at its key.
/// The machine is looked at only when some service sets a limit.
pub(super) fn check_controllers(
    cfg: &Config,
    origin: &BTreeMap<String, Origin>,
    errors: &mut Vec<ConfigError>,
) {
    if origin.values().all(|o| o.resources.is_empty()) {
        return;
    }
    let have = crate::cgroup::limits::have_for_check(cfg.supd.cgroups);
    for (name, o) in origin {
        let Some(svc) = cfg.services.get(name) else {
            continue;
        };
        for (key, why) in crate::cgroup::limits::refusals(&svc.resources, &have) {
            if let Some((_, file, line, column)) = o.resources.iter().find(|r| r.0 == key) {
                errors.push(ConfigError {
                    file: file.clone(),
                    line: *line,
                    column: *column,
                    key: format!("service.{name}.{key}"),
                    message: why,
                });
            }
        }
    }
}
