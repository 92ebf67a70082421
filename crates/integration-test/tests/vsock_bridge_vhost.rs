//! The sibling bridge's AF_VSOCK member path against the kernel's real vhost-vsock, inside a
//! VM harness guest (guest line `vsock-bridge-vhost`; #[ignore]d, and refused unless
//! NSFAST_VM_GUEST=1: AF_VSOCK on a host may belong to someone else).
//!
//! The guest plays the host: it loads vhost_vsock, runs `nsfast vsock bridge` with AF_VSOCK
//! members, and instead of booting nested VMs (far too slow under TCG) this file drives
//! `/dev/vhost-vsock` itself, as a VMM's virtio-vsock device would: a "fake guest" per CID
//! (VHOST_SET_OWNER, a memory table mapping its own buffers, an RX and a TX split virtqueue,
//! VHOST_VSOCK_SET_GUEST_CID, SET_RUNNING) that puts virtio-vsock packets (REQUEST, RW,
//! SHUTDOWN, CREDIT_*) on its TX queue and reads the host's on its RX queue. The kernel path
//! from there is the one real guests take: vhost-vsock checks the source CID, the bridge's
//! listener at VMADDR_CID_ANY accepts, getsockname gives the CID the fake guest addressed, and
//! the bridge's connect to a sibling CID goes out through vhost to that fake guest's RX queue.
//! A real guest sets VMADDR_FLAG_TO_HOST only to make its own kernel pick the host transport;
//! on the wire that is a packet with dst_cid = the sibling, which is what a fake guest sends.

use std::collections::VecDeque;
use std::io::{self, BufRead, BufReader};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::{Command, Stdio};
use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};

use nsfast_lab::peer::KillOnDrop;

/// The binary under test (`$NSFAST_BIN`, else the workspace's build).
use nsfast_lab::bins::nsfast as nsfast_bin;

fn require_guest() {
    assert_eq!(
        std::env::var("NSFAST_VM_GUEST").as_deref(),
        Ok("1"),
        "vhost-vsock tests run only inside the VM harness's guests (NSFAST_VM_GUEST=1); never on a host"
    );
    assert!(
        std::path::Path::new("/dev/vhost-vsock").exists(),
        "the guest lacks /dev/vhost-vsock (load vhost_vsock)"
    );
}

// ---- vhost ioctls (linux/vhost.h) ----

#[repr(C)]
struct VhostMemory {
    nregions: u32,
    padding: u32,
    region: VhostMemoryRegion,
}

#[repr(C)]
struct VhostMemoryRegion {
    guest_phys_addr: u64,
    memory_size: u64,
    userspace_addr: u64,
    flags_padding: u64,
}

#[repr(C)]
struct VringState {
    index: u32,
    num: u32,
}

#[repr(C)]
struct VringAddr {
    index: u32,
    flags: u32,
    desc_user_addr: u64,
    used_user_addr: u64,
    avail_user_addr: u64,
    log_guest_addr: u64,
}

#[repr(C)]
struct VringFile {
    index: u32,
    fd: i32,
}

const VHOST: u8 = 0xAF;
nix::ioctl_read!(vhost_get_features, VHOST, 0x00, u64);
nix::ioctl_write_ptr!(vhost_set_features, VHOST, 0x00, u64);
nix::ioctl_none!(vhost_set_owner, VHOST, 0x01);
// The real argument is `struct vhost_memory` with a flexible array; the request number encodes
// only the 8-byte head, which is what the kernel expects.
nix::ioctl_write_ptr_bad!(
    vhost_set_mem_table,
    nix::request_code_write!(VHOST, 0x03, 8),
    VhostMemory
);
nix::ioctl_write_ptr!(vhost_set_vring_num, VHOST, 0x10, VringState);
nix::ioctl_write_ptr!(vhost_set_vring_addr, VHOST, 0x11, VringAddr);
nix::ioctl_write_ptr!(vhost_set_vring_base, VHOST, 0x12, VringState);
nix::ioctl_write_ptr!(vhost_set_vring_kick, VHOST, 0x20, VringFile);
nix::ioctl_write_ptr!(vhost_set_vring_call, VHOST, 0x21, VringFile);
nix::ioctl_write_ptr!(vhost_vsock_set_guest_cid, VHOST, 0x60, u64);
nix::ioctl_write_ptr!(vhost_vsock_set_running, VHOST, 0x61, i32);

