//! Control messages (cmsg(3)) over plain byte buffers: an [`Encoder`] that appends typed
//! messages to a control buffer for `sendmsg`/`sendmmsg`, and an [`Iter`] over a control buffer
//! as `recvmsg`/`recvmmsg` filled it, yielding one [`Cmsg`] per message whose payload decodes to
//! a typed value.
//!
//! The layout is the kernel's (`CMSG_ALIGN`, `CMSG_LEN`, `CMSG_SPACE`): a `cmsghdr`, padded to
//! a multiple of `size_t`, then the payload, padded likewise before the next header. The walk
//! checks every header and payload against the buffer itself instead of trusting `cmsg_len`
//! (`CMSG_FIRSTHDR` does not check the first header's length), so a control buffer with any
//! content is read only inside its bounds (fuzz target `udp_cmsg`).

use std::mem::size_of;

/// `CMSG_ALIGN`: headers and payloads start at multiples of `size_t`. `None` on overflow.
fn align(n: usize) -> Option<usize> {
    n.checked_next_multiple_of(size_of::<usize>())
}

/// `CMSG_LEN(0)`: where a message's payload starts, counted from its header.
const DATA_OFFSET: usize = size_of::<libc::cmsghdr>().next_multiple_of(size_of::<usize>());

/// `CMSG_SPACE(size)`: the bytes one message with a `size`-byte payload takes in the buffer.
pub const fn space(size: usize) -> usize {
    DATA_OFFSET + size.next_multiple_of(size_of::<usize>())
}

/// Payload types that are plain data: every byte pattern of their size is a valid value and
/// they hold no pointers or padding that must not be read.
///
/// # Safety
/// Implement only for `Copy` C types for which any `size_of::<Self>()` bytes are a valid
/// value (integers and C structs made of them).
pub unsafe trait Plain: Copy {}

// SAFETY: integers: every bit pattern is a value.
unsafe impl Plain for u8 {}
// SAFETY: as above.
unsafe impl Plain for u16 {}
// SAFETY: as above.
unsafe impl Plain for u32 {}
// SAFETY: as above.
unsafe impl Plain for i32 {}
// SAFETY: a C struct of integer fields (family, port, address, zero padding bytes).
unsafe impl Plain for libc::sockaddr_in {}
// SAFETY: a C struct of integer fields (linux/errqueue.h).
unsafe impl Plain for libc::sock_extended_err {}

/// A control buffer aligned for `cmsghdr`, of `N` bytes.
#[derive(Clone, Copy)]
#[repr(C, align(8))]
pub struct Buf<const N: usize>(pub [u8; N]);

const _: () = assert!(std::mem::align_of::<libc::cmsghdr>() <= 8);

impl<const N: usize> Buf<N> {
    pub const fn new() -> Self {
        Self([0; N])
    }
}

impl<const N: usize> Default for Buf<N> {
    fn default() -> Self {
        Self::new()
    }
}

/// The message does not fit in what is left of the encoder's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full;

impl std::fmt::Display for Full {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("control message buffer full")
    }
}

impl std::error::Error for Full {}

/// Appends control messages to a buffer; [`Encoder::len`] is the `msg_controllen` to pass.
pub struct Encoder<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl<'a> Encoder<'a> {
    /// An encoder writing from the start of `buf` (which should be a [`Buf`] or otherwise
    /// aligned for `cmsghdr` when the kernel is to read it).
    pub fn new(buf: &'a mut [u8]) -> Self {
        Self { buf, len: 0 }
    }

    /// Appends one message of `level`/`ty` carrying `value`, padded to the next header's
    /// start. When it does not fit, nothing is written and the encoder is unchanged.
    pub fn push<T: Plain>(
        &mut self,
        level: libc::c_int,
        ty: libc::c_int,
        value: &T,
    ) -> Result<(), Full> {
        let need = space(size_of::<T>());
        let room = self.buf.len() - self.len;
        if need > room {
            return Err(Full);
        }
        let msg = &mut self.buf[self.len..self.len + need];
        msg.fill(0);
        // SAFETY: cmsghdr is a plain C struct of integers; all-zero is a valid value.
        let mut hdr: libc::cmsghdr = unsafe { std::mem::zeroed() };
        hdr.cmsg_len = (DATA_OFFSET + size_of::<T>()) as _;
        hdr.cmsg_level = level;
        hdr.cmsg_type = ty;
        // SAFETY: `msg` is `need` bytes long, at least DATA_OFFSET ≥ size_of::<cmsghdr>() for
        // the header plus size_of::<T>() for the payload at DATA_OFFSET; both writes are
        // unaligned writes of plain data inside it.
        unsafe {
            std::ptr::write_unaligned(msg.as_mut_ptr().cast::<libc::cmsghdr>(), hdr);
            std::ptr::write_unaligned(msg[DATA_OFFSET..].as_mut_ptr().cast::<T>(), *value);
        }
        self.len += need;
        Ok(())
    }

