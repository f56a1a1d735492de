//! Whether a service's user may run its program: every directory on the way searchable
//! by it, the program itself executable (and readable, for a script). The rule is a pure
//! function over what `stat` says of each path component and over the user's ids, so
//! that an upgrade can be refused before anything is switched (a version its user cannot
//! run would otherwise fail every start and look like a crash loop). The edge, which
//! stats the path and reads its ACLs, is `sys::acl` (`stat_chain`). supd itself never
//! reads the user database (a slow LDAP or sssd must not stall its loop): a service's
//! child looks its user up, reports the uid and groups it took (remembered for
//! `upgrade`'s check), and, refused, says why with `sys::acl::diagnose`, as its user.
//! Plain data and rules only: `sys` builds on this file, and it on nothing of the crate.

use std::path::PathBuf;

/// What `stat` says of one component of a path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    pub path: PathBuf,
    /// The permission bits (the low 12 bits of `st_mode`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// The owner as a person reads it: "root:sup" (numbers where names are unknown).
    pub owner: String,
    pub is_dir: bool,
    /// A regular file that starts with `#!`: its interpreter must read it too.
    pub script: bool,
    /// Its POSIX access ACL, when it has one (then it decides, not the mode alone).
    pub acl: Option<Vec<AclEntry>>,
}

/// One entry of a POSIX ACL: its tag (`ACL_USER_OBJ` and the others, as the kernel
/// stores them), its `rwx` bits, and the uid or gid it names (for `ACL_USER` and
/// `ACL_GROUP`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AclEntry {
    pub tag: u16,
    pub perm: u32,
    pub id: u32,
}

pub const ACL_USER_OBJ: u16 = 0x01;
pub const ACL_USER: u16 = 0x02;
pub const ACL_GROUP_OBJ: u16 = 0x04;
pub const ACL_GROUP: u16 = 0x08;
pub const ACL_MASK: u16 = 0x10;
pub const ACL_OTHER: u16 = 0x20;

/// Reads the `system.posix_acl_access` attribute: a little-endian version (2), then
/// entries of tag (u16), perm (u16), id (u32). `None` when it is not that.
pub fn parse_acl(bytes: &[u8]) -> Option<Vec<AclEntry>> {
    let (head, rest) = bytes.split_at_checked(4)?;
    if u32::from_le_bytes(head.try_into().ok()?) != 2 || rest.len() % 8 != 0 {
        return None;
    }
    Some(
        rest.chunks_exact(8)
            .map(|e| AclEntry {
                tag: u16::from_le_bytes([e[0], e[1]]),
                perm: u32::from(u16::from_le_bytes([e[2], e[3]])) & 7,
                id: u32::from_le_bytes([e[4], e[5], e[6], e[7]]),
            })
            .collect(),
    )
}

/// Who a service runs as: its uid, and every gid it holds (its primary group and its
/// supplementary groups).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Who {
    pub name: String,
    pub uid: u32,
    pub gids: Vec<u32>,
}

/// What the last component must allow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Want {
    /// Run it: a regular file, executable (and readable when it is a script).
    Exec,
    /// Enter it: a directory, searchable.
    Enter,
}

/// Whether `who` (not root) gets every bit of `want` (`rwx` in the low three bits) on
/// `n`, the way the kernel decides: the owner's bits for its owner, else the group's
/// for a member, else the others'; with an ACL, its named users and groups too,
/// limited by its mask.
fn allows(n: &Node, who: &Who, want: u32) -> bool {
    let Some(acl) = &n.acl else {
        let bits = if n.uid == who.uid {
            n.mode >> 6
        } else if who.gids.contains(&n.gid) {
            n.mode >> 3
        } else {
            n.mode
        };
        return bits & want == want;
    };
    let perm_of = |tag: u16| acl.iter().find(|e| e.tag == tag).map_or(0, |e| e.perm);
    if n.uid == who.uid {
        return perm_of(ACL_USER_OBJ) & want == want;
    }
    let mask = acl.iter().find(|e| e.tag == ACL_MASK).map_or(7, |e| e.perm);
    if let Some(e) = acl.iter().find(|e| e.tag == ACL_USER && e.id == who.uid) {
        return e.perm & mask & want == want;
    }
    let mut member = false;
    for e in acl {
        let names_us = match e.tag {
            ACL_GROUP_OBJ => who.gids.contains(&n.gid),
            ACL_GROUP => who.gids.contains(&e.id),
            _ => false,
        };
        if names_us {
            member = true;
            if e.perm & mask & want == want {
                return true;
            }
        }
    }
    !member && perm_of(ACL_OTHER) & want == want
}

fn describe(n: &Node) -> String {
    format!("mode {:04o}, owner {}", n.mode & 0o7777, n.owner)
}

/// Whether `who` may search every directory of `dirs` (from `/` down).
pub fn search(dirs: &[Node], who: &Who) -> Result<(), String> {
    let root = who.uid == 0;
    for d in dirs {
        if !d.is_dir {
            return Err(format!("{} is not a directory", d.path.display()));
        }
        if !root && !allows(d, who, 1) {
            return Err(format!(
                "user '{}' cannot search the directory {} ({}): give it x (such as chmod o+x {}, or a group the user is in)",
                who.name,
                d.path.display(),
                describe(d),
                d.path.display()
            ));
        }
    }
    Ok(())
}

