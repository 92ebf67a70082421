//! The floors: transports with no network stack at all, so each table shows how far a path is
//! from what two processes pay just to wake each other.
//!
//! - `unix`: an AF_UNIX stream socket in the topology's namespace (an abstract name, so
//!   nothing is left in the file system). Its cost is the socket layer and the wakeups.
//! - `pipe`: two FIFOs (client → server, server → client) in a root-only directory under
//!   /run. A pipe is the cheapest byte channel between processes: its round trip is two
//!   context switches and two copies (measured on this 2-core machine with a C ping-pong:
//!   pipe 5.4 µs, AF_UNIX 9.2 µs, TCP loopback 14.1 µs).
//!
//! A pipe carries one connection, so `crr` and `udp-stream` do not run on it; `unix` runs every
//! stream workload.

use std::cell::Cell;
use std::fs::{File, OpenOptions};
use std::io::{self, ErrorKind, Read, Write};
use std::os::fd::AsFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::net::{SocketAddr as UnixAddr, UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

/// The abstract AF_UNIX name of floor `id`.
pub fn unix_name(id: u64) -> String {
    format!("nsfast-bench-{id}")
}

fn unix_addr(id: u64) -> io::Result<UnixAddr> {
    UnixAddr::from_abstract_name(unix_name(id).as_bytes())
}

/// Listens on the abstract name of `id`.
pub fn unix_listen(id: u64) -> io::Result<UnixListener> {
    UnixListener::bind_addr(&unix_addr(id)?)
}

pub fn unix_connect(id: u64) -> io::Result<UnixStream> {
    UnixStream::connect_addr(&unix_addr(id)?)
}

/// The directory of pipe floor `id` (made by the server, root only).
pub fn pipe_dir(id: u64) -> PathBuf {
    PathBuf::from(format!("/run/nsfast-bench-pipe-{id}"))
}

const C2S: &str = "c2s";
const S2C: &str = "s2c";
/// What the server writes first on s2c (see [`pipe_connect`]).
const ACCEPTED: u8 = 0x06;

/// The server's side before the client came: the directory with both FIFOs and the read end of
/// c2s, held open so the client's blocking open of c2s for writing finds a reader.
pub struct PipeListener {
    dir: PathBuf,
    c2s: Mutex<Option<File>>,
}

impl PipeListener {
    /// Makes the directory (0700; an existing one is refused: it is not ours) and both FIFOs.
    pub fn bind(id: u64) -> io::Result<Self> {
        let dir = pipe_dir(id);
        std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
        let made = (|| -> io::Result<File> {
            for name in [C2S, S2C] {
                nix::unistd::mkfifo(
                    &dir.join(name),
                    nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR,
                )
                .map_err(io::Error::from)?;
            }
            open_fifo(&dir.join(C2S), false, true)
        })();
        match made {
            Ok(c2s) => Ok(PipeListener {
                dir,
                c2s: Mutex::new(Some(c2s)),
            }),
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                Err(e)
            }
        }
    }

    /// Waits up to `wait` for the client (it opens s2c for reading first): the stream, or
    /// WouldBlock. A pipe floor carries one connection: a second accept is refused.
    pub fn accept(&self, wait: Duration) -> io::Result<PipeStream> {
        let mut c2s = self.c2s.lock().unwrap_or_else(|e| e.into_inner());
        if c2s.is_none() {
            return Err(io::Error::new(
                ErrorKind::InvalidInput,
                "a pipe carries one connection",
            ));
        }
        let deadline = Instant::now() + wait;
        loop {
            // A write end opens without blocking only once a reader exists (else ENXIO).
            match open_fifo(&self.dir.join(S2C), true, true) {
                Ok(mut w) => {
                    let r = c2s.take().expect("checked above");
                    set_blocking(&r)?;
                    set_blocking(&w)?;
                    // The accept byte: until a writer exists the client's reads of s2c see EOF.
                    w.write_all(&[ACCEPTED])?;
                    return Ok(PipeStream::new(r, w));
                }
                Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {}
                Err(e) => return Err(e),
            }
            if Instant::now() >= deadline {
                return Err(ErrorKind::WouldBlock.into());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl Drop for PipeListener {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The client's side: s2c for reading (without blocking: the server waits for it), then c2s
/// for writing (blocking until the server's reader, which it already holds).
pub fn pipe_connect(id: u64) -> io::Result<PipeStream> {
    let dir = pipe_dir(id);
    let mut r = open_fifo(&dir.join(S2C), false, true)?;
    set_blocking(&r)?;
    let w = open_fifo(&dir.join(C2S), true, false)?;
    // A FIFO without a writer reads as EOF: wait for the server's accept byte.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut b = [0u8; 1];
    loop {
        match r.read(&mut b)? {
            1 if b[0] == ACCEPTED => return Ok(PipeStream::new(r, w)),
            1 => {
                return Err(io::Error::new(
                    ErrorKind::InvalidData,
                    "the pipe server's first byte is not its accept byte",
                ))
            }
            _ if Instant::now() >= deadline => {
                return Err(io::Error::new(
                    ErrorKind::TimedOut,
                    "the pipe server did not accept within 5 s",
                ))
            }
            _ => std::thread::sleep(Duration::from_millis(1)),
        }
    }
}

fn open_fifo(path: &std::path::Path, write: bool, nonblock: bool) -> io::Result<File> {
    let mut flags = libc::O_NOFOLLOW | libc::O_CLOEXEC;
    if nonblock {
        flags |= libc::O_NONBLOCK;
    }
    let f = OpenOptions::new()
        .read(!write)
        .write(write)
        .custom_flags(flags)
        .open(path)?;
    if !std::os::unix::fs::FileTypeExt::is_fifo(&f.metadata()?.file_type()) {
        return Err(io::Error::new(
            ErrorKind::InvalidData,
            format!("{} is not a FIFO", path.display()),
        ));
    }
    Ok(f)
}

fn set_blocking(f: &File) -> io::Result<()> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let fl = OFlag::from_bits_truncate(fcntl(f, FcntlArg::F_GETFL).map_err(io::Error::from)?);
    fcntl(f, FcntlArg::F_SETFL(fl - OFlag::O_NONBLOCK)).map_err(io::Error::from)?;
    Ok(())
}

/// Both directions of a pipe floor.
#[derive(Debug)]
pub struct PipeStream {
    r: File,
    w: Option<File>,
    timeout: Cell<Option<Duration>>,
}

impl PipeStream {
    fn new(r: File, w: File) -> Self {
        PipeStream {
            r,
            w: Some(w),
            timeout: Cell::new(None),
        }
    }

    /// As SO_RCVTIMEO: a read that waits longer fails with WouldBlock.
    pub fn set_read_timeout(&self, d: Option<Duration>) {
        self.timeout.set(d);
    }

    /// Closes the write end (the peer reads EOF); a pipe has nothing to shut for reading.
    pub fn shutdown_write(&mut self) {
        self.w = None;
    }
}

impl Read for PipeStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(d) = self.timeout.get() {
            let ms = u16::try_from(d.as_millis()).unwrap_or(u16::MAX);
            let mut fds = [PollFd::new(self.r.as_fd(), PollFlags::POLLIN)];
            if poll(&mut fds, PollTimeout::from(ms)).map_err(io::Error::from)? == 0 {
                return Err(ErrorKind::WouldBlock.into());
            }
        }
        self.r.read(buf)
    }
}

impl Write for PipeStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &mut self.w {
            Some(w) => w.write(buf),
            None => Err(ErrorKind::BrokenPipe.into()),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pipe_floor_carries_both_ways_and_ends_with_eof() {
        if !nix::unistd::geteuid().is_root() {
            return; // /run is root's
        }
        let id = u64::from(std::process::id()) << 16 | 1;
        let l = PipeListener::bind(id).unwrap();
        assert!(
            PipeListener::bind(id).is_err(),
            "an existing directory is refused"
        );
        let t = std::thread::spawn(move || {
            let mut c = pipe_connect(id).unwrap();
            c.write_all(b"ping").unwrap();
            let mut b = [0u8; 4];
            c.read_exact(&mut b).unwrap();
            assert_eq!(&b, b"pong");
            c.shutdown_write();
        });
        let mut s = loop {
            match l.accept(Duration::from_millis(100)) {
                Ok(s) => break s,
                Err(e) if e.kind() == ErrorKind::WouldBlock => continue,
                Err(e) => panic!("{e}"),
            }
        };
        let mut b = [0u8; 4];
        s.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"ping");
        s.write_all(b"pong").unwrap();
        t.join().unwrap();
        assert_eq!(s.read(&mut b).unwrap(), 0);
        assert!(l.accept(Duration::ZERO).is_err());
        drop(l);
        assert!(!pipe_dir(id).exists());
    }

    #[test]
    fn a_read_waits_at_most_its_timeout() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let id = u64::from(std::process::id()) << 16 | 2;
        let l = PipeListener::bind(id).unwrap();
        let c = std::thread::spawn(move || pipe_connect(id).unwrap());
        let mut s = l.accept(Duration::from_secs(5)).unwrap();
        let _c = c.join().unwrap();
        s.set_read_timeout(Some(Duration::from_millis(20)));
        let t = Instant::now();
        let e = s.read(&mut [0u8; 1]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::WouldBlock);
        assert!(t.elapsed() >= Duration::from_millis(15));
    }

    #[test]
    fn unix_floor_names_are_abstract_and_distinct() {
        assert_ne!(unix_name(1), unix_name(2));
        let l = unix_listen(u64::from(std::process::id()) << 16 | 3).unwrap();
        let _c = unix_connect(u64::from(std::process::id()) << 16 | 3).unwrap();
        drop(l);
    }
}
