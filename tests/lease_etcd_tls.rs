//! A production etcd (issue 22): several endpoints, a dead or hung one left for the next
//! within a tick; https with mutual TLS (certificates made here by openssl); etcd's
//! authentication, enabled here through the JSON gateway as `etcdctl auth enable` would.
//! Each failure an operator can make is said: what, where, and what to do.

mod common;
use common::certs;
use common::cluster::{Cluster, Options, SUP_LEASE};
use common::etcd::Etcd;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

// A store call may take T/3: at 3 s, a loaded machine's first call on a fresh https
// connection (and what is left of it after a dead and a hung endpoint had their shares)
// is not cut short into a lost tick, which these tests count as a failure.
const TTL: &str = "3s";

fn have_openssl() -> bool {
    let ok = Command::new("openssl")
        .arg("version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    assert!(
        ok || std::env::var_os("CI").is_none(),
        "openssl is missing: .ci/run installs it"
    );
    if !ok {
        eprintln!("skipped: openssl is not installed");
    }
    ok
}

/// A CA; etcd's certificate for 127.0.0.1 (server and client auth: its gateway dials
/// etcd with it); a client certificate for this node. All EC P-256, in `dir`.
struct Certs {
    dir: PathBuf,
}

impl Certs {
    fn make(dir: PathBuf) -> Certs {
        std::fs::create_dir_all(&dir).expect("certs dir");
        certs::make_ca(&dir, "/CN=sup etcd test CA");
        certs::sign(
            &dir,
            "server",
            "/CN=127.0.0.1",
            "basicConstraints=CA:FALSE\nsubjectAltName=IP:127.0.0.1\n\
             extendedKeyUsage=serverAuth,clientAuth\n",
        );
        certs::sign(
            &dir,
            "client",
            "/CN=node",
            "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n",
        );
        Certs { dir }
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    /// etcd serving https, asking its clients for a certificate signed by the CA.
    fn etcd_args(&self) -> Vec<String> {
        [
            "--cert-file",
            &self.path("server.pem"),
            "--key-file",
            &self.path("server.key"),
            "--client-cert-auth",
            "--trusted-ca-file",
            &self.path("ca.pem"),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }

    /// What a node gives sup-lease for mutual TLS.
    fn mutual(&self) -> Vec<String> {
        vec![
            "--cacert".into(),
            self.path("ca.pem"),
            "--cert".into(),
            self.path("client.pem"),
            "--key".into(),
            self.path("client.key"),
        ]
    }
}

/// `sup-lease --lease engine --store STORE ARGS... status`.
fn status(store: &str, args: &[String]) -> Output {
    Command::new(SUP_LEASE)
        .args(["--lease", "engine", "--store", store])
        .args(args)
        .arg("status")
        .output()
        .expect("sup-lease status")
}

fn said(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Asserts that `out` failed and its standard error says every one of `words`.
fn refused(out: &Output, words: &[&str]) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "not refused: {}", said(out));
    for w in words {
        assert!(err.contains(w), "{w:?} is not said: {}", said(out));
    }
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// One node's cluster on `store`, its sup-lease given `args`.
fn one_node(store: String, args: Vec<String>) -> Cluster {
    Cluster::with(
        &["0.6.2"],
        Some(store),
        TTL,
        Options {
            lease_args: args,
            ..Options::default()
        },
    )
}

/// etcd serving https with mutual TLS, its certificates made in a sandbox of the test's;
/// `None` (said) without openssl or etcd.
fn tls_etcd() -> Option<(common::Sandbox, Certs, Etcd)> {
    if !have_openssl() {
        return None;
    }
    let dir = common::Sandbox::new();
    let certs = Certs::make(dir.path("certs"));
    let e = Etcd::start_with("https", &certs.etcd_args())?;
    Some((dir, certs, e))
}

#[test]
fn a_node_leads_through_https_with_mutual_tls() {
    let Some((_dir, certs, e)) = tls_etcd() else {
        return;
    };
    let c = one_node(e.store(), certs.mutual());
    c.wait_leader("n1");
    let out = status(&e.store(), &certs.mutual());
    assert!(out.status.success(), "{}", said(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("leader: n1"),
        "{}",
        said(&out)
    );
}

#[test]
fn a_tls_etcd_refuses_a_node_without_its_client_certificate_and_says_why() {
    let Some((dir, certs, e)) = tls_etcd() else {
        return;
    };
    let store = e.store();
    // No client certificate: etcd refuses the TLS session.
    refused(
        &status(&store, &strings(&["--cacert", &certs.path("ca.pem")])),
        &[&e.url, "client certificate", "--cert", "--key"],
    );
    // etcd's certificate checked against the system's CAs only.
    refused(
        &status(&store, &[]),
        &[&e.url, "not signed by a CA this node trusts", "--cacert"],
    );
    // The files: missing, not PEM, a key that is not the certificate's.
    let mut args = certs.mutual();
    args[3] = dir.path("nowhere.pem").display().to_string();
    refused(
        &status(&store, &args),
        &["cannot read --cert", "nowhere.pem", "client certificate"],
    );
    let garbage = dir.file("garbage.pem", "not a certificate\n");
    let mut args = certs.mutual();
    args[1] = garbage.clone();
    refused(
        &status(&store, &args),
        &["--cacert", &garbage, "holds no PEM certificate", "CA"],
    );
    let mut args = certs.mutual();
    args[5] = garbage.clone();
    refused(
        &status(&store, &args),
        &["--key", &garbage, "holds no private key"],
    );
    let mut args = certs.mutual();
    args[5] = certs.path("server.key");
    refused(
        &status(&store, &args),
        &["server.key", "cannot be used with --cert", "client.pem"],
    );
    let mut args = certs.mutual();
    args.truncate(4);
    refused(&status(&store, &args), &["--cert needs --key"]);
    // With everything, it is let in.
    let out = status(&store, &certs.mutual());
    assert!(out.status.success(), "{}", said(&out));
}

/// POSTs to etcd's gateway, with a token when given; the answer, whatever its status.
fn gateway(url: &str, path: &str, body: Value, token: Option<&str>) -> Value {
    let mut req = ureq::post(&format!("{url}/v3/{path}"))
        .config()
        .http_status_as_error(false)
        .build()
        .header("content-type", "application/json");
    if let Some(t) = token {
        req = req.header("authorization", t);
    }
    let mut r = req.send(body.to_string()).expect("the gateway");
    let text = r.body_mut().read_to_string().expect("an answer");
    serde_json::from_str(&text).unwrap_or_else(|_| panic!("{path}: not JSON: {text}"))
}

/// Turns etcd's authentication on as an operator does with etcdctl: a root user, and a
/// user `node` (password `right`) whose role may read and write under /sup/.
fn enable_auth(url: &str) {
    let b64 = sup::lease::etcd::b64;
    for (path, body) in [
        (
            "auth/user/add",
            json!({"name": "root", "password": "rootpw"}),
        ),
        ("auth/role/add", json!({"name": "root"})),
        ("auth/user/grant", json!({"user": "root", "role": "root"})),
        (
            "auth/user/add",
            json!({"name": "node", "password": "right"}),
        ),
        ("auth/role/add", json!({"name": "sup"})),
        (
            "auth/role/grant",
            json!({"name": "sup", "perm": {"permType": "READWRITE",
                "key": b64(b"/sup/"), "range_end": b64(b"/sup0")}}),
        ),
        ("auth/user/grant", json!({"user": "node", "role": "sup"})),
        ("auth/enable", json!({})),
    ] {
        let v = gateway(url, path, body, None);
        assert!(v.get("error").is_none(), "{path}: {v}");
    }
}

fn root_token(url: &str) -> String {
    let v = gateway(
        url,
        "auth/authenticate",
        json!({"name": "root", "password": "rootpw"}),
        None,
    );
    v["token"].as_str().expect("root's token").to_string()
}

#[test]
fn with_etcd_authentication_the_right_password_leads_and_a_wrong_one_is_said() {
    // bcrypt at its lowest cost: an authentication in a tick costs a millisecond, not
    // the 100 ms of the default cost, which a T of 1 s on a loaded machine cannot spare.
    let Some(e) = Etcd::start_with("http", &["--bcrypt-cost".into(), "4".into()]) else {
        return;
    };
    enable_auth(&e.url);
    let dir = common::Sandbox::new();
    let right = dir.file("right", "right\n");
    let wrong = dir.file("wrong", "wrong\n");
    let store = e.store();
    refused(
        &status(
            &store,
            &strings(&["--user", "node", "--password-file", &wrong]),
        ),
        &[
            &e.url,
            "refused user 'node'",
            "wrong user name or password",
            &wrong,
        ],
    );
    refused(
        &status(&store, &[]),
        &[&e.url, "give --user NAME --password-file FILE"],
    );
    refused(
        &status(
            &store,
            &strings(&["--user", "node", "--password-file", "/nowhere/pw"]),
        ),
        &["cannot read --password-file /nowhere/pw", "user 'node'"],
    );
    refused(
        &status(&store, &strings(&["--user", "node"])),
        &["--user needs --password-file"],
    );

    let c = one_node(
        store.clone(),
        strings(&["--user", "node", "--password-file", &right]),
    );
    c.wait_leader("n1");
    let pid = c.nodes[0].sb.status("engine")["pid"].clone();
    let out = status(
        &store,
        &strings(&["--user", "node", "--password-file", &right]),
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("leader: n1"),
        "{}",
        said(&out)
    );

    // The password changes: the file first, then etcd, which drops the node's token.
    // The node authenticates again with the file's new password and keeps leading.
    std::fs::write(&right, "changed\n").expect("write the new password");
    let root = root_token(&e.url);
    let v = gateway(
        &e.url,
        "auth/user/changepw",
        json!({"name": "node", "password": "changed"}),
        Some(&root),
    );
    assert!(v.get("error").is_none(), "changepw: {v}");
    c.wait("the node authenticates again", |c| {
        c.logs().contains("authenticating again")
    });
    let later = Instant::now() + Duration::from_secs(2);
    c.wait("two seconds more of leading", |_| Instant::now() >= later);
    let logs = c.logs();
    assert!(!logs.contains("store: "), "a tick failed:\n{logs}");
    assert_eq!(c.running_engines(), ["n1"], "{logs}");
    assert_eq!(
        c.nodes[0].sb.status("engine")["pid"],
        pid,
        "the engine ran on without a stop\n{logs}"
    );
}

/// A port that refuses connections and that no other test can take while the socket
/// lives: bound, never listening.
fn closed_port() -> (std::os::fd::OwnedFd, u16) {
    use nix::sys::socket::SockaddrIn;
    use nix::sys::socket::{bind, getsockname, socket, AddressFamily, SockFlag, SockType};
    let fd = socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .expect("a socket");
    bind(
        std::os::fd::AsRawFd::as_raw_fd(&fd),
        &SockaddrIn::new(127, 0, 0, 1, 0),
    )
    .expect("bind");
    let at: SockaddrIn = getsockname(std::os::fd::AsRawFd::as_raw_fd(&fd)).expect("its address");
    (fd, at.port())
}

#[test]
fn several_endpoints_a_dead_and_a_hung_one_first_still_lead_within_a_tick_or_two() {
    let Some(e) = Etcd::start() else { return };
    // A socket that takes connections (the kernel's backlog) and never answers.
    let hung = TcpListener::bind("127.0.0.1:0").expect("bind");
    let hung_port = hung.local_addr().expect("addr").port();
    let (_closed, closed) = closed_port();
    let store = format!(
        "etcd:http://127.0.0.1:{closed},http://127.0.0.1:{hung_port},{}",
        e.url
    );
    let mut c = Cluster::with(
        &["0.6.2"],
        Some(store.clone()),
        TTL,
        Options {
            hold_leases: true,
            ..Options::default()
        },
    );
    let started = Instant::now();
    c.start_lease(0);
    c.wait_leader("n1");
    let took = started.elapsed();
    // The node leads T after it took the empty key (an empty key does not prove the last
    // grant over), and its supd starts the engine: no tick was lost to the two.
    let ttl = common::parse_ttl(TTL);
    let logs = c.logs();
    assert!(!logs.contains("store: "), "a tick failed:\n{logs}");
    // Both were tried, and left for the next within the call, once per store
    // connection: the tick's, and the watch's (a thread with its own connection).
    let moved = logs.matches("asking it first from now on").count();
    assert!((1..=2).contains(&moved), "moved {moved} times:\n{logs}");
    assert!(
        logs.contains(&format!("127.0.0.1:{closed}: cannot connect")),
        "{logs}"
    );
    assert!(
        logs.contains(&format!("127.0.0.1:{hung_port}: no answer within")),
        "{logs}"
    );
    assert!(
        took < ttl * 2 + Duration::from_secs(2),
        "leading took {took:?}\n{logs}"
    );
    let out = status(&store, &[]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("leader: n1"),
        "{}",
        said(&out)
    );
    drop(hung);
}

/// A TCP proxy to `to` that can be made a black hole: it then takes connections and
/// bytes and answers nothing, as a cut-off member behind a load balancer would.
struct Proxy {
    port: u16,
    black: Arc<AtomicBool>,
}

impl Proxy {
    fn start(to: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let black = Arc::new(AtomicBool::new(false));
        let b = black.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().map_while(Result::ok) {
                let Ok(upstream) = TcpStream::connect(("127.0.0.1", to)) else {
                    continue;
                };
                // No Nagle: each call's few writes pass at once, as without the proxy.
                let _ = upstream.set_nodelay(true);
                let _ = client.set_nodelay(true);
                for (mut from, mut to) in [
                    (
                        client.try_clone().expect("dup"),
                        upstream.try_clone().expect("dup"),
                    ),
                    (upstream, client),
                ] {
                    let b = b.clone();
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 16384];
                        while let Ok(n) = from.read(&mut buf) {
                            if n == 0 {
                                break;
                            }
                            if !b.load(Ordering::SeqCst) && to.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                    });
                }
            }
        });
        Proxy { port, black }
    }
}