/// Whether `who` may reach and use the last of `chain` (each component from `/` down,
/// symbolic links resolved), or the first refusal, said for a person: which path, which
/// user, what to change.
pub fn check(chain: &[Node], who: &Who, want: Want) -> Result<(), String> {
    let root = who.uid == 0;
    let Some((last, dirs)) = chain.split_last() else {
        return Err("no path to check".into());
    };
    search(dirs, who)?;
    match want {
        Want::Enter => {
            if !last.is_dir {
                return Err(format!("{} is not a directory", last.path.display()));
            }
            if !root && !allows(last, who, 1) {
                return Err(format!(
                    "user '{}' cannot enter the directory {} ({}): give it x (such as chmod o+x {})",
                    who.name,
                    last.path.display(),
                    describe(last),
                    last.path.display()
                ));
            }
        }
        Want::Exec => {
            if last.is_dir {
                return Err(format!("{} is a directory", last.path.display()));
            }
            // Root runs a file when anyone may, and reads anything.
            let (x, r) = if root {
                ((last.mode | last.mode >> 3 | last.mode >> 6) & 1 != 0, true)
            } else {
                (allows(last, who, 1), allows(last, who, 4))
            };
            if !x {
                return Err(format!(
                    "user '{}' cannot execute {} ({}): make it executable for the user (such as chmod a+rx {})",
                    who.name,
                    last.path.display(),
                    describe(last),
                    last.path.display()
                ));
            }
            if last.script && !r {
                return Err(format!(
                    "user '{}' cannot read the script {} ({}): its interpreter must read it (such as chmod a+rx {})",
                    who.name,
                    last.path.display(),
                    describe(last),
                    last.path.display()
                ));
            }
        }
    }
    Ok(())
}

