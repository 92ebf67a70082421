//! Finds the newest kernel package of a matrix entry, downloads it with the packages that
//! carry the same kernel (Debian 7.x splits image, binary, base and modules), unpacks them
//! once into `build/vm/kernels/`, and locates vmlinuz, the config and the module tree.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::apt::{self, Apt, PkgInfo};
use crate::config::{glob_match, KernelSpec, MajorMinor};

/// An unpacked kernel, ready to boot.
#[derive(Debug, Clone)]
pub struct Kernel {
    pub spec: KernelSpec,
    /// The image package chosen.
    pub package: PkgInfo,
    /// `uname -r` of this kernel (the module directory's name).
    pub release: String,
    pub version: MajorMinor,
    pub vmlinuz: PathBuf,
    pub config: PathBuf,
    /// `<unpacked>/lib/modules/<release>` (or usr/lib/...).
    pub modules_dir: PathBuf,
}

/// The newest package matching `spec.package` in the suite's index.
pub fn resolve(apt: &Apt, spec: &KernelSpec) -> Result<PkgInfo> {
    let prefix: String = spec.package.split('*').next().unwrap_or("").to_string();
    let names = apt.pkgnames(&prefix)?;
    let mut best: Option<PkgInfo> = None;
    for n in names.iter().filter(|n| glob_match(&spec.package, n)) {
        let Some(info) = apt.show(n)? else { continue };
        let newer = match &best {
            None => true,
            Some(b) => {
                apt::compare_versions(&info.version, &b.version).is_gt()
                    || (info.version == b.version && info.name > b.name)
            }
        };
        if newer {
            best = Some(info);
        }
    }
    best.with_context(|| {
        format!(
            "kernel {}: no package in {} matches {:?}; `apt-cache pkgnames {prefix}` with the private \
             configuration under build/vm/apt/{} lists what there is",
            spec.label, spec.suite, spec.package, spec.suite
        )
    })
}

/// The kernel flavour string inside package names: `linux-image-7.2.13+deb14-cloud-amd64` →
/// `7.2.13+deb14-cloud-amd64`.
pub fn abi_of(image: &str) -> &str {
    let s = image.strip_prefix("linux-image-").unwrap_or(image);
    s.strip_suffix("-unsigned").unwrap_or(s)
}

/// `image` and, recursively, every dependency whose name carries the same kernel ABI.
pub fn package_set(apt: &Apt, image: &PkgInfo) -> Result<Vec<PkgInfo>> {
    let abi = abi_of(&image.name).to_string();
    let mut out: BTreeMap<String, PkgInfo> = BTreeMap::new();
    let mut todo = vec![image.clone()];
    while let Some(p) = todo.pop() {
        if out.contains_key(&p.name) {
            continue;
        }
        for d in &p.depends {
            if d.contains(&abi) && !out.contains_key(d) {
                let info = apt.show(d)?.with_context(|| {
                    format!(
                        "{} depends on {d}, which the {} index does not have",
                        p.name, apt.suite
                    )
                })?;
                todo.push(info);
            }
        }
        out.insert(p.name.clone(), p);
    }
    Ok(out.into_values().collect())
}

/// Downloads (cached) and unpacks (cached) the kernel of `spec`.
pub fn fetch(apt: &Apt, spec: &KernelSpec, build: &Path) -> Result<Kernel> {
    let image = resolve(apt, spec)?;
    let pkgs = package_set(apt, &image)?;
    let debs_dir = build.join("debs").join(&spec.suite);
    let mut debs = Vec::new();
    for p in &pkgs {
        debs.push(apt.download(p, &debs_dir)?);
    }
    let root = build.join("kernels").join(&spec.label).join(format!(
        "{}_{}",
        image.name,
        image.version.replace(':', "%3a")
    ));
    let stamp = root.join(".unpacked");
    if !stamp.exists() {
        if root.exists() {
            fs::remove_dir_all(&root).with_context(|| format!("removing {}", root.display()))?;
        }
        fs::create_dir_all(&root)?;
        for d in &debs {
            run(Command::new("dpkg-deb").arg("-x").arg(d).arg(&root))
                .with_context(|| format!("unpacking {}", d.display()))?;
        }
        fs::write(&stamp, "")?;
    }
    locate(spec.clone(), image, &root)
}

fn locate(spec: KernelSpec, package: PkgInfo, root: &Path) -> Result<Kernel> {
    let mut dirs = Vec::new();
    for base in ["lib/modules", "usr/lib/modules"] {
        if let Ok(rd) = fs::read_dir(root.join(base)) {
            for e in rd.flatten() {
                // lib may be a symlink to usr/lib (made for depmod): count each directory once.
                let p = e.path().canonicalize().unwrap_or_else(|_| e.path());
                if p.is_dir() && !dirs.contains(&p) {
                    dirs.push(p);
                }
            }
        }
    }
    let [modules_dir] = dirs.as_slice() else {
        bail!(
            "kernel {}: expected exactly one module directory in {} (lib/modules/* or usr/lib/modules/*), found {}",
            spec.label,
            root.display(),
            dirs.len()
        );
    };
    let release = modules_dir
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let pick = |names: [PathBuf; 2], what: &str| -> Result<PathBuf> {
        names
            .iter()
            .find(|p| p.exists())
            .cloned()
            .with_context(|| format!("kernel {}: no {what} in {}", spec.label, root.display()))
    };
    let vmlinuz = pick(
        [
            root.join(format!("boot/vmlinuz-{release}")),
            modules_dir.join("vmlinuz"),
        ],
        "vmlinuz",
    )?;
    let config = pick(
        [
            root.join(format!("boot/config-{release}")),
            modules_dir.join("config"),
        ],
        "kernel config",
    )?;
    let kv = nsfast_sys::kernel::KernelVersion::parse(&release)
        .with_context(|| format!("kernel {}: cannot parse release {release:?}", spec.label))?;
    Ok(Kernel {
        spec,
        package,
        version: MajorMinor(kv.major, kv.minor),
        release,
        vmlinuz,
        config,
        modules_dir: modules_dir.clone(),
    })
}