const VIRTIO_F_VERSION_1: u64 = 1 << 32;

// ---- virtio-vsock packets ----

const HDR: usize = 44;
const TYPE_STREAM: u16 = 1;
const OP_REQUEST: u16 = 1;
const OP_RESPONSE: u16 = 2;
const OP_RST: u16 = 3;
const OP_SHUTDOWN: u16 = 4;
const OP_RW: u16 = 5;
const OP_CREDIT_UPDATE: u16 = 6;
const OP_CREDIT_REQUEST: u16 = 7;
const SHUT_RCV: u32 = 1;
const SHUT_SEND: u32 = 2;
/// Our receive buffer as announced to the host: large, so the host never waits for credit.
const BUF_ALLOC: u32 = 64 << 20;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Hdr {
    src_cid: u64,
    dst_cid: u64,
    src_port: u32,
    dst_port: u32,
    len: u32,
    ty: u16,
    op: u16,
    flags: u32,
    buf_alloc: u32,
    fwd_cnt: u32,
}

impl Hdr {
    fn encode(&self) -> [u8; HDR] {
        let mut b = [0u8; HDR];
        b[0..8].copy_from_slice(&self.src_cid.to_le_bytes());
        b[8..16].copy_from_slice(&self.dst_cid.to_le_bytes());
        b[16..20].copy_from_slice(&self.src_port.to_le_bytes());
        b[20..24].copy_from_slice(&self.dst_port.to_le_bytes());
        b[24..28].copy_from_slice(&self.len.to_le_bytes());
        b[28..30].copy_from_slice(&self.ty.to_le_bytes());
        b[30..32].copy_from_slice(&self.op.to_le_bytes());
        b[32..36].copy_from_slice(&self.flags.to_le_bytes());
        b[36..40].copy_from_slice(&self.buf_alloc.to_le_bytes());
        b[40..44].copy_from_slice(&self.fwd_cnt.to_le_bytes());
        b
    }

    fn decode(b: &[u8]) -> Self {
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        let u16_at = |o: usize| u16::from_le_bytes(b[o..o + 2].try_into().unwrap());
        Self {
            src_cid: u64_at(0),
            dst_cid: u64_at(8),
            src_port: u32_at(16),
            dst_port: u32_at(20),
            len: u32_at(24),
            ty: u16_at(28),
            op: u16_at(30),
            flags: u32_at(32),
            buf_alloc: u32_at(36),
            fwd_cnt: u32_at(40),
        }
    }
}

#[derive(Debug)]
struct Pkt {
    hdr: Hdr,
    data: Vec<u8>,
}

// ---- a split virtqueue in our own memory ----

const QSIZE: u16 = 64;
const SLOT: usize = 64 * 1024 + 4096;

struct Vq {
    /// Page with desc (offset 0), avail (1024) and used (2048).
    ring: *mut u8,
    /// QSIZE buffers of SLOT bytes.
    bufs: *mut u8,
    avail_idx: u16,
    last_used: u16,
    kick: OwnedFd,
    _call: OwnedFd,
}

impl Vq {
    fn desc(&self, i: u16) -> *mut u8 {
        // SAFETY: i < QSIZE and the descriptor table (16 * QSIZE = 1024 bytes) is at the
        // start of the ring page.
        unsafe { self.ring.add(16 * usize::from(i)) }
    }
    fn avail(&self) -> *mut u8 {
        // SAFETY: the avail ring is at offset 1024 of the 4096-byte ring page.
        unsafe { self.ring.add(1024) }
    }
    fn used(&self) -> *mut u8 {
        // SAFETY: the used ring is at offset 2048 of the 4096-byte ring page.
        unsafe { self.ring.add(2048) }
    }
    fn buf(&self, i: u16) -> *mut u8 {
        // SAFETY: i < QSIZE and the buffer area holds QSIZE slots.
        unsafe { self.bufs.add(SLOT * usize::from(i)) }
    }