/// An owner as numbers ("0:0"): what supd says, since it never reads the user
/// database itself.
pub fn numeric_owner(uid: u32, gid: u32) -> String {
    format!("{uid}:{gid}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(path: &str, mode: u32, uid: u32, gid: u32) -> Node {
        Node {
            path: path.into(),
            mode,
            uid,
            gid,
            owner: format!("{uid}:{gid}"),
            is_dir: true,
            script: false,
            acl: None,
        }
    }

    fn file(path: &str, mode: u32, uid: u32, gid: u32, script: bool) -> Node {
        Node {
            is_dir: false,
            script,
            ..dir(path, mode, uid, gid)
        }
    }

    const SUP: u32 = 998;

    fn nobody() -> Who {
        Who {
            name: "nobody".into(),
            uid: 65534,
            gids: vec![65534],
        }
    }

    /// `/var/lib/sup/tools/agent/1.0.0/bin/agent` with the state dir's mode given.
    fn package_chain(state_mode: u32, bin_mode: u32) -> Vec<Node> {
        vec![
            dir("/", 0o755, 0, 0),
            dir("/var", 0o755, 0, 0),
            dir("/var/lib", 0o755, 0, 0),
            dir("/var/lib/sup", state_mode, 0, SUP),
            dir("/var/lib/sup/tools", 0o755, 0, 0),
            dir("/var/lib/sup/tools/agent", 0o755, 0, 0),
            dir("/var/lib/sup/tools/agent/1.0.0", 0o755, 0, 0),
            dir("/var/lib/sup/tools/agent/1.0.0/bin", 0o755, 0, 0),
            file(
                "/var/lib/sup/tools/agent/1.0.0/bin/agent",
                bin_mode,
                0,
                0,
                false,
            ),
        ]
    }

    #[test]
    fn the_package_layout_lets_a_user_run_its_tool() {
        assert_eq!(
            check(&package_chain(0o751, 0o755), &nobody(), Want::Exec),
            Ok(())
        );
    }

    #[test]
    fn a_private_state_dir_on_the_way_is_named() {
        let e = check(&package_chain(0o750, 0o755), &nobody(), Want::Exec).unwrap_err();
        assert!(e.contains("user 'nobody'"), "{e}");
        assert!(
            e.contains("cannot search the directory /var/lib/sup "),
            "{e}"
        );
        assert!(e.contains("mode 0750, owner 0:998"), "{e}");
        assert!(e.contains("chmod o+x /var/lib/sup"), "{e}");
    }

    #[test]
    fn a_group_member_passes_by_its_group_bits_only() {
        let mut who = nobody();
        who.gids.push(SUP);
        assert_eq!(
            check(&package_chain(0o750, 0o755), &who, Want::Exec),
            Ok(())
        );
        // The group's bits apply, not others': a group member is refused what others get.
        assert!(check(&package_chain(0o701, 0o755), &who, Want::Exec).is_err());
        // The owner's bits apply to the owner, even when the group's would allow.
        let mut chain = package_chain(0o070, 0o755);
        chain[3].uid = 42;
        let not_root_owner = Who {
            name: "u".into(),
            uid: 42,
            gids: vec![SUP],
        };
        assert!(check(&chain, &not_root_owner, Want::Exec).is_err());
    }

    #[test]
    fn the_program_needs_x_and_a_script_needs_r_too() {
        let e = check(&package_chain(0o751, 0o744), &nobody(), Want::Exec).unwrap_err();
        assert!(
            e.contains("cannot execute /var/lib/sup/tools/agent/1.0.0/bin/agent"),
            "{e}"
        );
        // A binary may be execute-only; a script may not.
        assert_eq!(
            check(&package_chain(0o751, 0o711), &nobody(), Want::Exec),
            Ok(())
        );
        let mut chain = package_chain(0o751, 0o711);
        chain.last_mut().expect("file").script = true;
        let e = check(&chain, &nobody(), Want::Exec).unwrap_err();
        assert!(e.contains("cannot read the script"), "{e}");
    }

    #[test]
    fn root_searches_anything_but_runs_only_what_someone_may() {
        let root = Who {
            name: "root".into(),
            uid: 0,
            gids: vec![0],
        };
        assert_eq!(
            check(&package_chain(0o700, 0o100), &root, Want::Exec),
            Ok(())
        );
        assert!(check(&package_chain(0o700, 0o644), &root, Want::Exec).is_err());
    }

    #[test]
    fn an_acl_decides_by_named_users_and_groups_within_its_mask() {
        let entry = |tag, perm, id| AclEntry { tag, perm, id };
        let acl = |named: Vec<AclEntry>, mask: u32| {
            let mut v = vec![
                entry(ACL_USER_OBJ, 7, u32::MAX),
                entry(ACL_GROUP_OBJ, 5, u32::MAX),
                entry(ACL_MASK, mask, u32::MAX),
                entry(ACL_OTHER, 0, u32::MAX),
            ];
            v.extend(named);
            Some(v)
        };
        let mut chain = package_chain(0o750, 0o755);
        // setfacl -m u:nobody:x /var/lib/sup
        chain[3].acl = acl(vec![entry(ACL_USER, 1, 65534)], 5);
        assert_eq!(check(&chain, &nobody(), Want::Exec), Ok(()));
        // The mask takes it away again.
        chain[3].acl = acl(vec![entry(ACL_USER, 1, 65534)], 4);
        assert!(check(&chain, &nobody(), Want::Exec).is_err());
        // A named group of the user's; a group entry that matches but does not grant
        // refuses, even though others would get it.
        chain[3].acl = acl(vec![entry(ACL_GROUP, 1, 65534)], 7);
        assert_eq!(check(&chain, &nobody(), Want::Exec), Ok(()));
        chain[3].acl = acl(vec![entry(ACL_GROUP, 4, 65534)], 7);
        if let Some(v) = chain[3].acl.as_mut() {
            v[3].perm = 1;
        }
        assert!(check(&chain, &nobody(), Want::Exec).is_err());
        // Another user's entry gives nobody nothing.
        chain[3].acl = acl(vec![entry(ACL_USER, 1, 1000)], 7);
        assert!(check(&chain, &nobody(), Want::Exec).is_err());
    }

    #[test]
    fn acls_are_read_as_the_kernel_stores_them() {
        let mut raw = 2u32.to_le_bytes().to_vec();
        for (tag, perm, id) in [(1u16, 7u16, u32::MAX), (2, 5, 65534), (0x20, 0, u32::MAX)] {
            raw.extend(tag.to_le_bytes());
            raw.extend(perm.to_le_bytes());
            raw.extend(id.to_le_bytes());
        }
        let acl = parse_acl(&raw).expect("parsed");
        assert_eq!(
            acl[1],
            AclEntry {
                tag: ACL_USER,
                perm: 5,
                id: 65534
            }
        );
        assert_eq!(parse_acl(&raw[..7]), None);
        assert_eq!(parse_acl(&[1, 0, 0, 0]), None);
    }

    #[test]
    fn a_chain_stated_as_far_as_the_user_could_names_the_directory_that_stopped_it() {
        // As nobody, nothing below /var/lib/sup (0750) can be stated: the chain ends
        // there, and that directory is the refusal.
        let chain = &package_chain(0o750, 0o755)[..4];
        let e = search(chain, &nobody()).unwrap_err();
        assert!(
            e.contains("cannot search the directory /var/lib/sup "),
            "{e}"
        );
        assert_eq!(search(&package_chain(0o751, 0o755)[..4], &nobody()), Ok(()));
    }

    #[test]
    fn a_cwd_must_be_a_directory_the_user_may_enter() {
        let chain = vec![dir("/", 0o755, 0, 0), dir("/srv", 0o700, 0, 0)];
        let e = check(&chain, &nobody(), Want::Enter).unwrap_err();
        assert!(e.contains("cannot enter the directory /srv"), "{e}");
        let chain = vec![dir("/", 0o755, 0, 0), file("/f", 0o755, 0, 0, false)];
        assert!(check(&chain, &nobody(), Want::Enter).is_err());
        let chain = vec![dir("/", 0o755, 0, 0), dir("/srv", 0o711, 0, 0)];
        assert_eq!(check(&chain, &nobody(), Want::Enter), Ok(()));
    }
}
