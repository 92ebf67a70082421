//! The plugin's log: `logFile` and `logLevel` from the network configuration.
//!
//! Runtimes swallow a plugin's stderr (containerd and CRI-O keep only the error object on
//! stdout), so the configuration can name a file that the plugin appends its log lines to:
//!
//! ```json
//! { "type": "nsfast-cni", "logFile": "/var/log/nsfast-cni.log", "logLevel": "info", ... }
//! ```
//!
//! `logLevel` is `error`, `warn`, `info` or `debug` (default `info` for the file; without
//! `RUST_LOG` it also sets stderr's level, default `warn`). The file is opened with
//! `O_APPEND|O_CREAT|O_NOFOLLOW|O_CLOEXEC` (and `O_NONBLOCK|O_NOCTTY` until it is checked),
//! mode 0600 when created; the path must be absolute, and one that is a symbolic link, not
//! a regular file (a directory, FIFO, device or socket), another user's file or a file with
//! more than one name (a hard link) is refused before anything is written.
//! Each line is one `write(2)` to an `O_APPEND` file, so concurrent invocations interleave
//! whole lines.
//!
//! `logMaxSize` (bytes, or with a suffix: `"10M"`; default 10 MiB, at least 64 KiB) bounds
//! the file: an invocation that finds it at that size or more renames it to `<logFile>.1`
//! (replacing the one before) and starts a new one, under an exclusive `flock` of the file so
//! that concurrent invocations rotate it once. The log then takes at most about twice that.

use std::fs::File;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde_json::Value;
use tracing_subscriber::filter::LevelFilter;

use crate::error::{code, CniError};

/// `logLevel`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Error,
    Warn,
    Info,
    Debug,
}

impl Level {
    pub const NAMES: &'static str = "error, warn, info or debug";

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "error" => Self::Error,
            "warn" => Self::Warn,
            "info" => Self::Info,
            "debug" => Self::Debug,
            _ => return None,
        })
    }

    pub fn filter(self) -> LevelFilter {
        match self {
            Self::Error => LevelFilter::ERROR,
            Self::Warn => LevelFilter::WARN,
            Self::Info => LevelFilter::INFO,
            Self::Debug => LevelFilter::DEBUG,
        }
    }
}

/// The log settings of one invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub file: Option<PathBuf>,
    pub level: Option<Level>,
    /// `logMaxSize`: the size at which the file is rotated.
    pub max_size: u64,
}

/// Default `logMaxSize`.
pub const DEFAULT_MAX_SIZE: u64 = 10 << 20;
/// Smallest `logMaxSize`.
pub const MIN_MAX_SIZE: u64 = 64 << 10;

impl Default for Settings {
    fn default() -> Self {
        Self {
            file: None,
            level: None,
            max_size: DEFAULT_MAX_SIZE,
        }
    }
}

fn bad(conf: &Value, msg: String, details: &str) -> CniError {
    let mut e = CniError::new(code::INVALID_CONFIG, msg, details);
    if let Some(v) = conf.get("cniVersion").and_then(Value::as_str) {
        e.cni_version = v.to_string();
    }
    e
}

impl Settings {
    /// `logFile` and `logLevel` of the configuration on stdin. Input that is not a JSON object
    /// has none (the command's own parsing reports it); present keys must be valid.
    pub fn from_stdin(stdin: &[u8]) -> Result<Self, CniError> {
        match serde_json::from_slice::<Value>(stdin) {
            Ok(v) if v.is_object() => Self::from_conf(&v),
            _ => Ok(Self::default()),
        }
    }

