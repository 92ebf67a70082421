//! The two systemd protocols nsfast speaks, without libsystemd:
//!
//! - [`notify`]: `sd_notify(3)` — one datagram (`READY=1`, `STATUS=...`) to the UNIX socket
//!   named by `$NOTIFY_SOCKET` (a path, or an abstract name written with a leading `@`).
//! - [`stderr_is_journal`]: whether stderr is connected to the journal (`$JOURNAL_STREAM` holds
//!   `DEVICE:INODE` of that stream), so logs can drop colour and timestamps.

use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

/// Sends `state` (e.g. `"READY=1"`) to the service manager. Returns `Ok(false)` when
/// `$NOTIFY_SOCKET` is not set (not started by systemd with `Type=notify`).
pub fn notify(state: &str) -> io::Result<bool> {
    let Some(target) = std::env::var_os("NOTIFY_SOCKET") else {
        return Ok(false);
    };
    let target = target.to_string_lossy().into_owned();
    let addr = notify_addr(&target)?;
    let sock = UnixDatagram::unbound()?;
    sock.send_to_addr(state.as_bytes(), &addr).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("sending {state:?} to NOTIFY_SOCKET {target}: {e}"),
        )
    })?;
    Ok(true)
}

/// The address `$NOTIFY_SOCKET` names: `@name` is the abstract name `name`, `/path` a path.
pub fn notify_addr(s: &str) -> io::Result<SocketAddr> {
    if let Some(name) = s.strip_prefix('@') {
        SocketAddr::from_abstract_name(name.as_bytes())
    } else if s.starts_with('/') {
        SocketAddr::from_pathname(s)
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("NOTIFY_SOCKET {s:?}: must be an absolute path or start with '@'"),
        ))
    }
}

/// Whether stderr is the journal stream systemd set up for this service: `$JOURNAL_STREAM`
/// is `DEVICE:INODE` and matches stderr (a child whose stderr was redirected elsewhere
/// inherits the variable but not the stream).
pub fn stderr_is_journal() -> bool {
    let Some(v) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = parse_journal_stream(&v.to_string_lossy()) else {
        return false;
    };
    nix::sys::stat::fstat(std::io::stderr()).is_ok_and(|st| st.st_dev == dev && st.st_ino == ino)
}

/// `DEVICE:INODE` (decimal) of `$JOURNAL_STREAM`.
pub fn parse_journal_stream(s: &str) -> Option<(u64, u64)> {
    let (d, i) = s.trim().split_once(':')?;
    Some((d.parse().ok()?, i.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notify_socket_addresses() {
        let a = notify_addr("@nsfast-test").unwrap();
        assert_eq!(a.as_abstract_name(), Some(&b"nsfast-test"[..]));
        let p = notify_addr("/run/systemd/notify").unwrap();
        assert_eq!(
            p.as_pathname(),
            Some(std::path::Path::new("/run/systemd/notify"))
        );
        let e = notify_addr("relative").unwrap_err();
        assert!(e.to_string().contains("\"relative\""), "{e}");
    }

    #[test]
    fn journal_stream_values() {
        assert_eq!(parse_journal_stream("8:12345"), Some((8, 12345)));
        assert_eq!(parse_journal_stream("8-1"), None);
        assert_eq!(parse_journal_stream("x:1"), None);
    }

    #[test]
    fn ready_reaches_a_path_listener() {
        let dir = std::env::temp_dir().join(format!("nsfast-notify-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        let path = dir.join("notify");
        let listener = UnixDatagram::bind(&path).unwrap();
        let sock = UnixDatagram::unbound().unwrap();
        sock.send_to_addr(b"READY=1", &notify_addr(path.to_str().unwrap()).unwrap())
            .unwrap();
        let mut buf = [0u8; 64];
        let n = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