    /// Writes descriptor `i` (one buffer, `len` bytes, device-writable or not) and offers it.
    fn offer(&mut self, i: u16, len: u32, writable: bool) {
        let d = self.desc(i);
        // SAFETY: d points at descriptor i inside our mapping; the device only reads
        // descriptors that are in the avail ring, and i is not there until the index store
        // below, after the release fence.
        unsafe {
            std::ptr::write_volatile(d.cast::<u64>(), self.buf(i) as u64);
            std::ptr::write_volatile(d.add(8).cast::<u32>(), len);
            std::ptr::write_volatile(d.add(12).cast::<u16>(), if writable { 2 } else { 0 });
            std::ptr::write_volatile(d.add(14).cast::<u16>(), 0);
            let slot = self
                .avail()
                .add(4 + 2 * usize::from(self.avail_idx % QSIZE));
            std::ptr::write_volatile(slot.cast::<u16>(), i);
        }
        fence(Ordering::Release);
        self.avail_idx = self.avail_idx.wrapping_add(1);
        // SAFETY: avail.idx is at offset 2 of the avail ring, inside our mapping.
        unsafe { std::ptr::write_volatile(self.avail().add(2).cast::<u16>(), self.avail_idx) };
        fence(Ordering::SeqCst);
    }

    fn notify(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: kick is our eventfd; writing 8 bytes from a live array.
        unsafe { nix::libc::write(self.kick.as_raw_fd(), one.as_ptr().cast(), 8) };
    }

    /// The next used element, if the device has returned one: (descriptor id, bytes written).
    fn take_used(&mut self) -> Option<(u16, u32)> {
        // SAFETY: used.idx is at offset 2 of the used ring, inside our mapping; the device
        // writes it concurrently, hence the volatile read.
        let idx = unsafe { std::ptr::read_volatile(self.used().add(2).cast::<u16>()) };
        if idx == self.last_used {
            return None;
        }
        fence(Ordering::Acquire);
        let e = usize::from(self.last_used % QSIZE);
        // SAFETY: used.ring[e] (8 bytes: id u32, len u32) lies inside the used ring page.
        let (id, len) = unsafe {
            let p = self.used().add(4 + 8 * e);
            (
                std::ptr::read_volatile(p.cast::<u32>()),
                std::ptr::read_volatile(p.add(4).cast::<u32>()),
            )
        };
        self.last_used = self.last_used.wrapping_add(1);
        Some((id as u16, len))
    }
}