#[test]
fn an_endpoint_that_stops_answering_under_the_holder_is_left_without_losing_the_lease() {
    let Some(e) = Etcd::start() else { return };
    let etcd_port: u16 = e
        .url
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("port");
    let proxy = Proxy::start(etcd_port);
    let store = format!("etcd:http://127.0.0.1:{},{}", proxy.port, e.url);
    let c = one_node(store, vec![]);
    c.wait_leader("n1");
    let pid = c.nodes[0].sb.status("engine")["pid"].clone();
    proxy.black.store(true, Ordering::SeqCst);
    let later = Instant::now() + common::parse_ttl(TTL) * 4;
    c.wait("4 T with the first endpoint silent", |_| {
        Instant::now() >= later
    });
    assert_eq!(
        c.running_engines(),
        ["n1"],
        "{}\n{}",
        c.logs(),
        c.nodes[0].sb.supd_log()
    );
    let logs = c.logs();
    assert!(!logs.contains("store: "), "a tick failed:\n{logs}");
    assert!(logs.contains("asking it first from now on"), "{logs}");
    assert_eq!(
        c.nodes[0].sb.status("engine")["pid"],
        pid,
        "the engine ran on without a stop\n{}\n{}",
        c.logs(),
        c.nodes[0].sb.supd_log()
    );
}
