//! Host side of hybrid vsock (Firecracker, Cloud Hypervisor, vhost-device-vsock `--uds-path`):
//! connect to the VMM's UNIX socket, send `CONNECT <port>\n`, read one line. Success is any
//! `OK <n>\n` (Firecracker answers with a host-side port, vhost-device-vsock echoes the guest
//! port); on failure the VMM closes the connection without a word.

use std::io::{self, Read, Write};

/// The longest reply line accepted, newline included.
pub const MAX_REPLY: usize = 32;

/// Why a hybrid handshake failed.
#[derive(Debug, thiserror::Error)]
pub enum HybridError {
    /// The VMM closed the connection: nothing listens on that port in the guest.
    #[error("the VMM closed the connection after CONNECT {port}: nothing listens on vsock port {port} in the guest (or the VMM refused)")]
    Refused { port: u32 },
    /// The reply line did not end within MAX_REPLY bytes.
    #[error("hybrid vsock reply longer than {MAX_REPLY} bytes without a newline: {0:?}")]
    TooLong(String),
    /// The reply was not `OK <n>`.
    #[error("hybrid vsock reply {0:?} is not \"OK <port>\"")]
    NotOk(String),
    /// The VMM's socket could not be connected to.
    #[error("connect to the VMM's socket")]
    Connect(#[source] io::Error),
    /// The VMM accepted but its whole reply line did not arrive within the connect timeout
    /// (one deadline over the connect, the request and the reply, not a limit per read).
    #[error("no reply to CONNECT {port} within {} (the limit for the connect, the request and the whole reply line): the VMM accepted but did not answer in time", nsfast_sys::args::duration::format(*.timeout))]
    Timeout {
        port: u32,
        timeout: std::time::Duration,
    },
    /// An I/O error during the handshake.
    #[error("hybrid vsock handshake")]
    Io(#[from] io::Error),
}

/// Performs the handshake on `s`; returns the number after `OK`. Reads byte by byte so that no
/// byte after the reply line is consumed.
pub fn connect_handshake<S: Read + Write>(s: &mut S, port: u32) -> Result<u32, HybridError> {
    s.write_all(format!("CONNECT {port}\n").as_bytes())?;
    let line = read_line(s, port)?;
    parse_reply(&line)
}

fn read_line<S: Read>(s: &mut S, port: u32) -> Result<String, HybridError> {
    let mut line = Vec::with_capacity(MAX_REPLY);
    loop {
        let mut b = [0u8; 1];
        match s.read(&mut b) {
            Ok(0) => {
                return if line.is_empty() {
                    Err(HybridError::Refused { port })
                } else {
                    Err(HybridError::NotOk(
                        String::from_utf8_lossy(&line).into_owned(),
                    ))
                }
            }
            Ok(_) => {
                if b[0] == b'\n' {
                    return Ok(String::from_utf8_lossy(&line).into_owned());
                }
                line.push(b[0]);
                if line.len() >= MAX_REPLY {
                    return Err(HybridError::TooLong(
                        String::from_utf8_lossy(&line).into_owned(),
                    ));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {
                return Err(HybridError::Refused { port })
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Parses a reply line (without its newline).
pub fn parse_reply(line: &str) -> Result<u32, HybridError> {
    let line_trim = line.strip_suffix('\r').unwrap_or(line);
    match line_trim.split_once(' ') {
        Some(("OK", n)) => n
            .trim()
            .parse::<u32>()
            .map_err(|_| HybridError::NotOk(line.to_string())),
        _ => Err(HybridError::NotOk(line.to_string())),
    }
}

/// Parses a `CONNECT <port>` request line (without newline); the VMM side of the protocol,
/// used by nsfast's own tests and the sibling bridge.
pub fn parse_connect(line: &str) -> Option<u32> {
    line.strip_prefix("CONNECT ")?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::io::Cursor;

    struct Duplex {
        input: Cursor<Vec<u8>>,
        output: Vec<u8>,
    }

    impl Read for Duplex {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.input.read(buf)
        }
    }

    impl Write for Duplex {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.output.write(buf)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn run(reply: &[u8]) -> (Result<u32, HybridError>, Duplex) {
        let mut d = Duplex {
            input: Cursor::new(reply.to_vec()),
            output: Vec::new(),
        };
        let r = connect_handshake(&mut d, 1234);
        (r, d)
    }

    #[test]
    fn accepts_firecracker_and_vhost_device_vsock_replies() {
        let (r, d) = run(b"OK 1073741824\nDATA");
        assert_eq!(r.unwrap(), 1 << 30);
        assert_eq!(d.output, b"CONNECT 1234\n");
        // Nothing after the newline was consumed.
        let mut d = d;
        let mut rest = String::new();
        d.input.read_to_string(&mut rest).unwrap();
        assert_eq!(rest, "DATA");
        assert_eq!(run(b"OK 1234\n").0.unwrap(), 1234);
    }

    #[test]
    fn rejects_bad_replies() {
        assert!(matches!(
            run(b"").0,
            Err(HybridError::Refused { port: 1234 })
        ));
        assert!(matches!(run(b"NO\n").0, Err(HybridError::NotOk(_))));
        assert!(matches!(run(b"OK abc\n").0, Err(HybridError::NotOk(_))));
        assert!(matches!(run(b"OK 12").0, Err(HybridError::NotOk(_))));
        let long = vec![b'O'; 100];
        assert!(matches!(run(&long).0, Err(HybridError::TooLong(_))));
        assert_eq!(parse_connect("CONNECT 52"), Some(52));
        assert_eq!(parse_connect("CONNECT x"), None);
    }

    proptest! {
        // Whatever a VMM (or an attacker on its socket) answers, the handshake returns an error
        // or a port: it never panics, never reads more than MAX_REPLY bytes.
        #[test]
        fn handshake_never_panics(reply in proptest::collection::vec(any::<u8>(), 0..200)) {
            let (r, d) = run(&reply);
            prop_assert!(d.input.position() as usize <= MAX_REPLY);
            if let Ok(n) = r {
                // Success only for a newline-terminated "OK <n>" line within the limit.
                let end = reply.iter().position(|&b| b == b'\n');
                prop_assert!(end.is_some_and(|e| e < MAX_REPLY));
                let line = String::from_utf8_lossy(&reply[..end.unwrap()]).into_owned();
                prop_assert_eq!(parse_reply(&line).ok(), Some(n));
            }
        }
    }
}
