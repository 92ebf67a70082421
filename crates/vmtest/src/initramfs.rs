//! Builds a guest's initramfs: a staging tree on disk (so `depmod` can index the modules), then
//! an uncompressed `newc` cpio archive written here (no cpio tool needed; the kernel unpacks an
//! uncompressed archive fastest, and it only lives in the build folder).

use std::collections::BTreeSet;
use std::fs;
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::kernel::{self, Kernel, ModuleDeps, ModuleFate};

/// Writes `newc` cpio entries.
pub struct CpioWriter<W: Write> {
    out: W,
    ino: u32,
    written: u64,
}

impl<W: Write> CpioWriter<W> {
    pub fn new(out: W) -> Self {
        Self {
            out,
            ino: 1,
            written: 0,
        }
    }

    fn header(&mut self, name: &str, mode: u32, size: usize, rdev: (u32, u32)) -> io::Result<()> {
        let name_len = name.len() + 1;
        let hdr = format!(
            "070701{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}",
            self.ino, mode, 0, 0, 1, 0, size, 0, 0, rdev.0, rdev.1, name_len, 0
        );
        self.ino += 1;
        self.raw(hdr.as_bytes())?;
        self.raw(name.as_bytes())?;
        self.raw(&[0])?;
        self.pad()
    }

    fn raw(&mut self, b: &[u8]) -> io::Result<()> {
        self.out.write_all(b)?;
        self.written += b.len() as u64;
        Ok(())
    }

    fn pad(&mut self) -> io::Result<()> {
        let n = (4 - (self.written % 4) as usize) % 4;
        self.raw(&[0u8; 3][..n])
    }

    pub fn dir(&mut self, name: &str) -> io::Result<()> {
        self.header(name, 0o040755, 0, (0, 0))
    }

    pub fn file(&mut self, name: &str, mode: u32, data: &[u8]) -> io::Result<()> {
        self.header(name, 0o100000 | (mode & 0o7777), data.len(), (0, 0))?;
        self.raw(data)?;
        self.pad()
    }

    pub fn symlink(&mut self, name: &str, target: &str) -> io::Result<()> {
        self.header(name, 0o120777, target.len(), (0, 0))?;
        self.raw(target.as_bytes())?;
        self.pad()
    }

    pub fn char_dev(&mut self, name: &str, mode: u32, major: u32, minor: u32) -> io::Result<()> {
        self.header(name, 0o020000 | (mode & 0o7777), 0, (major, minor))
    }

    /// Writes the trailer and returns the inner writer.
    pub fn finish(mut self) -> io::Result<W> {
        self.header("TRAILER!!!", 0, 0, (0, 0))?;
        let n = (512 - (self.written % 512) as usize) % 512;
        self.raw(&vec![0u8; n])?;
        self.out.flush()?;
        Ok(self.out)
    }
}

/// Appends the tree under `root` to `w`, paths relative to `root`, sorted.
pub fn write_tree<W: Write>(w: &mut CpioWriter<W>, root: &Path) -> Result<()> {
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let abs = root.join(&rel);
        let mut entries: Vec<_> = fs::read_dir(&abs)
            .with_context(|| format!("reading {}", abs.display()))?
            .flatten()
            .collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries.into_iter().rev() {
            let r = rel.join(e.file_name());
            let name = r.to_string_lossy().into_owned();
            let md = fs::symlink_metadata(e.path())?;
            let ft = md.file_type();
            if ft.is_symlink() {
                let t = fs::read_link(e.path())?;
                w.symlink(&name, &t.to_string_lossy())?;
            } else if ft.is_dir() {
                w.dir(&name)?;
                stack.push(r);
            } else if ft.is_file() {
                let data = fs::read(e.path())?;
                w.file(&name, md.mode(), &data)?;
            }
        }
    }
    Ok(())
}

/// What goes into a guest besides the kernel's own files.
#[derive(Debug, Clone)]
pub struct Payload {
    pub busybox: PathBuf,
    pub init_script: PathBuf,
    /// (path in the guest, host file) for binaries; shared libraries are added from `ldd`.
    pub binaries: Vec<(String, PathBuf)>,
    pub modules: Vec<String>,
    /// `NAME\tTIMEOUT\tCOMMAND` lines.
    pub tests: String,
    /// The command of a peer guest (`@peer`), written to /etc/nsfast/peer.
    pub peer: Option<String>,
}

/// Module load outcome for the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModuleNote {
    pub name: String,
    pub fate: &'static str,
}

