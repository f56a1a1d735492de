//! `supctl log` as an operator queries it (issue 27): several services interleaved by
//! time and named, a marker at each start and exit of a run, `--since`, `--grep`, local
//! time, `-f` that says when supd goes away and follows again across a `reexec`, and the
//! old one-service request still answered. Real supd, real services.

mod common;
use common::files::wait_file;
use common::*;
use serde_json::json;
use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

/// A FIFO in the sandbox that a service's script reads a line from to go on.
fn fifo(sb: &Sandbox, name: &str) -> String {
    let p = sb.path(name);
    nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
    p.to_string_lossy().into_owned()
}

/// A client following `services` (none: every service), nothing of the past.
fn follower(sb: &Sandbox, services: &[&str]) -> Client {
    let mut c = sb.client();
    let a = c.call(json!({"cmd": "log", "services": services, "lines": 0, "follow": true}));
    assert_eq!(a["ok"], true, "{a}");
    c
}

/// Reads followed lines until one of `service` ends with `text`; returns that line.
fn until_line(c: &mut Client, service: &str, text: &str) -> String {
    loop {
        let e = c.read().expect("a followed line");
        let line = e["line"].as_str().unwrap_or("").to_string();
        if e["service"] == service && line.ends_with(text) {
            return line;
        }
    }
}

/// supctl's output, which must have exited 0.
fn ok(out: &std::process::Output) -> String {
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The texts after `NAME: ` of supctl's lines that are not markers, named.
fn texts(out: &str) -> Vec<String> {
    out.lines()
        .filter_map(|l| l.split_once(' ').map(|(_, rest)| rest.to_string()))
        .filter(|t| !t.contains(": --- "))
        .collect()
}

/// Two services: their lines come merged in time order, each named; none named is every
/// service; `-n` is the last N of the merged lines; the old request (one `service`) is
/// answered in its old shape; an unknown service is an error naming it; a `log =
/// "null"` one is skipped among others (said on stderr) and an error alone.
#[test]
fn services_interleave_in_time_order_with_names() {
    let mut sb = Sandbox::new();
    let (ga, gb) = (fifo(&sb, "go-a"), fifo(&sb, "go-b"));
    sb.config(&format!(
        "[service.a]\ncommand = [\"/bin/sh\", \"-c\", \"echo a1; read x < {ga}; echo a2; exec sleep 1000\"]\n\
         [service.b]\ncommand = [\"/bin/sh\", \"-c\", \"read x < {gb}; echo b1; exec sleep 1000\"]\n\
         [service.quiet]\ncommand = [\"/bin/sleep\", \"1000\"]\nlog = \"null\"\n"
    ));
    sb.start();
    let mut f = follower(&sb, &["a", "b"]);
    // a1 (a's run began before the follower: asked from the ring), then b1, then a2.
    let got = sb.ok(json!({"cmd": "log", "services": ["a"]}));
    if !got["lines"].to_string().contains(" a1\"") {
        until_line(&mut f, "a", " a1");
    }
    std::fs::write(&gb, "go\n").expect("release b");
    let b1 = until_line(&mut f, "b", " b1");
    // Lines are ordered by their stamps, to the millisecond (lines of one millisecond
    // keep no order between services: supctl(8)); a2 must be stamped after b1, so a is
    // released once the clock has left b1's millisecond.
    let b1_stamp = b1.split(' ').next().unwrap_or("").to_string();
    let end = Instant::now() + Duration::from_secs(5);
    while sup::time::utc_stamp(SystemTime::now()) <= b1_stamp {
        assert!(Instant::now() < end, "the clock stays at {b1_stamp}");
        std::hint::spin_loop();
    }
    std::fs::write(&ga, "go\n").expect("release a");
    until_line(&mut f, "a", " a2");
    let merged = ok(&sb.supctl(&["log", "a", "b"]));
    assert_eq!(texts(&merged), ["a: a1", "b: b1", "a: a2"], "{merged}");
    assert!(merged.contains(" a: --- started: pid "), "{merged}");
    assert!(merged.contains(" b: --- started: pid "), "{merged}");
    let every = ok(&sb.supctl(&["log"]));
    assert_eq!(texts(&every), ["a: a1", "b: b1", "a: a2"], "{every}");
    let last = ok(&sb.supctl(&["log", "-n", "2"]));
    assert_eq!(texts(&last), ["b: b1", "a: a2"], "{last}");
    // The JSON answer carries the service of each line.
    let data = sb.ok(json!({"cmd": "log", "services": ["a", "b"], "lines": 2}));
    assert_eq!(data["lines"][0]["service"], "b", "{data}");
    assert!(data["lines"][0]["line"]
        .as_str()
        .unwrap_or("")
        .ends_with(" b1"));
    assert_eq!(data["lines"][1]["marker"], false, "{data}");
    // An older supctl's request, and its answer's shape.
    let old = sb.ok(json!({"cmd": "log", "service": "a", "lines": 5}));
    assert_eq!(old["service"], "a", "{old}");
    let lines: Vec<&str> = old["lines"]
        .as_array()
        .expect("lines")
        .iter()
        .map(|l| l.as_str().expect("a line is a string"))
        .collect();
    assert!(lines.last().is_some_and(|l| l.ends_with(" a2")), "{old}");
    // An unknown service among others.
    let unknown = sb.supctl(&["log", "a", "nosuch"]);
    assert_eq!(unknown.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&unknown.stderr).contains("'nosuch'"),
        "{unknown:?}"
    );
    // `log = "null"`: skipped among others, said; alone, an error.
    let with_quiet = sb.supctl(&["log", "a", "quiet"]);
    assert_eq!(texts(&ok(&with_quiet)), ["a: a1", "a: a2"]);
    let said = String::from_utf8_lossy(&with_quiet.stderr).into_owned();
    assert!(
        said.contains("skipped quiet") && said.contains("null"),
        "{said}"
    );
    let alone = sb.supctl(&["log", "quiet"]);
    assert_eq!(alone.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&alone.stderr).contains("null"));
}