fn eventfd() -> OwnedFd {
    // SAFETY: eventfd(2) takes no pointers; a non-negative result is a new fd we own.
    let fd = unsafe { nix::libc::eventfd(0, nix::libc::EFD_CLOEXEC | nix::libc::EFD_NONBLOCK) };
    assert!(fd >= 0, "eventfd: {}", io::Error::last_os_error());
    // SAFETY: fd was just created and nothing else owns it.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// With NSFAST_TRACE_VHOST=1, one line per packet on stderr.
fn trace(cid: u64, dir: &str, h: &Hdr) {
    if std::env::var_os("NSFAST_TRACE_VHOST").is_some() {
        eprintln!(
            "fake {cid} {dir}: op {} {}:{} -> {}:{} len {} flags {} buf_alloc {} fwd_cnt {}",
            h.op,
            h.src_cid,
            h.src_port,
            h.dst_cid,
            h.dst_port,
            h.len,
            h.flags,
            h.buf_alloc,
            h.fwd_cnt
        );
    }
}

/// One fake guest: a vhost-vsock device instance with guest CID `cid`.
struct FakeGuest {
    cid: u64,
    _dev: OwnedFd,
    mem: *mut u8,
    mem_len: usize,
    rx: Vq,
    tx: Vq,
    tx_free: Vec<u16>,
    inbox: VecDeque<Pkt>,
    /// Every REQUEST this guest was sent (port), accepted or not.
    requests: Vec<u32>,
}

// SAFETY: the raw pointers point into this guest's own mapping, used by one thread at a time.
unsafe impl Send for FakeGuest {}

impl Drop for FakeGuest {
    fn drop(&mut self) {
        // Closing the device (after the fields drop) stops vhost; unmap after that is not
        // possible from here, so stop it first.
        // SAFETY: _dev is our vhost fd; SET_RUNNING takes a pointer to a live int.
        unsafe {
            let _ = vhost_vsock_set_running(self._dev.as_raw_fd(), &0);
        }
        // SAFETY: mem/mem_len are the mapping made in new(); vhost no longer runs.
        unsafe { nix::libc::munmap(self.mem.cast(), self.mem_len) };
    }
}

impl FakeGuest {
    fn new(cid: u64) -> Self {
        let dev = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/vhost-vsock")
            .expect("open /dev/vhost-vsock");
        let dev = OwnedFd::from(dev);
        let fd = dev.as_raw_fd();
        let mem_len = 2 * 4096 + 2 * usize::from(QSIZE) * SLOT;
        // SAFETY: anonymous private mapping, no fd; checked below.
        let mem = unsafe {
            nix::libc::mmap(
                std::ptr::null_mut(),
                mem_len,
                nix::libc::PROT_READ | nix::libc::PROT_WRITE,
                nix::libc::MAP_PRIVATE | nix::libc::MAP_ANONYMOUS | nix::libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        assert_ne!(mem, nix::libc::MAP_FAILED, "mmap");
        let mem = mem.cast::<u8>();
        let mut features = 0u64;
        // SAFETY: each ioctl gets our vhost fd and a pointer to a live value of the type the
        // request encodes; the memory table maps exactly our mapping (guest addresses are our
        // own addresses).
        unsafe {
            vhost_set_owner(fd).expect("VHOST_SET_OWNER");
            vhost_get_features(fd, &mut features).expect("VHOST_GET_FEATURES");
            let want = features & VIRTIO_F_VERSION_1;
            vhost_set_features(fd, &want).expect("VHOST_SET_FEATURES");
            let table = VhostMemory {
                nregions: 1,
                padding: 0,
                region: VhostMemoryRegion {
                    guest_phys_addr: mem as u64,
                    memory_size: mem_len as u64,
                    userspace_addr: mem as u64,
                    flags_padding: 0,
                },
            };
            vhost_set_mem_table(fd, &table).expect("VHOST_SET_MEM_TABLE");
        }
        let mk = |q: usize| -> Vq {
            // SAFETY: ring page q and buffer area q lie inside the mapping.
            let (ring, bufs) = unsafe {
                (
                    mem.add(4096 * q),
                    mem.add(2 * 4096 + q * usize::from(QSIZE) * SLOT),
                )
            };
            let kick = eventfd();
            let call = eventfd();
            // SAFETY: as above; the addresses are inside the registered memory region.
            unsafe {
                let st = VringState {
                    index: q as u32,
                    num: u32::from(QSIZE),
                };
                vhost_set_vring_num(fd, &st).expect("VHOST_SET_VRING_NUM");
                let base = VringState {
                    index: q as u32,
                    num: 0,
                };
                vhost_set_vring_base(fd, &base).expect("VHOST_SET_VRING_BASE");
                let addr = VringAddr {
                    index: q as u32,
                    flags: 0,
                    desc_user_addr: ring as u64,
                    used_user_addr: ring.add(2048) as u64,
                    avail_user_addr: ring.add(1024) as u64,
                    log_guest_addr: 0,
                };
                vhost_set_vring_addr(fd, &addr).expect("VHOST_SET_VRING_ADDR");
                let k = VringFile {
                    index: q as u32,
                    fd: kick.as_raw_fd(),
                };
                vhost_set_vring_kick(fd, &k).expect("VHOST_SET_VRING_KICK");
                let c = VringFile {
                    index: q as u32,
                    fd: call.as_raw_fd(),
                };
                vhost_set_vring_call(fd, &c).expect("VHOST_SET_VRING_CALL");
            }
            Vq {
                ring,
                bufs,
                avail_idx: 0,
                last_used: 0,
                kick,
                _call: call,
            }
        };
        let mut rx = mk(0);
        let tx = mk(1);
        // SAFETY: as above.
        unsafe {
            vhost_vsock_set_guest_cid(fd, &cid).expect("VHOST_VSOCK_SET_GUEST_CID");
        }
        for i in 0..QSIZE {
            rx.offer(i, SLOT as u32, true);
        }
        rx.notify();
        // SAFETY: as above.
        unsafe {
            vhost_vsock_set_running(fd, &1).expect("VHOST_VSOCK_SET_RUNNING");
        }
        Self {
            cid,
            _dev: dev,
            mem,
            mem_len,
            rx,
            tx,
            tx_free: (0..QSIZE).collect(),
            inbox: VecDeque::new(),
            requests: Vec::new(),
        }
    }

    fn reclaim_tx(&mut self) {
        while let Some((id, _)) = self.tx.take_used() {
            self.tx_free.push(id);
        }
    }

    fn send(&mut self, mut h: Hdr, data: &[u8]) {
        assert!(HDR + data.len() <= SLOT);
        h.src_cid = self.cid;
        h.len = data.len() as u32;
        h.ty = TYPE_STREAM;
        let deadline = Instant::now() + Duration::from_secs(30);
        let id = loop {
            self.reclaim_tx();
            if let Some(id) = self.tx_free.pop() {
                break id;
            }
            assert!(Instant::now() < deadline, "TX queue never drained");
            std::thread::sleep(Duration::from_micros(200));
        };
        let b = self.tx.buf(id);
        // SAFETY: slot `id` is free (returned by the device or never offered) and SLOT bytes
        // long; header + data fit (asserted above).
        unsafe {
            std::ptr::copy_nonoverlapping(h.encode().as_ptr(), b, HDR);
            std::ptr::copy_nonoverlapping(data.as_ptr(), b.add(HDR), data.len());
        }
        self.tx.offer(id, (HDR + data.len()) as u32, false);
        self.tx.notify();
        trace(self.cid, "tx", &h);
    }

    /// Moves everything the device has delivered into the inbox; re-offers the buffers.
    fn pump(&mut self) {
        let mut any = false;
        while let Some((id, len)) = self.rx.take_used() {
            let b = self.rx.buf(id);
            let len = (len as usize).min(SLOT);
            let mut raw = vec![0u8; len];
            // SAFETY: the device wrote `len` bytes into slot `id` and gave it back.
            unsafe { std::ptr::copy_nonoverlapping(b, raw.as_mut_ptr(), len) };
            self.rx.offer(id, SLOT as u32, true);
            any = true;
            if len < HDR {
                continue;
            }
            let hdr = Hdr::decode(&raw);
            trace(self.cid, "rx", &hdr);
            let n = (hdr.len as usize).min(len - HDR);
            self.inbox.push_back(Pkt {
                hdr,
                data: raw[HDR..HDR + n].to_vec(),
            });
        }
        if any {
            self.rx.notify();
        }
    }

    /// The next packet for this guest, within `timeout`.
    fn recv(&mut self, timeout: Duration) -> Option<Pkt> {
        let deadline = Instant::now() + timeout;
        loop {
            self.pump();
            if let Some(p) = self.inbox.pop_front() {
                if p.hdr.op == OP_REQUEST {
                    self.requests.push(p.hdr.dst_port);
                }
                return Some(p);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

/// One stream connection of a fake guest.
struct Stream {
    local_port: u32,
    peer_cid: u64,
    peer_port: u32,
    peer_buf_alloc: u32,
    peer_fwd_cnt: u32,
    tx_cnt: u32,
    fwd_cnt: u32,
    /// fwd_cnt in the last CREDIT_UPDATE sent.
    fwd_sent: u32,
    peer_done_sending: bool,
    reset: bool,
    received: Vec<u8>,
}

impl Stream {
    fn hdr(&self, op: u16, flags: u32) -> Hdr {
        Hdr {
            dst_cid: self.peer_cid,
            src_port: self.local_port,
            dst_port: self.peer_port,
            op,
            flags,
            buf_alloc: BUF_ALLOC,
            fwd_cnt: self.fwd_cnt,
            ..Hdr::default()
        }
    }

    fn mine(&self, p: &Pkt) -> bool {
        p.hdr.src_cid == self.peer_cid
            && p.hdr.src_port == self.peer_port
            && p.hdr.dst_port == self.local_port
    }

    /// Handles one packet of this connection.
    fn absorb(&mut self, g: &mut FakeGuest, p: Pkt) {
        if !self.mine(&p) {
            // Another connection's packet (or a stray REQUEST): reset it, as a guest with no
            // such socket would.
            if p.hdr.op != OP_RST {
                let h = Hdr {
                    dst_cid: p.hdr.src_cid,
                    src_port: p.hdr.dst_port,
                    dst_port: p.hdr.src_port,
                    op: OP_RST,
                    ..Hdr::default()
                };
                g.send(h, &[]);
            }
            return;
        }
        self.peer_buf_alloc = p.hdr.buf_alloc;
        self.peer_fwd_cnt = p.hdr.fwd_cnt;
        match p.hdr.op {
            OP_RW => {
                self.fwd_cnt = self.fwd_cnt.wrapping_add(p.data.len() as u32);
                self.received.extend_from_slice(&p.data);
                // As a guest kernel does when it consumes data: tell the sender. The host does
                // not send beyond its own buffer size in flight (256 KiB) without an update,
                // whatever buf_alloc we announced.
                if self.fwd_cnt.wrapping_sub(self.fwd_sent) >= 64 * 1024 {
                    self.fwd_sent = self.fwd_cnt;
                    g.send(self.hdr(OP_CREDIT_UPDATE, 0), &[]);
                }
            }
            OP_CREDIT_REQUEST => g.send(self.hdr(OP_CREDIT_UPDATE, 0), &[]),
            OP_SHUTDOWN if p.hdr.flags & SHUT_SEND != 0 => self.peer_done_sending = true,
            OP_RST => {
                self.reset = true;
                self.peer_done_sending = true;
            }
            _ => {}
        }
    }

    fn step(&mut self, g: &mut FakeGuest, timeout: Duration) -> bool {
        match g.recv(timeout) {
            Some(p) => {
                self.absorb(g, p);
                true
            }
            None => false,
        }
    }

    fn write_all(&mut self, g: &mut FakeGuest, data: &[u8]) {
        for c in data.chunks(4096) {
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                let in_flight = self.tx_cnt.wrapping_sub(self.peer_fwd_cnt);
                if self.peer_buf_alloc.saturating_sub(in_flight) as usize >= c.len() {
                    break;
                }
                assert!(!self.reset, "connection reset while writing");
                assert!(
                    Instant::now() < deadline,
                    "no credit from the host for 60 s"
                );
                if !self.step(g, Duration::from_millis(100)) {
                    g.send(self.hdr(OP_CREDIT_REQUEST, 0), &[]);
                }
            }
            g.send(self.hdr(OP_RW, 0), c);
            self.tx_cnt = self.tx_cnt.wrapping_add(c.len() as u32);
            // Take what arrived meanwhile (credit updates, data) without waiting.
            while let Some(p) = {
                g.pump();
                g.inbox.pop_front()
            } {
                self.absorb(g, p);
            }
        }
    }

    fn shutdown_send(&mut self, g: &mut FakeGuest) {
        g.send(self.hdr(OP_SHUTDOWN, SHUT_SEND), &[]);
    }

    /// Reads until the peer stops sending (SHUTDOWN with SEND, or RST).
    fn read_to_end(&mut self, g: &mut FakeGuest) -> Vec<u8> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.peer_done_sending {
            assert!(Instant::now() < deadline, "no end of stream within 30 s");
            self.step(g, Duration::from_millis(100));
        }
        std::mem::take(&mut self.received)
    }

    fn close(mut self, g: &mut FakeGuest) {
        g.send(self.hdr(OP_SHUTDOWN, SHUT_SEND | SHUT_RCV), &[]);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.reset && Instant::now() < deadline {
            self.step(g, Duration::from_millis(100));
        }
    }
}

/// Connects from fake guest `g` to `dst_cid:port`: Ok(stream) on RESPONSE, Err on RST.
fn connect(
    g: &mut FakeGuest,
    local_port: u32,
    dst_cid: u64,
    port: u32,
    timeout: Duration,
) -> Result<Stream, String> {
    let mut s = Stream {
        local_port,
        peer_cid: dst_cid,
        peer_port: port,
        peer_buf_alloc: 0,
        peer_fwd_cnt: 0,
        tx_cnt: 0,
        fwd_cnt: 0,
        fwd_sent: 0,
        peer_done_sending: false,
        reset: false,
        received: Vec::new(),
    };
    g.send(s.hdr(OP_REQUEST, 0), &[]);
    let deadline = Instant::now() + timeout;
    loop {
        let Some(p) = g.recv(Duration::from_millis(200)) else {
            if Instant::now() > deadline {
                return Err("no answer to REQUEST".into());
            }
            continue;
        };
        if !s.mine(&p) {
            s.absorb(g, p);
            continue;
        }
        match p.hdr.op {
            OP_RESPONSE => {
                s.peer_buf_alloc = p.hdr.buf_alloc;
                s.peer_fwd_cnt = p.hdr.fwd_cnt;
                return Ok(s);
            }
            OP_RST => return Err("RST".into()),
            op => return Err(format!("op {op} instead of RESPONSE")),
        }
    }
}

/// Waits for a REQUEST to `port` on fake guest `g` and accepts it.
fn accept(g: &mut FakeGuest, port: u32, timeout: Duration) -> Option<Stream> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        let Some(p) = g.recv(Duration::from_millis(200)) else {
            continue;
        };
        if p.hdr.op == OP_REQUEST && p.hdr.dst_port == port {
            let s = Stream {
                local_port: port,
                peer_cid: p.hdr.src_cid,
                peer_port: p.hdr.src_port,
                peer_buf_alloc: p.hdr.buf_alloc,
                peer_fwd_cnt: p.hdr.fwd_cnt,
                tx_cnt: 0,
                fwd_cnt: 0,
                fwd_sent: 0,
                peer_done_sending: false,
                reset: false,
                received: Vec::new(),
            };
            g.send(s.hdr(OP_RESPONSE, 0), &[]);
            return Some(s);
        }
    }
    None
}

/// A bridge with `--json` events on a channel.
struct Bridge {
    _child: KillOnDrop,
    events: std::sync::mpsc::Receiver<serde_json::Value>,
}

impl Bridge {
    fn start(args: &[&str]) -> Self {
        let mut child = KillOnDrop::new(
            Command::new(nsfast_bin())
                .args(["vsock", "bridge", "--json"])
                .args(args)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("spawn nsfast vsock bridge"),
        );
        let out = child.child_mut().stdout.take().unwrap();
        let (tx, events) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) {
                    if tx.send(v).is_err() {
                        break;
                    }
                }
            }
        });
        let b = Self {
            _child: child,
            events,
        };
        assert_eq!(b.wait("listening")["event"], "listening");
        b
    }

    fn wait(&self, kind: &str) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let e = self
                .events
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no {kind} event from the bridge within 60 s"));
            // "" takes whatever comes next.
            if kind.is_empty() || e["event"] == kind {
                return e;
            }
        }
    }
}