/// Stages and writes `out` (a cpio archive); returns what happened to each module.
pub fn build(k: &Kernel, p: &Payload, stage: &Path, out: &Path) -> Result<Vec<ModuleNote>> {
    if stage.exists() {
        fs::remove_dir_all(stage).with_context(|| format!("removing {}", stage.display()))?;
    }
    for d in ["bin", "sbin", "etc/nsfast", "boot", "tests"] {
        fs::create_dir_all(stage.join(d))?;
    }
    copy_file(&p.busybox, &stage.join("bin/busybox"), 0o755)?;
    copy_file(&p.init_script, &stage.join("init"), 0o755)?;
    for (guest, host) in &p.binaries {
        copy_binary(host, &stage.join(guest.trim_start_matches('/')))?;
    }
    let mut libs = BTreeSet::new();
    for (_, host) in &p.binaries {
        libs.extend(shared_libs(host)?);
    }
    for lib in &libs {
        copy_file(
            lib,
            &stage.join(lib.strip_prefix("/").unwrap_or(lib)),
            0o755,
        )?;
    }
    fs::copy(&k.config, stage.join("boot/config"))?;
    fs::copy(&k.config, stage.join(format!("boot/config-{}", k.release)))?;
    fs::write(stage.join("etc/nsfast/tests"), &p.tests)?;
    if let Some(cmd) = &p.peer {
        fs::write(stage.join("etc/nsfast/peer"), format!("{cmd}\n"))?;
    }
    fs::write(
        stage.join("etc/nsfast/kernel"),
        format!("{}\n", k.spec.label),
    )?;

    // Modules: copy each requested one with its dependencies, decompressed, then depmod.
    let deps = ModuleDeps::load(k)?;
    let mdir = stage.join("lib/modules").join(&k.release);
    fs::create_dir_all(&mdir)?;
    for f in [
        "modules.builtin",
        "modules.builtin.modinfo",
        "modules.order",
    ] {
        let src = k.modules_dir.join(f);
        if src.exists() {
            fs::copy(&src, mdir.join(f))?;
        }
    }
    let mut notes = Vec::new();
    let mut load = Vec::new();
    let mut copied = BTreeSet::new();
    for m in &p.modules {
        let fate = match deps.resolve(m) {
            ModuleFate::Module(files) => {
                for f in files {
                    if copied.insert(f.clone()) {
                        copy_module(&k.modules_dir.join(&f), &mdir.join(strip_compression(&f)))?;
                    }
                }
                load.push(m.clone());
                "module"
            }
            ModuleFate::BuiltIn => "built-in",
            ModuleFate::Absent => "absent",
        };
        notes.push(ModuleNote {
            name: m.clone(),
            fate,
        });
    }
    kernel::run(
        Command::new(kernel::depmod())
            .arg("-b")
            .arg(stage)
            .arg(&k.release),
    )
    .with_context(|| format!("depmod for the initramfs of kernel {}", k.spec.label))?;
    fs::write(stage.join("etc/nsfast/modules"), load.join("\n") + "\n")?;

    let file = fs::File::create(out).with_context(|| format!("creating {}", out.display()))?;
    let mut w = CpioWriter::new(BufWriter::new(file));
    w.dir("dev")?;
    w.char_dev("dev/console", 0o600, 5, 1)?;
    w.char_dev("dev/null", 0o666, 1, 3)?;
    write_tree(&mut w, stage)?;
    w.finish()?;
    // The archive holds everything: the tree would only double the disk a run needs (one
    // per kernel and profile, hundreds of MiB each).
    fs::remove_dir_all(stage).with_context(|| format!("removing {}", stage.display()))?;
    Ok(notes)
}

fn strip_compression(path: &str) -> String {
    for ext in [".xz", ".zst", ".gz"] {
        if let Some(p) = path.strip_suffix(ext) {
            return p.to_string();
        }
    }
    path.to_string()
}

