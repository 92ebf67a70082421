//! The two text files that drive the harness: the kernel matrix (`tests/vm/kernels.txt`) and
//! the guest test list (`tests/vm/guest-tests.txt`). Parsing only; errors name file and line.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use anyhow::{bail, Context, Result};

use crate::checks::Checks;

/// One kernel of the matrix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelSpec {
    /// Short label used in tables and paths (`6.1`, `7.2`).
    pub label: String,
    /// Debian suite (`bookworm`, `trixie`, `sid`).
    pub suite: String,
    /// Glob (`*` only) over binary package names; the newest matching version wins.
    pub package: String,
}

/// The kernel matrix plus its settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Matrix {
    /// Archive URL used in the private sources list.
    pub mirror: String,
    /// Suite from which busybox-static is taken.
    pub tools_suite: String,
    pub kernels: Vec<KernelSpec>,
}

pub const DEFAULT_MIRROR: &str = "http://deb.debian.org/debian";

fn is_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 32
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '_')
}

fn is_suite(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_lowercase() || c == '-')
}

/// Parses a kernel matrix. Lines: `LABEL SUITE PACKAGE-GLOB`, `@mirror URL`,
/// `@tools-suite SUITE`; `#` starts a comment.
pub fn parse_matrix(text: &str, file: &Path) -> Result<Matrix> {
    let mut m = Matrix {
        mirror: DEFAULT_MIRROR.into(),
        tools_suite: String::new(),
        kernels: Vec::new(),
    };
    for (i, raw) in text.lines().enumerate() {
        let at = || format!("{}:{}", file.display(), i + 1);
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["@mirror", url] => {
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    bail!("{}: invalid mirror {url:?}: must start with http:// or https://", at());
                }
                m.mirror = url.trim_end_matches('/').to_string();
            }
            ["@tools-suite", s] if is_suite(s) => m.tools_suite = s.to_string(),
            [label, suite, package] if !label.starts_with('@') => {
                if !is_label(label) {
                    bail!("{}: invalid kernel label {label:?}: use 1-32 characters from [A-Za-z0-9._-]", at());
                }
                if !is_suite(suite) {
                    bail!("{}: invalid suite {suite:?}: expected a Debian suite name such as bookworm, trixie or sid", at());
                }
                if !package.starts_with("linux-image-") {
                    bail!("{}: invalid package pattern {package:?}: must start with linux-image-", at());
                }
                if m.kernels.iter().any(|k| k.label == *label) {
                    bail!("{}: kernel label {label:?} appears twice", at());
                }
                m.kernels.push(KernelSpec {
                    label: label.to_string(),
                    suite: suite.to_string(),
                    package: package.to_string(),
                });
            }
            _ => bail!(
                "{}: cannot parse {line:?}: expected `LABEL SUITE linux-image-GLOB`, `@mirror URL` or `@tools-suite SUITE`",
                at()
            ),
        }
    }
    if m.kernels.is_empty() {
        bail!("{}: no kernels listed", file.display());
    }
    if m.tools_suite.is_empty() {
        m.tools_suite = m.kernels[0].suite.clone();
    }
    Ok(m)
}

/// `*` matches any run of characters (including none); everything else is literal.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == name;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !name.starts_with(first) || name.len() < first.len() + last.len() || !name.ends_with(last) {
        return false;
    }
    let mut rest = &name[first.len()..name.len() - last.len()];
    for mid in &parts[1..parts.len() - 1] {
        match rest.find(mid) {
            Some(i) => rest = &rest[i + mid.len()..],
            None => return false,
        }
    }
    true
}

/// A kernel version `major.minor` used by test constraints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct MajorMinor(pub u32, pub u32);

impl fmt::Display for MajorMinor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.0, self.1)
    }
}

impl std::str::FromStr for MajorMinor {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (a, b) = s.split_once('.').ok_or_else(|| {
            format!("invalid kernel version {s:?}: expected MAJOR.MINOR such as 6.12")
        })?;
        let p = |x: &str| {
            x.parse::<u32>().map_err(|_| {
                format!("invalid kernel version {s:?}: expected MAJOR.MINOR such as 6.12")
            })
        };
        Ok(Self(p(a)?, p(b)?))
    }
}

