//! `listen = ["tcp:127.0.0.1:8080", "tcp:[::1]:8080", "unix:/run/app.sock"]` and
//! `fd_store = N`: the sockets supd binds for a service and hands to each of its runs
//! (`kept.rs` holds them), and how many fds the service may keep in supd. Here only the
//! values are read and checked; nothing is bound.

use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::PathBuf;

/// The most fds one service may keep in supd's store: each is an open file of supd's,
/// and the kernel passes at most 253 in one message (SCM_MAX_FD).
pub const FD_STORE_MAX: u32 = 4096;

/// The most `listen` entries of one service.
pub const LISTEN_MAX: usize = 64;

/// One `listen` entry: a stream socket supd binds and listens on.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ListenAddr {
    /// `tcp:ADDRESS:PORT`: an IPv4 or (in brackets) IPv6 literal; never a name, which
    /// supd would have to look up.
    Tcp(SocketAddr),
    /// `unix:/ABSOLUTE/PATH`: a Unix stream socket there, given to the service's user.
    Unix(PathBuf),
}

impl std::fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ListenAddr::Tcp(a) => write!(f, "tcp:{a}"),
            ListenAddr::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// The longest path a Unix socket address holds (sun_path, less its final NUL).
const SUN_PATH_MAX: usize = 107;

/// Reads one `listen` entry.
pub fn parse(s: &str) -> Result<ListenAddr, String> {
    let expected = "expected \"tcp:ADDRESS:PORT\" (such as \"tcp:127.0.0.1:8080\" or \
                    \"tcp:[::1]:8080\") or \"unix:/PATH\"";
    if let Some(rest) = s.strip_prefix("tcp:") {
        let addr: SocketAddr = rest.parse().map_err(|_| {
            if rest.rsplit_once(':').is_some_and(|(host, _)| {
                !host.is_empty() && host.parse::<std::net::IpAddr>().is_err()
            }) && !rest.starts_with('[')
            {
                format!("'{s}': the address is not an IP address (supd looks up no host names); {expected}")
            } else {
                format!("'{s}' is not an address and a port; {expected}")
            }
        })?;
        if addr.port() == 0 {
            return Err(format!(
                "'{s}': port 0 would be a different port at each bind; name one"
            ));
        }
        if let SocketAddr::V6(v6) = addr {
            // supd binds IPv6 alone (IPV6_V6ONLY): a mapped IPv4 address cannot be bound.
            if let Some(v4) = v6.ip().to_ipv4_mapped() {
                return Err(format!(
                    "'{s}' is an IPv4 address in IPv6 form: write \"tcp:{v4}:{}\"",
                    addr.port()
                ));
            }
        }
        return Ok(ListenAddr::Tcp(addr));
    }
    if let Some(path) = s.strip_prefix("unix:") {
        if !path.starts_with('/') {
            return Err(format!("'{s}': the path must be absolute; {expected}"));
        }
        if path.ends_with('/') {
            return Err(format!("'{s}' names a directory, not a socket"));
        }
        if path.contains('\0') || path.chars().any(char::is_control) {
            return Err(format!("'{s}' holds a control character"));
        }
        if path.len() > SUN_PATH_MAX {
            return Err(format!(
                "'{s}': the path is {} bytes, longer than a Unix socket address holds ({SUN_PATH_MAX})",
                path.len()
            ));
        }
        return Ok(ListenAddr::Unix(PathBuf::from(path)));
    }
    Err(format!("'{s}': {expected}"))
}