fn payload(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(13) ^ seed).collect()
}

/// One exchange through the bridge from `a` (dialling `dialled`) to `b`: `a` sends, half-closes;
/// `b` reads to the end, answers, half-closes; `a` reads the answer to the end.
fn exchange(
    a: &mut FakeGuest,
    b: &mut FakeGuest,
    local_port: u32,
    dialled: u64,
    port: u32,
    n: usize,
) {
    let req = payload(n, a.cid as u8);
    let mut sa = connect(a, local_port, dialled, port, Duration::from_secs(30))
        .expect("connect through the bridge");
    std::thread::scope(|s| {
        let srv = s.spawn(|| {
            let mut sb =
                accept(b, port, Duration::from_secs(30)).expect("the bridge never dialled B");
            // The bridge dials from the host.
            assert_eq!(sb.peer_cid, 2, "B's peer");
            let got = sb.read_to_end(b);
            let answer = payload(got.len() + 7, b.cid as u8);
            sb.write_all(b, &answer);
            sb.shutdown_send(b);
            let _ = sb.read_to_end(b);
            (got, answer)
        });
        sa.write_all(a, &req);
        // Half-close: B sees the end of the request and only then answers on this connection.
        sa.shutdown_send(a);
        let back = sa.read_to_end(a);
        let (got, answer) = srv.join().unwrap();
        assert!(
            got == req,
            "B got {} bytes, not the {} sent",
            got.len(),
            req.len()
        );
        assert!(
            back == answer,
            "A got {} bytes back, not the {} answered",
            back.len(),
            answer.len()
        );
        assert!(
            !sa.reset,
            "A's connection was reset before the end of the answer"
        );
    });
    sa.close(a);
}

