use super::*;

fn have(v2: &[Controller], v1: &[&str]) -> Have {
    Have {
        v2: v2.iter().copied().collect(),
        v1: (v1.iter())
            .map(|h| (h.to_string(), PathBuf::from(format!("/sys/fs/cgroup/{h}"))))
            .collect(),
        off: false,
    }
}

fn files(w: &[Write]) -> Vec<(Place, &str, &str)> {
    w.iter()
        .map(|w| (w.place, w.file, w.value.as_str()))
        .collect()
}

fn all_set() -> ResourceLimits {
    ResourceLimits {
        memory_max: Some(64 << 20),
        memory_high: Some(48 << 20),
        cpu_weight: Some(200),
        cpu_max: Some(20),
        pids_max: Some(8),
        io_weight: Some(50),
    }
}

#[test]
fn cgroup2_takes_each_limit_in_its_own_file() {
    use Controller::*;
    let h = have(&[Memory, Cpu, Pids, Io], &["memory"]);
    let w = writes(&all_set(), &ResourceLimits::default(), &h);
    assert_eq!(
        files(&w),
        vec![
            (Place::V2, "memory.max", "67108864"),
            (Place::V2, "memory.high", "50331648"),
            (Place::V2, "cpu.weight", "200"),
            (Place::V2, "cpu.max", "20000 100000"),
            (Place::V2, "pids.max", "8"),
            (Place::V2, "io.weight", "default 50"),
        ]
    );
    assert!(v1_joins(&all_set(), &h).is_empty());
    assert_eq!(v2_needs(&all_set(), &h).len(), 4);
}

#[test]
fn a_hybrid_host_takes_them_from_the_v1_hierarchies() {
    // This kind of machine: cgroup2 has hugetlb alone.
    let h = have(&[], &["memory", "cpu", "cpuacct", "pids", "blkio"]);
    let w = writes(&all_set(), &ResourceLimits::default(), &h);
    assert_eq!(
        files(&w),
        vec![
            (Place::V1("memory"), "memory.limit_in_bytes", "67108864"),
            (
                Place::V1("memory"),
                "memory.soft_limit_in_bytes",
                "50331648"
            ),
            (Place::V1("cpu"), "cpu.shares", "2048"),
            (Place::V1("cpu"), "cpu.cfs_period_us", "100000"),
            (Place::V1("cpu"), "cpu.cfs_quota_us", "20000"),
            (Place::V1("pids"), "pids.max", "8"),
            (Place::V1("blkio"), "blkio.weight", "250"),
        ]
    );
    assert_eq!(
        v1_joins(&all_set(), &h),
        vec!["blkio", "cpu", "cpuacct", "memory", "pids"]
    );
    let only_mem = ResourceLimits {
        memory_max: Some(32 << 20),
        ..Default::default()
    };
    assert_eq!(v1_joins(&only_mem, &h), vec!["cpuacct", "memory"]);
    assert!(v1_joins(&ResourceLimits::default(), &h).is_empty());
}

#[test]
fn more_than_one_cpu_and_extreme_weights_map_within_bounds() {
    let h = have(&[], &["cpu", "blkio"]);
    let l = ResourceLimits {
        cpu_max: Some(150),
        cpu_weight: Some(1),
        io_weight: Some(10_000),
        ..Default::default()
    };
    let w = writes(&l, &ResourceLimits::default(), &h);
    assert!(files(&w).contains(&(Place::V1("cpu"), "cpu.cfs_quota_us", "150000")));
    assert!(files(&w).contains(&(Place::V1("cpu"), "cpu.shares", "10")));
    assert!(files(&w).contains(&(Place::V1("blkio"), "blkio.weight", "1000")));
    let h2 = have(&[Controller::Cpu], &[]);
    let w2 = writes(&l, &ResourceLimits::default(), &h2);
    assert!(files(&w2).contains(&(Place::V2, "cpu.max", "150000 100000")));
}

#[test]
fn a_limit_taken_away_goes_back_to_the_default_and_others_are_left_alone() {
    let h = have(&[Controller::Pids], &["memory", "cpu"]);
    let old = ResourceLimits {
        memory_max: Some(64 << 20),
        cpu_max: Some(20),
        pids_max: Some(8),
        ..Default::default()
    };
    let new = ResourceLimits {
        memory_max: Some(128 << 20),
        ..Default::default()
    };
    assert_eq!(
        files(&writes(&new, &old, &h)),
        vec![
            (Place::V1("memory"), "memory.limit_in_bytes", "134217728"),
            (Place::V1("cpu"), "cpu.cfs_period_us", "100000"),
            (Place::V1("cpu"), "cpu.cfs_quota_us", "-1"),
            (Place::V2, "pids.max", "max"),
        ]
    );
    assert!(writes(&ResourceLimits::default(), &ResourceLimits::default(), &h).is_empty());
}

#[test]
fn a_limit_without_its_controller_anywhere_is_refused_with_the_reason() {
    let h = have(&[Controller::Pids], &["cpu"]);
    let r = refusals(&all_set(), &h);
    let keys: Vec<&str> = r.iter().map(|(k, _)| *k).collect();
    assert_eq!(keys, vec!["memory_max", "memory_high", "io_weight"]);
    assert!(
        r[0].1
            .starts_with("no cgroup hierarchy here has the memory controller"),
        "{}",
        r[0].1
    );
    assert!(r[2].1.contains("the io controller"), "{}", r[2].1);
    assert!(refusals(&all_set(), &have(&[], &V1_HIERARCHIES)).is_empty());
    let off = Have {
        off: true,
        ..have(&[Controller::Memory], &["memory"])
    };
    let r = refusals(&all_set(), &off);
    assert_eq!(r.len(), 6);
    assert!(r[0].1.contains("cgroups = \"off\""), "{}", r[0].1);
    assert!(writes(&all_set(), &ResourceLimits::default(), &off).is_empty());
}

#[test]
fn finds_supds_own_cgroup_in_each_v1_hierarchy() {
    let info = "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n\
                35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n\
                39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids\n\
                40 31 0:37 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,name=systemd\n\
                41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n";
    let own =
        "8:pids:/\n4:memory:/process_api/c1\n2:cpu,cpuacct:/user.slice\n1:name=systemd:/\n0::/\n";
    let dirs = v1_own_dirs(info, own);
    assert_eq!(
        dirs.get("memory"),
        Some(&PathBuf::from("/sys/fs/cgroup/memory/process_api/c1"))
    );
    assert_eq!(
        dirs.get("cpu"),
        Some(&PathBuf::from("/sys/fs/cgroup/cpu,cpuacct/user.slice"))
    );
    assert_eq!(dirs.get("cpu"), dirs.get("cpuacct"));
    assert_eq!(
        dirs.get("pids"),
        Some(&PathBuf::from("/sys/fs/cgroup/pids"))
    );
    assert_eq!(dirs.get("blkio"), None);
}

#[test]
fn reads_keyed_counters() {
    let events = "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n";
    assert_eq!(keyed(events, "oom_kill"), Some(1));
    assert_eq!(
        keyed("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n", "oom_kill"),
        Some(3)
    );
    assert_eq!(
        keyed("usage_usec 1234\nuser_usec 1000\n", "usage_usec"),
        Some(1234)
    );
    assert_eq!(keyed("", "oom_kill"), None);
    assert_eq!(
        v2_controllers("cpuset cpu io memory hugetlb pids rdma\n"),
        [
            Controller::Memory,
            Controller::Cpu,
            Controller::Pids,
            Controller::Io
        ]
        .into_iter()
        .collect()
    );
    assert!(v2_controllers("hugetlb\n").is_empty());
}