    /// Bytes written so far: the sum of the messages' `CMSG_SPACE`, for `msg_controllen`.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// One control message of a received buffer: its level, type and payload bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cmsg<'a> {
    pub level: libc::c_int,
    pub ty: libc::c_int,
    /// The payload: `cmsg_len` minus the header, all inside the buffer.
    pub data: &'a [u8],
}

impl Cmsg<'_> {
    /// The payload as a `T`, when it holds at least `size_of::<T>()` bytes (more are ignored,
    /// as with `sock_extended_err` followed by the offender's address).
    pub fn decode<T: Plain>(&self) -> Option<T> {
        if self.data.len() < size_of::<T>() {
            return None;
        }
        // SAFETY: `data` holds at least size_of::<T>() bytes (checked above) and T is Plain,
        // so any bytes are a valid T; the read is unaligned.
        Some(unsafe { std::ptr::read_unaligned(self.data.as_ptr().cast::<T>()) })
    }
}

/// Walks a control buffer (`msg_control`, the first `msg_controllen` bytes). A header whose
/// `cmsg_len` is shorter than the header or runs past the end stops the walk.
#[derive(Debug, Clone)]
pub struct Iter<'a> {
    rest: &'a [u8],
}

impl<'a> Iter<'a> {
    pub fn new(ctrl: &'a [u8]) -> Self {
        Self { rest: ctrl }
    }
}

impl<'a> Iterator for Iter<'a> {
    type Item = Cmsg<'a>;

    fn next(&mut self) -> Option<Cmsg<'a>> {
        if self.rest.len() < DATA_OFFSET {
            self.rest = &[];
            return None;
        }
        // SAFETY: `rest` holds at least DATA_OFFSET ≥ size_of::<cmsghdr>() bytes; cmsghdr is
        // plain data, read unaligned.
        let c: libc::cmsghdr = unsafe { std::ptr::read_unaligned(self.rest.as_ptr().cast()) };
        #[allow(clippy::unnecessary_cast)] // size_t on glibc, socklen_t on musl
        let len = c.cmsg_len as usize;
        if len < DATA_OFFSET || len > self.rest.len() {
            self.rest = &[];
            return None;
        }
        let item = Cmsg {
            level: c.cmsg_level,
            ty: c.cmsg_type,
            data: &self.rest[DATA_OFFSET..len],
        };
        self.rest = align(len)
            .and_then(|next| self.rest.get(next..))
            .unwrap_or(&[]);
        Some(item)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRO: libc::c_int = 104;

    fn sin(a: [u8; 4], port: u16) -> libc::sockaddr_in {
        // SAFETY: sockaddr_in is plain data; all-zero is valid.
        let mut s: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        s.sin_family = libc::AF_INET as libc::sa_family_t;
        s.sin_port = port.to_be();
        s.sin_addr.s_addr = u32::from_ne_bytes(a);
        s
    }

    fn eq_sin(a: &libc::sockaddr_in, b: &libc::sockaddr_in) -> bool {
        (a.sin_family, a.sin_port, a.sin_addr.s_addr)
            == (b.sin_family, b.sin_port, b.sin_addr.s_addr)
    }

    #[test]
    fn layout_is_the_kernels() {
        for n in [0usize, 1, 2, 4, 8, 16, 17] {
            // SAFETY: CMSG_SPACE / CMSG_LEN are pure computations on their argument.
            let (s, l) = unsafe { (libc::CMSG_SPACE(n as u32), libc::CMSG_LEN(n as u32)) };
            assert_eq!(space(n), s as usize, "CMSG_SPACE({n})");
            assert_eq!(DATA_OFFSET + n, l as usize, "CMSG_LEN({n})");
        }
    }

    #[test]
    fn encoded_messages_iterate_back_typed() {
        let mut buf = Buf::<128>::new();
        let dst = sin([10, 201, 0, 2], 51820);
        let mut e = Encoder::new(&mut buf.0);
        assert!(e.is_empty());
        e.push(libc::SOL_UDP, 103, &1400u16).unwrap();
        e.push(libc::SOL_UDP, GRO, &1420i32).unwrap();
        e.push(libc::SOL_IP, libc::IP_ORIGDSTADDR, &dst).unwrap();
        let len = e.len();
        assert_eq!(
            len,
            space(2) + space(4) + space(size_of::<libc::sockaddr_in>())
        );
        let got: Vec<Cmsg<'_>> = Iter::new(&buf.0[..len]).collect();
        assert_eq!(got.len(), 3);
        assert_eq!(
            (got[0].level, got[0].ty, got[0].data.len()),
            (libc::SOL_UDP, 103, 2)
        );
        assert_eq!(got[0].decode::<u16>(), Some(1400));
        assert_eq!((got[1].level, got[1].ty), (libc::SOL_UDP, GRO));
        assert_eq!(got[1].decode::<i32>(), Some(1420));
        assert_eq!(
            (got[2].level, got[2].ty),
            (libc::SOL_IP, libc::IP_ORIGDSTADDR)
        );
        assert!(eq_sin(&got[2].decode::<libc::sockaddr_in>().unwrap(), &dst));
        // A payload shorter than the type asked for does not decode.
        assert_eq!(got[0].decode::<u32>(), None);
        assert!(got[1].decode::<libc::sockaddr_in>().is_none());
    }