fn copy_module(src: &Path, dst: &Path) -> Result<()> {
    if let Some(parent) = dst.parent() {
        fs::create_dir_all(parent)?;
    }
    let name = src.to_string_lossy();
    let tool = if name.ends_with(".xz") {
        Some("xz")
    } else if name.ends_with(".zst") {
        Some("zstd")
    } else if name.ends_with(".gz") {
        Some("gzip")
    } else {
        None
    };
    match tool {
        None => {
            fs::copy(src, dst).with_context(|| format!("copying {}", src.display()))?;
        }
        Some(tool) => {
            let out = Command::new(tool)
                .arg("-dc")
                .arg(src)
                .output()
                .with_context(|| {
                    format!("running {tool} (install it) to unpack {}", src.display())
                })?;
            if !out.status.success() {
                bail!(
                    "{tool} -dc {} failed: {}",
                    src.display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
            fs::write(dst, out.stdout)?;
        }
    }
    Ok(())
}

/// Copies an executable without its debug sections (`strip --strip-debug` keeps the symbols,
/// so backtraces still name functions); a plain copy when strip is missing or fails.
fn copy_binary(src: &Path, dst: &Path) -> Result<()> {
    if let Some(parent) = dst.parent() {
        fs::create_dir_all(parent)?;
    }
    let stripped = Command::new("strip")
        .arg("--strip-debug")
        .arg("-o")
        .arg(dst)
        .arg(src)
        .output()
        .is_ok_and(|o| o.status.success());
    if !stripped {
        tracing::debug!("strip failed for {}; copying it whole", src.display());
        fs::copy(src, dst).with_context(|| format!("copying {}", src.display()))?;
    }
    fs::set_permissions(dst, fs::Permissions::from_mode(0o755))?;
    Ok(())
}

fn copy_file(src: &Path, dst: &Path, mode: u32) -> Result<()> {
    if let Some(parent) = dst.parent() {
        fs::create_dir_all(parent)?;
    }
    fs::copy(src, dst)
        .with_context(|| format!("copying {} to {}", src.display(), dst.display()))?;
    fs::set_permissions(dst, fs::Permissions::from_mode(mode))?;
    Ok(())
}

/// Absolute paths of the shared libraries (and the loader) `bin` needs, from `ldd`.
/// A static binary needs none.
pub fn shared_libs(bin: &Path) -> Result<Vec<PathBuf>> {
    let out = Command::new("ldd")
        .arg(bin)
        .output()
        .context("running ldd (install libc-bin)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        // "not a dynamic executable"
        return Ok(Vec::new());
    }
    parse_ldd(&text).with_context(|| format!("ldd {}", bin.display()))
}

/// Parses `ldd` output; a library it could not find is an error naming it.
pub fn parse_ldd(text: &str) -> Result<Vec<PathBuf>> {
    let mut libs = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.contains("=> not found") {
            bail!("shared library not found: {line}");
        }
        let path = match line.split_once("=>") {
            Some((_, rhs)) => rhs.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            libs.push(PathBuf::from(p));
        }
    }
    Ok(libs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpio_layout() {
        let mut w = CpioWriter::new(Vec::new());
        w.dir("bin").unwrap();
        w.file("bin/x", 0o755, b"hello").unwrap();
        w.symlink("bin/y", "x").unwrap();
        w.char_dev("dev/console", 0o600, 5, 1).unwrap();
        let buf = w.finish().unwrap();
        assert_eq!(buf.len() % 512, 0);
        assert!(buf.starts_with(b"070701"));
        let s = String::from_utf8_lossy(&buf);
        // The file entry: mode 0100755, size 5, then name, NUL, padding, data.
        let at = s.find("bin/x\0").unwrap();
        let hdr = &s[at - 110..at];
        assert_eq!(&hdr[14..22], "000081ed");
        assert_eq!(&hdr[54..62], "00000005");
        let data_at = (at + 6).div_ceil(4) * 4;
        assert_eq!(&buf[data_at..data_at + 5], b"hello");
        // Every header starts 4-aligned.
        for (i, _) in s.match_indices("070701") {
            assert_eq!(i % 4, 0);
        }
        assert!(s.contains("TRAILER!!!"));
        // dev/console is char 5:1
        let at = s.find("dev/console\0").unwrap();
        let hdr = &s[at - 110..at];
        assert_eq!(&hdr[14..22], "00002180");
        assert_eq!(&hdr[78..86], "00000005");
        assert_eq!(&hdr[86..94], "00000001");
    }

    #[test]
    fn ldd_parsing() {
        let t = "\tlinux-vdso.so.1 (0x00007ffd)\n\tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x1)\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x2)\n\t/lib64/ld-linux-x86-64.so.2 (0x3)\n";
        let libs = parse_ldd(t).unwrap();
        assert_eq!(
            libs,
            [
                PathBuf::from("/lib/x86_64-linux-gnu/libgcc_s.so.1"),
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2")
            ]
        );
        let e = parse_ldd("\tlibfoo.so.1 => not found\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("libfoo.so.1"), "{e}");
        assert_eq!(strip_compression("kernel/a.ko.xz"), "kernel/a.ko");
        assert_eq!(strip_compression("kernel/a.ko"), "kernel/a.ko");
    }
}
