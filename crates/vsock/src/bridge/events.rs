//! What happened to each connection: the bridge's events, as log lines (Display) or JSON
//! objects (Serialize, `--json`).

use serde::Serialize;

/// What happened to one connection; printed as a log line, or a JSON object with `--json`.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "event", rename_all = "lowercase")]
pub enum Event {
    /// A connection was accepted and its target connected; bytes flow from now on.
    Open {
        id: u64,
        src: u32,
        dst: u32,
        port: u32,
        dialled: u32,
    },
    /// A connection was refused by the routing rules (or the connection limit) and closed.
    Deny {
        src: u32,
        dialled: u32,
        port: u32,
        reason: String,
    },
    /// The target could not be reached; the source connection was closed.
    Fail {
        id: u64,
        src: u32,
        dst: u32,
        port: u32,
        error: String,
    },
    /// A bridged connection ended.
    Close {
        id: u64,
        src: u32,
        dst: u32,
        port: u32,
        bytes_src_to_dst: u64,
        bytes_dst_to_src: u64,
        millis: u64,
        spliced: bool,
        /// `kernel` (both AF_VSOCK legs joined by the sockmap redirect, crates/vsock/src/kernel.rs),
        /// `splice` or `copy`.
        path: &'static str,
        error: Option<String>,
    },
}

impl std::fmt::Display for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Event::Open {
                id,
                src,
                dst,
                port,
                dialled,
            } => write!(
                f,
                "bridge {src}:{port} -> {dst}:{port} (conn {id}, dialled {dialled})"
            ),
            Event::Deny {
                src,
                dialled,
                port,
                reason,
            } => write!(f, "denied {src}:{port} -> {dialled}:{port}: {reason}"),
            Event::Fail {
                id,
                src,
                dst,
                port,
                error,
            } => write!(
                f,
                "failed {src}:{port} -> {dst}:{port} (conn {id}): {error}"
            ),
            Event::Close {
                id,
                src,
                dst,
                port,
                bytes_src_to_dst,
                bytes_dst_to_src,
                millis,
                spliced,
                path,
                error,
            } => {
                write!(
                    f,
                    "closed {src}:{port} -> {dst}:{port} (conn {id}): {bytes_src_to_dst} bytes ->, {bytes_dst_to_src} bytes <-, {millis} ms{}",
                    match (*path, *spliced) {
                        ("kernel", _) => ", kernel path",
                        (_, true) => ", spliced",
                        _ => "",
                    }
                )?;
                if let Some(e) = error {
                    write!(f, ", error: {e}")?;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bridge::policy::Deny;

    #[test]
    fn event_lines() {
        let e = Event::Open {
            id: 1,
            src: 3,
            dst: 4,
            port: 5000,
            dialled: 2,
        };
        assert_eq!(e.to_string(), "bridge 3:5000 -> 4:5000 (conn 1, dialled 2)");
        let d = Event::Deny {
            src: 3,
            dialled: 5,
            port: 5000,
            reason: Deny::NoSharedGroup { src: 3, dst: 5 }.to_string(),
        };
        assert_eq!(
            d.to_string(),
            "denied 3:5000 -> 5:5000: 3 dialled 5, and the two share no group"
        );
    }
}
