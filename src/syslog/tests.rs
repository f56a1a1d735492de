use super::*;

fn p(s: &str) -> Message {
    parse(s.as_bytes())
}

#[test]
fn glibc_s_rfc3164_line() {
    let m = p("<78>Dec  2 10:00:00 CRON[123]: (root) CMD (x)");
    assert_eq!(m.priority(), "cron.info");
    assert_eq!(m.tag.as_deref(), Some("CRON[123]"));
    assert_eq!(m.text, "(root) CMD (x)");
    assert_eq!(m.line(), "[syslog cron.info] CRON[123]: (root) CMD (x)");
    let m = p("<30>Dec 12 01:02:03 sshd[9]: Accepted key\n");
    assert_eq!(m.line(), "[syslog daemon.info] sshd[9]: Accepted key");
}

#[test]
fn logger_s_lines() {
    // logger -u (the local header), logger --rfc3164 (with a host), logger --id.
    let m = p("<13>Dec  2 20:19:49 tag: hello");
    assert_eq!(m.line(), "[syslog user.notice] tag: hello");
    let m = p("<13>Dec  2 20:19:57 vm tag3: hello3");
    assert_eq!(m.line(), "[syslog user.notice] tag3: hello3");
    let m = p("<13>Dec  2 20:19:57 idtag[29981]: idhello");
    assert_eq!(m.line(), "[syslog user.notice] idtag[29981]: idhello");
}

#[test]
fn rfc5424_lines() {
    let m = p("<13>1 2026-12-02T20:19:57.627994+00:00 vm tag5 - - [timeQuality tzKnown=\"1\" isSynced=\"0\"] hello5");
    assert_eq!(m.line(), "[syslog user.notice] tag5: hello5");
    let m =
        p("<165>1 2003-10-11T22:14:15.003Z host app 42 ID47 [a x=\"q\\]\"][b] \u{feff}text here");
    assert_eq!(m.priority(), "local4.notice");
    assert_eq!(m.tag.as_deref(), Some("app[42]"));
    assert_eq!(m.text, "text here");
    let m = p("<14>1 - - - - - -");
    assert_eq!(m.line(), "[syslog user.info] ");
    let m = p("<14>1 - - - - - - plain");
    assert_eq!(m.text, "plain");
}

#[test]
fn garbage_is_kept_as_user_notice() {
    for raw in [
        "no pri at all",
        "<>x",
        "<1234>x",
        "<192>x",
        "<9x>y",
        "<",
        "",
        "<13>",
        "<13>1",
        "<13>1 ",
        "<13>Dec",
        "<13>1 a b c d e [unterminated \"q",
    ] {
        let m = p(raw);
        assert!(m.facility < 24 && m.severity < 8, "{raw:?}");
    }
    let m = p("no pri at all");
    assert_eq!(m.line(), "[syslog user.notice] no pri at all");
    let m = p("<192>x");
    assert_eq!(m.text, "<192>x");
    // Invalid UTF-8 and control characters: one line, nothing lost but the bytes.
    let m = parse(b"<13>tag: a\xffb\nc\x07d");
    assert_eq!(m.text, "a\u{fffd}b c d");
    // A long text is cut at a character's boundary.
    let long = format!("<13>t: {}", "é".repeat(5000));
    assert!(p(&long).text.len() <= TEXT_MAX);
}

#[test]
fn a_cgroup_names_its_service() {
    let v2 = "0::/user.slice/sup-ab12/web.service\n";
    assert_eq!(service_in_cgroup(v2, "sup-ab12"), Some("web"));
    assert_eq!(service_in_cgroup(v2, "sup-other"), None);
    let v1 = "13:name=sup:/sup-ab12/cron.service\n9:name=systemd:/\n0::/\n";
    assert_eq!(service_in_cgroup(v1, "sup-ab12"), Some("cron"));
    let check = "0::/x/sup-ab12/web+check.service";
    assert_eq!(service_in_cgroup(check, "sup-ab12"), Some("web"));
    // supd's own cgroup, the root itself, a probe: no service's.
    assert_eq!(service_in_cgroup("0::/x/sup-ab12\n", "sup-ab12"), None);
    assert_eq!(
        service_in_cgroup("0::/x/sup-ab12/probe+fork", "sup-ab12"),
        None
    );
    assert_eq!(service_in_cgroup("garbage", "sup-ab12"), None);
}