/// A marker at each start and exit of a run, with the version, the pid and how it
/// ended, in the ring, to followers and in the log file.
#[test]
fn markers_around_a_restart() {
    let mut sb = Sandbox::new();
    let go = fifo(&sb, "go");
    sb.provision_version("1.0.0", &format!("echo hello; read x < {go}; exit 3"));
    sb.config(
        "[service.agent]\ntool = \"agent\"\ncommand = [\"bin/agent\"]\nrestart_delay = \"10ms\"\n",
    );
    sb.start();
    let mut f = follower(&sb, &["agent"]);
    let first = sb.wait_state("agent", "running")["pid"]
        .as_i64()
        .expect("a pid");
    let lines = sb.ok(json!({"cmd": "log", "services": ["agent"]}))["lines"].clone();
    if !lines.to_string().contains(" hello\"") {
        until_line(&mut f, "agent", " hello");
    }
    std::fs::write(&go, "go\n").expect("let it exit");
    let exited = until_line(&mut f, "agent", &format!(" (pid {first})"));
    let restarted = loop {
        let e = f.read().expect("a followed line");
        if e["marker"] == true {
            break e;
        }
    };
    let second = sb.wait_state("agent", "running")["pid"]
        .as_i64()
        .expect("a pid");
    assert_ne!(first, second);
    assert!(exited.contains(" --- exited: code 3 after "), "{exited}");
    let started = format!(" --- started: version 1.0.0, pid {second}");
    assert!(
        restarted["line"].as_str().unwrap_or("").ends_with(&started),
        "{restarted}"
    );
    // The ring, in order, markers marked.
    let data = sb.ok(json!({"cmd": "log", "services": ["agent"], "lines": 100}));
    let all: Vec<(String, bool)> = data["lines"]
        .as_array()
        .expect("lines")
        .iter()
        .map(|l| {
            let line = l["line"].as_str().unwrap_or("");
            let text = line.split_once(' ').map_or("", |(_, t)| t);
            (text.to_string(), l["marker"] == true)
        })
        .collect();
    let want_first = format!("--- started: version 1.0.0, pid {first}");
    let at = all
        .iter()
        .position(|(t, m)| *m && *t == want_first)
        .unwrap_or_else(|| panic!("no first start marker: {all:?}"));
    let texts: Vec<&str> = all[at..].iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(texts[1..3], ["agent 1.0.0 up", "hello"], "{all:?}");
    assert!(
        texts[3].starts_with("--- exited: code 3 after ") && all[at + 3].1,
        "{all:?}"
    );
    assert_eq!(texts[4], started.trim_start(), "{all:?}");
    assert!(!all[at + 1].1 && !all[at + 2].1, "output is not a marker");
    // And the log file.
    let file = wait_file(&sb.path("log/agent.log"), |t| t.contains(&started));
    assert!(file.contains(&format!(" {want_first}\n")), "{file}");
    assert!(file.contains(" --- exited: code 3 after "), "{file}");
    let _ = f.read();
}

