//! `instances = N`: one table, N services of their own.
//!
//! A table `web` with `instances = 3` becomes the services `web@0`, `web@1` and `web@2`,
//! each with its own state, restarts, pid record and log file, and `SUP_INSTANCE` set to
//! its index. `instances = 1` (the default) keeps the plain name. The expansion happens
//! once the whole config is read and checked, so `after` and the cycle check work on
//! tables; an `after` naming an instanced table then names every one of its instances.
//!
//! Names cannot collide: a plain service's name must not end in `@` and digits (that
//! form is the instances'), and an instanced table's name holds no `@`.

use super::{valid_name, Instance, ServiceConfig};
use std::collections::BTreeMap;

/// The most instances one table may run: each costs supd pipes, a pid record and a log.
pub const MAX_INSTANCES: u32 = 256;

/// The most instances a whole config may ask for: a config file of a few MiB must not
/// become millions of services.
pub const MAX_TOTAL_INSTANCES: usize = 16_384;

/// The name of instance `index` of table `table`.
pub fn instance_name(table: &str, index: u32) -> String {
    format!("{table}@{index}")
}

/// `web@1` → `("web", 1)`: a name of the instances' form (`@` then digits, no leading
/// zero but in `@0`).
pub fn split(name: &str) -> Option<(&str, u32)> {
    let (table, index) = name.rsplit_once('@')?;
    let ok = !table.is_empty()
        && !index.is_empty()
        && index.bytes().all(|b| b.is_ascii_digit())
        && (index == "0" || !index.starts_with('0'));
    ok.then(|| index.parse().ok().map(|i| (table, i)))?
}

/// A plain service's name (`instances = 1`) must not look like an instance's.
pub fn check_plain_name(name: &str) -> Result<(), String> {
    match name.rsplit_once('@') {
        Some((table, index)) if !index.is_empty() && index.bytes().all(|b| b.is_ascii_digit()) => {
            Err(format!(
                "a name ending in '@' and digits is kept for instances: write [service.{table}] with instances = N to run {table}@0, {table}@1, ...; or choose another name"
            ))
        }
        _ => Ok(()),
    }
}

/// The value of `instances` in table `name`, checked.
pub fn count(name: &str, n: i64) -> Result<u32, String> {
    if !(1..=i64::from(MAX_INSTANCES)).contains(&n) {
        return Err(format!(
            "expected a number of instances from 1 to {MAX_INSTANCES}"
        ));
    }
    let n = n as u32;
    if n > 1 && name.contains('@') {
        return Err(format!(
            "an instanced table's name holds no '@' (its services are named {name}@0 ... and supctl finds them by the part before '@')"
        ));
    }
    let last = instance_name(name, n - 1);
    if n > 1 && !valid_name(&last) {
        return Err(format!(
            "the instances' names would be too long ('{last}' is over 64 characters): shorten the table's name"
        ));
    }
    Ok(n)
}

/// Replaces every table of `counts` (name → N > 1) by its N instances, and every `after`
/// naming such a table by the names of all its instances.
pub fn expand(services: &mut BTreeMap<String, ServiceConfig>, counts: &BTreeMap<String, u32>) {
    for (table, &n) in counts {
        let Some(def) = services.remove(table) else {
            continue;
        };
        for index in 0..n {
            let mut svc = def.clone();
            svc.name = instance_name(table, index);
            svc.instance = Some(Instance {
                table: table.clone(),
                index,
            });
            services.insert(svc.name.clone(), svc);
        }
    }
    for svc in services.values_mut() {
        if svc.after.iter().any(|a| counts.contains_key(a)) {
            svc.after = svc
                .after
                .iter()
                .flat_map(|a| match counts.get(a) {
                    Some(&n) => (0..n).map(|i| instance_name(a, i)).collect(),
                    None => vec![a.clone()],
                })
                .collect();
        }
    }
}

