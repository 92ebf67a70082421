//! The unprivileged user a rootless world runs as: an existing account, looked up and checked
//! here, never created (`nsfast bench --tenant USER` names it). Creating one is the test-only
//! [`crate::test_user`]'s job, which nothing shipped calls.

use std::path::Path;

/// The subordinate uid and gid files newuidmap/newgidmap read (shadow-utils).
pub const SUBUID: &str = "/etc/subuid";
pub const SUBGID: &str = "/etc/subgid";

/// An unprivileged user with subordinate uid and gid ranges.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Tenant {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
}

/// Why a user cannot be a tenant; each names the user and what a valid one has.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TenantError {
    #[error("no user {0:?} on this system: name an existing unprivileged user with ranges in /etc/subuid and /etc/subgid")]
    NoSuchUser(String),
    #[error("user {name:?} is uid 0 (root): name an unprivileged user with ranges in /etc/subuid and /etc/subgid, such as the one running rootless Docker")]
    Root { name: String },
    #[error("user {name:?} (uid {uid}) has no range in {file}: add a line {name}:START:COUNT there (e.g. {name}:100000:65536, not overlapping other users' ranges)")]
    NoRange {
        name: String,
        uid: u32,
        file: &'static str,
    },
    #[error("looking up user {name:?}: {why}")]
    Lookup { name: String, why: String },
}

impl Tenant {
    /// The existing user `name`, if it can be a tenant: not root, with a subordinate uid range
    /// in [`SUBUID`] and a gid range in [`SUBGID`] (a line `name:start:count` or
    /// `uid:start:count` with count ≥ 1, as newuidmap accepts).
    pub fn lookup(name: &str) -> Result<Tenant, TenantError> {
        Self::lookup_in(name, Path::new(SUBUID), Path::new(SUBGID))
    }

    fn lookup_in(name: &str, subuid: &Path, subgid: &Path) -> Result<Tenant, TenantError> {
        let user = nix::unistd::User::from_name(name)
            .map_err(|e| TenantError::Lookup {
                name: name.into(),
                why: e.to_string(),
            })?
            .ok_or_else(|| TenantError::NoSuchUser(name.into()))?;
        let uid = user.uid.as_raw();
        if uid == 0 {
            return Err(TenantError::Root { name: name.into() });
        }
        for (path, file) in [(subuid, SUBUID), (subgid, SUBGID)] {
            // A missing file holds no range.
            let text = std::fs::read_to_string(path).unwrap_or_default();
            if !has_range(&text, name, uid) {
                return Err(TenantError::NoRange {
                    name: name.into(),
                    uid,
                    file,
                });
            }
        }
        Ok(Tenant {
            name: name.into(),
            uid,
            gid: user.gid.as_raw(),
        })
    }
}

/// Whether `text` (the format of /etc/subuid) gives `name` (or its `uid`) a non-empty range.
fn has_range(text: &str, name: &str, uid: u32) -> bool {
    let uid = uid.to_string();
    text.lines().any(|line| {
        let mut f = line.trim().split(':');
        let (Some(owner), Some(start), Some(count), None) =
            (f.next(), f.next(), f.next(), f.next())
        else {
            return false;
        };
        (owner == name || owner == uid)
            && start.parse::<u32>().is_ok()
            && count.parse::<u32>().is_ok_and(|c| c > 0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_by_name_or_uid_count_empty_and_malformed_ones_do_not() {
        let text = "alice:100000:65536\n1001:165536:65536\nbob:200000:0\ncarol:x:5\ndave:1\n";
        assert!(has_range(text, "alice", 1000));
        assert!(has_range(text, "erin", 1001));
        assert!(!has_range(text, "bob", 1002));
        assert!(!has_range(text, "carol", 1003));
        assert!(!has_range(text, "dave", 1004));
        assert!(!has_range(text, "alic", 1005));
        assert!(!has_range("", "alice", 1000));
    }

    #[test]
    fn errors_name_the_user_and_what_a_tenant_needs() {
        let dir = std::env::temp_dir().join(crate::name::unique("tenant"));
        std::fs::create_dir_all(&dir).unwrap();
        let (sub_u, sub_g) = (dir.join("subuid"), dir.join("subgid"));
        let e = Tenant::lookup_in("nsfast-no-such-user", &sub_u, &sub_g).unwrap_err();
        assert_eq!(e, TenantError::NoSuchUser("nsfast-no-such-user".into()));
        assert!(e.to_string().contains("\"nsfast-no-such-user\""), "{e}");
        let e = Tenant::lookup_in("root", &sub_u, &sub_g).unwrap_err();
        assert!(e.to_string().contains("uid 0 (root)"), "{e}");
        // nobody exists everywhere; with no ranges it is refused, with both it is a tenant.
        let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
        let e = Tenant::lookup_in("nobody", &sub_u, &sub_g).unwrap_err();
        assert!(
            e.to_string()
                .contains("has no range in /etc/subuid: add a line nobody:START:COUNT"),
            "{e}"
        );
        std::fs::write(&sub_u, "nobody:100000:65536\n").unwrap();
        let e = Tenant::lookup_in("nobody", &sub_u, &sub_g).unwrap_err();
        assert!(e.to_string().contains("has no range in /etc/subgid"), "{e}");
        std::fs::write(&sub_g, format!("{}:100000:65536\n", nobody.uid)).unwrap();
        let t = Tenant::lookup_in("nobody", &sub_u, &sub_g).unwrap();
        assert_eq!((t.uid, t.gid), (nobody.uid.as_raw(), nobody.gid.as_raw()));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