/// The stamp of `text`'s line in `service`'s `log --json` answer, as Unix ms.
fn stamp_of(sb: &Sandbox, service: &str, text: &str) -> u64 {
    let data = sb.ok(json!({"cmd": "log", "services": [service], "lines": 100}));
    let line = data["lines"]
        .as_array()
        .expect("lines")
        .iter()
        .filter_map(|l| l["line"].as_str())
        .find(|l| l.ends_with(text))
        .unwrap_or_else(|| panic!("no line {text}: {data}"))
        .to_string();
    let stamp = line.split_once(' ').expect("a stamp").0;
    // "2026-12-02T10:00:05.123Z"
    let secs = Command::new("date")
        .args(["-u", "-d", stamp, "+%s"])
        .output()
        .expect("date");
    let secs: u64 = String::from_utf8_lossy(&secs.stdout)
        .trim()
        .parse()
        .expect("seconds");
    secs * 1000 + stamp[20..23].parse::<u64>().expect("ms")
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as u64
}

/// `--since`: a line older than the cut is left out, in each form of TIME; a bad TIME
/// is a usage error saying the forms.
#[test]
fn since_leaves_out_older_lines() {
    let mut sb = Sandbox::new();
    let go = fifo(&sb, "go");
    sb.config(&format!(
        "[service.s]\ncommand = [\"/bin/sh\", \"-c\", \"echo old; read x < {go}; echo new; exec sleep 1000\"]\n"
    ));
    sb.start();
    let mut f = follower(&sb, &["s"]);
    let ring = sb.ok(json!({"cmd": "log", "services": ["s"]}));
    if !ring["lines"].to_string().contains(" old\"") {
        until_line(&mut f, "s", " old");
    }
    let cut = stamp_of(&sb, "s", " old") + 1;
    // The clock passes the cut before "new" is said (a spin of at most a millisecond).
    while now_ms() <= cut {
        std::hint::spin_loop();
    }
    std::fs::write(&go, "go\n").expect("release");
    until_line(&mut f, "s", " new");
    let epoch = format!("@{}.{:03}", cut / 1000, cut % 1000);
    let rfc = String::from_utf8_lossy(
        &Command::new("date")
            .args([
                "-u",
                "-d",
                &format!("@{}", cut / 1000),
                "+%Y-%m-%dT%H:%M:%S",
            ])
            .output()
            .expect("date")
            .stdout,
    )
    .trim()
    .to_string();
    let rfc = format!("{rfc}.{:03}+00:00", cut % 1000);
    for since in [epoch.as_str(), rfc.as_str()] {
        let out = ok(&sb.supctl(&["log", "s", "--since", since]));
        assert_eq!(texts(&out), ["s: new"], "--since {since}: {out}");
    }
    let both = ok(&sb.supctl(&["log", "s", "--since", "1h"]));
    assert_eq!(texts(&both), ["s: old", "s: new"], "{both}");
    let bad = sb.supctl(&["log", "s", "--since", "yesterday"]);
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
    let said = String::from_utf8_lossy(&bad.stderr);
    assert!(
        said.contains("'yesterday'") && said.contains("RFC 3339") && said.contains("@EPOCH"),
        "{said}"
    );
}

/// `--grep RE` with `-n N`: the last N lines whose text (not stamp) matches, and only
/// such lines followed; a bad RE is an error naming it with regerror's words.
#[test]
fn grep_with_n_gives_the_last_matching_lines() {
    let mut sb = Sandbox::new();
    let go = fifo(&sb, "go");
    sb.config(&format!(
        "[service.g]\ncommand = [\"/bin/sh\", \"-c\", \"for i in 1 2 3; do echo match $i; echo skip $i; done; echo done; read x < {go}; echo skip 4; echo match 4; exec sleep 1000\"]\n",
    ));
    sb.start();
    let mut f = follower(&sb, &["g"]);
    let ring = sb.ok(json!({"cmd": "log", "services": ["g"]}));
    if !ring["lines"].to_string().contains(" done\"") {
        until_line(&mut f, "g", " done");
    }
    let two = ok(&sb.supctl(&["log", "g", "--grep", "^match [0-9]$", "-n", "2"]));
    assert_eq!(texts(&two), ["g: match 2", "g: match 3"], "{two}");
    let all = ok(&sb.supctl(&["log", "g", "--grep", "match (1|3)"]));
    assert_eq!(texts(&all), ["g: match 1", "g: match 3"], "{all}");
    // The stamp is not matched.
    let none = ok(&sb.supctl(&["log", "g", "--grep", "^20[0-9][0-9]-"]));
    assert_eq!(none, "", "{none}");
    // Followed with a pattern: the lines that match alone.
    let mut grepped = sb.client();
    let a = grepped.call(
        json!({"cmd": "log", "services": ["g"], "lines": 0, "follow": true, "grep": "^match"}),
    );
    assert_eq!(a["ok"], true, "{a}");
    std::fs::write(&go, "go\n").expect("release");
    let e = grepped.read().expect("a followed line");
    assert!(
        e["line"].as_str().unwrap_or("").ends_with(" match 4"),
        "{e}"
    );
    let bad = sb.supctl(&["log", "g", "--grep", "(unclosed"]);
    assert_eq!(bad.status.code(), Some(1), "{bad:?}");
    let said = String::from_utf8_lossy(&bad.stderr);
    assert!(
        said.contains("bad regular expression '(unclosed': ") && said.trim_end().len() > 50,
        "{said}"
    );
}