#[test]
fn the_sender_s_service_is_found_in_a_few_lookups() {
    use std::cell::Cell;
    let reads = Cell::new(0);
    let leader = |pid: i32| (pid == 100).then(|| "web".to_string());
    let cgroup = |pid: i32| {
        reads.set(reads.get() + 1);
        match pid {
            200 => Some("0::/sup-r/cron.service".to_string()),
            300 => Some("0::/sup-r/gone.service".to_string()),
            _ => None,
        }
    };
    let session = |pid: i32| {
        reads.set(reads.get() + 1);
        match pid {
            400 => Some(100),
            _ => None,
        }
    };
    let known = |n: &str| n == "web" || n == "cron";
    let find = |pid, root| sender_service(pid, None, &leader, root, &cgroup, &session, &known);
    // The leader itself: nothing read.
    assert_eq!(find(100, Some("sup-r")).as_deref(), Some("web"));
    assert_eq!(reads.get(), 0);
    // By its cgroup: one read.
    assert_eq!(find(200, Some("sup-r")).as_deref(), Some("cron"));
    assert_eq!(reads.get(), 1);
    // A cgroup of no service now, then the session: a daemon's child of web's run.
    assert_eq!(find(300, Some("sup-r")), None);
    assert_eq!(find(400, Some("sup-r")).as_deref(), Some("web"));
    // Without cgroups: the session alone.
    reads.set(0);
    assert_eq!(find(400, None).as_deref(), Some("web"));
    assert_eq!(reads.get(), 1);
    // Gone, or a pid supd cannot see (0): supd's own log.
    assert_eq!(find(999, Some("sup-r")), None);
    assert_eq!(find(0, Some("sup-r")), None);

    // The service the sender's pidfd named comes first, with nothing read: a sender
    // gone (reaped, its pid perhaps another's now) is placed by it alone...
    reads.set(0);
    let by_id = |pid, name| sender_service(pid, name, &leader, None, &cgroup, &session, &known);
    assert_eq!(by_id(999, Some("cron")).as_deref(), Some("cron"));
    assert_eq!(by_id(100, Some("cron")).as_deref(), Some("cron"));
    assert_eq!(by_id(0, Some("cron")).as_deref(), Some("cron"));
    assert_eq!(reads.get(), 0);
    // ...unless that service is gone: then as before.
    assert_eq!(by_id(100, Some("removed")).as_deref(), Some("web"));
}

#[test]
fn cgroup_ids_name_their_services_and_forget_what_is_replaced_or_removed() {
    let mut ids = CgroupIds::default();
    assert!(!ids.primed());
    ids.prime(vec![
        (10, "web.service".into()),
        (11, "web+check.service".into()),
    ]);
    assert!(ids.primed());
    assert_eq!(ids.service(10), Some("web"));
    // A health check's cgroup is its service's.
    assert_eq!(ids.service(11), Some("web"));
    assert_eq!(ids.service(12), None);
    // Made anew (a new id): the old id names nothing.
    ids.note("web.service", 20);
    assert_eq!((ids.service(10), ids.service(20)), (None, Some("web")));
    ids.forget("web.service");
    assert_eq!(ids.service(20), None);
    assert_eq!(ids.service(11), Some("web"));
    // What is no service's cgroup names none.
    ids.note("cgroup.procs", 30);
    ids.note("+check.service", 31);
    assert_eq!((ids.service(30), ids.service(31)), (None, None));
}

#[test]
fn a_sender_is_bounded_per_second_and_its_drops_told_once_a_second() {
    let mut l = Limiter::default();
    let t0 = Mono(5_000_000_000);
    let kept = (0..1000).filter(|_| l.admit(7, t0)).count();
    assert_eq!(kept as u64, BURST);
    // Another sender is not held back by the first.
    assert!(l.admit(8, t0));
    assert_eq!(l.to_tell(t0), vec![(7, 1000 - BURST)]);
    // Half a second later: half a second's worth, the drops kept for the next telling.
    let t1 = t0.plus(Duration::from_millis(500));
    let kept = (0..1000).filter(|_| l.admit(7, t1)).count();
    assert_eq!(kept as u64, RATE / 2);
    assert!(l.to_tell(t1).is_empty(), "told a second ago at most");
    let t2 = t0.plus(Duration::from_secs(1));
    assert_eq!(l.to_tell(t2), vec![(7, 1000 - RATE / 2)]);
    assert!(l.to_tell(t2.plus(Duration::from_secs(5))).is_empty());
    // A quiet while fills the bucket up to the burst, no more.
    let t3 = t2.plus(Duration::from_secs(60));
    let kept = (0..1000).filter(|_| l.admit(7, t3)).count();
    assert_eq!(kept as u64, BURST);
}

#[test]
fn quiet_senders_are_forgotten() {
    let mut l = Limiter::default();
    let t0 = Mono(1_000_000_000);
    for pid in 1..=SENDERS_MAX as i32 {
        l.admit(pid, t0);
    }
    assert_eq!(l.senders(), SENDERS_MAX);
    // A second later every bucket is full again: a new sender makes room.
    l.admit(5000, t0.plus(Duration::from_secs(1)));
    assert_eq!(l.senders(), 1);
    // Senders that keep sending are kept, up to a cap; past it, new ones share a
    // bucket: a storm of pids cannot grow supd.
    let t1 = t0.plus(Duration::from_secs(2));
    for pid in 1..=(SENDERS_CAP as i32 + 500) {
        for _ in 0..=BURST {
            l.admit(pid, t1);
        }
    }
    assert_eq!(l.senders(), SENDERS_CAP + 1);
    let told = l.to_tell(t1);
    let shared = told.iter().find(|(p, _)| *p == OVERFLOW).map(|(_, n)| *n);
    assert_eq!(shared, Some(500 * (BURST + 1) - BURST), "{told:?}");
}