/// The origins of every table of `counts` given to each of its instances.
pub fn expand_origins(
    origins: &mut BTreeMap<String, super::Origins>,
    counts: &BTreeMap<String, u32>,
) {
    for (table, &n) in counts {
        let Some(o) = origins.remove(table) else {
            continue;
        };
        for index in 0..n {
            origins.insert(instance_name(table, index), o.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{load_text, Config, ConfigError};
    use super::*;
    use std::path::Path;

    fn load(text: &str) -> Result<Config, Vec<String>> {
        load_text(Path::new("/etc/sup/sup.toml"), text)
            .map_err(|es| es.iter().map(ConfigError::to_string).collect())
    }

    #[test]
    fn a_table_with_instances_becomes_that_many_services_with_their_index() {
        let cfg = load(
            "[service.web]\ncommand = [\"/bin/web\"]\ninstances = 3\ntool = \"web\"\n\
             [service.db]\ncommand = [\"/bin/db\"]\n\
             [service.front]\ncommand = [\"/bin/front\"]\nafter = [\"db\", \"web\"]\n",
        )
        .expect("valid");
        let names: Vec<&str> = cfg.services.keys().map(String::as_str).collect();
        assert_eq!(names, ["db", "front", "web@0", "web@1", "web@2"]);
        for i in 0..3 {
            let svc = &cfg.services[&format!("web@{i}")];
            assert_eq!(svc.name, format!("web@{i}"));
            assert_eq!(
                svc.instance,
                Some(Instance {
                    table: "web".into(),
                    index: i
                })
            );
            assert_eq!(svc.command, ["/bin/web"], "the table's keys are each one's");
            assert_eq!(svc.tool.as_deref(), Some("web"));
        }
        assert_eq!(
            cfg.services["front"].after,
            ["db", "web@0", "web@1", "web@2"],
            "after an instanced table: after every instance"
        );
        assert_eq!(cfg.services["db"].instance, None);
    }

    #[test]
    fn one_instance_keeps_the_plain_name() {
        let cfg = load("[service.web]\ncommand = [\"/bin/web\"]\ninstances = 1\n").expect("ok");
        assert_eq!(cfg.services.keys().collect::<Vec<_>>(), ["web"]);
        assert_eq!(cfg.services["web"].instance, None);
    }

    #[test]
    fn an_instance_of_a_table_is_one_service_each_time_the_config_is_read() {
        // The same table read twice gives equal definitions: a reload that changes
        // only N touches only the instances added or removed.
        let three = load("[service.w]\ncommand = [\"/w\"]\ninstances = 3\n").expect("ok");
        let two = load("[service.w]\ncommand = [\"/w\"]\ninstances = 2\n").expect("ok");
        assert_eq!(three.services["w@0"], two.services["w@0"]);
        assert_eq!(three.services["w@1"], two.services["w@1"]);
        assert!(!two.services.contains_key("w@2"));
    }

    #[test]
    fn bad_instances_say_where_and_what_was_expected() {
        let cases: &[(&str, &str)] = &[
            (
                "[service.w]\ncommand = [\"/w\"]\ninstances = 0\n",
                "/etc/sup/sup.toml:3:13: service.w.instances: expected a number of instances from 1 to 256",
            ),
            (
                "[service.w]\ncommand = [\"/w\"]\ninstances = 257\n",
                "/etc/sup/sup.toml:3:13: service.w.instances: expected a number of instances from 1 to 256",
            ),
            (
                "[service.w]\ncommand = [\"/w\"]\ninstances = \"3\"\n",
                "/etc/sup/sup.toml:3:13: service.w.instances: expected an integer",
            ),
            (
                "[service.\"w@1\"]\ncommand = [\"/w\"]\n",
                "/etc/sup/sup.toml:1:10: service.w@1: a name ending in '@' and digits is kept for instances",
            ),
            (
                "[service.\"getty@tty\"]\ncommand = [\"/w\"]\ninstances = 2\n",
                "/etc/sup/sup.toml:3:13: service.getty@tty.instances: an instanced table's name holds no '@'",
            ),
            (
                &format!("[service.{}]\ncommand = [\"/w\"]\ninstances = 20\n", "x".repeat(62)),
                "is over 64 characters",
            ),
            (
                "[service.w]\ncommand = [\"/w\"]\ninstances = 2\n[service.f]\ncommand = [\"/f\"]\nafter = [\"w@1\"]\n",
                "/etc/sup/sup.toml:6:10: service.f.after: 'w@1' is an instance of [service.w]: name the table ('w'), which means all its instances",
            ),
        ];
        for (text, expected) in cases {
            let errors = load(text).expect_err(text);
            assert_eq!(errors.len(), 1, "{text}: {errors:#?}");
            assert!(
                errors[0].contains(expected),
                "{text}\nexpected {expected:?}\ngot {:?}",
                errors[0]
            );
        }
    }

    #[test]
    fn a_config_asks_for_a_bounded_number_of_instances_in_all() {
        let table = |i: usize| format!("[service.w{i}]\ncommand = [\"/w\"]\ninstances = 256\n");
        let at_most: String = (0..MAX_TOTAL_INSTANCES / 256).map(table).collect();
        let cfg = load(&at_most).expect("at the bound");
        assert_eq!(cfg.services.len(), MAX_TOTAL_INSTANCES);
        let over = format!("{at_most}{}", table(99_999));
        let errors = load(&over).expect_err("over the bound");
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].contains("service.w99999.instances: the config's tables ask for more than 16384 instances in all"),
            "{errors:?}"
        );
    }

    #[test]
    fn plain_names_with_an_at_sign_stay_valid() {
        let cfg = load("[service.\"getty@tty1\"]\ncommand = [\"/sbin/getty\", \"tty1\"]\n")
            .expect("a name like getty@tty1 is a plain name");
        assert!(cfg.services.contains_key("getty@tty1"));
    }

    #[test]
    fn names_split_only_in_the_instances_form() {
        assert_eq!(split("web@0"), Some(("web", 0)));
        assert_eq!(split("web@12"), Some(("web", 12)));
        for not in ["web", "web@", "@1", "web@01", "web@x1", "getty@tty1"] {
            assert_eq!(split(not), None, "{not}");
        }
    }
}
