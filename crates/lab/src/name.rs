//! The one naming scheme for throwaway objects (namespaces, cgroups, folders, pods).
//!
//! Every name starts with an *owner id*, `nsf<kind><pid>[x<n>]`, then optionally `-<part>`:
//!
//! | kind | made by                                   | owner id        | e.g.                  |
//! |------|-------------------------------------------|-----------------|-----------------------|
//! | `b`  | a bench run ([`run_prefix`], one a process) | `nsfb<pid>`     | `nsfb4242-veth-c`     |
//! | `v`  | a rootless world ([`world_prefix`])       | `nsfv<pid>x<n>` | `nsfv4242x0-host`     |
//! | `t`  | a test ([`unique`])                       | `nsft<pid>x<n>` | `nsft4242x3-ctr`      |
//!
//! `<pid>` is the whole id of the process that made the name and `<n>` a per-process counter,
//! so every name says who owns it: [`owner`] reads it back and [`dead_owner`] tells a dead
//! run's leftovers (what [`crate::cleanup::dead_runs`], `nsfast bench --cleanup`, removes:
//! bench runs' and killed tests' namespaces, cgroups and pod state; rootless worlds' processes,
//! namespaces and folders) from a live run's, which are never touched.
//!
//! Interface names (IFNAMSIZ: 15 characters) do not carry the owner id: they live inside
//! namespaces the run made, so they need not be unique across runs and are fixed short names
//! (`wire0`, `eth0`, `nsfb-c`), except the rootless world's veth ends, `<owner id>h`/`s`
//! (at most 15 characters for pids up to 7 digits and n < 100).
//!
//! [`owner`] also reads the bench form `nsfb-<pid>[-<part>]`, which builds before this naming
//! scheme wrote, so the cleanup also removes what such runs left.

use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};

/// The start of every throwaway name.
pub const PREFIX: &str = "nsf";
/// Bench runs' owner ids (`nsfb<pid>`; `nsfb-<pid>` is read too).
pub const BENCH: &str = "nsfb";
/// Rootless worlds' owner ids (`nsfv<pid>x<n>`).
pub const WORLD: &str = "nsfv";
/// Tests' owner ids (`nsft<pid>x<n>`).
pub const TEST: &str = "nsft";

static COUNTER: AtomicU32 = AtomicU32::new(0);

fn next() -> u32 {
    COUNTER.fetch_add(1, Ordering::Relaxed)
}

/// A fresh name for a test object: `nsft<pid>x<n>-<tag>` (`nsft<pid>x<n>` for an empty tag).
/// `tag` (a few of [a-z0-9-]) only helps a reader; the owner id makes the name unique.
pub fn unique(tag: &str) -> String {
    let id = format!("{TEST}{}x{}", std::process::id(), next());
    if tag.is_empty() {
        id
    } else {
        format!("{id}-{tag}")
    }
}

/// This process's bench-run prefix, `nsfb<pid>`: every namespace and cgroup of the run starts
/// with it.
pub fn run_prefix() -> String {
    run_prefix_of(std::process::id())
}

/// The bench-run prefix of process `pid` (to look for what that run left).
pub fn run_prefix_of(pid: u32) -> String {
    format!("{BENCH}{pid}")
}

/// A fresh rootless-world prefix, `nsfv<pid>x<n>`.
pub fn world_prefix() -> String {
    format!("{WORLD}{}x{}", std::process::id(), next())
}

/// The pid in a throwaway name and the name's owner id (`nsfb4242`, `nsfv4242x0`,
/// `nsft4242x3`, or `nsfb-4242`); `None` for names of other forms (foreign objects,
/// interface names, names of older test builds).
pub fn owner(name: &str) -> Option<(u32, String)> {
    let digits = |s: &str| s.bytes().take_while(u8::is_ascii_digit).count();
    // What follows an owner id: the end of the name or a `-<part>`.
    let ends = |s: &str| s.is_empty() || s.starts_with('-');
    if let Some(rest) = name.strip_prefix("nsfb-") {
        let d = digits(rest);
        if d == 0 || !ends(&rest[d..]) {
            return None;
        }
        return Some((rest[..d].parse().ok()?, format!("nsfb-{}", &rest[..d])));
    }
    let rest = name.strip_prefix(PREFIX)?;
    let kind = rest.chars().next()?;
    let rest = &rest[kind.len_utf8()..];
    let d = digits(rest);
    if d == 0 {
        return None;
    }
    let pid: u32 = rest[..d].parse().ok()?;
    let len = match (kind, &rest[d..]) {
        ('b', tail) if ends(tail) => d,
        ('v' | 't', tail) => {
            let n = tail.strip_prefix('x').map(digits).unwrap_or(0);
            if n == 0 || !ends(&tail[1 + n..]) {
                return None;
            }
            d + 1 + n
        }
        _ => return None,
    };
    Some((pid, format!("{PREFIX}{kind}{}", &rest[..len])))
}

/// Whether process `pid` is gone (no /proc entry in this pid namespace).
pub fn is_dead(pid: u32) -> bool {
    !Path::new(&format!("/proc/{pid}")).exists()
}

/// The owner id of `name` if it is a throwaway name whose process is gone.
pub fn dead_owner(name: &str) -> Option<String> {
    let (pid, prefix) = owner(name)?;
    is_dead(pid).then_some(prefix)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_of_each_form() {
        for (name, pid, id) in [
            ("nsfb42-veth-c", 42, "nsfb42"),
            ("nsfb42", 42, "nsfb42"),
            ("nsfb-42-veth-c", 42, "nsfb-42"),
            ("nsfb-42", 42, "nsfb-42"),
            ("nsfv42x3-host", 42, "nsfv42x3"),
            ("nsfv42x3-xdg", 42, "nsfv42x3"),
            ("nsfv42x3", 42, "nsfv42x3"),
            ("nsft42x12-ctr", 42, "nsft42x12"),
            ("nsft42x0", 42, "nsft42x0"),
        ] {
            assert_eq!(owner(name), Some((pid, id.into())), "{name}");
        }
        for other in [
            "nsfb-",
            "nsfb-x1",
            "nsfb",
            "nsfb-c",
            "nsfb-s",
            "nsfb42x",
            "nsfvx1",
            "nsfv42",
            "nsfv42x",
            "nsfv42x3h2",
            "nsft-c1x2",
            "nsft42",
            "nsft42x",
            "nsft42xa",
            "nsfq42x1",
            "nsf",
            "nsfold0",
            "nsftold0",
            "nsf1a2b3c4d",
            "cni-1",
            "",
        ] {
            assert_eq!(owner(other), None, "{other}");
        }
    }

    #[test]
    fn own_names_are_alive_unique_and_owned() {
        let me = std::process::id();
        assert_eq!(owner(&run_prefix()), Some((me, run_prefix())));
        assert_eq!(dead_owner(&format!("{}-veth-c", run_prefix())), None);
        let (a, b) = (world_prefix(), world_prefix());
        assert_ne!(a, b);
        assert_eq!(owner(&format!("{a}-host")), Some((me, a.clone())));
        assert_eq!(dead_owner(&format!("{a}-host")), None);
        let (t, u) = (unique("ctr"), unique("ctr"));
        assert_ne!(t, u);
        assert!(t.starts_with(TEST) && t.ends_with("-ctr"), "{t}");
        assert_eq!(owner(&t).map(|o| o.0), Some(me));
        assert_eq!(owner(&unique("")).map(|o| o.0), Some(me));
        assert_eq!(dead_owner(&t), None);
    }
}
