//! Error reports: an error and its causes on one line, and the exit-code contract every
//! binary follows (docs/json.md, "Exit codes"): 0 ok, 1 failure, 2 bad usage.

use std::error::Error;

/// Exit status of a run that failed (the system said no, a resource is missing, ...).
pub const EXIT_FAILURE: u8 = 1;
/// Exit status of a bad command line or configuration value, as clap's own errors.
pub const EXIT_USAGE: u8 = 2;

/// A bad value the command line parser could not see by itself (two values that conflict,
/// a setting read from a variable): the binaries exit [`EXIT_USAGE`] for it.
#[derive(Debug)]
pub struct Usage(pub String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl Error for Usage {}

/// What a binary says, before the error itself, when the kernel refused an operation to a
/// process without the privileges it takes.
pub const NEEDS_ROOT: &str = "needs root (CAP_BPF, CAP_NET_ADMIN)";

/// Whether `e` or a cause in its chain is the kernel's EPERM (as `std::io::Error`, `nix`'s
/// `Errno`, or a message that only kept its text). EACCES is left out: it is a file's mode
/// or a port below 1024 as often as a missing capability.
pub fn is_permission_error(e: &(dyn Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(c) = cur {
        let code = c
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::raw_os_error)
            .or_else(|| c.downcast_ref::<nix::errno::Errno>().map(|e| *e as i32));
        if code == Some(libc::EPERM) {
            return true;
        }
        let text = c.to_string();
        if text.contains("Operation not permitted") || text.contains("(os error 1)") {
            return true;
        }
        cur = c.source();
    }
    false
}

/// Whether an error of a process running as effective uid `euid` means "run this as root":
/// a permission error ([`is_permission_error`]) in a process that is not root.
pub fn needs_root(e: &(dyn Error + 'static), euid: u32) -> bool {
    euid != 0 && is_permission_error(e)
}

/// This process's effective uid.
pub fn euid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// Whether `e` or a cause in its chain is a [`Usage`] error.
pub fn is_usage(e: &(dyn Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(c) = cur {
        if c.is::<Usage>() {
            return true;
        }
        cur = c.source();
    }
    false
}

/// `e` and every error in its `source()` chain, `a: b: c` (what anyhow's `{:#}` prints).
pub fn error_chain(e: &dyn Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("open the relay")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn permission_errors_are_found_anywhere_in_the_chain() {
        let eperm = Outer(std::io::Error::from_raw_os_error(libc::EPERM));
        assert!(is_permission_error(&eperm));
        assert!(needs_root(&eperm, 65534));
        assert!(!needs_root(&eperm, 0));
        assert!(is_permission_error(&nix::errno::Errno::EPERM));
        assert!(!is_permission_error(&nix::errno::Errno::EACCES));
        let text = std::io::Error::other("bpf(BPF_MAP_CREATE): Operation not permitted");
        assert!(is_permission_error(&text));
        let other = Outer(std::io::Error::from_raw_os_error(libc::ENOENT));
        assert!(!is_permission_error(&other));
    }

    #[test]
    fn usage_errors_are_found_anywhere_in_the_chain() {
        #[derive(Debug, thiserror::Error)]
        #[error("pod add")]
        struct Wrap(#[source] Usage);
        assert!(is_usage(&Wrap(Usage("bad --ip".into()))));
        assert!(!is_usage(&std::io::Error::other("x")));
    }

    #[test]
    fn chains_every_cause() {
        let e = Outer(std::io::Error::other("no such file"));
        assert_eq!(error_chain(&e), "open the relay: no such file");
        assert_eq!(error_chain(&std::io::Error::other("x")), "x");
    }
}