/// Times in local time (TZ respected): five hours east of UTC, the hour is the JSON
/// stamp's plus five.
#[test]
fn times_are_local() {
    let mut sb = Sandbox::new();
    sb.config("[service.t]\ncommand = [\"/bin/sh\", \"-c\", \"echo tick; exec sleep 1000\"]\n");
    sb.start();
    let mut f = follower(&sb, &["t"]);
    let ring = sb.ok(json!({"cmd": "log", "services": ["t"]}));
    if !ring["lines"].to_string().contains(" tick\"") {
        until_line(&mut f, "t", " tick");
    }
    let data = sb.ok(json!({"cmd": "log", "services": ["t"], "grep": "^tick$"}));
    let line = data["lines"][0]["line"]
        .as_str()
        .expect("the line")
        .to_string();
    // "2026-12-02T10:00:05.123Z tick"
    let hour: u32 = line[11..13].parse().expect("hour");
    let rest = &line[13..23];
    let out = Command::new(SUPCTL)
        .env("TZ", "UTC-5")
        .arg("-s")
        .arg(&sb.socket)
        .args(["log", "t", "--grep", "^tick$"])
        .output()
        .expect("supctl");
    let shown = ok(&out);
    let want = format!("{:02}{rest} t: tick\n", (hour + 5) % 24);
    assert!(
        shown.ends_with(&want),
        "{shown:?} for {line:?}, want {want:?}"
    );
}

/// `-f` says when supd goes away, and exits 4 once it has not come back; across a
/// `reexec` it follows on, each line shown once.
#[test]
fn follow_says_when_supd_goes_away_and_comes_back() {
    let mut sb = Sandbox::new();
    let go = fifo(&sb, "go");
    sb.config(&format!(
        "[service.f]\ncommand = [\"/bin/sh\", \"-c\", \"echo one; read x < {go}; echo two; read x < {go}; echo three; exec sleep 1000\"]\n"
    ));
    sb.start();
    let mut child = Command::new(SUPCTL)
        .arg("-s")
        .arg(&sb.socket)
        .args(["log", "-f", "f"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("supctl log -f");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut next = || {
        let mut l = String::new();
        let n = out.read_line(&mut l).expect("a line from supctl");
        assert!(n > 0, "supctl log -f ended");
        l
    };
    let mut seen = Vec::new();
    while !seen.iter().any(|l: &String| l.ends_with(" f: one\n")) {
        seen.push(next());
    }
    sb.reexec();
    std::fs::write(&go, "go\n").expect("release");
    while !seen.iter().any(|l: &String| l.ends_with(" f: two\n")) {
        seen.push(next());
    }
    let ones = seen.iter().filter(|l| l.ends_with(" f: one\n")).count();
    assert_eq!(ones, 1, "{seen:?}");
    // supd killed: said, and exit 4 once it has not come back.
    let begun = Instant::now();
    sb.stop_supd(nix::sys::signal::Signal::SIGKILL);
    if wait_exit(child.id() as i32, DEADLINE).is_none() {
        let _ = child.kill();
        panic!("supctl log -f did not end");
    }
    let status = child.wait().expect("wait supctl");
    let mut err = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut err)
        .expect("stderr");
    assert!(
        err.contains("supctl: supd is back; following again"),
        "{err}"
    );
    assert!(err.contains("supctl: supd went away ("), "{err}");
    assert!(err.contains("did not come back"), "{err}");
    assert_eq!(status.code(), Some(4), "{err}");
    assert!(
        begun.elapsed() >= Duration::from_secs(4),
        "it waited for supd"
    );
}