#[test]
#[ignore = "runs inside the VM harness guests (drives /dev/vhost-vsock)"]
fn bridge_vsock_members_through_real_vhost_vsock() {
    require_guest();
    let bridge = Bridge::start(&[
        "--group", "3,4", "--group", "5,6,7", "--group", "8", "--ports", "5000",
    ]);
    let mut g3 = FakeGuest::new(3);
    let mut g4 = FakeGuest::new(4);
    let mut g5 = FakeGuest::new(5);
    let mut g6 = FakeGuest::new(6);
    let mut g8 = FakeGuest::new(8);
    let mut g9 = FakeGuest::new(9);

    // 3 dials the host (CID 2): the bridge takes it to 4, the only other member of its group.
    // Bytes both ways, with half-close in between, through the real vhost-vsock.
    exchange(&mut g3, &mut g4, 40001, 2, 5000, 300 * 1024);
    let open = bridge.wait("open");
    assert_eq!(
        (&open["src"], &open["dst"], &open["dialled"]),
        (&3.into(), &4.into(), &2.into())
    );
    let close = bridge.wait("close");
    assert_eq!(close["bytes_src_to_dst"], 300 * 1024);
    assert_eq!(close["bytes_dst_to_src"], 300 * 1024 + 7);
    assert!(close["error"].is_null(), "{close}");

    // And back: 4 dials the host and reaches 3.
    exchange(&mut g4, &mut g3, 40002, 2, 5000, 64 * 1024);
    let open = bridge.wait("open");
    assert_eq!((&open["src"], &open["dst"]), (&4.into(), &3.into()));
    bridge.wait("close");

    // What VMADDR_FLAG_TO_HOST puts on the wire (dst_cid = the sibling) never reaches a host
    // socket through vhost-vsock: since Linux 5.5 ("vhost/vsock: accept only packets with the
    // right dst_cid") vhost drops guest packets not addressed to CID 2, silently (no RST).
    // So on a vhost-vsock host the bridge only ever sees host dials.
    let r = connect(&mut g4, 40003, 3, 5000, Duration::from_secs(5));
    assert_eq!(r.err().as_deref(), Some("no answer to REQUEST"));
    assert!(
        bridge.events.try_recv().is_err(),
        "the bridge saw the sibling-addressed dial"
    );

    // Denials, each closed without a byte: a host dial in a group of three (ambiguous), from
    // a group of one, and from a VM in no group.
    for (g, port, why) in [
        (&mut g5, 40004u32, "VMADDR_FLAG_TO_HOST"),
        (&mut g8, 40005, "no group of 8 has another member"),
        (&mut g9, 40006, "9 is in no group"),
    ] {
        let r = connect(g, port, 2, 5000, Duration::from_secs(30));
        // Strictly the next event: nothing else happened in between.
        let deny = bridge.wait("");
        assert_eq!(deny["event"], "deny", "{deny}");
        assert_eq!((&deny["src"], &deny["dialled"]), (&g.cid.into(), &2.into()));
        assert!(deny["reason"].as_str().unwrap().contains(why), "{deny}");
        if let Ok(mut s) = r {
            assert!(
                s.read_to_end(g).is_empty(),
                "a denied connection carried bytes"
            );
        }
    }
    for g in [&mut g3, &mut g4, &mut g6] {
        while g.recv(Duration::from_millis(300)).is_some() {}
    }
    assert_eq!(
        g4.requests,
        vec![5000],
        "4 was dialled for 3's connection only"
    );
    assert_eq!(
        g3.requests,
        vec![5000],
        "3 was dialled for 4's connection only"
    );
    assert!(g6.requests.is_empty(), "6 was dialled");
}

