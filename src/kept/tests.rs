//! The kept part with real sockets (a test's expects are a test's).

use super::*;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

fn tcp(port: u16) -> ListenAddr {
    ListenAddr::Tcp(format!("127.0.0.1:{port}").parse().expect("addr"))
}

fn temp_dir(tag: &str) -> crate::scratch::Scratch {
    crate::scratch::Scratch::new(&format!("kept-{tag}"))
}

#[test]
fn a_kept_entry_keeps_its_socket_and_its_backlog() {
    let (a, b) = (tcp(free_port()), tcp(free_port()));
    let mut h = Kept::default();
    h.reconcile(std::slice::from_ref(&a)).expect("bind");
    let fd = h.for_run("web").fds[0].as_raw_fd();
    // A client connects while no run is there: the kernel completes it in the backlog.
    let ListenAddr::Tcp(sa) = &a else {
        unreachable!()
    };
    let mut client = std::net::TcpStream::connect(sa).expect("connect to the held socket");
    h.reconcile(&[b.clone(), a.clone()]).expect("bind b");
    let run = h.for_run("web");
    assert_eq!(run.fds.len(), 2);
    assert_eq!(
        run.fds[1].as_raw_fd(),
        fd,
        "a kept entry is the same socket"
    );
    assert_eq!(run.names, ["web", "web"]);
    // The waiting connection is accepted from the kept socket.
    let listener = std::net::TcpListener::from(run.fds[1].try_clone_to_owned().expect("dup"));
    let (mut conn, _) = listener.accept().expect("accept the waiting connection");
    client.write_all(b"x").expect("write");
    let mut byte = [0u8; 1];
    conn.read_exact(&mut byte).expect("read");
    assert_eq!(&byte, b"x");
    drop(listener);
    // An entry no longer listed is let go: its port refuses.
    h.reconcile(std::slice::from_ref(&b)).expect("keep b");
    assert_eq!(h.for_run("web").fds.len(), 1);
    assert!(
        std::net::TcpStream::connect(sa).is_err(),
        "{a} still listens"
    );
}

#[test]
fn a_port_in_use_is_an_error_that_says_so_and_the_rest_is_held() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let busy = tcp(taken.local_addr().expect("addr").port());
    let free = tcp(free_port());
    let mut h = Kept::default();
    let e = h.reconcile(&[busy.clone(), free.clone()]).unwrap_err();
    assert!(e.contains("in use") && e.contains(&busy.to_string()), "{e}");
    assert_eq!(h.shown().0, [free.to_string()]);
    drop(taken);
    h.reconcile(&[busy.clone(), free.clone()])
        .expect("free now");
    assert_eq!(h.shown().0, [busy.to_string(), free.to_string()]);
}

#[test]
fn unix_sockets_refuse_what_is_not_theirs_and_replace_a_stale_one() {
    let dir = temp_dir("unix");
    let mut h = Kept::default();
    let missing = ListenAddr::Unix(dir.join("no/such/dir.sock"));
    let e = h.reconcile(&[missing]).unwrap_err();
    assert!(e.contains("does not exist"), "{e}");
    let file = dir.join("file");
    std::fs::write(&file, "data").expect("write");
    let e = h.reconcile(&[ListenAddr::Unix(file.clone())]).unwrap_err();
    assert!(e.contains("not a socket"), "{e}");
    assert_eq!(
        std::fs::read(&file).expect("read"),
        b"data",
        "a file was replaced"
    );
    // Somebody else's live socket is refused; a stale one is replaced.
    let path = dir.join("app.sock");
    let other = std::os::unix::net::UnixListener::bind(&path).expect("bind");
    let e = h.reconcile(&[ListenAddr::Unix(path.clone())]).unwrap_err();
    assert!(e.contains("another program listens"), "{e}");
    drop(other);
    h.reconcile(&[ListenAddr::Unix(path.clone())])
        .expect("stale socket replaced");
    let mode = std::fs::metadata(&path).expect("stat").permissions().mode() & 0o777;
    assert_eq!(mode, 0o666);
    UnixStream::connect(&path).expect("connect");
    assert_eq!(h.for_run("app").give, std::slice::from_ref(&path));
    // Let go: its file goes, but only while it is the file supd made.
    assert!(h.release().is_empty(), "nothing was stored");
    assert!(!path.exists(), "the socket file was left");
    h.reconcile(&[ListenAddr::Unix(path.clone())])
        .expect("bind again");
    std::fs::remove_file(&path).expect("rm");
    std::fs::write(&path, "someone else's").expect("write");
    let _ = h.release();
    assert!(path.exists(), "another file at the path was removed");
}

fn pipes(n: usize) -> (Vec<OwnedFd>, Vec<OwnedFd>) {
    (0..n).map(|_| nix::unistd::pipe().expect("pipe")).unzip()
}