/// Whether `a` and `b` cannot both be bound: the same address, or TCP addresses of one
/// port and family where one is the wildcard (`0.0.0.0` takes the port on every IPv4
/// address, `[::]` on every IPv6 one: supd binds IPv6 alone, so not on IPv4's).
pub fn clashes(a: &ListenAddr, b: &ListenAddr) -> bool {
    match (a, b) {
        (ListenAddr::Tcp(x), ListenAddr::Tcp(y)) => {
            let same = match (x, y) {
                (SocketAddr::V6(x), SocketAddr::V6(y)) => {
                    x.ip() == y.ip() && x.scope_id() == y.scope_id()
                }
                _ => x.ip() == y.ip(),
            };
            x.port() == y.port()
                && x.is_ipv4() == y.is_ipv4()
                && (same || x.ip().is_unspecified() || y.ip().is_unspecified())
        }
        _ => a == b,
    }
}

/// The addresses among which one that clashes with `a` is found ([`clashes`]): a TCP
/// address's port and family (as the wildcard of its family), a Unix socket's path.
pub fn clash_key(a: &ListenAddr) -> ListenAddr {
    match a {
        ListenAddr::Tcp(SocketAddr::V4(x)) => ListenAddr::Tcp(SocketAddr::new(
            std::net::Ipv4Addr::UNSPECIFIED.into(),
            x.port(),
        )),
        ListenAddr::Tcp(SocketAddr::V6(x)) => ListenAddr::Tcp(SocketAddr::new(
            std::net::Ipv6Addr::UNSPECIFIED.into(),
            x.port(),
        )),
        ListenAddr::Unix(_) => a.clone(),
    }
}

/// Reads `fd_store = N`.
pub fn fd_store(n: i64) -> Result<u32, String> {
    u32::try_from(n)
        .ok()
        .filter(|n| *n <= FD_STORE_MAX)
        .ok_or_else(|| format!("expected a number of fds from 0 to {FD_STORE_MAX}"))
}

#[cfg(test)]
// A test's expects and unwraps are a test's: a failed one fails the test.
mod tests {
    use super::*;

    #[test]
    fn tcp_and_unix_addresses_are_read() {
        assert_eq!(
            parse("tcp:127.0.0.1:8080"),
            Ok(ListenAddr::Tcp("127.0.0.1:8080".parse().unwrap()))
        );
        assert_eq!(
            parse("tcp:[::1]:8080"),
            Ok(ListenAddr::Tcp("[::1]:8080".parse().unwrap()))
        );
        assert_eq!(
            parse("unix:/run/app.sock"),
            Ok(ListenAddr::Unix("/run/app.sock".into()))
        );
        for s in ["tcp:127.0.0.1:8080", "tcp:[::1]:8080", "unix:/run/app.sock"] {
            assert_eq!(parse(s).unwrap().to_string(), s);
        }
    }

    #[test]
    fn bad_entries_say_what_was_expected() {
        for (s, says) in [
            ("tcp:localhost:8080", "no host names"),
            ("tcp:127.0.0.1", "not an address and a port"),
            ("tcp:127.0.0.1:0", "port 0"),
            ("tcp:127.0.0.1:99999", "not an address and a port"),
            ("tcp:::1:80", "not an address and a port"),
            ("unix:run/app.sock", "absolute"),
            ("unix:/run/", "directory"),
            ("udp:127.0.0.1:53", "expected \"tcp:"),
            ("127.0.0.1:8080", "expected \"tcp:"),
        ] {
            let e = parse(s).unwrap_err();
            assert!(e.contains(says), "{s}: {e}");
        }
        let long = format!("unix:/{}", "a".repeat(120));
        assert!(parse(&long).unwrap_err().contains("longer than"));
    }

