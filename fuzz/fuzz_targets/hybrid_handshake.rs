//! The hybrid vsock handshake: what a VMM (or whoever holds its socket) answers to
//! `CONNECT <port>\n`, and the `CONNECT` request line the VMM side parses.
#![no_main]
use std::io::{self, Cursor, Read, Write};

use libfuzzer_sys::fuzz_target;
use nsfast_vsock::hybrid::{connect_handshake, parse_connect, parse_reply, MAX_REPLY};

struct Vmm<'a> {
    reply: Cursor<&'a [u8]>,
    sent: Vec<u8>,
}

impl Read for Vmm<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.reply.read(buf)
    }
}

impl Write for Vmm<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.sent.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fuzz_target!(|data: &[u8]| {
    let mut vmm = Vmm {
        reply: Cursor::new(data),
        sent: Vec::new(),
    };
    let r = connect_handshake(&mut vmm, 1234);
    assert_eq!(vmm.sent, b"CONNECT 1234\n");
    // Never reads past the reply line, nor more than MAX_REPLY bytes.
    let used = vmm.reply.position() as usize;
    assert!(used <= MAX_REPLY, "read {used} bytes");
    match r {
        Ok(n) => {
            let end = data
                .iter()
                .position(|&b| b == b'\n')
                .expect("OK needs a newline");
            assert_eq!(used, end + 1);
            let line = String::from_utf8_lossy(&data[..end]);
            assert_eq!(parse_reply(&line).ok(), Some(n));
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
    // The VMM side: request lines.
    for line in String::from_utf8_lossy(data).split('\n') {
        if let Some(p) = parse_connect(line) {
            assert_eq!(parse_connect(&format!("CONNECT {p}")), Some(p));
        }
    }
});
