//! A private apt configuration per suite under `build/vm/apt/<suite>/`: its own sources list,
//! lists, cache and (empty) dpkg status. The system's apt sources are never read or changed:
//! every call passes `Dir::Etc::SourceList`, `Dir::Etc::SourceParts`, `Dir::State::Lists`,
//! `Dir::State::status` and `Dir::Cache` pointing into the build folder.

use std::cmp::Ordering;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context, Result};

const KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";

/// A package as the private index describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PkgInfo {
    pub name: String,
    pub version: String,
    /// First alternative of each Depends entry, without version constraints.
    pub depends: Vec<String>,
}

/// apt for one suite, confined to its own directory.
#[derive(Debug, Clone)]
pub struct Apt {
    pub suite: String,
    root: PathBuf,
}

impl Apt {
    /// Prepares `build_dir/apt/<suite>` with a sources list for `mirror`.
    pub fn new(build_dir: &Path, suite: &str, mirror: &str) -> Result<Self> {
        let root = build_dir.join("apt").join(suite);
        for d in ["lists/partial", "cache/archives/partial", "prefs.d"] {
            fs::create_dir_all(root.join(d))
                .with_context(|| format!("creating {}", root.join(d).display()))?;
        }
        let signed = if Path::new(KEYRING).exists() {
            format!("[signed-by={KEYRING}] ")
        } else {
            String::new()
        };
        let sources = format!("deb {signed}{mirror} {suite} main\n");
        let path = root.join("sources.list");
        if fs::read_to_string(&path).ok().as_deref() != Some(sources.as_str()) {
            fs::write(&path, sources).with_context(|| format!("writing {}", path.display()))?;
        }
        let status = root.join("status");
        if !status.exists() {
            fs::write(&status, "").with_context(|| format!("writing {}", status.display()))?;
        }
        Ok(Self {
            suite: suite.into(),
            root,
        })
    }

    fn opts(&self) -> Vec<String> {
        let r = self.root.display();
        [
            format!("Dir::Etc::SourceList={r}/sources.list"),
            "Dir::Etc::SourceParts=/nonexistent".to_string(),
            format!("Dir::Etc::Preferences={r}/preferences"),
            format!("Dir::Etc::PreferencesParts={r}/prefs.d"),
            format!("Dir::State::Lists={r}/lists"),
            format!("Dir::State::status={r}/status"),
            format!("Dir::Cache={r}/cache"),
            "APT::Architecture=amd64".to_string(),
            "APT::Architectures=amd64".to_string(),
            "APT::Sandbox::User=root".to_string(),
            "Acquire::Languages=none".to_string(),
            "Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false".to_string(),
            "Acquire::IndexTargets::deb::DEP-11-icons::DefaultEnabled=false".to_string(),
            "Acquire::IndexTargets::deb::DEP-11-icons-small::DefaultEnabled=false".to_string(),
            "Acquire::Retries=3".to_string(),
            "Acquire::http::Timeout=30".to_string(),
        ]
        .into_iter()
        .flat_map(|o| ["-o".to_string(), o])
        .collect()
    }

    fn command(&self, tool: &str) -> Command {
        let mut c = Command::new(tool);
        c.args(self.opts()).arg("-q");
        c.env("LC_ALL", "C");
        c
    }

