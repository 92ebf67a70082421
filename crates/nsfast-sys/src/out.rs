//! Output to stdout that never panics: a closed stdout (a reader such as `head -c1` that went
//! away) is an `io::Error` with [`std::io::ErrorKind::BrokenPipe`], which
//! the binaries' `main` turns into a quiet exit (ripgrep's rule), instead of `println!`'s panic.
//!
//! - [`outln!`](crate::outln) / [`out!`](macro@crate::out): `println!` / `print!` that return
//!   `io::Result<()>`; use them with `?`.
//! - [`is_broken_pipe`]: whether an error (or any error in its source chain) is a closed pipe.
//! - [`errln`]: a last error line to stderr that ignores a closed stderr.
//! - [`Json`]: the machine-output contract (`-j`/`-p`): every JSON document printed or
//!   written carries `schema_version` ([`SCHEMA_VERSION`]); see docs/json.md.

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

/// Writes one error line to stderr, ignoring errors (a closed stderr is not worth a panic).
/// When stderr is the journal the line starts with `<3>` (sd-daemon(3)): journald files it at
/// priority error, as the log lines carry theirs (`crate::logging`).
pub fn errln(line: &str) {
    static JOURNAL: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let prefix = if *JOURNAL.get_or_init(crate::systemd::stderr_is_journal) {
        "<3>"
    } else {
        ""
    };
    let _ = writeln!(std::io::stderr().lock(), "{prefix}{line}");
}

/// The version of the JSON documents the tools print and write. It rises when a field
/// changes meaning or goes away; new fields may appear without a bump.
pub const SCHEMA_VERSION: u32 = 1;

/// `doc` as a JSON value with `schema_version` added: an object gets the key, anything else
/// (a list) is wrapped as `{"schema_version": 1, "items": doc}`.
pub fn document<T: serde::Serialize + ?Sized>(doc: &T) -> std::io::Result<serde_json::Value> {
    let v = serde_json::to_value(doc).map_err(std::io::Error::from)?;
    Ok(match v {
        serde_json::Value::Object(mut m) => {
            m.insert("schema_version".into(), SCHEMA_VERSION.into());
            serde_json::Value::Object(m)
        }
        other => serde_json::json!({ "schema_version": SCHEMA_VERSION, "items": other }),
    })
}

/// How JSON goes to stdout: one compact line (`-j`) or indented (`-p`), like `ip -j [-p]`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Json {
    /// Indent (`-p`/`--pretty`).
    pub pretty: bool,
}

impl Json {
    /// `doc` (with `schema_version`) as text, without a trailing newline.
    pub fn render<T: serde::Serialize + ?Sized>(&self, doc: &T) -> std::io::Result<String> {
        let v = document(doc)?;
        let s = if self.pretty {
            serde_json::to_string_pretty(&v)
        } else {
            serde_json::to_string(&v)
        };
        s.map_err(std::io::Error::from)
    }

    /// Prints `doc` (with `schema_version`) and a newline to stdout and flushes. A closed
    /// stdout comes back as a `BrokenPipe` error, which `main` ends quietly on.
    pub fn print<T: serde::Serialize + ?Sized>(&self, doc: &T) -> std::io::Result<()> {
        let text = self.render(doc)?;
        let mut o = std::io::stdout().lock();
        writeln!(o, "{text}")?;
        o.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_carry_the_schema_version() {
        let v = document(&serde_json::json!({"a": 1})).unwrap();
        assert_eq!(v["schema_version"], SCHEMA_VERSION);
        assert_eq!(v["a"], 1);
        let l = document(&[1, 2]).unwrap();
        assert_eq!(l["schema_version"], SCHEMA_VERSION);
        assert_eq!(l["items"], serde_json::json!([1, 2]));
        let one = Json { pretty: false }
            .render(&serde_json::json!({"a": 1}))
            .unwrap();
        assert!(!one.contains('\n'), "{one}");
        let p = Json { pretty: true }
            .render(&serde_json::json!({"a": 1}))
            .unwrap();
        assert!(p.contains('\n'), "{p}");
    }

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
