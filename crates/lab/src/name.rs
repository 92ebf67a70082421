//! The one naming scheme for throwaway objects (namespaces, cgroups, folders, links).
//!
//! Every name starts with `nsf` and a kind letter, then the id of the process that made it:
//!
//! | kind | made by                         | form                         | e.g.              |
//! |------|---------------------------------|------------------------------|-------------------|
//! | `b`  | a bench run ([`run_prefix`])    | `nsfb-<pid>[-<part>]`         | `nsfb-4242-veth-c` |
//! | `v`  | a rootless world ([`world_prefix`]) | `nsfv<pid>x<n>[-<part>]`  | `nsfv4242x0-host`  |
//! | `t`  | a test ([`unique`])             | `<tag><pid mod 100000>x<n>`  | `nsft-c4242x3`     |
//!
//! Bench and world names carry the whole pid, so [`dead_owner`] can tell a dead run's leftovers
//! (what [`crate::cleanup::dead_runs`] removes) from a live run's. Test names keep the pid's last
//! five digits so that `<tag>` + suffixes fit IFNAMSIZ (15 characters) when used as interface
//! names; tests remove their objects on drop and are never swept by the cleanup.

use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};

/// The start of every throwaway name.
pub const PREFIX: &str = "nsf";
/// Bench runs' prefix (`nsfb-<pid>`).
pub const BENCH: &str = "nsfb-";
/// Rootless worlds' prefix (`nsfv<pid>x<n>`).
pub const WORLD: &str = "nsfv";

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A unique short name for a test object: `<tag><pid mod 100000>x<counter>` (fits interface
/// names for tags of up to 4 characters plus a one-character suffix).
pub fn unique(tag: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{tag}{}x{n}", std::process::id() % 100_000)
}

/// This process's bench-run prefix, `nsfb-<pid>`: every namespace and cgroup of the run starts
/// with it.
pub fn run_prefix() -> String {
    format!("{BENCH}{}", std::process::id())
}

/// A fresh rootless-world prefix, `nsfv<pid>x<n>`.
pub fn world_prefix() -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{WORLD}{}x{n}", std::process::id())
}

/// The pid in a bench or world name, and the name's owning prefix (`nsfb-<pid>`,
/// `nsfv<pid>x<n>`); `None` for names of other forms (tests' names, foreign objects).
pub fn owner(name: &str) -> Option<(u32, String)> {
    if let Some(rest) = name.strip_prefix(BENCH) {
        let pid = rest.split('-').next().unwrap_or("");
        let p = pid.parse::<u32>().ok()?;
        return Some((p, format!("{BENCH}{pid}")));
    }
    let rest = name.strip_prefix(WORLD)?;
    let (pid, tail) = rest.split_once('x')?;
    let n: String = tail.chars().take_while(|c| c.is_ascii_digit()).collect();
    if pid.is_empty() || n.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((pid.parse().ok()?, format!("{WORLD}{pid}x{n}")))
}

/// The owning prefix of `name` if it is a bench or world name whose process is gone.
pub fn dead_owner(name: &str) -> Option<String> {
    let (pid, prefix) = owner(name)?;
    (!Path::new(&format!("/proc/{pid}")).exists()).then_some(prefix)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_of_each_form() {
        assert_eq!(owner("nsfb-42-veth-c"), Some((42, "nsfb-42".into())));
        assert_eq!(owner("nsfb-42"), Some((42, "nsfb-42".into())));
        assert_eq!(owner("nsfv42x3-host"), Some((42, "nsfv42x3".into())));
        assert_eq!(owner("nsfv42x3-xdg"), Some((42, "nsfv42x3".into())));
        for other in [
            "nsfb-",
            "nsfb-x1",
            "nsfvx1",
            "nsfv42",
            "nsfv42x",
            "nsft-c1x2",
            "cni-1",
        ] {
            assert_eq!(owner(other), None, "{other}");
        }
    }

    #[test]
    fn own_names_are_alive_and_unique() {
        assert_eq!(dead_owner(&run_prefix()), None);
        let (a, b) = (world_prefix(), world_prefix());
        assert_ne!(a, b);
        assert_eq!(dead_owner(&format!("{a}-host")), None);
        assert!(unique("nsft-c").len() <= 15);
        assert_ne!(unique("t"), unique("t"));
    }
}