    fn lists_age(&self) -> Option<Duration> {
        let dir = self.root.join("lists");
        fs::read_dir(dir)
            .ok()?
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with("_InRelease"))
            .filter_map(|e| e.metadata().ok()?.modified().ok())
            .max()
            .and_then(|t| SystemTime::now().duration_since(t).ok())
    }

    /// Runs `apt-get update` unless the lists are younger than `max_age`. With `offline`, never
    /// updates and fails if there are no lists yet.
    pub fn update(&self, max_age: Duration, offline: bool) -> Result<()> {
        match self.lists_age() {
            Some(age) if offline || age < max_age => return Ok(()),
            None if offline => bail!(
                "--offline: no package lists for suite {} under {} yet; run once without --offline",
                self.suite,
                self.root.display()
            ),
            _ => {}
        }
        tracing::info!("updating the private package lists for {}", self.suite);
        let out = self
            .command("apt-get")
            .arg("update")
            .output()
            .context("running apt-get (install apt)")?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !out.status.success()
            || stderr
                .lines()
                .any(|l| l.starts_with("E:") || l.starts_with("W:"))
        {
            bail!(
                "apt-get update for suite {} failed ({}):\n{}",
                self.suite,
                out.status,
                stderr.trim()
            );
        }
        // apt keeps the old InRelease's mtime when nothing changed; mark the lists fresh.
        let _ = fs::write(self.root.join("lists/.updated"), "");
        for e in fs::read_dir(self.root.join("lists"))?.flatten() {
            if e.file_name().to_string_lossy().ends_with("_InRelease") {
                let f = fs::File::options().append(true).open(e.path())?;
                f.set_modified(SystemTime::now())?;
            }
        }
        Ok(())
    }

    /// Names of all packages starting with `prefix`.
    pub fn pkgnames(&self, prefix: &str) -> Result<Vec<String>> {
        let out = self
            .command("apt-cache")
            .args(["pkgnames", prefix])
            .output()
            .context("running apt-cache")?;
        if !out.status.success() {
            bail!(
                "apt-cache pkgnames {prefix} ({}) failed: {}",
                self.suite,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| l.trim().to_string())
            .filter(|l| !l.is_empty())
            .collect())
    }

    /// The candidate version of `name`, or None if it is only a virtual package.
    pub fn show(&self, name: &str) -> Result<Option<PkgInfo>> {
        let out = self
            .command("apt-cache")
            .args(["show", "--no-all-versions", name])
            .output()
            .context("running apt-cache")?;
        if !out.status.success() {
            return Ok(None);
        }
        Ok(parse_show(&String::from_utf8_lossy(&out.stdout)))
    }

    /// Downloads `pkg` into `dest` unless already there; returns the .deb path.
    pub fn download(&self, pkg: &PkgInfo, dest: &Path) -> Result<PathBuf> {
        fs::create_dir_all(dest).with_context(|| format!("creating {}", dest.display()))?;
        let file = dest.join(deb_file_name(pkg));
        if file.exists() {
            return Ok(file);
        }
        tracing::info!("downloading {} {} ({})", pkg.name, pkg.version, self.suite);
        let out = self
            .command("apt-get")
            .current_dir(dest)
            .args(["download", &format!("{}={}", pkg.name, pkg.version)])
            .output()
            .context("running apt-get download")?;
        if !out.status.success() || !file.exists() {
            bail!(
                "apt-get download {}={} ({}) failed: {}",
                pkg.name,
                pkg.version,
                self.suite,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(file)
    }
}

/// `apt-get download`'s file name: `name_version_amd64.deb` with `:` as `%3a`.
pub fn deb_file_name(pkg: &PkgInfo) -> String {
    format!("{}_{}_amd64.deb", pkg.name, pkg.version.replace(':', "%3a"))
}

/// Parses the first stanza of `apt-cache show`.
pub fn parse_show(text: &str) -> Option<PkgInfo> {
    let mut name = None;
    let mut version = None;
    let mut depends = Vec::new();
    for line in text.lines() {
        if line.is_empty() {
            break;
        }
        if let Some(v) = line.strip_prefix("Package: ") {
            name = Some(v.trim().to_string());
        } else if let Some(v) = line.strip_prefix("Version: ") {
            version = Some(v.trim().to_string());
        } else if let Some(v) = line.strip_prefix("Depends: ") {
            depends = v
                .split(',')
                .filter_map(|d| {
                    let first = d.split('|').next()?.trim();
                    let n = first.split([' ', '(', ':']).next()?.trim();
                    (!n.is_empty()).then(|| n.to_string())
                })
                .collect();
        }
    }
    Some(PkgInfo {
        name: name?,
        version: version?,
        depends,
    })
}

/// Compares Debian versions (`[epoch:]upstream[-revision]`) as dpkg does.
pub fn compare_versions(a: &str, b: &str) -> Ordering {
    fn split(v: &str) -> (u64, &str, &str) {
        let (epoch, rest) = match v.split_once(':') {
            Some((e, r)) if e.chars().all(|c| c.is_ascii_digit()) => (e.parse().unwrap_or(0), r),
            _ => (0, v),
        };
        match rest.rsplit_once('-') {
            Some((u, r)) => (epoch, u, r),
            None => (epoch, rest, ""),
        }
    }
    let (ea, ua, ra) = split(a);
    let (eb, ub, rb) = split(b);
    ea.cmp(&eb)
        .then_with(|| verrevcmp(ua, ub))
        .then_with(|| verrevcmp(ra, rb))
}

fn order(c: Option<u8>) -> i32 {
    match c {
        None => 0,
        Some(b'~') => -1,
        Some(c) if c.is_ascii_digit() => 0,
        Some(c) if c.is_ascii_alphabetic() => c as i32,
        Some(c) => c as i32 + 256,
    }
}

fn verrevcmp(a: &str, b: &str) -> Ordering {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        while (i < a.len() && !a[i].is_ascii_digit()) || (j < b.len() && !b[j].is_ascii_digit()) {
            let ac = order(a.get(i).copied().filter(|c| !c.is_ascii_digit()));
            let bc = order(b.get(j).copied().filter(|c| !c.is_ascii_digit()));
            if ac != bc {
                return ac.cmp(&bc);
            }
            if i < a.len() && !a[i].is_ascii_digit() {
                i += 1;
            }
            if j < b.len() && !b[j].is_ascii_digit() {
                j += 1;
            }
        }
        while i < a.len() && a[i] == b'0' {
            i += 1;
        }
        while j < b.len() && b[j] == b'0' {
            j += 1;
        }
        let si = i;
        let sj = j;
        while i < a.len() && a[i].is_ascii_digit() {
            i += 1;
        }
        while j < b.len() && b[j].is_ascii_digit() {
            j += 1;
        }
        let (na, nb) = (&a[si..i], &b[sj..j]);
        let c = na.len().cmp(&nb.len()).then_with(|| na.cmp(nb));
        if c != Ordering::Equal {
            return c;
        }
    }
    Ordering::Equal
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debian_version_order() {
        use Ordering::*;
        assert_eq!(compare_versions("6.12.117-1", "6.12.107-1"), Greater);
        assert_eq!(compare_versions("1.0~rc1-1", "1.0-1"), Less);
        assert_eq!(compare_versions("1:1.0-1", "2.0-1"), Greater);
        assert_eq!(compare_versions("1.0-1", "1.0-1"), Equal);
        assert_eq!(compare_versions("1.0a", "1.0"), Greater);
        assert_eq!(compare_versions("1.0+deb12u1", "1.0"), Greater);
        assert_eq!(compare_versions("6.1.176-1", "6.1.99-2"), Greater);
        assert_eq!(compare_versions("7.2.13-1", "7.2.9-1"), Greater);
    }

    #[test]
    fn parses_apt_cache_show() {
        let t = "Package: linux-image-7.2.13+deb14-cloud-amd64\nSource: linux-signed-amd64 (7.2.13+1)\nVersion: 7.2.13-1\nDepends: dracut | initramfs-tools (>= 0.120+deb8u2) | linux-initramfs-tool, linux-base-7.2.13+deb14-cloud-amd64 (= 7.2.13-1), kmod:any\nDescription: x\n\nPackage: other\n";
        let p = parse_show(t).unwrap();
        assert_eq!(p.name, "linux-image-7.2.13+deb14-cloud-amd64");
        assert_eq!(p.version, "7.2.13-1");
        assert_eq!(
            p.depends,
            ["dracut", "linux-base-7.2.13+deb14-cloud-amd64", "kmod"]
        );
        assert_eq!(
            deb_file_name(&PkgInfo {
                name: "busybox-static".into(),
                version: "1:1.35.0-4".into(),
                depends: vec![]
            }),
            "busybox-static_1%3a1.35.0-4_amd64.deb"
        );
        assert!(parse_show("").is_none());
    }
}