pub fn run(cmd: &mut Command) -> Result<()> {
    let out = cmd
        .output()
        .with_context(|| format!("running {:?}", cmd.get_program()))?;
    if !out.status.success() {
        bail!(
            "{:?} failed ({}): {}",
            cmd.get_program(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Where `depmod` lives (often /sbin, which may not be on PATH).
pub fn depmod() -> PathBuf {
    for p in [
        "/usr/sbin/depmod",
        "/sbin/depmod",
        "/usr/bin/depmod",
        "/bin/depmod",
    ] {
        if Path::new(p).exists() {
            return PathBuf::from(p);
        }
    }
    PathBuf::from("depmod")
}

/// Module name from a modules.dep path: `kernel/net/x/vsock-loopback.ko.xz` → `vsock_loopback`.
pub fn module_name(path: &str) -> String {
    let base = path.rsplit('/').next().unwrap_or(path);
    base.split(".ko").next().unwrap_or(base).replace('-', "_")
}

/// Module dependency data of one kernel: name → (path relative to the module dir, deps).
#[derive(Debug, Default)]
pub struct ModuleDeps {
    pub modules: BTreeMap<String, (String, Vec<String>)>,
    pub builtin: BTreeSet<String>,
}

/// What became of a requested module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModuleFate {
    /// Copied (with these files, dependencies first).
    Module(Vec<String>),
    BuiltIn,
    Absent,
}

impl ModuleDeps {
    /// Reads modules.dep (running depmod on a scratch copy of the tree if the package did not
    /// ship one) and modules.builtin.
    pub fn load(k: &Kernel) -> Result<Self> {
        let dep_file = k.modules_dir.join("modules.dep");
        if !dep_file.exists() {
            // depmod -b BASE wants BASE/lib/modules/RELEASE; the unpacked tree may be merged-/usr.
            let base = k
                .modules_dir
                .parent()
                .and_then(Path::parent)
                .and_then(Path::parent)
                .context("module directory too shallow")?;
            let base = if base.ends_with("usr") {
                let top = base.parent().unwrap();
                let lib = top.join("lib");
                if !lib.exists() {
                    std::os::unix::fs::symlink("usr/lib", &lib)
                        .with_context(|| format!("linking {}", lib.display()))?;
                }
                top.to_path_buf()
            } else {
                base.to_path_buf()
            };
            run(Command::new(depmod()).arg("-b").arg(&base).arg(&k.release))
                .with_context(|| format!("depmod for kernel {}", k.spec.label))?;
        }
        let text = fs::read_to_string(&dep_file)
            .with_context(|| format!("reading {}", dep_file.display()))?;
        let mut modules = BTreeMap::new();
        for line in text.lines() {
            let Some((path, deps)) = line.split_once(':') else {
                continue;
            };
            let deps = deps.split_whitespace().map(module_name).collect();
            modules.insert(module_name(path), (path.trim().to_string(), deps));
        }
        let builtin = fs::read_to_string(k.modules_dir.join("modules.builtin"))
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(module_name)
            .collect();
        Ok(Self { modules, builtin })
    }

    /// Resolves `name` to the module files to copy, dependencies first.
    pub fn resolve(&self, name: &str) -> ModuleFate {
        let n = name.replace('-', "_");
        if !self.modules.contains_key(&n) {
            return if self.builtin.contains(&n) {
                ModuleFate::BuiltIn
            } else {
                ModuleFate::Absent
            };
        }
        let mut order = Vec::new();
        let mut seen = BTreeSet::new();
        self.visit(&n, &mut seen, &mut order);
        ModuleFate::Module(order)
    }

    fn visit(&self, n: &str, seen: &mut BTreeSet<String>, order: &mut Vec<String>) {
        if !seen.insert(n.to_string()) {
            return;
        }
        if let Some((path, deps)) = self.modules.get(n) {
            for d in deps {
                self.visit(d, seen, order);
            }
            order.push(path.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn abi_strings() {
        assert_eq!(
            abi_of("linux-image-7.2.13+deb14-cloud-amd64"),
            "7.2.13+deb14-cloud-amd64"
        );
        assert_eq!(
            abi_of("linux-image-6.1.0-50-cloud-amd64-unsigned"),
            "6.1.0-50-cloud-amd64"
        );
    }

    #[test]
    fn module_closure_orders_dependencies_first() {
        let mut d = ModuleDeps::default();
        d.modules
            .insert("vsock".into(), ("kernel/vsock.ko.xz".into(), vec![]));
        d.modules.insert(
            "vmw_vsock_virtio_transport_common".into(),
            ("kernel/common.ko.xz".into(), vec!["vsock".into()]),
        );
        d.modules.insert(
            "vsock_loopback".into(),
            (
                "kernel/vsock_loopback.ko.xz".into(),
                vec!["vmw_vsock_virtio_transport_common".into(), "vsock".into()],
            ),
        );
        d.builtin.insert("netkit".into());
        assert_eq!(
            d.resolve("vsock-loopback"),
            ModuleFate::Module(vec![
                "kernel/vsock.ko.xz".into(),
                "kernel/common.ko.xz".into(),
                "kernel/vsock_loopback.ko.xz".into()
            ])
        );
        assert_eq!(d.resolve("netkit"), ModuleFate::BuiltIn);
        assert_eq!(d.resolve("nope"), ModuleFate::Absent);
    }
}
