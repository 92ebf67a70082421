//! Joining a rootless container engine's namespaces (RootlessKit's child: user, mount and
//! network namespace) from an unprivileged process, the way
//! `nsenter -U --preserve-credentials -m -n -t PID` does.
//!
//! `setns(CLONE_NEWUSER)` needs a single-threaded caller, so the join happens in a forked child
//! between fork and exec ([`Target::configure_command`]). A process that joined the user
//! namespace can never go back to the host network namespace (EPERM): anything that needs
//! host-side sockets must stay in a process that never joined.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use nix::sys::signal::Signal;

use crate::syscall::cvt;

/// Errors naming the process or file involved.
#[derive(Debug, thiserror::Error)]
pub enum UsernsError {
    /// A namespace file could not be opened.
    #[error("cannot open {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Where the network namespace comes from.
#[derive(Debug)]
enum Net {
    /// The target process's own network namespace.
    Fd(OwnedFd),
    /// A bind-mounted namespace file, opened after joining the mount namespace (RootlessKit
    /// `--detach-netns`: the file is only visible there).
    Path(CString),
}

/// The namespaces of a process to join.
#[derive(Debug)]
pub struct Target {
    user: OwnedFd,
    mnt: OwnedFd,
    net: Net,
}

fn open(path: &Path) -> Result<OwnedFd, UsernsError> {
    File::open(path)
        .map(OwnedFd::from)
        .map_err(|source| UsernsError::Open {
            path: path.to_path_buf(),
            source,
        })
}

impl Target {
    /// The user, mount and network namespaces of `pid`; with `netns_file`, the network
    /// namespace is that file as seen inside `pid`'s mount namespace instead.
    pub fn of_pid(pid: u32, netns_file: Option<&Path>) -> Result<Self, UsernsError> {
        let base = PathBuf::from(format!("/proc/{pid}/ns"));
        let user = open(&base.join("user"))?;
        let mnt = open(&base.join("mnt"))?;
        let net = match netns_file {
            Some(p) => Net::Path(CString::new(p.as_os_str().as_encoded_bytes()).map_err(|_| {
                UsernsError::Open {
                    path: p.to_path_buf(),
                    source: io::Error::from(io::ErrorKind::InvalidInput),
                }
            })?),
            None => Net::Fd(open(&base.join("net"))?),
        };
        Ok(Self { user, mnt, net })
    }

    /// Namespaces already opened by the caller (e.g. through a `/proc/<pid>` directory it
    /// verified while holding a pidfd): `user`, `mnt`, and either `net` or `netns_file` (the
    /// network namespace file as seen inside `mnt`, opened after joining it).
    pub fn from_fds(
        user: OwnedFd,
        mnt: OwnedFd,
        net: Option<OwnedFd>,
        netns_file: Option<&Path>,
    ) -> Result<Self, UsernsError> {
        let net = match (net, netns_file) {
            (_, Some(p)) => {
                Net::Path(CString::new(p.as_os_str().as_encoded_bytes()).map_err(|_| {
                    UsernsError::Open {
                        path: p.to_path_buf(),
                        source: io::Error::from(io::ErrorKind::InvalidInput),
                    }
                })?)
            }
            (Some(fd), None) => Net::Fd(fd),
            (None, None) => {
                return Err(UsernsError::Open {
                    path: PathBuf::from("(network namespace)"),
                    source: io::Error::from(io::ErrorKind::InvalidInput),
                })
            }
        };
        Ok(Self { user, mnt, net })
    }

    /// Makes `cmd` join these namespaces before exec (user first, so the caller gains
    /// capabilities over the others), change to `/`, and get SIGTERM when the spawning
    /// thread dies (`PR_SET_PDEATHSIG`).
    pub fn configure_command(&self, cmd: &mut Command) {
        let user = self.user.as_raw_fd();
        let mnt = self.mnt.as_raw_fd();
        let (net_fd, net_path) = match &self.net {
            Net::Fd(f) => (f.as_raw_fd(), None),
            Net::Path(p) => (-1, Some(p.clone())),
        };
        // SAFETY: the closure runs in the forked child before exec and only makes
        // async-signal-safe system calls (prctl, setns, open, close, chdir) on descriptors
        // and strings prepared before the fork; it allocates nothing.
        unsafe {
            cmd.pre_exec(move || {
                crate::child::die_with_parent_raw(Signal::SIGTERM)?;
                cvt(libc::setns(user, libc::CLONE_NEWUSER))?;
                cvt(libc::setns(mnt, libc::CLONE_NEWNS))?;
                match &net_path {
                    Some(p) => {
                        let fd = cvt(libc::open(
                            p.as_ptr(),
                            libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW,
                        ))?;
                        let r = libc::setns(fd, libc::CLONE_NEWNET);
                        libc::close(fd);
                        cvt(r)?;
                    }
                    None => {
                        cvt(libc::setns(net_fd, libc::CLONE_NEWNET))?;
                    }
                }
                cvt(libc::chdir(c"/".as_ptr()))?;
                Ok(())
            });
        }
    }
}
