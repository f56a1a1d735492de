//! sup::fleet::artifact against real servers on loopback: a small HTTP server in a thread
//! of the test (good, 404, cut mid-body, too big, redirect), a python3 HTTPS server with a
//! CA made here by openssl, and file:// URLs; archives are built here with the tar and
//! flate2 crates, malicious ones by writing the tar headers by hand.

mod common;
use common::certs;
use flate2::write::GzEncoder;
use sha2::{Digest, Sha256};
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;
use sup::fleet::artifact::{check_sha256, fetch, fetch_with, FetchError, FetchOptions, Pace};
use tar::EntryType;

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// One test's directory, removed at the end.
struct Dir(PathBuf);

impl Dir {
    fn new() -> Dir {
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let p = PathBuf::from(format!("/tmp/sup-artifact-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&p);
        fs::create_dir_all(&p).expect("make the test dir");
        Dir(p)
    }
    fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
    /// The staging dir of this test (not made: fetch makes it).
    fn staging(&self) -> PathBuf {
        self.join("staging")
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// One tar entry, written by hand so that the test can write what a well-behaved
/// builder would refuse (`..`, absolute paths).
struct E<'a> {
    name: &'a str,
    kind: EntryType,
    link: &'a str,
    data: &'a [u8],
    mode: u32,
}

fn file<'a>(name: &'a str, data: &'a [u8], mode: u32) -> E<'a> {
    E {
        name,
        kind: EntryType::Regular,
        link: "",
        data,
        mode,
    }
}

fn dir(name: &str, mode: u32) -> E<'_> {
    E {
        name,
        kind: EntryType::Directory,
        link: "",
        data: b"",
        mode,
    }
}

fn symlink<'a>(name: &'a str, target: &'a str) -> E<'a> {
    E {
        name,
        kind: EntryType::Symlink,
        link: target,
        data: b"",
        mode: 0o777,
    }
}

fn other<'a>(name: &'a str, kind: EntryType, link: &'a str) -> E<'a> {
    E {
        name,
        kind,
        link,
        data: b"",
        mode: 0o644,
    }
}

fn targz(entries: &[E]) -> Vec<u8> {
    let mut b = tar::Builder::new(GzEncoder::new(Vec::new(), flate2::Compression::default()));
    for e in entries {
        let mut h = tar::Header::new_gnu();
        let old = h.as_old_mut();
        old.name[..e.name.len()].copy_from_slice(e.name.as_bytes());
        old.linkname[..e.link.len()].copy_from_slice(e.link.as_bytes());
        h.set_entry_type(e.kind);
        h.set_size(e.data.len() as u64);
        h.set_mode(e.mode);
        h.set_uid(4242);
        h.set_gid(4242);
        h.set_mtime(1_700_000_000);
        h.set_cksum();
        b.append(&h, e.data).expect("append to the test archive");
    }
    b.into_inner()
        .expect("finish the tar")
        .finish()
        .expect("finish the gzip")
}

fn sha(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn opts() -> FetchOptions {
    FetchOptions {
        timeout: Duration::from_secs(10),
        ..FetchOptions::default()
    }
}

/// The names in `dir`, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .expect("read staging")
        .map(|e| {
            e.expect("dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    v.sort();
    v
}

fn mode(p: &Path) -> u32 {
    fs::symlink_metadata(p).expect("stat").mode() & 0o7777
}

/// A good archive: a version directory with an executable, a config, a read-only
/// directory, relative symlinks.
fn good_archive() -> Vec<u8> {
    targz(&[
        dir("./", 0o755),
        dir("./bin/", 0o755),
        file("./bin/tool", b"#!/bin/sh\necho hi\n", 0o755),
        file("./etc/tool.conf", b"x = 1\n", 0o640),
        file("./share/loose", b"y\n", 0o666),
        file("./share/setuid", b"z\n", 0o4755),
        dir("./ro/", 0o555),
        file("./ro/inside", b"in\n", 0o444),
        symlink("./bin/conf", "../etc/tool.conf"),
        symlink("./current", "bin/tool"),
    ])
}

fn assert_good(at: &Path) {
    assert_eq!(
        fs::read(at.join("bin/tool")).expect("bin/tool"),
        b"#!/bin/sh\necho hi\n"
    );
    assert_eq!(
        mode(&at.join("bin/tool")),
        0o755,
        "the executable bit is kept"
    );
    assert_eq!(mode(&at.join("etc/tool.conf")), 0o640);
    assert_eq!(mode(&at.join("share/loose")), 0o644, "no group/other write");
    assert_eq!(mode(&at.join("share/setuid")), 0o755, "no setuid");
    assert_eq!(mode(&at.join("ro")), 0o555);
    assert_eq!(fs::read(at.join("ro/inside")).expect("ro/inside"), b"in\n");
    assert_eq!(
        fs::read_link(at.join("bin/conf")).expect("bin/conf"),
        Path::new("../etc/tool.conf")
    );
    assert_eq!(
        fs::read(at.join("bin/conf")).expect("through bin/conf"),
        b"x = 1\n"
    );
    assert_eq!(
        fs::read(at.join("current")).expect("current"),
        b"#!/bin/sh\necho hi\n"
    );
    let uid = nix::unistd::geteuid().as_raw();
    assert_eq!(
        fs::metadata(at.join("bin/tool")).expect("stat").uid(),
        uid,
        "owners are not taken from the archive"
    );
}

/// What the test server answers for a path.
#[derive(Clone)]
enum Reply {
    Body(Vec<u8>),
    /// No Content-Length: the body ends when the connection closes.
    Unsized(Vec<u8>),
    Status(u16),
    /// Announces the whole length, sends half, closes.
    Cut(Vec<u8>),
    Redirect(&'static str),
    /// Announces this many bytes, then sends one every 200 ms until the client goes.
    Trickle(usize),
}

/// A one-thread HTTP/1.1 server on 127.0.0.1, one connection at a time.
struct Server {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    fn start(routes: Vec<(&'static str, Reply)>) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
        let addr = listener.local_addr().expect("local addr");
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stopping.load(Ordering::SeqCst) {
                    break;
                }
                if let Ok(conn) = conn {
                    serve(conn, &routes);
                }
            }
        });
        Server {
            addr,
            stop,
            thread: Some(thread),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr); // wakes the accept
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(mut conn: TcpStream, routes: &[(&'static str, Reply)]) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match conn.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return,
        }
    }
    let head = String::from_utf8_lossy(&head);
    let path = head.split(' ').nth(1).unwrap_or("");
    let reply = routes
        .iter()
        .find(|(p, _)| *p == path)
        .map(|(_, r)| r.clone())
        .unwrap_or(Reply::Status(404));
    let out = match reply {
        Reply::Body(b) => [
            format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                b.len()
            )
            .into_bytes(),
            b,
        ]
        .concat(),
        Reply::Unsized(b) => [b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n".to_vec(), b].concat(),
        Reply::Status(code) => format!(
            "HTTP/1.1 {code} Whatever\r\nContent-Length: 3\r\nConnection: close\r\n\r\nno\n"
        )
        .into_bytes(),
        Reply::Cut(b) => [
            format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                b.len()
            )
            .into_bytes(),
            b[..b.len() / 2].to_vec(),
        ]
        .concat(),
        Reply::Trickle(n) => {
            let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {n}\r\n\r\n");
            if conn.write_all(head.as_bytes()).is_err() {
                return;
            }
            for _ in 0..n {
                if conn.write_all(b"x").is_err() {
                    return;
                }
                // The fault's own pace.
                std::thread::sleep(Duration::from_millis(200));
            }
            return;
        }
        Reply::Redirect(to) => format!(
            "HTTP/1.1 302 Found\r\nLocation: {to}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
        .into_bytes(),
    };
    let _ = conn.write_all(&out);
    let _ = conn.shutdown(Shutdown::Both);
}

#[test]
fn a_good_archive_over_http_is_unpacked_with_its_modes() {
    let d = Dir::new();
    let tgz = good_archive();
    let srv = Server::start(vec![("/tool-1.2.0.tar.gz", Reply::Body(tgz.clone()))]);
    let staging = d.staging();
    let at = fetch(
        &srv.url("/tool-1.2.0.tar.gz"),
        &sha(&tgz).to_uppercase(),
        &staging,
        "1.2.0",
        &opts(),
    )
    .expect("fetch");
    assert_eq!(at, staging.join("1.2.0"));
    assert_good(&at);
    assert_eq!(listing(&staging), ["1.2.0"], "no temp files are left");
    assert_eq!(mode(&staging), 0o700, "staging is made private");
}

#[test]
fn a_redirect_is_followed_and_an_unsized_body_read_to_its_end() {
    let d = Dir::new();
    let tgz = good_archive();
    let srv = Server::start(vec![
        ("/old.tar.gz", Reply::Redirect("/new.tar.gz")),
        ("/new.tar.gz", Reply::Unsized(tgz.clone())),
    ]);
    let at = fetch(
        &srv.url("/old.tar.gz"),
        &sha(&tgz),
        &d.staging(),
        "2",
        &opts(),
    )
    .expect("fetch through a redirect");
    assert_good(&at);
}

#[test]
fn a_good_archive_over_file_url_is_unpacked_with_its_modes() {
    let d = Dir::new();
    let tgz = good_archive();
    let src = d.join("tool 1.2.0.tar.gz");
    fs::write(&src, &tgz).expect("write the archive");
    let url = format!("file://{}", src.display()).replace(' ', "%20");
    let staging = d.staging();
    let at = fetch(&url, &sha(&tgz), &staging, "1.2.0", &opts()).expect("fetch file://");
    assert_good(&at);
    assert_eq!(listing(&staging), ["1.2.0"]);
}

#[test]
fn a_bare_path_is_refused_with_a_hint_to_use_file_url() {
    let d = Dir::new();
    let err = fetch(
        "/srv/tool.tar.gz",
        &"0".repeat(64),
        &d.staging(),
        "1",
        &opts(),
    )
    .expect_err("a bare path");
    assert!(matches!(err, FetchError::Url(_)), "{err:?}");
    assert!(err.to_string().contains("file:///srv/tool.tar.gz"), "{err}");
    let err = fetch(
        "ftp://h/t.tar.gz",
        &"0".repeat(64),
        &d.staging(),
        "1",
        &opts(),
    )
    .expect_err("ftp");
    assert!(matches!(err, FetchError::Url(_)), "{err:?}");
    assert!(check_sha256("xyz").is_err());
}

#[test]
fn a_wrong_sha256_is_a_mismatch_and_nothing_is_unpacked() {
    let d = Dir::new();
    let tgz = good_archive();
    let srv = Server::start(vec![("/t.tar.gz", Reply::Body(tgz.clone()))]);
    let staging = d.staging();
    // A leftover from an earlier attempt is not left to look like this one's result.
    fs::create_dir_all(staging.join("1.2.0")).expect("leftover");
    let wrong = "ab".repeat(32);
    let err = fetch(&srv.url("/t.tar.gz"), &wrong, &staging, "1.2.0", &opts())
        .expect_err("a wrong sha256 must fail");
    match &err {
        FetchError::Mismatch { expected, got } => {
            assert_eq!(expected, &wrong);
            assert_eq!(got, &sha(&tgz));
        }
        other => panic!("not a mismatch: {other:?}"),
    }
    assert!(err.to_string().contains(&sha(&tgz)), "{err}");
    assert!(listing(&staging).is_empty(), "{:?}", listing(&staging));
}

#[test]
fn http_404_is_a_download_error_naming_it() {
    let d = Dir::new();
    let srv = Server::start(vec![]);
    let url = srv.url("/missing.tar.gz");
    let err = fetch(&url, &"0".repeat(64), &d.staging(), "1", &opts()).expect_err("404");
    assert!(matches!(err, FetchError::Download(_)), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("404") && text.contains(&url), "{text}");
    assert!(listing(&d.staging()).is_empty());
}

#[test]
fn a_connection_closed_mid_body_is_a_download_error_and_nothing_is_unpacked() {
    let d = Dir::new();
    let tgz = good_archive();
    let srv = Server::start(vec![("/t.tar.gz", Reply::Cut(tgz.clone()))]);
    let err = fetch(
        &srv.url("/t.tar.gz"),
        &sha(&tgz),
        &d.staging(),
        "1",
        &opts(),
    )
    .expect_err("a cut body");
    assert!(matches!(err, FetchError::Download(_)), "{err:?}");
    assert!(listing(&d.staging()).is_empty());
}

#[test]
fn a_download_over_max_bytes_is_refused() {
    let d = Dir::new();
    let tgz = good_archive();
    let srv = Server::start(vec![
        ("/sized.tar.gz", Reply::Body(tgz.clone())),
        ("/unsized.tar.gz", Reply::Unsized(tgz.clone())),
    ]);
    let src = d.join("t.tar.gz");
    fs::write(&src, &tgz).expect("write the archive");
    let small = FetchOptions {
        max_bytes: tgz.len() as u64 - 1,
        ..opts()
    };
    for url in [
        srv.url("/sized.tar.gz"),
        srv.url("/unsized.tar.gz"),
        format!("file://{}", src.display()),
    ] {
        let err = fetch(&url, &sha(&tgz), &d.staging(), "1", &small).expect_err("too big");
        assert!(matches!(err, FetchError::Download(_)), "{url}: {err:?}");
        assert!(err.to_string().contains("limit"), "{err}");
        assert!(listing(&d.staging()).is_empty(), "{url}");
    }
    // Exactly max_bytes is fine.
    let exact = FetchOptions {
        max_bytes: tgz.len() as u64,
        ..opts()
    };
    fetch(
        &srv.url("/unsized.tar.gz"),
        &sha(&tgz),
        &d.staging(),
        "1",
        &exact,
    )
    .expect("exactly max_bytes");
}

#[test]
fn unsafe_entries_are_refused_and_nothing_is_left() {
    let d = Dir::new();
    let cases: Vec<(&str, Vec<E>)> = vec![
        ("parent dir", vec![file("../escaped", b"x", 0o644)]),
        (
            "parent dir inside",
            vec![file("a/../../escaped", b"x", 0o644)],
        ),
        (
            "absolute path",
            vec![file("/tmp/sup-artifact-abs", b"x", 0o644)],
        ),
        ("symlink out", vec![symlink("bin/up", "../../etc")]),
        ("symlink absolute", vec![symlink("passwd", "/etc/passwd")]),
        ("symlink dotdot late", vec![symlink("a/l", "x/../../..")]),
        (
            "write through a symlink",
            vec![
                dir("sub", 0o755),
                symlink("l", "sub"),
                file("l/x", b"x", 0o644),
            ],
        ),
        (
            "replace a symlink",
            vec![symlink("l", "ok"), file("l", b"x", 0o644)],
        ),
        ("hard link", vec![other("h", EntryType::Link, "ok")]),
        ("fifo", vec![other("f", EntryType::Fifo, "")]),
        ("char device", vec![other("c", EntryType::Char, "")]),
        ("block device", vec![other("b", EntryType::Block, "")]),
    ];
    let mut wrong = Vec::new();
    for (what, entries) in cases {
        let mut all = vec![file("ok", b"ok\n", 0o644)];
        all.extend(entries);
        let tgz = targz(&all);
        let src = d.join("t.tar.gz");
        fs::write(&src, &tgz).expect("write the archive");
        let staging = d.staging();
        let url = format!("file://{}", src.display());
        match fetch(&url, &sha(&tgz), &staging, "1", &opts()) {
            Err(FetchError::Unpack(_)) => {}
            other => wrong.push(format!("{what}: {other:?}")),
        }
        if !listing(&staging).is_empty() {
            wrong.push(format!("{what}: left {:?}", listing(&staging)));
        }
        for outside in [
            staging.join("escaped"),
            d.join("escaped"),
            "/tmp/sup-artifact-abs".into(),
        ] {
            if outside.exists() {
                wrong.push(format!("{what}: wrote {}", outside.display()));
                let _ = fs::remove_file(outside);
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

#[test]
fn a_leftover_from_an_earlier_attempt_is_replaced() {
    let d = Dir::new();
    let staging = d.staging();
    fs::create_dir_all(staging.join("1.2.0/bin")).expect("leftover");
    fs::write(staging.join("1.2.0/bin/old"), "old").expect("leftover file");
    fs::set_permissions(staging.join("1.2.0/bin"), fs::Permissions::from_mode(0o555))
        .expect("chmod leftover");
    fs::write(staging.join(".1.2.0.download"), "half").expect("leftover download");
    fs::create_dir_all(staging.join(".1.2.0.unpack/x")).expect("leftover unpack");
    let tgz = good_archive();
    let src = d.join("t.tar.gz");
    fs::write(&src, &tgz).expect("write the archive");
    let at = fetch(
        &format!("file://{}", src.display()),
        &sha(&tgz),
        &staging,
        "1.2.0",
        &opts(),
    )
    .expect("fetch over a leftover");
    assert!(!at.join("bin/old").exists(), "the leftover is gone");
    assert_good(&at);
    assert_eq!(listing(&staging), ["1.2.0"]);
}

/// A python3 HTTPS server on 127.0.0.1 serving `root`, with a certificate for 127.0.0.1
/// signed by a CA made here; killed by its PID when dropped.
struct Https {
    child: Child,
    port: u16,
}

impl Drop for Https {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const HTTPS_SERVER: &str = r#"
import functools, http.server, ssl, sys
cert, key, root = sys.argv[1:4]
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=root)
server = http.server.HTTPServer(("127.0.0.1", 0), handler)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
server.socket = ctx.wrap_socket(server.socket, server_side=True)
print(server.server_address[1], flush=True)
server.serve_forever()
"#;

/// Whether `cmd` can be run at all (its answer to `version` does not matter).
fn have(cmd: &str) -> bool {
    Command::new(cmd)
        .arg("version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// Makes ca.pem, srv.pem and srv.key in `dir`.
fn make_certs(dir: &Path) {
    certs::make_ca(dir, "/CN=sup test CA");
    certs::sign(
        dir,
        "srv",
        "/CN=127.0.0.1",
        "basicConstraints=CA:FALSE\nsubjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
    );
}

fn start_https(certs: &Path, root: &Path) -> Https {
    let mut child = Command::new("python3")
        .arg("-c")
        .arg(HTTPS_SERVER)
        .arg(certs.join("srv.pem"))
        .arg(certs.join("srv.key"))
        .arg(root)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start python3");
    let stdout = child.stdout.take().expect("python3's stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let mut server = Https { child, port: 0 };
    let line = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the HTTPS server says its port within 20 s");
    server.port = line.trim().parse().expect("a port number");
    server
}

#[test]
fn https_with_a_ca_file_is_trusted_and_without_it_refused() {
    if !have("openssl") || !have("python3") {
        eprintln!("SKIPPED: https test needs openssl and python3 (.ci/run installs them)");
        return;
    }
    let d = Dir::new();
    let certs = d.join("certs");
    let root = d.join("www");
    fs::create_dir_all(&certs).expect("certs dir");
    fs::create_dir_all(&root).expect("www dir");
    make_certs(&certs);
    let tgz = good_archive();
    fs::write(root.join("t.tar.gz"), &tgz).expect("write the archive");
    let server = start_https(&certs, &root);
    let url = format!("https://127.0.0.1:{}/t.tar.gz", server.port);

    let trusted = FetchOptions {
        ca_file: Some(certs.join("ca.pem")),
        ..opts()
    };
    let at = fetch(&url, &sha(&tgz), &d.staging(), "1", &trusted).expect("fetch over https");
    assert_good(&at);

    let err = fetch(&url, &sha(&tgz), &d.staging(), "2", &opts())
        .expect_err("a certificate from an unknown CA");
    assert!(matches!(err, FetchError::Download(_)), "{err:?}");
    assert!(err.to_string().contains(&url), "{err}");
    assert_eq!(listing(&d.staging()), ["1"]);
}

/// A body that trickles (5 bytes a second, where the pace wants 100 in each second) is
/// given up at the stall deadline, saying so; progress was told with the size announced;
/// nothing is left in staging.
#[test]
fn a_trickling_download_is_given_up_at_its_stall_deadline_with_its_progress_told() {
    let d = Dir::new();
    let srv = Server::start(vec![("/slow.tar.gz", Reply::Trickle(100_000))]);
    let staging = d.staging();
    let o = FetchOptions {
        pace: Pace {
            stall: Duration::from_secs(1),
            stall_bytes: 100,
            ..Pace::default()
        },
        ..opts()
    };
    let mut told = Vec::new();
    let started = std::time::Instant::now();
    let url = srv.url("/slow.tar.gz");
    let e = fetch_with(
        &url,
        &"ab".repeat(32),
        &staging,
        "1.0.0",
        &o,
        &mut |b, t| told.push((b, t)),
    )
    .unwrap_err();
    let took = started.elapsed();
    let FetchError::Download(m) = &e else {
        panic!("not a download error: {e:?}")
    };
    assert!(
        m.contains(&format!("download of {url} too slow: "))
            && m.contains("bytes in 1 s")
            && m.contains("stalled"),
        "{m}"
    );
    assert!(took < Duration::from_secs(5), "given up after {took:?}");
    assert_eq!(told.first(), Some(&(0, Some(100_000))), "{told:?}");
    assert_eq!(listing(&staging), Vec::<String>::new(), "nothing left");
}
