//! Error reports: an error and its causes on one line.

use std::error::Error;

/// `e` and every error in its `source()` chain, `a: b: c` (what anyhow's `{:#}` prints).
pub fn error_chain(e: &dyn Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("open the relay")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn chains_every_cause() {
        let e = Outer(std::io::Error::other("no such file"));
        assert_eq!(error_chain(&e), "open the relay: no such file");
        assert_eq!(error_chain(&std::io::Error::other("x")), "x");
    }
}
