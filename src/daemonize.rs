//! A main process that exited with a success code while other processes of its run
//! remained has daemonized (forked into the background, its parent exiting): what
//! `status` and the log say of it, with the fix for the programs that do it most.
//! Pure: the exit (as it is said), the name of the program and a count in, words out.

/// The reason given for a run whose leader exited with `exit` (a success code)
/// leaving `left` other processes of its run (`None`: some, not counted): it names the
/// daemonizing and the fix.
pub fn reason(exit: impl std::fmt::Display, left: Option<u32>, command: &[String]) -> String {
    let what = match left {
        Some(1) => "1 other process".to_string(),
        Some(n) => format!("{n} other processes"),
        None => "other processes".to_string(),
    };
    format!(
        "{exit} while {what} of its run remained: it forked into the background: run it in the foreground ({})",
        fix(command)
    )
}

/// The reason given for a one-shot (`ready = "exited"`) whose leader exited with
/// `exit` (a success code) leaving `left` other processes: its exit is its contract, a
/// success; what it left is ended with its run, and said so (`None`: some, not counted).
pub fn ended(exit: impl std::fmt::Display, left: Option<u32>) -> String {
    let what = match left {
        Some(1) => "1 other process of its run was".to_string(),
        Some(n) => format!("{n} other processes of its run were"),
        None => "other processes of its run were".to_string(),
    };
    format!("{exit}; {what} still there, and ended with it")
}

/// The fix in one line for the program `command` runs: its foreground flag or setting.
pub fn fix(command: &[String]) -> String {
    let program = command.first().map(String::as_str).unwrap_or_default();
    let base = program.rsplit('/').next().unwrap_or(program);
    let known: &[(&[&str], &str)] = &[
        (
            &["redis-server", "redis-sentinel", "valkey-server"],
            "`daemonize no` in its config file, or `--daemonize no` in `command`",
        ),
        (
            &["nginx"],
            "`daemon off;` in nginx.conf, or `-g` `daemon off;` in `command`",
        ),
        (
            &["sshd"],
            "`-D` in `command`: [\"/usr/sbin/sshd\", \"-D\", \"-e\"]",
        ),
        (&["cron", "crond"], "`-f` in `command`"),
        (
            &["haproxy"],
            "no `daemon` in haproxy.cfg, and `-Ws` in `command`",
        ),
        (
            &["pg_ctl", "pg_ctlcluster"],
            "run `postgres -D DATADIR` itself, not pg_ctl",
        ),
        (&["mysqld_safe"], "run `mysqld` itself, not mysqld_safe"),
        (
            &["apache2", "httpd", "apachectl"],
            "`-DFOREGROUND` in `command`",
        ),
        (&["memcached"], "no `-d` in `command`"),
        (&["rsyslogd", "ntpd"], "`-n` in `command`"),
        (&["named", "avahi-daemon"], "`-f` in `command`"),
        (&["dnsmasq"], "`-k` in `command`"),
        (&["dbus-daemon"], "`--nofork` in `command`"),
        (&["squid"], "`-N` in `command`"),
        (&["postfix"], "`start-fg` in `command`, not `start`"),
    ];
    if let Some((_, fix)) = known.iter().find(|(names, _)| names.contains(&base)) {
        return format!("{base}: {fix}");
    }
    if base.starts_with("php-fpm") {
        return format!("{base}: `--nodaemonize` in `command`");
    }
    "its foreground flag in `command`, often `-f`, `-D`, `-n` or `--foreground`: see its manual"
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn names_the_fix_of_common_daemons() {
        let redis = fix(&cmd(&["/usr/bin/redis-server", "/etc/redis/redis.conf"]));
        assert!(redis.contains("daemonize no"), "{redis}");
        assert!(fix(&cmd(&["/usr/sbin/nginx"])).contains("daemon off;"));
        assert!(fix(&cmd(&["/usr/sbin/sshd"])).contains("-D"));
        assert!(fix(&cmd(&["cron"])).contains("-f"));
        assert!(fix(&cmd(&["/usr/sbin/php-fpm8.2"])).contains("--nodaemonize"));
        let other = fix(&cmd(&["/opt/x/bin/agent", "--daemon"]));
        assert!(other.starts_with("its foreground flag"), "{other}");
        assert!(fix(&[]).starts_with("its foreground flag"));
    }

    #[test]
    fn the_reason_says_it_forked_and_how_many_remained() {
        let r = reason("exited with code 0", Some(1), &cmd(&["redis-server"]));
        assert_eq!(
            r,
            "exited with code 0 while 1 other process of its run remained: it forked into the \
             background: run it in the foreground (redis-server: `daemonize no` in its config \
             file, or `--daemonize no` in `command`)"
        );
        assert!(reason("exited with code 0", Some(3), &[]).contains("3 other processes"));
        assert!(reason("exited with code 0", None, &[])
            .contains("code 0 while other processes of its run remained: it forked"));
        assert_eq!(
            ended("exited with code 0", Some(1)),
            "exited with code 0; 1 other process of its run was still there, and ended with it"
        );
        assert_eq!(
            ended("exited with code 0", None),
            "exited with code 0; other processes of its run were still there, and ended with it"
        );
    }
}
