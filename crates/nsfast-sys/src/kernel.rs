//! Running kernel version, parsed once and cached.

use std::sync::OnceLock;

/// A kernel version `major.minor.patch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct KernelVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl KernelVersion {
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        Self {
            major,
            minor,
            patch,
        }
    }

    /// Parses a release string such as `6.18.44-fc-v657` or `7.2.0-1-cloud-amd64`.
    pub fn parse(release: &str) -> Option<Self> {
        let mut it = release
            .split(|c: char| !c.is_ascii_digit())
            .filter(|s| !s.is_empty());
        let major = it.next()?.parse().ok()?;
        let minor = it.next()?.parse().ok()?;
        // The patch may be absent ("7.0-rc1"); treat it as 0.
        let rest = release
            .trim_start_matches(|c: char| c.is_ascii_digit())
            .trim_start_matches('.')
            .trim_start_matches(|c: char| c.is_ascii_digit());
        let patch = if let Some(r) = rest.strip_prefix('.') {
            r.split(|c: char| !c.is_ascii_digit())
                .next()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0)
        } else {
            0
        };
        Some(Self::new(major, minor, patch))
    }

    /// The running kernel (from `uname`), cached for the life of the process.
    pub fn current() -> Self {
        static CURRENT: OnceLock<KernelVersion> = OnceLock::new();
        *CURRENT.get_or_init(|| {
            let release = release();
            Self::parse(&release).unwrap_or(Self::new(0, 0, 0))
        })
    }

    pub fn at_least(self, major: u32, minor: u32) -> bool {
        (self.major, self.minor) >= (major, minor)
    }
}

impl std::fmt::Display for KernelVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// The full release string of the running kernel (`uname -r`).
pub fn release() -> String {
    nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The running kernel's build configuration (`/boot/config-$(uname -r)`, else
/// `/proc/config.gz` through `zcat`); `None` when neither can be read.
pub fn config_text() -> Option<String> {
    std::fs::read_to_string(format!("/boot/config-{}", release()))
        .ok()
        .or_else(|| {
            let out = std::process::Command::new("zcat")
                .arg("/proc/config.gz")
                .output()
                .ok()?;
            out.status
                .success()
                .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_release_strings() {
        assert_eq!(
            KernelVersion::parse("6.18.44-fc-v657"),
            Some(KernelVersion::new(6, 18, 44))
        );
        assert_eq!(
            KernelVersion::parse("7.2.0-1-cloud-amd64"),
            Some(KernelVersion::new(7, 2, 0))
        );
        assert_eq!(
            KernelVersion::parse("7.0-rc1"),
            Some(KernelVersion::new(7, 0, 0))
        );
        assert_eq!(KernelVersion::parse("garbage"), None);
        assert!(KernelVersion::new(6, 18, 44).at_least(6, 7));
        assert!(!KernelVersion::new(6, 1, 0).at_least(6, 7));
    }
}
