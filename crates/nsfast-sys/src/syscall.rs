//! Raw libc calls as `io::Result`.

use std::io;

/// A libc call's result as `io::Result`: a negative return means failure with the reason in
/// `errno`; anything else is the call's value. Reads only `errno` and allocates nothing, so it
/// is async-signal-safe and usable in `pre_exec` closures.
pub fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negative_is_the_errno_and_the_rest_passes_through() {
        assert_eq!(cvt(0).unwrap(), 0);
        assert_eq!(cvt(7).unwrap(), 7);
        // SAFETY: close(2) on -1 takes no pointers; it fails with EBADF and sets errno.
        let e = cvt(unsafe { libc::close(-1) }).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EBADF));
    }
}