/// `--path kernel`: guest 3's leg and guest 4's leg (both AF_VSOCK, vhost transport) joined by
/// the sockmap redirect (crates/vsock/src/kernel.rs), both ways with half-close, byte-exact;
/// the close event says `kernel`. Linux 6.4+ (vhost's read_skb); older kernels: the join is
/// refused and the connection closed, with the reason in the event.
#[test]
#[ignore = "runs inside the VM harness guests (drives /dev/vhost-vsock)"]
fn bridge_vsock_members_joined_in_the_kernel_through_real_vhost_vsock() {
    require_guest();
    let joins = nsfast_sys::kernel::KernelVersion::current().at_least(6, 4);
    let bridge = Bridge::start(&["--path", "kernel", "--group", "3,4", "--ports", "5000"]);
    let mut g3 = FakeGuest::new(3);
    let mut g4 = FakeGuest::new(4);
    if !joins {
        let sa = connect(&mut g3, 40011, 2, 5000, Duration::from_secs(30))
            .expect("connect through the bridge");
        let mut sb =
            accept(&mut g4, 5000, Duration::from_secs(30)).expect("the bridge never dialled 4");
        let close = bridge.wait("close");
        assert!(
            close["error"].as_str().unwrap_or("").contains("sockmap"),
            "{close}"
        );
        assert!(
            sb.read_to_end(&mut g4).is_empty(),
            "bytes on a refused join"
        );
        drop(sa);
        return;
    }
    for (i, n) in [300 * 1024usize, 1 << 20].into_iter().enumerate() {
        exchange(&mut g3, &mut g4, 40011 + i as u32, 2, 5000, n);
        let open = bridge.wait("open");
        assert_eq!((&open["src"], &open["dst"]), (&3.into(), &4.into()));
        let close = bridge.wait("close");
        assert_eq!(close["path"], "kernel", "{close}");
        assert_eq!(close["bytes_src_to_dst"], n as u64, "{close}");
        assert_eq!(close["bytes_dst_to_src"], n as u64 + 7, "{close}");
        assert!(close["error"].is_null(), "{close}");
    }
}