    /// `logFile` and `logLevel` of a configuration object, checked: each error names the bad
    /// value and what is valid.
    pub fn from_conf(conf: &Value) -> Result<Self, CniError> {
        let file = match conf.get("logFile") {
            None | Some(Value::Null) => None,
            Some(Value::String(p)) if Path::new(p).is_absolute() => Some(PathBuf::from(p)),
            Some(Value::String(p)) => return Err(bad(
                conf,
                format!("invalid \"logFile\" {p:?}: expected an absolute path"),
                "e.g. \"/var/log/nsfast-cni.log\"; the plugin's working directory is the runtime's",
            )),
            Some(other) => {
                return Err(bad(
                    conf,
                    format!("invalid \"logFile\" {other}: expected a string (an absolute path)"),
                    "e.g. \"/var/log/nsfast-cni.log\"",
                ))
            }
        };
        let level = match conf.get("logLevel") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(Level::parse(s).ok_or_else(|| {
                bad(
                    conf,
                    format!("invalid \"logLevel\" {s:?}: expected {}", Level::NAMES),
                    "logLevel sets what the plugin writes to logFile (default info)",
                )
            })?),
            Some(other) => {
                return Err(bad(
                    conf,
                    format!("invalid \"logLevel\" {other}: expected {}", Level::NAMES),
                    "logLevel is a string",
                ))
            }
        };
        let max_size = match conf.get("logMaxSize") {
            None | Some(Value::Null) => DEFAULT_MAX_SIZE,
            Some(v) => {
                let text = match v {
                    Value::String(s) => s.clone(),
                    Value::Number(n) => n.to_string(),
                    other => other.to_string(),
                };
                nsfast_sys::args::size::parse_in("logMaxSize", &text, MIN_MAX_SIZE, 1 << 40)
                    .map_err(|e| {
                        bad(
                            conf,
                            format!("invalid \"logMaxSize\" {v}: {e}"),
                            "bytes, or a size such as \"10M\"; the log is rotated to logFile.1 there",
                        )
                    })?
            }
        };
        Ok(Self {
            file,
            level,
            max_size,
        })
    }
}

/// [`open_log_file`], rotated first when it has reached `max_size` (see the module's
/// documentation). A rotation that fails (`<path>.1` is a directory, say) leaves the file to
/// grow rather than fail the invocation: it is logged on stderr.
pub fn open_rotated(path: &Path, max_size: u64) -> Result<File, CniError> {
    use std::os::unix::fs::MetadataExt;
    let file = open_log_file(path)?;
    let full = |f: &File| f.metadata().is_ok_and(|m| m.len() >= max_size);
    if !full(&file) {
        return Ok(file);
    }
    let Ok(locked) = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive) else {
        return open_log_file(path);
    };
    // Still the file at `path`, and still full: another invocation may have rotated it while
    // this one waited for the lock.
    let same = std::fs::symlink_metadata(path)
        .ok()
        .zip(locked.metadata().ok())
        .is_some_and(|(p, f)| p.ino() == f.ino() && p.dev() == f.dev());
    if same && full(&locked) {
        let mut old = path.as_os_str().to_owned();
        old.push(".1");
        if let Err(e) = std::fs::rename(path, &old) {
            nsfast_sys::out::errln(&format!(
                "nsfast-cni: rotating \"logFile\" {} to {}: {e}; appending to it",
                path.display(),
                PathBuf::from(&old).display()
            ));
            return locked.unlock().map_err(|(_, e)| {
                CniError::new(code::IO_FAILURE, format!("unlock the log: {e}"), "")
            });
        }
    }
    drop(locked);
    open_log_file(path)
}

/// Opens `path` for appending log lines: created 0600 if missing; a symbolic link (last
/// component) or anything but a regular file is refused without writing to it (a FIFO is
/// not waited on: the open does not block).
pub fn open_log_file(path: &Path) -> Result<File, CniError> {
    let shown = path.display();
    let open_err = |e: std::io::Error| {
        let refused = match e.raw_os_error() {
            Some(libc::ELOOP) => Some("a symbolic link"),
            Some(libc::EISDIR) => Some("a directory"),
            // O_WRONLY|O_NONBLOCK on a FIFO without a reader.
            Some(libc::ENXIO) => Some("a FIFO or device"),
            _ => None,
        };
        match refused {
            Some(what) => CniError::new(
                code::INVALID_CONFIG,
                format!("\"logFile\" {shown:?} is {what}: refused (expected a regular file)"),
                "nothing was written to it",
            ),
            None => CniError::new(
                code::IO_FAILURE,
                format!("cannot open \"logFile\" {shown:?}: {e}"),
                "the log file is opened with O_APPEND|O_CREAT|O_NOFOLLOW, mode 0600",
            ),
        }
    };
    let file = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(open_err)?;
    let meta = file.metadata().map_err(open_err)?;
    if !meta.is_file() {
        let ft = meta.file_type();
        let what = if ft.is_dir() {
            "a directory"
        } else if ft.is_fifo() {
            "a FIFO"
        } else if ft.is_char_device() || ft.is_block_device() {
            "a device"
        } else if ft.is_socket() {
            "a socket"
        } else {
            "not a regular file"
        };
        return Err(CniError::new(
            code::INVALID_CONFIG,
            format!("\"logFile\" {shown:?} is {what}: refused (expected a regular file)"),
            "nothing was written to it",
        ));
    }
    // A regular file, but maybe not ours to write: one planted by another user (in a
    // world-writable directory), or a second name of another file (a hard link, e.g. to
    // /etc/shadow where fs.protected_hardlinks is off).
    use std::os::unix::fs::MetadataExt;
    let euid = nix::unistd::geteuid().as_raw();
    let refuse = |why: String| {
        CniError::new(
            code::INVALID_CONFIG,
            format!("\"logFile\" {shown:?} {why}: refused"),
            "nothing was written to it; expected a file of the plugin's own user with one name",
        )
    };
    if meta.uid() != euid {
        return Err(refuse(format!(
            "is owned by uid {}, not the plugin's uid {euid}",
            meta.uid()
        )));
    }
    if meta.nlink() != 1 {
        return Err(refuse(format!("has {} hard links", meta.nlink())));
    }
    // Back to blocking writes for the regular file.
    nix::fcntl::fcntl(
        &file,
        nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_APPEND),
    )
    .map_err(|e| open_err(e.into()))?;
    Ok(file)
}

