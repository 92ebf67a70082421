//! The control-message iterator (`cmsg::Iter`) and, over it, the reader behind
//! `RecvBatch::recv` (recvmmsg): UDP_GRO segment sizes, IP_ORIGDSTADDR and SO_MARK. The bytes
//! are copied into an 8-byte-aligned buffer, as the real one is.
#![no_main]
use libfuzzer_sys::fuzz_target;
use nsfast_sys::cmsg;
use nsfast_sys::udp::parse_cmsgs;

fuzz_target!(|data: &[u8]| {
    let mut buf = vec![0u64; data.len().div_ceil(8)];
    // SAFETY: `buf` has at least data.len() bytes, u64 has no padding and any bytes are a
    // valid u64; the two buffers do not overlap.
    let ctrl: &[u8] = unsafe {
        std::ptr::copy_nonoverlapping(data.as_ptr(), buf.as_mut_ptr().cast::<u8>(), data.len());
        std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), data.len())
    };
    // Every payload lies inside the buffer, after its header, and the messages do not overlap.
    let range = ctrl.as_ptr_range();
    let mut end = range.start;
    for c in cmsg::Iter::new(ctrl) {
        let d = c.data.as_ptr_range();
        assert!(
            d.start > end && d.end <= range.end,
            "payload outside the buffer"
        );
        end = d.end;
    }
    let info = parse_cmsgs(ctrl);
    if let Some(s) = info.gro_stride {
        assert!(s > 0 && s <= i32::MAX as usize, "stride {s}");
    }
});
