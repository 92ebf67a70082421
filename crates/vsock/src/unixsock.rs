//! Listening UNIX sockets that survive a crash of their previous owner, shared by the relay
//! (`unix-listen`, `hybrid-listen`) and the bridge (hybrid members' `PATH_PORT`).
//!
//! - At start, a socket file nobody listens on (left by a SIGKILLed relay or bridge) is removed
//!   and bound again; a live listener is refused with an error naming the path, found without
//!   connecting to it where /proc/net/unix shows it. Only a socket is ever removed: a symlink
//!   (never followed), a regular file or anything else at the path is an error and stays.
//! - On exit, the file is removed only while it is still the one this process bound (same
//!   device and inode), so a later owner's socket is never taken away.

use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use tracing::debug;

/// Why a UNIX listener could not be bound.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("{} exists and a process is listening on it: another relay or bridge? (stop it, or choose another path)", .path.display())]
    InUse { path: PathBuf },
    #[error("{} exists and is not a socket ({kind}): not removed; remove it yourself or choose another path", .path.display())]
    NotSocket { path: PathBuf, kind: &'static str },
    #[error("{op} {}", .path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Whether a process listens on the UNIX socket `path`.
///
/// First /proc/net/unix (this network namespace's sockets): a LISTEN (01) entry with that name
/// says yes without waking the listener. Sockets of other namespaces are not in that table,
/// so when it has no such entry a connect probe decides: `ECONNREFUSED` is a socket file with
/// no listener (stale); a successful connect is a live listener elsewhere (it sees one
/// connection that closes at once). Other errors are returned.
pub fn listening(path: &Path) -> io::Result<bool> {
    if let Ok(table) = std::fs::read_to_string("/proc/thread-self/net/unix") {
        let want = path.as_os_str().to_string_lossy();
        let listed = table.lines().skip(1).any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // Num RefCount Protocol Flags Type St Inode Path
            f.len() >= 8 && f[5] == "01" && f[7..].join(" ") == want
        });
        if listed {
            return Ok(true);
        }
    }
    match UnixStream::connect(path) {
        Ok(_) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => Ok(false),
        Err(e) => Err(e),
    }
}

fn kind(ft: std::fs::FileType) -> &'static str {
    if ft.is_symlink() {
        "a symlink"
    } else if ft.is_file() {
        "a regular file"
    } else if ft.is_dir() {
        "a directory"
    } else if ft.is_fifo() {
        "a FIFO"
    } else {
        "a device"
    }
}

/// A bound UNIX listener and the identity of its socket file.
#[derive(Debug)]
pub struct BoundSocket {
    pub listener: UnixListener,
    pub path: PathBuf,
    dev: u64,
    ino: u64,
}

impl BoundSocket {
    /// Binds `path`, first removing a stale socket file there (see the module docs).
    pub fn bind(path: &Path) -> Result<Self, BindError> {
        let io = |op| {
            move |source| BindError::Io {
                op,
                path: path.into(),
                source,
            }
        };
        match std::fs::symlink_metadata(path) {
            Ok(md) if md.file_type().is_socket() => {
                if listening(path).map_err(io("probe"))? {
                    return Err(BindError::InUse { path: path.into() });
                }
                debug!("removing stale socket {}", path.display());
                // unlink never follows a symlink: at worst (the file swapped since the lstat
                // by someone who may write this directory) it removes that name, which that
                // someone could remove as well.
                match std::fs::remove_file(path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(io("remove stale socket")(e)),
                }
            }
            Ok(md) => {
                return Err(BindError::NotSocket {
                    path: path.into(),
                    kind: kind(md.file_type()),
                })
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io("stat")(e)),
        }
        let listener = UnixListener::bind(path).map_err(io("bind"))?;
        let md = std::fs::symlink_metadata(path).map_err(io("stat"))?;
        Ok(Self {
            listener,
            path: path.into(),
            dev: md.dev(),
            ino: md.ino(),
        })
    }

    /// Removes the socket file if it is still the one bound here. Idempotent.
    pub fn remove(&self) {
        if let Ok(md) = std::fs::symlink_metadata(&self.path) {
            if md.file_type().is_socket() && md.dev() == self.dev && md.ino() == self.ino {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }
}

impl Drop for BoundSocket {
    fn drop(&mut self) {
        self.remove();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("nsft-us-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn stale_replaced_live_refused_others_kept() {
        let d = dir("a");
        let p = d.join("s");
        drop(UnixListener::bind(&p).unwrap());
        assert!(!listening(&p).unwrap());
        let b = BoundSocket::bind(&p).expect("a stale socket is replaced");
        assert!(listening(&p).unwrap());
        let e = BoundSocket::bind(&p).unwrap_err();
        assert!(matches!(e, BindError::InUse { .. }), "{e}");
        // Another file took the path after us: it is not ours to remove.
        std::fs::remove_file(&p).unwrap();
        std::fs::write(&p, b"x").unwrap();
        b.remove();
        assert_eq!(std::fs::read(&p).unwrap(), b"x");
        let e = BoundSocket::bind(&p).unwrap_err();
        assert!(
            e.to_string().contains("is not a socket (a regular file)"),
            "{e}"
        );
        drop(b);
        assert!(p.exists());
        // A symlink to a stale socket: refused, neither removed.
        let s = d.join("stale");
        drop(UnixListener::bind(&s).unwrap());
        let l = d.join("link");
        std::os::unix::fs::symlink(&s, &l).unwrap();
        let e = BoundSocket::bind(&l).unwrap_err();
        assert!(e.to_string().contains("(a symlink)"), "{e}");
        assert!(s.exists() && std::fs::symlink_metadata(&l).is_ok());
        // Ours is removed on drop.
        let q = d.join("q");
        drop(BoundSocket::bind(&q).unwrap());
        assert!(!q.exists());
        let _ = std::fs::remove_dir_all(&d);
    }
}