/// Sets up logging for one invocation: stderr at `RUST_LOG` (else `logLevel`, else warn),
/// through the shared stderr layer ([`nsfast_sys::logging`]), and, with `logFile`, that file
/// at `logLevel` (default info), without colour.
pub fn init(s: &Settings) -> Result<(), CniError> {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::{EnvFilter, Layer};
    let stderr_filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        EnvFilter::default().add_directive(s.level.unwrap_or(Level::Warn).filter().into())
    });
    let stderr = nsfast_sys::logging::stderr_layer(stderr_filter);
    let file = match &s.file {
        Some(p) => Some(
            tracing_subscriber::fmt::layer()
                .with_writer(std::sync::Mutex::new(open_rotated(p, s.max_size)?))
                .with_ansi(false)
                .with_target(false)
                .with_filter(s.level.unwrap_or(Level::Info).filter()),
        ),
        None => None,
    };
    let _ = tracing_subscriber::registry()
        .with(stderr)
        .with(file)
        .try_init();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;

    fn conf(extra: &str) -> Value {
        serde_json::from_str(&format!(
            r#"{{"cniVersion":"1.0.0","name":"n","type":"nsfast-cni"{extra}}}"#
        ))
        .unwrap()
    }

    #[test]
    fn levels_and_paths_are_checked_naming_the_bad_value() {
        assert_eq!(Settings::from_conf(&conf("")).unwrap(), Settings::default());
        for (s, l) in [
            ("error", Level::Error),
            ("warn", Level::Warn),
            ("info", Level::Info),
            ("debug", Level::Debug),
        ] {
            let c = conf(&format!(r#","logLevel":"{s}","logFile":"/var/log/x.log""#));
            let got = Settings::from_conf(&c).unwrap();
            assert_eq!(got.level, Some(l));
            assert_eq!(got.file.as_deref(), Some(Path::new("/var/log/x.log")));
        }
        let e = Settings::from_conf(&conf(r#","logLevel":"verbose""#)).unwrap_err();
        assert_eq!(e.code, code::INVALID_CONFIG);
        assert_eq!(e.cni_version, "1.0.0");
        assert!(
            e.msg.contains("\"verbose\"") && e.msg.contains("error, warn, info or debug"),
            "{e:?}"
        );
        let e = Settings::from_conf(&conf(r#","logLevel":3"#)).unwrap_err();
        assert!(e.msg.contains("logLevel") && e.msg.contains('3'), "{e:?}");
        let e = Settings::from_conf(&conf(r#","logFile":"cni.log""#)).unwrap_err();
        assert_eq!(e.code, code::INVALID_CONFIG);
        assert!(
            e.msg.contains("\"cni.log\"") && e.msg.contains("absolute"),
            "{e:?}"
        );
        let e = Settings::from_conf(&conf(r#","logFile":["/x"]"#)).unwrap_err();
        assert!(e.msg.contains("logFile") && e.msg.contains("/x"), "{e:?}");
        // Not JSON: left to the command's own decoding error.
        assert_eq!(Settings::from_stdin(b"{").unwrap(), Settings::default());
    }

    /// A directory of our own under the temp dir, removed on drop.
    struct Dir(PathBuf);
    impl Dir {
        fn new(tag: &str) -> Self {
            let p = std::env::temp_dir().join(format!(
                "nsfast-cni-log-{tag}-{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir(&p).unwrap();
            Self(p)
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn log_file_is_created_0600_and_appended_to() {
        let d = Dir::new("append");
        let p = d.0.join("cni.log");
        writeln!(open_log_file(&p).unwrap(), "one").unwrap();
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o7777,
            0o600
        );
        writeln!(open_log_file(&p).unwrap(), "two").unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "one\ntwo\n");
    }

    #[test]
    fn a_full_log_is_rotated_once_to_dot_1() {
        let d = Dir::new("rotate");
        let p = d.0.join("cni.log");
        let max = MIN_MAX_SIZE;
        std::fs::write(&p, vec![b'a'; max as usize - 3]).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        // Below the bound: appended.
        writeln!(open_rotated(&p, max).unwrap(), "bc").unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().len(), max);
        // At it: the file goes to .1 and a new one starts.
        writeln!(open_rotated(&p, max).unwrap(), "new").unwrap();
        let old = d.0.join("cni.log.1");
        assert_eq!(std::fs::metadata(&old).unwrap().len(), max);
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "new\n");
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o7777,
            0o600
        );
        // Full again: the older .1 is replaced, never a third file.
        std::fs::write(&p, vec![b'z'; max as usize]).unwrap();
        writeln!(open_rotated(&p, max).unwrap(), "newer").unwrap();
        assert_eq!(std::fs::read(&old).unwrap(), vec![b'z'; max as usize]);
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "newer\n");
        assert_eq!(std::fs::read_dir(&d.0).unwrap().count(), 2);
    }

    #[test]
    fn log_max_size_is_checked_naming_the_bad_value() {
        let s = Settings::from_conf(&conf(r#","logMaxSize":"1M""#)).unwrap();
        assert_eq!(s.max_size, 1 << 20);
        let s = Settings::from_conf(&conf(r#","logMaxSize":131072"#)).unwrap();
        assert_eq!(s.max_size, 131072);
        assert_eq!(
            Settings::from_conf(&conf("")).unwrap().max_size,
            DEFAULT_MAX_SIZE
        );
        for bad in [r#""1K""#, r#""lots""#, "true", "-5"] {
            let e = Settings::from_conf(&conf(&format!(r#","logMaxSize":{bad}"#))).unwrap_err();
            assert_eq!(e.code, code::INVALID_CONFIG, "{bad}");
            assert!(e.msg.contains("logMaxSize"), "{bad}: {e:?}");
        }
    }

    #[test]
    fn log_file_that_is_not_a_regular_file_is_refused_untouched() {
        let d = Dir::new("refuse");
        let target = d.0.join("target");
        std::fs::write(&target, "keep\n").unwrap();
        let link = d.0.join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = open_log_file(&link).unwrap_err();
        assert_eq!(e.code, code::INVALID_CONFIG);
        assert!(
            e.msg.contains("symbolic link") && e.msg.contains("link"),
            "{e:?}"
        );
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep\n");

        let e = open_log_file(&d.0).unwrap_err();
        assert_eq!(e.code, code::INVALID_CONFIG);
        assert!(e.msg.contains("is a directory"), "{e:?}");

        // A FIFO without a reader: refused at once, not waited on.
        let fifo = d.0.join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let e = open_log_file(&fifo).unwrap_err();
        assert!(
            e.msg.contains("FIFO") || e.msg.contains("No such device"),
            "{e:?}"
        );

        let e = open_log_file(Path::new("/dev/null")).unwrap_err();
        assert_eq!(e.code, code::INVALID_CONFIG);
        assert!(e.msg.contains("is a device"), "{e:?}");

        // A second name of another file, and a file of another user.
        let alias = d.0.join("alias");
        std::fs::hard_link(&target, &alias).unwrap();
        let e = open_log_file(&alias).unwrap_err();
        assert_eq!(e.code, code::INVALID_CONFIG);
        assert!(e.msg.contains("has 2 hard links"), "{e:?}");
        std::fs::remove_file(&alias).unwrap();
        if nix::unistd::geteuid().is_root() {
            std::os::unix::fs::chown(&target, Some(65534), None).unwrap();
            let e = open_log_file(&target).unwrap_err();
            assert!(e.msg.contains("is owned by uid 65534"), "{e:?}");
        }
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep\n");

        let e = open_log_file(&d.0.join("no/such/dir.log")).unwrap_err();
        assert_eq!(e.code, code::IO_FAILURE);
        assert!(e.msg.contains("no/such/dir.log"), "{e:?}");
    }
}