#[test]
fn the_store_keeps_names_within_its_bound_and_refuses_a_message_whole() {
    let mut h = Kept::default();
    let (r, _w) = pipes(2);
    assert_eq!(h.store(r, Some("conn"), true, 0), Err(Refused::NoStore));
    let (r, _w1) = pipes(3);
    assert_eq!(h.store(r, Some("conn"), true, 4), Ok(3));
    let (r, _w2) = pipes(2);
    assert_eq!(
        h.store(r, None, true, 4),
        Err(Refused::Full {
            have: 3,
            sent: 2,
            max: 4
        })
    );
    assert_eq!(
        h.stored_count(),
        3,
        "a refused message stored part of its fds"
    );
    let (r, _w3) = pipes(1);
    assert_eq!(
        h.store(r, Some("a:b"), true, 4),
        Err(Refused::BadName("a:b".into()))
    );
    let (r, _w4) = pipes(1);
    assert_eq!(h.store(r, None, true, 4), Ok(1));
    let run = h.for_run("svc");
    assert_eq!(run.names, ["conn", "conn", "conn", "stored"]);
    assert_eq!(h.remove("conn").len(), 3);
    assert_eq!(h.shown().1.len(), 1);
    assert_eq!(h.remove("nothing").len(), 0);
    let (r, _w5) = pipes(2);
    h.store(r, Some("late"), true, 4).expect("store");
    // fd_store lowered to 2: the first two stay.
    let past: Vec<String> = h.trim(2).into_iter().map(|(n, _)| n).collect();
    assert_eq!(past, ["late"]);
    assert_eq!(h.for_run("svc").names, ["stored", "late"]);
    assert!(h.trim(2).is_empty());
    assert_eq!(
        h.release().len(),
        2,
        "the store's fds are handed back to be closed"
    );
    assert_eq!(h.stored_count(), 0);
}

#[test]
fn a_stored_fd_that_hangs_up_is_dropped_unless_it_asked_not_to_be_watched() {
    let mut h = Kept::default();
    let (a, peer_a) = UnixStream::pair().expect("pair");
    let (b, peer_b) = UnixStream::pair().expect("pair");
    let (c, _peer_c) = UnixStream::pair().expect("pair");
    h.store(vec![a.into()], Some("a"), true, 8).expect("store");
    h.store(vec![b.into()], Some("b"), false, 8).expect("store");
    h.store(vec![c.into()], Some("c"), true, 8).expect("store");
    // A regular file (a memfd too) never hangs up, and epoll refuses it: not watched;
    // nor are devices without poll, nor an O_PATH fd.
    let file = std::fs::File::open("/proc/self/status").expect("open");
    h.store(vec![file.into()], Some("file"), true, 8)
        .expect("store");
    let null = std::fs::File::open("/dev/null").expect("open");
    h.store(vec![null.into()], Some("null"), true, 8)
        .expect("store");
    let path = nix::fcntl::open(
        "/",
        nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .expect("O_PATH");
    h.store(vec![path], Some("path"), true, 8).expect("store");
    assert_eq!(h.watched().count(), 2);
    assert!(h.drop_hung().is_empty());
    drop(peer_a);
    drop(peer_b);
    let hung: Vec<String> = h.drop_hung().into_iter().map(|(n, _)| n).collect();
    assert_eq!(hung, ["a"]);
    let names: Vec<String> = h.shown().1.into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        ["b", "c", "file", "null", "path"],
        "FDPOLL=0's fd was dropped, or a live one"
    );
    assert_eq!(h.watched().count(), 1);
}

#[test]
fn a_reexec_carries_sockets_and_stored_fds_by_number() {
    let a = tcp(free_port());
    let mut h = Kept::default();
    h.reconcile(std::slice::from_ref(&a)).expect("bind");
    let (r, _w) = pipes(1);
    h.store(r, Some("conn"), false, 4).expect("store");
    let mut fds = Vec::new();
    let carried = h.carry(&mut fds);
    assert_eq!(fds.len(), 2);
    let json = serde_json::to_string(&carried).expect("serialize");
    // The old image execs: nothing is closed.
    std::mem::forget(h);
    let back: Carried = serde_json::from_str(&json).expect("deserialize");
    let (h, lost) = Kept::adopt(back);
    assert!(lost.is_empty(), "{lost:?}");
    assert_eq!(h.shown().0, [a.to_string()]);
    assert_eq!(h.for_run("web").names, ["web", "conn"]);
    let ListenAddr::Tcp(sa) = &a else {
        unreachable!()
    };
    std::net::TcpStream::connect(sa).expect("the carried socket listens");
    // An fd the previous image did not leave open is named, not taken.
    let bad: Carried = serde_json::from_str(
        r#"{"listen":[[{"Tcp":"127.0.0.1:1"},9999,null]],"stored":[["x",9998,true]]}"#,
    )
    .expect("deserialize");
    let (h2, lost) = Kept::adopt(bad);
    assert!(h2.is_empty());
    assert_eq!(lost.len(), 2, "{lost:?}");
}

#[test]
fn names_are_what_listen_fdnames_can_carry() {
    assert!(valid_name("conn"));
    assert!(valid_name("stored-1.x"));
    for n in ["", "a:b", "a b", "é", &"x".repeat(256)] {
        assert!(!valid_name(n), "{n:?}");
    }
}

#[test]
fn refusals_are_told_once_a_second_per_kind_with_their_count() {
    use crate::time::Mono;
    use std::time::Duration;
    let mut h = Kept::default();
    let t0 = Mono::now();
    assert_eq!(h.refused("full", t0), Some(1));
    assert_eq!(h.refused("full", t0.plus(Duration::from_millis(10))), None);
    assert_eq!(h.refused("full", t0.plus(Duration::from_millis(20))), None);
    // Another kind is told at once.
    assert_eq!(
        h.refused("bad name", t0.plus(Duration::from_millis(30))),
        Some(1)
    );
    // A second on: told, with the two kept back.
    assert_eq!(
        h.refused("full", t0.plus(Duration::from_millis(1000))),
        Some(3)
    );
    assert_eq!(
        h.refused("full", t0.plus(Duration::from_millis(1500))),
        None
    );
}
