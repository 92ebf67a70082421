//! Linux 7.0 vsock network-namespace modes: `/proc/sys/net/vsock/ns_mode` (read-only, fixed
//! when the namespace is created) and `child_ns_mode` (write-once: the same value again
//! succeeds, a different one fails with EBUSY; a local namespace cannot set global: EPERM).
//! Namespaces are created the safe way: `child_ns_mode` is written in a throwaway parent
//! namespace, never in the caller's, so the initial namespace is never locked.

use std::io;
use std::path::{Path, PathBuf};

use nsfast_sys::netns::{NetNs, NETNS_RUN_DIR};
use serde::Serialize;

pub const NS_MODE: &str = "/proc/sys/net/vsock/ns_mode";
pub const CHILD_NS_MODE: &str = "/proc/sys/net/vsock/child_ns_mode";

/// A namespace mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Global,
    Local,
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "global" => Ok(Mode::Global),
            "local" => Ok(Mode::Local),
            other => Err(format!(
                "invalid vsock namespace mode {other:?}: expected global or local"
            )),
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Mode::Global => "global",
            Mode::Local => "local",
        })
    }
}

/// Errors of the namespace-mode tools.
#[derive(Debug, thiserror::Error)]
pub enum NsModeError {
    #[error("vsock namespace modes are absent on this kernel ({kernel}): they need Linux 7.0 or later ({NS_MODE} does not exist)")]
    Absent { kernel: String },
    #[error(transparent)]
    Netns(#[from] nsfast_sys::netns::NetnsError),
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
}

/// The modes of one namespace.
#[derive(Debug, Clone, Serialize)]
pub struct Modes {
    pub namespace: String,
    pub ns_mode: Mode,
    pub child_ns_mode: Mode,
}

fn absent() -> NsModeError {
    NsModeError::Absent {
        kernel: nsfast_sys::kernel::release(),
    }
}

fn read_mode(path: &str) -> Result<Mode, NsModeError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            absent()
        } else {
            NsModeError::Io {
                what: format!("read {path}"),
                source: e,
            }
        }
    })?;
    text.parse().map_err(|e: String| NsModeError::Io {
        what: format!("read {path}"),
        source: io::Error::other(e),
    })
}

/// Whether this kernel has namespace modes.
pub fn supported() -> bool {
    Path::new(NS_MODE).exists()
}

/// The modes of the calling thread's namespace.
pub fn current() -> Result<Modes, NsModeError> {
    Ok(Modes {
        namespace: "current".into(),
        ns_mode: read_mode(NS_MODE)?,
        child_ns_mode: read_mode(CHILD_NS_MODE)?,
    })
}

/// The modes of a named namespace (or a path such as /proc/PID/ns/net).
pub fn show(name: &str) -> Result<Modes, NsModeError> {
    let ns = NetNs::open(name)?;
    let mut m = ns.run(current)??;
    m.namespace = name.to_string();
    Ok(m)
}

/// Writes `child_ns_mode` in the calling thread's namespace (write-once semantics are the
/// kernel's: EBUSY for a different value, EPERM for global under local).
pub fn set_child_mode(mode: Mode) -> io::Result<()> {
    std::fs::write(CHILD_NS_MODE, mode.to_string())
}

/// Creates the named namespace NAME (at /run/netns/NAME) whose `ns_mode` is `mode`.
pub fn create(name: &str, mode: Mode) -> Result<Modes, NsModeError> {
    if !supported() {
        return Err(absent());
    }
    if !nsfast_sys::netns::valid_name(name) {
        return Err(nsfast_sys::netns::NetnsError::BadName(name.into()).into());
    }
    let target: PathBuf = Path::new(NETNS_RUN_DIR).join(name);
    if target.exists() {
        return Err(nsfast_sys::netns::NetnsError::Exists(name.into()).into());
    }
    // A thread: unshare a throwaway parent, set its child_ns_mode, unshare the child and
    // bind-mount it. The parent dies with the thread; the caller's namespace is untouched.
    let n = name.to_string();
    std::thread::spawn(move || -> Result<(), NsModeError> {
        let io = |what: &str| {
            let what = what.to_string();
            move |e: nix::Error| NsModeError::Io {
                what,
                source: e.into(),
            }
        };
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(io("unshare throwaway parent"))?;
        set_child_mode(mode).map_err(|e| NsModeError::Io {
            what: format!("write {CHILD_NS_MODE} in the throwaway parent"),
            source: e,
        })?;
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(io("unshare the new namespace"))?;
        std::fs::create_dir_all(NETNS_RUN_DIR).map_err(|e| NsModeError::Io {
            what: format!("mkdir {NETNS_RUN_DIR}"),
            source: e,
        })?;
        let target = Path::new(NETNS_RUN_DIR).join(&n);
        std::fs::File::create(&target).map_err(|e| NsModeError::Io {
            what: format!("create {}", target.display()),
            source: e,
        })?;
        nix::mount::mount(
            Some("/proc/thread-self/ns/net"),
            &target,
            None::<&str>,
            nix::mount::MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|e| {
            let _ = std::fs::remove_file(&target);
            NsModeError::Io {
                what: format!("bind mount {}", target.display()),
                source: e.into(),
            }
        })
    })
    .join()
    .map_err(|_| NsModeError::Io {
        what: "namespace creation thread".into(),
        source: io::Error::other("panicked"),
    })??;
    let _ = target;
    show(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse() {
        assert_eq!("global\n".parse::<Mode>(), Ok(Mode::Global));
        assert_eq!("local".parse::<Mode>(), Ok(Mode::Local));
        assert!("both".parse::<Mode>().unwrap_err().contains("\"both\""));
    }
}