/// One guest test.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestTest {
    pub name: String,
    /// Shell command run by the guest's /init (busybox sh), from the guest's `/`.
    pub command: String,
    pub min: Option<MajorMinor>,
    pub max: Option<MajorMinor>,
    /// Kernels inside `min..=max` it does not run on (`except=6.12`): what they would show
    /// is already shown by the kernels on either side.
    pub except: Vec<MajorMinor>,
    /// Seconds before the guest kills the test.
    pub timeout: u32,
    /// Boot profile (extra QEMU devices); `default` has none.
    pub boot: String,
    /// What its output must show besides exit code 0 (`tests=`, `min-tests=`, `expect=`,
    /// `reject=`; see [`crate::checks`]).
    pub checks: Checks,
}

impl GuestTest {
    /// Why this test does not apply to kernel `v`, if it does not.
    pub fn skip_reason(&self, v: MajorMinor) -> Option<String> {
        match (self.min, self.max) {
            (Some(min), _) if v < min => Some(format!("needs kernel >= {min}")),
            (_, Some(max)) if v > max => Some(format!("needs kernel <= {max}")),
            _ if self.except.contains(&v) => Some(format!(
                "not run on {v} (except={v}: the kernels around it run it)"
            )),
            _ => None,
        }
    }
}

/// A host process started before the guests of one boot profile, stopped after each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Helper {
    /// Run with `sh -c` (after `{run}` substitution); `exec` the long-running program.
    pub command: String,
    /// A path (with `{run}`) that must exist before QEMU starts.
    pub ready: Option<String>,
}

/// Extra QEMU arguments and host helpers for tests with `boot=NAME`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BootProfile {
    pub qemu_args: Vec<String>,
    pub helpers: Vec<Helper>,
    /// `@peer`: the command a second guest of this profile runs instead of the tests (a helper
    /// boots it with `{peer-qemu}`; its /init sees `nsfast.role=peer` on the command line).
    pub peer: Option<String>,
}

/// Everything in the guest test list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GuestSuite {
    /// Binary targets copied into the guest's /bin.
    pub bins: Vec<String>,
    /// Host programs (found on PATH) copied into the guest's /bin with their libraries.
    pub host_bins: Vec<String>,
    /// Packages whose test executables go into the guest's /tests.
    pub cargo_tests: Vec<String>,
    /// Kernel modules loaded at boot, in order.
    pub modules: Vec<String>,
    pub boots: BTreeMap<String, BootProfile>,
    pub tests: Vec<GuestTest>,
}

impl GuestSuite {
    /// The programs the guest starts: the first word of each test's command (and of the peer
    /// command of each boot profile a test uses) after its `NAME=value` assignments.
    pub fn programs(&self) -> std::collections::BTreeSet<String> {
        let peers = self
            .tests
            .iter()
            .filter_map(|t| self.boots.get(&t.boot).and_then(|b| b.peer.as_deref()));
        self.tests
            .iter()
            .map(|t| t.command.as_str())
            .chain(peers)
            .filter_map(|c| {
                c.split_whitespace()
                    .find(|w| !w.contains('='))
                    .map(|w| w.rsplit('/').next().unwrap_or(w).to_string())
            })
            .collect()
    }
}

pub const DEFAULT_TEST_TIMEOUT: u32 = 120;

fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
}

/// Splits `HEAD -- TAIL` into (head words, tail text).
fn split_dashes(line: &str) -> Option<(Vec<&str>, &str)> {
    let idx = line.find(" -- ")?;
    Some((
        line[..idx].split_whitespace().collect(),
        line[idx + 4..].trim(),
    ))
}

/// Splits a test line's head into words; `"..."` keeps spaces inside one word
/// (`expect="a b"` is the word `expect=a b`).
fn head_words(head: &str) -> std::result::Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut any = false;
    for c in head.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                any = true;
            }
            c if c.is_whitespace() && !quoted => {
                if any {
                    words.push(std::mem::take(&mut cur));
                    any = false;
                }
            }
            c => {
                cur.push(c);
                any = true;
            }
        }
    }
    if quoted {
        return Err(format!("unterminated \" in {head:?}"));
    }
    if any {
        words.push(cur);
    }
    Ok(words)
}