    // The encoder's output is what the libc macros walk, message by message.
    #[test]
    fn libc_macros_walk_the_encoded_buffer() {
        let mut buf = Buf::<64>::new();
        let mut e = Encoder::new(&mut buf.0);
        e.push(libc::SOL_UDP, 103, &1000u16).unwrap();
        e.push(libc::SOL_UDP, GRO, &7i32).unwrap();
        let len = e.len();
        // SAFETY: msghdr is plain data; all-zero is valid.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_control = buf.0.as_mut_ptr().cast();
        msg.msg_controllen = len as _;
        let mut seen = Vec::new();
        // SAFETY: msg_control points at `buf`, msg_controllen bytes of which the encoder
        // wrote with consistent lengths; the macros stay inside them.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                seen.push(((*c).cmsg_level, (*c).cmsg_type, (*c).cmsg_len as usize));
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        assert_eq!(
            seen,
            vec![
                (libc::SOL_UDP, 103, DATA_OFFSET + 2),
                (libc::SOL_UDP, GRO, DATA_OFFSET + 4)
            ]
        );
    }

    #[test]
    fn encoder_refuses_what_does_not_fit_and_writes_nothing() {
        let mut buf = [0xAAu8; 40];
        let mut e = Encoder::new(&mut buf);
        e.push(libc::SOL_UDP, GRO, &1i32).unwrap();
        assert_eq!(e.len(), space(4));
        // space(16) = 32 > 40 - 24 left.
        assert_eq!(
            e.push(libc::SOL_IP, libc::IP_ORIGDSTADDR, &sin([1, 2, 3, 4], 5)),
            Err(Full)
        );
        assert_eq!(e.len(), space(4));
        assert!(buf[space(4)..].iter().all(|&b| b == 0xAA));
        let mut none = [0u8; DATA_OFFSET + 7];
        assert_eq!(
            Encoder::new(&mut none).push(libc::SOL_IP, 1, &0u8),
            Err(Full)
        );
        assert_eq!(Encoder::new(&mut []).push(libc::SOL_IP, 1, &0u8), Err(Full));
    }

    #[test]
    fn truncated_buffers_yield_only_whole_messages() {
        let mut buf = Buf::<128>::new();
        let mut e = Encoder::new(&mut buf.0);
        e.push(libc::SOL_UDP, GRO, &1000i32).unwrap();
        let first = e.len();
        e.push(libc::SOL_IP, libc::IP_ORIGDSTADDR, &sin([1, 2, 3, 4], 99))
            .unwrap();
        let len = e.len();
        assert_eq!(Iter::new(&buf.0[..len]).count(), 2);
        // Every cut inside the second message leaves the first alone.
        for cut in first..len {
            let got: Vec<_> = Iter::new(&buf.0[..cut]).collect();
            let last_whole = cut >= first + DATA_OFFSET + size_of::<libc::sockaddr_in>();
            assert_eq!(got.len(), 1 + last_whole as usize, "cut at {cut}");
            assert_eq!(got[0].decode::<i32>(), Some(1000));
        }
        // Every cut inside the first: nothing, and nothing read past the cut.
        for cut in 0..DATA_OFFSET + 4 {
            assert_eq!(Iter::new(&buf.0[..cut]).count(), 0, "cut at {cut}");
        }
        assert_eq!(Iter::new(&[]).next(), None);
    }

    #[test]
    fn lying_lengths_stop_the_walk() {
        let mut buf = Buf::<64>::new();
        let mut e = Encoder::new(&mut buf.0);
        e.push(libc::SOL_UDP, GRO, &1420i32).unwrap();
        let len = e.len();
        let set_len = |b: &mut Buf<64>, v: usize| {
            b.0[..size_of::<usize>()].copy_from_slice(&v.to_ne_bytes());
        };
        // cmsg_len below the header.
        let mut short = buf;
        set_len(&mut short, 4);
        assert_eq!(Iter::new(&short.0[..len]).count(), 0);
        // cmsg_len past the end of the buffer.
        let mut long = buf;
        set_len(&mut long, len + 1);
        assert_eq!(Iter::new(&long.0[..len]).count(), 0);
        let mut huge = buf;
        set_len(&mut huge, usize::MAX);
        assert_eq!(Iter::new(&huge.0).count(), 0);
        // An exact cmsg_len with no trailing padding is the last message.
        let exact = DATA_OFFSET + 4;
        let got: Vec<_> = Iter::new(&buf.0[..exact]).collect();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].data.len(), 4);
    }
}