    #[test]
    fn a_wildcard_clashes_with_the_addresses_of_its_family_on_its_port() {
        let a = |s: &str| parse(s).unwrap();
        for (x, y, clash) in [
            ("tcp:127.0.0.1:80", "tcp:127.0.0.1:80", true),
            ("tcp:0.0.0.0:80", "tcp:127.0.0.1:80", true),
            ("tcp:127.0.0.1:80", "tcp:0.0.0.0:80", true),
            ("tcp:[::]:80", "tcp:[::1]:80", true),
            ("tcp:0.0.0.0:80", "tcp:[::]:80", false),
            ("tcp:0.0.0.0:80", "tcp:[::1]:80", false),
            ("tcp:127.0.0.1:80", "tcp:127.0.0.2:80", false),
            ("tcp:0.0.0.0:80", "tcp:0.0.0.0:81", false),
            ("tcp:[fe80::1%2]:80", "tcp:[fe80::1%3]:80", false),
            ("unix:/run/a.sock", "unix:/run/a.sock", true),
            ("unix:/run/a.sock", "unix:/run/b.sock", false),
        ] {
            assert_eq!(clashes(&a(x), &a(y)), clash, "{x} {y}");
            if clash {
                assert_eq!(clash_key(&a(x)), clash_key(&a(y)), "{x} {y}");
            }
        }
        let e = parse("tcp:[::ffff:127.0.0.1]:80").unwrap_err();
        assert!(e.contains("write \"tcp:127.0.0.1:80\""), "{e}");
    }

    #[test]
    fn fd_store_is_bounded() {
        assert_eq!(fd_store(0), Ok(0));
        assert_eq!(fd_store(16), Ok(16));
        assert!(fd_store(-1).is_err());
        assert!(fd_store(i64::from(FD_STORE_MAX) + 1).is_err());
    }

    fn errors_of(text: &str) -> Vec<String> {
        let path = std::path::Path::new("/etc/sup/sup.toml");
        match crate::config::load_text(path, text) {
            Ok(_) => Vec::new(),
            Err(errors) => errors.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn config_errors_name_their_place_and_what_to_do() {
        let base = "[service.a]\ncommand = [\"/bin/true\"]\n";
        let e = errors_of(&format!(
            "{base}listen = [\"tcp:127.0.0.1:80\", \"tcp:web:80\"]\n"
        ));
        assert!(
            e[0].starts_with("/etc/sup/sup.toml:3:31: service.a.listen: 'tcp:web:80'"),
            "{e:?}"
        );
        let e = errors_of(&format!(
            "{base}listen = [\"unix:/run/a.sock\", \"unix:/run/a.sock\"]\n"
        ));
        assert!(e[0].contains("listed twice"), "{e:?}");
        let e = errors_of(&format!("{base}fd_store = -1\n"));
        assert!(
            e[0].contains("3:12: service.a.fd_store: expected a number"),
            "{e:?}"
        );
        // fd:N among the fds given (3 for the socket, 4 and 5 for the store).
        let e = errors_of(&format!(
            "{base}listen = [\"tcp:127.0.0.1:80\"]\nfd_store = 2\nready = \"fd:5\"\n"
        ));
        assert!(
            e[0].contains("service.a.ready") && e[0].contains("above them"),
            "{e:?}"
        );
        assert!(errors_of(&format!(
            "{base}listen = [\"tcp:127.0.0.1:80\"]\nfd_store = 2\nready = \"fd:6\"\n"
        ))
        .is_empty());
    }

    #[test]
    fn one_address_is_one_service() {
        let text = "[service.a]\ncommand = [\"/bin/true\"]\nlisten = [\"tcp:[::1]:80\"]\n\
                    [service.b]\ncommand = [\"/bin/true\"]\nlisten = [\"tcp:[::1]:80\"]\n";
        let e = errors_of(text);
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].contains("service.b.listen: 'tcp:[::1]:80' is a's too"),
            "{e:?}"
        );
        let text = "[service.w]\ncommand = [\"/bin/true\"]\ninstances = 2\n\
                    listen = [\"tcp:127.0.0.1:80\"]\n";
        let e = errors_of(text);
        assert!(e[0].contains("each of its 2 instances"), "{e:?}");
        let ok = "[service.a]\ncommand = [\"/bin/true\"]\nlisten = [\"tcp:0.0.0.0:80\", \"tcp:[::]:80\"]\n";
        assert!(errors_of(ok).is_empty());
    }
}