/// Parses the guest test list (see `tests/vm/guest-tests.txt` for the format).
pub fn parse_guest_suite(text: &str, file: &Path) -> Result<GuestSuite> {
    let mut s = GuestSuite::default();
    s.boots.insert("default".into(), BootProfile::default());
    for (i, raw) in text.lines().enumerate() {
        let at = format!("{}:{}", file.display(), i + 1);
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        match words[0] {
            "@bin" | "@host-bin" | "@cargo-tests" | "@modules" => {
                if words.len() < 2 {
                    bail!("{at}: {} needs at least one name", words[0]);
                }
                for w in &words[1..] {
                    if !is_name(w) {
                        bail!("{at}: invalid name {w:?} after {}", words[0]);
                    }
                }
                let list = match words[0] {
                    "@bin" => &mut s.bins,
                    "@host-bin" => &mut s.host_bins,
                    "@cargo-tests" => &mut s.cargo_tests,
                    _ => &mut s.modules,
                };
                list.extend(words[1..].iter().map(|w| w.to_string()));
            }
            "@boot" => {
                let (head, tail) = split_dashes(line)
                    .with_context(|| format!("{at}: expected `@boot NAME -- QEMU ARGS...`"))?;
                let [_, name] = head.as_slice() else {
                    bail!("{at}: expected `@boot NAME -- QEMU ARGS...`");
                };
                if !is_name(name) {
                    bail!("{at}: invalid boot profile name {name:?}");
                }
                let p = s.boots.entry(name.to_string()).or_default();
                p.qemu_args.extend(tail.split_whitespace().map(str::to_string));
            }
            "@helper" => {
                let (head, tail) = split_dashes(line).with_context(|| {
                    format!("{at}: expected `@helper NAME [ready=PATH] -- COMMAND...`")
                })?;
                let (name, attrs) = match head.as_slice() {
                    [_, name, attrs @ ..] => (*name, attrs),
                    _ => bail!("{at}: expected `@helper NAME [ready=PATH] -- COMMAND...`"),
                };
                let mut ready = None;
                for a in attrs {
                    match a.split_once('=') {
                        Some(("ready", p)) => ready = Some(p.to_string()),
                        _ => bail!("{at}: unknown helper attribute {a:?}: expected ready=PATH"),
                    }
                }
                if tail.is_empty() {
                    bail!("{at}: helper {name:?} has no command");
                }
                s.boots.entry(name.to_string()).or_default().helpers.push(Helper {
                    command: tail.to_string(),
                    ready,
                });
            }
            "@peer" => {
                let usage = || format!("{at}: expected `@peer PROFILE -- COMMAND...`");
                let (head, tail) = split_dashes(line).with_context(usage)?;
                let [_, name] = head.as_slice() else {
                    bail!(usage());
                };
                if !is_name(name) {
                    bail!("{at}: invalid boot profile name {name:?}");
                }
                if tail.is_empty() {
                    bail!("{at}: @peer {name} has no command");
                }
                let p = s.boots.entry(name.to_string()).or_default();
                if p.peer.is_some() {
                    bail!("{at}: boot profile {name:?} has a @peer already (one per profile)");
                }
                p.peer = Some(tail.to_string());
            }
            w if w.starts_with('@') => bail!(
                "{at}: unknown directive {w:?}: expected @bin, @host-bin, @cargo-tests, @modules, @boot, @helper or @peer"
            ),
            _ => {
                let usage = || format!("{at}: expected `NAME [min=X.Y] [max=X.Y] [timeout=SECS] [boot=NAME] [tests=N|min-tests=N] [expect=REGEX]... [reject=REGEX]... -- COMMAND`");
                let idx = line.find(" -- ").with_context(usage)?;
                let command = line[idx + 4..].trim();
                let head = head_words(&line[..idx]).map_err(|e| anyhow::anyhow!("{at}: {e}"))?;
                let name = head[0].as_str();
                if !is_name(name) {
                    bail!("{at}: invalid test name {name:?}: use 1-64 characters from [A-Za-z0-9._-]");
                }
                if s.tests.iter().any(|t| t.name == name) {
                    bail!("{at}: test {name:?} appears twice");
                }
                if command.is_empty() {
                    bail!("{at}: test {name:?} has no command");
                }
                let mut t = GuestTest {
                    name: name.into(),
                    command: command.into(),
                    min: None,
                    max: None,
                    except: Vec::new(),
                    timeout: DEFAULT_TEST_TIMEOUT,
                    boot: "default".into(),
                    checks: Checks::default(),
                };
                let count = |k: &str, v: &str| {
                    v.parse::<u32>()
                        .ok()
                        .filter(|n| (1..=100_000).contains(n))
                        .with_context(|| format!("{at}: invalid {k} {v:?}: must be a number of tests from 1 to 100000"))
                };
                for a in &head[1..] {
                    let (k, v) = a
                        .split_once('=')
                        .with_context(|| format!("{at}: attribute {a:?} is not KEY=VALUE"))?;
                    match k {
                        "min" => t.min = Some(v.parse().map_err(|e| anyhow::anyhow!("{at}: {e}"))?),
                        "max" => t.max = Some(v.parse().map_err(|e| anyhow::anyhow!("{at}: {e}"))?),
                        "except" => {
                            for x in v.split(',') {
                                t.except.push(x.parse().map_err(|e| anyhow::anyhow!("{at}: except: {e}"))?);
                            }
                        }
                        "timeout" => {
                            t.timeout = v
                                .parse()
                                .ok()
                                .filter(|n| (1..=3600).contains(n))
                                .with_context(|| {
                                    format!("{at}: invalid timeout {v:?}: must be 1-3600 seconds")
                                })?
                        }
                        "boot" => t.boot = v.to_string(),
                        "tests" => t.checks.tests = Some(count(k, v)?),
                        "min-tests" => t.checks.min_tests = Some(count(k, v)?),
                        "expect" | "reject" => {
                            crate::checks::compile(v).map_err(|e| anyhow::anyhow!("{at}: {k}: {e}"))?;
                            if k == "expect" {
                                t.checks.expect.push(v.to_string());
                            } else {
                                t.checks.reject.push(v.to_string());
                            }
                        }
                        _ => bail!("{at}: unknown test attribute {k:?}: expected min, max, except, timeout, boot, tests, min-tests, expect or reject"),
                    }
                }
                if t.checks.tests.is_some() && t.checks.min_tests.is_some() {
                    bail!("{at}: test {name:?} declares both tests= and min-tests=: keep one");
                }
                s.tests.push(t);
            }
        }
    }
    for t in &s.tests {
        if !s.boots.contains_key(&t.boot) {
            bail!(
                "{}: test {:?} uses boot profile {:?}, which no @boot or @helper line defines",
                file.display(),
                t.name,
                t.boot
            );
        }
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob_match(
            "linux-image-6.1.0-*-cloud-amd64-unsigned",
            "linux-image-6.1.0-50-cloud-amd64-unsigned"
        ));
        assert!(!glob_match(
            "linux-image-6.1.0-*-cloud-amd64-unsigned",
            "linux-image-6.1.0-50-cloud-amd64"
        ));
        assert!(!glob_match(
            "linux-image-6.1.0-*-cloud-amd64",
            "linux-image-6.1.0-50-cloud-amd64-dbg"
        ));
        assert!(glob_match(
            "linux-image-7.2.*-cloud-amd64",
            "linux-image-7.2.13+deb14-cloud-amd64"
        ));
        assert!(glob_match("a*b*c", "a-x-b-y-c"));
        assert!(!glob_match("a*b*c", "a-x-c"));
        assert!(glob_match("exact", "exact"));
        assert!(!glob_match("ab*ba", "aba"));
    }

    #[test]
    fn matrix_parses_and_rejects() {
        let p = Path::new("kernels.txt");
        let m = parse_matrix(
            "# c\n6.1 bookworm linux-image-6.1.0-*-cloud-amd64 # x\n7.2 sid linux-image-7.2.*\n",
            p,
        )
        .unwrap();
        assert_eq!(m.kernels.len(), 2);
        assert_eq!(m.tools_suite, "bookworm");
        assert_eq!(m.mirror, DEFAULT_MIRROR);
        let e = parse_matrix("6.1 bookworm bash\n", p)
            .unwrap_err()
            .to_string();
        assert!(e.contains("kernels.txt:1") && e.contains("\"bash\""), "{e}");
        let e = parse_matrix("6.1 Bookworm linux-image-x\n", p)
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"Bookworm\""), "{e}");
        assert!(parse_matrix("# nothing\n", p).is_err());
        assert!(parse_matrix("a sid linux-image-x\na sid linux-image-y\n", p).is_err());
    }

    #[test]
    fn guest_suite_parses() {
        let text = "\
@bin nsfast nsfast-vmcheck
@host-bin socat
@modules veth vsock_loopback
@boot rng -- -device virtio-rng-pci
@helper vs ready={run}/s -- helperprog --sock {run}/s
@boot vs -- -chardev socket,id=c0,path={run}/s
probe -- nsfast probe
vsock min=6.12 timeout=30 -- nsfast-vmcheck vsock-loopback --check a=b
rng boot=rng except=6.12,7.1 -- test -e /dev/hwrng
";
        let s = parse_guest_suite(text, Path::new("g.txt")).unwrap();
        assert_eq!(s.bins, ["nsfast", "nsfast-vmcheck"]);
        assert_eq!(s.modules, ["veth", "vsock_loopback"]);
        assert_eq!(s.host_bins, ["socat"]);
        assert_eq!(s.tests.len(), 3);
        let v = &s.tests[1];
        assert_eq!(v.min, Some(MajorMinor(6, 12)));
        assert_eq!(v.timeout, 30);
        assert_eq!(v.command, "nsfast-vmcheck vsock-loopback --check a=b");
        assert_eq!(
            v.skip_reason(MajorMinor(6, 1)).as_deref(),
            Some("needs kernel >= 6.12")
        );
        assert_eq!(v.skip_reason(MajorMinor(7, 2)), None);
        let r = &s.tests[2];
        assert_eq!(r.except, [MajorMinor(6, 12), MajorMinor(7, 1)]);
        assert_eq!(
            r.skip_reason(MajorMinor(6, 12)).as_deref(),
            Some("not run on 6.12 (except=6.12: the kernels around it run it)")
        );
        assert_eq!(r.skip_reason(MajorMinor(6, 1)), None);
        assert!(parse_guest_suite("x except=6 -- true\n", Path::new("g.txt")).is_err());
        assert_eq!(s.boots["vs"].helpers[0].ready.as_deref(), Some("{run}/s"));
        assert_eq!(
            s.boots["vs"].helpers[0].command,
            "helperprog --sock {run}/s"
        );
        assert_eq!(s.boots["rng"].qemu_args, ["-device", "virtio-rng-pci"]);
        assert_eq!(s.boots["rng"].peer, None);
    }

    #[test]
    fn test_lines_declare_checks() {
        let p = Path::new("g.txt");
        let s = parse_guest_suite(
            "a tests=3 -- x\nb min-tests=40 timeout=9 -- y\nc expect=\"^ok +netkit\" expect=done reject=MISMATCH -- z\nd -- w\n",
            p,
        )
        .unwrap();
        assert_eq!(s.tests[0].checks.tests, Some(3));
        assert_eq!(s.tests[1].checks.min_tests, Some(40));
        assert_eq!(s.tests[1].timeout, 9);
        assert_eq!(s.tests[2].checks.expect, ["^ok +netkit", "done"]);
        assert_eq!(s.tests[2].checks.reject, ["MISMATCH"]);
        assert_eq!(s.tests[2].command, "z");
        assert_eq!(s.tests[3].checks, Checks::default());
        for (line, want) in [
            ("a tests=0 -- x\n", "invalid tests \"0\""),
            ("a min-tests=many -- x\n", "invalid min-tests \"many\""),
            ("a tests=1 min-tests=1 -- x\n", "both tests= and min-tests="),
            ("a expect=( -- x\n", "invalid pattern \"(\""),
            ("a expect=\"open -- x\n", "unterminated"),
        ] {
            let e = format!("{:#}", parse_guest_suite(line, p).unwrap_err());
            assert!(e.contains("g.txt:1") && e.contains(want), "{line}: {e}");
        }
    }

    /// The repository's list parses, and the lines that run no libtest binary (probes, the
    /// bench) say what they check with expect=.
    #[test]
    fn the_repository_list_declares_its_checks() {
        let text = include_str!("../../../tests/vm/guest-tests.txt");
        let s = parse_guest_suite(text, Path::new("tests/vm/guest-tests.txt")).unwrap();
        for t in &s.tests {
            let program = t
                .command
                .split_whitespace()
                .find(|w| !w.contains('='))
                .unwrap_or("");
            if program == "nsfast-vmcheck" || program == "nsfast" {
                assert!(!t.checks.expect.is_empty(), "{}: no expect=", t.name);
            }
        }
        let names: Vec<&str> = s.tests.iter().map(|t| t.name.as_str()).collect();
        assert!(names.contains(&"bench-topology"), "{names:?}");
        // The bench line's patterns against the table `nsfast bench` prints (report::table).
        let vt = &s
            .tests
            .iter()
            .find(|t| t.name == "vsock-throughput")
            .unwrap()
            .checks;
        let row = |w: &str, t: &str, v: &str| {
            format!("{w:<11} {t:<11} {v:>12} {:<7} {:>7}", "Gbit/s", "1.00")
        };
        let good = vec![
            "placement same-cpu (client CPU 0, server CPU 0)".to_string(),
            row("stream", "vsock", "3.41"),
            row("", "vsock-relay", "2.10"),
            row("", "vsock-socat", "0.95"),
        ];
        assert!(crate::checks::judge(vt, &good).is_ok(), "{good:?}");
        let mut failed = good.clone();
        failed[2] = row("", "vsock-relay", "–") + "  5 round(s) failed: relay gone";
        assert!(crate::checks::judge(vt, &failed).is_err());
        let mut skipped = good.clone();
        skipped.remove(3);
        skipped.push("skipped vsock-socat: socat not found on PATH".into());
        assert!(crate::checks::judge(vt, &skipped).is_err());
        // probe-config and vsock-loopback against what nsfast-vmcheck prints.
        let check = |name: &str| &s.tests.iter().find(|t| t.name == name).unwrap().checks;
        let probe_row = |verdict: &str, f: &str| {
            format!("{verdict} {f:<20} probe=yes config=yes (CONFIG_X)  probe says: fine")
        };
        let rows: Vec<String> = ["netkit", "vsock", "vsock_loopback", "tcx"]
            .iter()
            .map(|f| probe_row("ok      ", f))
            .collect();
        assert!(
            crate::checks::judge(check("probe-config"), &rows).is_ok(),
            "{rows:?}"
        );
        let mut bad = rows.clone();
        bad[3] = probe_row("MISMATCH", "tcx");
        assert!(crate::checks::judge(check("probe-config"), &bad).is_err());
        let echo = vec![
            "vsock loopback CID 1 port 7000: 1048576 bytes echoed in 3.2 ms (310.0 MiB/s), 100 ping-pongs, 20.1 us each".to_string(),
        ];
        assert!(crate::checks::judge(check("vsock-loopback"), &echo).is_ok());
        assert!(crate::checks::judge(check("vsock-loopback"), &[""]).is_err());
    }

    #[test]
    fn peer_directive() {
        let p = Path::new("g.txt");
        let s = parse_guest_suite(
            "@helper two -- exec {peer-qemu}\n@peer two -- echo-server --port 5\nt boot=two -- true\n",
            p,
        )
        .unwrap();
        assert_eq!(s.boots["two"].peer.as_deref(), Some("echo-server --port 5"));
        let e = parse_guest_suite("@peer two -- a\n@peer two -- b\n", p)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("g.txt:2") && e.contains("\"two\" has a @peer already"),
            "{e}"
        );
        assert!(parse_guest_suite("@peer two\n", p).is_err());
        assert!(parse_guest_suite("@peer t/x -- a\n", p).is_err());
    }

    #[test]
    fn guest_suite_errors_name_the_value() {
        let p = Path::new("g.txt");
        let e = parse_guest_suite("t timeout=0 -- true\n", p)
            .unwrap_err()
            .to_string();
        assert!(e.contains("g.txt:1") && e.contains("\"0\""), "{e}");
        let e = parse_guest_suite("t min=6 -- true\n", p)
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"6\""), "{e}");
        let e = parse_guest_suite("t boot=nope -- true\n", p)
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"nope\""), "{e}");
        let e = parse_guest_suite("t color=red -- true\n", p)
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"color\""), "{e}");
        assert!(parse_guest_suite("t true\n", p).is_err());
        assert!(parse_guest_suite("@frob x\n", p).is_err());
        assert!(parse_guest_suite("@host-bin\n", p).is_err());
        assert!(parse_guest_suite("@host-bin /usr/bin/socat\n", p).is_err());
        assert!(parse_guest_suite("a -- true\na -- false\n", p).is_err());
    }
}
