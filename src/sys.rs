//! The thin edge to the kernel that needs `unsafe`, one file per concern: the spawn plan
//! (`plan`), the child between fork and exec (`child`), its exec report (`report`), the
//! dead-man guard (`guard`), fds (`fds`), supd's priority (`scheduling`), processes and
//! pidfds (`processes`), POSIX ACLs and the access rule's edge (`acl`), the local time
//! zone (`zone`), POSIX regular expressions (`regex`); `raw` holds what they share
//! (errno, C strings). The parts import one
//! another, never this root, which re-exports what callers use; of the crate, `sys`
//! imports only `access` (a limit's type, `Rlimit`, is defined in `plan` and re-exported
//! by `config`). What the kernel lacks is learned once by a
//! probe, with the fallbacks of old kernels. Everything else uses nix's safe wrappers.
//! Each `unsafe` block says why it is sound.
#![allow(unsafe_code)]

pub mod acl;
pub mod child;
pub mod fds;
pub mod guard;
pub mod plan;
pub mod processes;
mod raw;
pub mod regex;
pub mod report;
pub mod scheduling;
pub mod zone;

pub use acl::{grant_group_rw, posix_acl};
pub use child::{
    born_in, fork_for_supd, give_up_born_in, probe_born_in, spawn_direct, BornIn, Pending,
};
pub use fds::{
    adopt_fd, child_nofile_env, cloexec_inherited, epoll_delete_raw, file_of_raw, keep_across_exec,
    pass_pidfd, raise_nofile, raw, set_dir_lock_fd, set_listener_fd, set_lock_fd,
};
pub use guard::{board_end, board_file, board_record, spawn_guard, GuardTarget, BOARD_LEN};
pub use plan::{Account, Io, Rlimit, SpawnSpec, Tuning};
pub use processes::{
    client_start, exec, fork_kill_all, fork_worker, ignore_tty_stops, pidfd_cgroup_id, pidfd_getfd,
    pidfd_open, pidfd_send_signal, reset_dispositions,
};
pub use raw::cstring;
pub use regex::Regex;
pub use report::{Exec, ExecFailure};
pub use scheduling::{
    child_nice, child_nice_env, note_spawner_nice, sched_policy, set_own_nice, set_own_realtime,
    REALTIME_PRIORITY,
};
pub use zone::utc_offset;

/// Learns once which of the newer system calls this kernel has (`close_range`, Linux
/// 5.9; pidfds, 5.3), so that forked children, which must not probe and log, take the
/// right path at once. Cheap: two system calls that change nothing. Called first thing
/// by supd (before any fork); says once what is missing.
pub fn probe_kernel() {
    fds::probe_close_range();
    processes::probe_pidfd();
}
