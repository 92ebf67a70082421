//! Output to stdout that never panics: a closed stdout (a reader such as `head -c1` that went
//! away) is an `io::Error` with [`ErrorKind::BrokenPipe`](std::io::ErrorKind::BrokenPipe), which
//! the binaries' `main` turns into a quiet exit (ripgrep's rule), instead of `println!`'s panic.
//!
//! - [`outln!`](crate::outln) / [`out!`](crate::out): `println!` / `print!` that return
//!   `io::Result<()>`; use them with `?`.
//! - [`is_broken_pipe`]: whether an error (or any error in its source chain) is a closed pipe.
//! - [`errln`]: a last error line to stderr that ignores a closed stderr.

use std::error::Error;
use std::io::{ErrorKind, Write};

/// `println!` to stdout that returns `io::Result<()>` instead of panicking on a closed stdout.
#[macro_export]
macro_rules! outln {
    ($($arg:tt)*) => {{
        use ::std::io::Write as _;
        writeln!(::std::io::stdout().lock(), $($arg)*)
    }};
}

/// `print!` to stdout that returns `io::Result<()>` instead of panicking on a closed stdout.
/// Flushes, so partial lines reach a pipe at once.
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {{
        use ::std::io::Write as _;
        let mut o = ::std::io::stdout().lock();
        write!(o, $($arg)*).and_then(|()| o.flush())
    }};
}

/// Whether `e`, or any error in its `source()` chain, is an I/O error of kind `BrokenPipe`.
pub fn is_broken_pipe(e: &(dyn Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(c) = cur {
        if c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == ErrorKind::BrokenPipe)
        {
            return true;
        }
        cur = c.source();
    }
    false
}

/// Writes one line to stderr, ignoring errors (a closed stderr is not worth a panic).
pub fn errln(line: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Wrap(std::io::Error);
    impl std::fmt::Display for Wrap {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("wrapped")
        }
    }
    impl Error for Wrap {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn broken_pipe_is_found_in_the_source_chain() {
        let bp = Wrap(std::io::Error::from(ErrorKind::BrokenPipe));
        assert!(is_broken_pipe(&bp));
        let other = Wrap(std::io::Error::from(ErrorKind::NotFound));
        assert!(!is_broken_pipe(&other));
    }
}
