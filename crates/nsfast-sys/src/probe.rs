//! Kernel feature probe: what this kernel offers nsfast, each answer with its reason.
//!
//! Probes try the real thing where that is harmless (a netkit pair in a throwaway network
//! namespace that dies with its thread, a verifier load of a three-instruction program that is
//! never attached, a `setsockopt` on an unbound UDP socket) and otherwise read /proc and /sys.
//!
//! vsock is probed **only** through /proc and /sys (module state, sysctls): this never opens
//! an `AF_VSOCK` socket, because a host's vsock device may belong to someone else.

use std::fs;
use std::io;
use std::path::PathBuf;

use crate::bpf::{self, Insn};
use crate::kernel::{self, KernelVersion};

/// One probed feature.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Feature {
    /// Stable identifier, e.g. `netkit`, `vsock_loopback`.
    pub name: &'static str,
    /// Whether nsfast can use it on this kernel.
    pub available: bool,
    /// Why: what was tried or read, and what it said.
    pub reason: String,
    /// What nsfast uses it for.
    pub enables: &'static str,
    /// What nsfast does where it is missing.
    pub fallback: &'static str,
}

/// Every feature [`probe_all`] reports, in its order, as (name, what nsfast uses it for,
/// what nsfast does without it), then those of [`PROBED_BY_CALLER`].
pub const USES: &[(&str, &str, &str)] = &[
    (
        "netkit",
        "netkit pods (pod add --mode netkit|netkit-l2; auto picks them); bench topology netkit",
        "pods on veth (auto picks veth); bench skips netkit",
    ),
    (
        "tcx",
        "pod and uplink programs attached as TCX links",
        "classic tc: clsact qdisc + cls_bpf filters (NSFAST_POD_ATTACH=tc)",
    ),
    (
        "bpf_redirect_peer",
        "pod datapath: pod -> pod and wire -> pod straight into the pod's namespace",
        "none: nsfast pod and nsfast-cni need it (Linux 5.10)",
    ),
    (
        "netns_cookie_sockops",
        "namespace cookie in sockops (informational)",
        "not needed: the sockmap shortcut pairs by 4-tuple and both ISNs",
    ),
    (
        "netns_cookie_sk_msg",
        "namespace cookie in sk_msg (informational)",
        "not needed: the sockmap shortcut keys by socket cookies in socket storage",
    ),
    (
        "udp_gso",
        "vpnrelay sends batches as UDP GSO super-datagrams",
        "vpnrelay sends single datagrams, batched by sendmmsg (as --no-gso)",
    ),
    (
        "udp_gro",
        "vpnrelay receives coalesced UDP GRO batches",
        "vpnrelay receives single datagrams by recvmmsg (as --no-gro)",
    ),
    (
        "vsock",
        "nsfast vsock relay/bridge/bench on AF_VSOCK",
        "hybrid vsock (UNIX socket), TCP and UNIX addresses only",
    ),
    (
        "vsock_loopback",
        "vsock within one machine (CID 1): bench topologies vsock, vsock-relay, vsock-socat",
        "bench skips the vsock topologies",
    ),
    (
        "vsock_virtio",
        "a guest's vsock to its host (vsock-connect:2:PORT)",
        "no guest-to-host vsock (not a virtio-vsock guest)",
    ),
    (
        "vhost_vsock",
        "vsock bridge members that are QEMU guests on AF_VSOCK",
        "bridge members over hybrid vsock only (--vm CID=hybrid:PATH)",
    ),
    (
        "vsock_vmci",
        "vsock to VMware guests/hosts",
        "no VMware vsock",
    ),
    (
        "vsock_hyperv",
        "vsock to Hyper-V guests/hosts",
        "no Hyper-V vsock",
    ),
    (
        "vsock_ns_mode",
        "nsfast vsock ns show: per-namespace vsock (Linux 7.0)",
        "one vsock space shared by every namespace",
    ),
    (
        "vsock_child_ns_mode",
        "nsfast vsock ns create --mode global|local (Linux 7.0)",
        "new namespaces share the global vsock space",
    ),
    (
        "vsock_sockmap",
        "vsock relay --path kernel can join AF_VSOCK legs in a sockmap (Linux 6.4+; experimental)",
        "AF_VSOCK legs are relayed with splice (TCP <-> TCP still joins)",
    ),
    (
        "vsock_zerocopy",
        "MSG_ZEROCOPY on AF_VSOCK sends (SO_ZEROCOPY, Linux 6.7+; `nsfast vsock relay --zerocopy on`)",
        "vsock sends copy",
    ),
    (
        "splice_guard",
        "the sockmap shortcut (sockmap run, pod shortcut) is safe for readers that switch \
         from recv(2) to splice(2)/sendfile(2), e.g. HAProxy with option splice-*",
        "sockmap run, pod shortcut enable and the CNI's \"shortcut\": true refuse to start \
         unless --allow-splice-hole (CNI: \"allowSpliceHole\": true) accepts that such a \
         reader may miss bytes",
    ),
];

/// The feature names [`probe_all`] reports, in its order.
pub fn feature_names() -> impl Iterator<Item = &'static str> {
    USES.iter().map(|u| u.0)
}

/// A feature of [`USES`] with its answer (for probes that live in other crates, such as the
/// splice guard's, which needs the BPF object).
pub fn feature(name: &'static str, available: bool, reason: impl Into<String>) -> Feature {
    let (enables, fallback) = USES
        .iter()
        .find(|u| u.0 == name)
        .map(|u| (u.1, u.2))
        .unwrap_or(("", ""));
    Feature {
        name,
        available,
        reason: reason.into(),
        enables,
        fallback,
    }
}

/// Everything [`probe_all`] found.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    /// `uname -r`.
    pub kernel_release: String,
    /// Parsed version of `kernel_release`.
    pub kernel_version: KernelVersion,
    pub features: Vec<Feature>,
}

impl Report {
    /// The feature named `name`, if probed.
    pub fn get(&self, name: &str) -> Option<&Feature> {
        self.features.iter().find(|f| f.name == name)
    }
}

fn yes(name: &'static str, reason: impl Into<String>) -> Feature {
    feature(name, true, reason)
}

fn no(name: &'static str, reason: impl Into<String>) -> Feature {
    feature(name, false, reason)
}

/// The vsock modules probed, as (feature name, module name, what it is).
pub const VSOCK_MODULES: &[(&str, &str, &str)] = &[
    ("vsock", "vsock", "AF_VSOCK core"),
    (
        "vsock_loopback",
        "vsock_loopback",
        "local transport (CID 1)",
    ),
    (
        "vsock_virtio",
        "vmw_vsock_virtio_transport",
        "guest transport over virtio-vsock",
    ),
    (
        "vhost_vsock",
        "vhost_vsock",
        "host transport for guests (/dev/vhost-vsock)",
    ),
    (
        "vsock_vmci",
        "vmw_vsock_vmci_transport",
        "VMware VMCI transport",
    ),
    ("vsock_hyperv", "hv_sock", "Hyper-V transport"),
];

/// The features of [`USES`] that [`probe_all`] leaves to its caller, which appends them to the
/// report in this order: the splice guard's probe attaches the sockmap object's programs,
/// which this crate does not have (`nsfast probe` does it with nsfast-bpf).
pub const PROBED_BY_CALLER: &[&str] = &["splice_guard"];

/// Probes every feature. Never fails: a probe that cannot run reports `available: false`
/// and says why.
pub fn probe_all() -> Report {
    let kv = KernelVersion::current();
    let mut features = vec![
        probe_netkit(),
        probe_tcx(kv),
        probe_redirect_peer(kv),
        probe_netns_cookie(
            "netns_cookie_sockops",
            bpf::BPF_PROG_TYPE_SOCK_OPS,
            "sockops",
        ),
        probe_netns_cookie("netns_cookie_sk_msg", bpf::BPF_PROG_TYPE_SK_MSG, "sk_msg"),
        probe_udp_opt("udp_gso", UDP_SEGMENT, "UDP_SEGMENT", 1200),
        probe_udp_opt("udp_gro", UDP_GRO, "UDP_GRO", 1),
    ];
    let mods = ModuleIndex::load();
    for (name, module, what) in VSOCK_MODULES {
        let state = mods.state(module);
        let f = feature(
            name,
            state.usable(),
            format!("{what}: module {module} {}", state.describe(&mods)),
        );
        features.push(f);
    }
    features.push(probe_vsock_sysctl("vsock_ns_mode", "ns_mode", kv));
    features.push(probe_vsock_sysctl(
        "vsock_child_ns_mode",
        "child_ns_mode",
        kv,
    ));
    let vsock = mods.state("vsock");
    let kallsyms = std::fs::read_to_string("/proc/kallsyms").unwrap_or_default();
    features.push(probe_vsock_sockmap(kv, vsock, &kallsyms));
    features.push(probe_vsock_zerocopy(kv, vsock));
    Report {
        kernel_release: kernel::release(),
        kernel_version: kv,
        features,
    }
}

/// Whether AF_VSOCK sockets can join a sockmap, decided without opening one: vsock's
/// `vsock_bpf_update_proto` (net/vmw_vsock/vsock_bpf.c, Linux 6.4, built with
/// CONFIG_BPF_SYSCALL) is in /proc/kallsyms while the vsock module is loaded; when it is not
/// loaded (no symbols to look at), the kernel version decides. Which transports have
/// `read_skb` (loopback, virtio, vhost since 6.4; not VMCI or Hyper-V) is left to the relay,
/// whose join is refused with EOPNOTSUPP otherwise.
fn probe_vsock_sockmap(kv: KernelVersion, vsock: ModuleState, kallsyms: &str) -> Feature {
    const NAME: &str = "vsock_sockmap";
    if !vsock.usable() {
        return no(NAME, "no vsock module");
    }
    let sym = kallsyms
        .lines()
        .any(|l| l.split_whitespace().nth(2) == Some("vsock_bpf_update_proto"));
    if sym {
        return yes(
            NAME,
            "vsock_bpf_update_proto is in /proc/kallsyms (vsock in sockmap)",
        );
    }
    let loaded = matches!(vsock, ModuleState::Loaded | ModuleState::BuiltIn);
    match (loaded, kv.at_least(6, 4)) {
        (true, _) if !kallsyms.is_empty() => no(
            NAME,
            format!(
                "vsock is loaded but /proc/kallsyms has no vsock_bpf_update_proto (kernel {kv}: \
                 before 6.4, or built without CONFIG_BPF_SYSCALL)"
            ),
        ),
        (_, true) => yes(
            NAME,
            format!("kernel {kv} >= 6.4 (by version: vsock not loaded or kallsyms unreadable)"),
        ),
        (_, false) => no(
            NAME,
            format!("kernel {kv} < 6.4: vsock cannot join a sockmap"),
        ),
    }
}

/// MSG_ZEROCOPY for AF_VSOCK (Linux 6.7), by kernel version and the vsock module (its code is
/// static functions that may be inlined, so kallsyms cannot tell).
fn probe_vsock_zerocopy(kv: KernelVersion, vsock: ModuleState) -> Feature {
    const NAME: &str = "vsock_zerocopy";
    if !vsock.usable() {
        return no(NAME, "no vsock module");
    }
    if kv.at_least(6, 7) {
        yes(NAME, format!("kernel {kv} >= 6.7 (by version)"))
    } else {
        no(
            NAME,
            format!("kernel {kv} < 6.7: no MSG_ZEROCOPY for vsock"),
        )
    }
}

/// Runs `f` on a thread inside a fresh, unnamed network namespace. The namespace has no name
/// and no bind mount: it disappears when the thread ends, whatever happens.
fn in_throwaway_netns<R: Send>(f: impl FnOnce() -> R + Send) -> io::Result<R> {
    std::thread::scope(|s| {
        s.spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).map_err(io::Error::from)?;
            Ok(f())
        })
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("probe thread panicked")))
    })
}

fn probe_netkit() -> Feature {
    const NAME: &str = "netkit";
    match crate::net::netkit_trial() {
        Ok(()) => yes(
            NAME,
            "created an L3 netkit pair in a throwaway network namespace",
        ),
        Err(crate::net::NetError::Io(e)) => no(
            NAME,
            format!("cannot test: creating a throwaway network namespace failed: {e} (needs root)"),
        ),
        Err(e) => {
            let why = crate::report::error_chain(&e);
            no(
                NAME,
                format!("the kernel refused to create a netkit pair in a throwaway network namespace: {why}"),
            )
        }
    }
}

/// TCX (BPF_TCX_INGRESS links, Linux 6.6): probed on its own for callers that need only it.
pub fn tcx() -> Feature {
    probe_tcx(KernelVersion::current())
}

fn probe_tcx(kv: KernelVersion) -> Feature {
    const NAME: &str = "tcx";
    // A read-only query of TCX ingress on the loopback device of a throwaway namespace.
    let r = in_throwaway_netns(|| bpf::prog_query_ifindex(1, bpf::BPF_TCX_INGRESS));
    match r {
        Ok(Ok(_)) => yes(NAME, "BPF_PROG_QUERY for BPF_TCX_INGRESS on lo succeeded"),
        Ok(Err(e)) if e.raw_os_error() == Some(libc::EINVAL) => no(
            NAME,
            format!("BPF_PROG_QUERY rejects attach type BPF_TCX_INGRESS (EINVAL); kernel {kv}, TCX needs 6.6"),
        ),
        Ok(Err(e)) if kv.at_least(6, 6) => yes(
            NAME,
            format!("kernel {kv} >= 6.6 (trial query failed: {e})"),
        ),
        Ok(Err(e)) => no(NAME, format!("kernel {kv} < 6.6 (trial query failed: {e})")),
        Err(e) if kv.at_least(6, 6) => yes(
            NAME,
            format!("kernel {kv} >= 6.6 (not tried: throwaway namespace failed: {e})"),
        ),
        Err(e) => no(
            NAME,
            format!("kernel {kv} < 6.6 (not tried: throwaway namespace failed: {e})"),
        ),
    }
}

const HELPER_REDIRECT_PEER: i32 = 155;
const HELPER_GET_NETNS_COOKIE: i32 = 122;

fn probe_redirect_peer(kv: KernelVersion) -> Feature {
    const NAME: &str = "bpf_redirect_peer";
    let prog = [
        Insn::mov64_imm(1, 1),
        Insn::mov64_imm(2, 0),
        Insn::call(HELPER_REDIRECT_PEER),
        Insn::exit(),
    ];
    match bpf::trial_load(bpf::BPF_PROG_TYPE_SCHED_CLS, &prog) {
        Ok(()) => yes(
            NAME,
            "the verifier accepted a tc program calling bpf_redirect_peer",
        ),
        Err(e) if is_perm(&e.error) => {
            let by_version = kv.at_least(5, 10);
            feature(
                NAME,
                by_version,
                format!(
                    "kernel {kv} {} 5.10 (trial load not permitted: {e}; run as root to test)",
                    if by_version { ">=" } else { "<" }
                ),
            )
        }
        Err(e) => no(
            NAME,
            format!("the verifier refused a tc program calling bpf_redirect_peer: {e}"),
        ),
    }
}

fn probe_netns_cookie(name: &'static str, prog_type: u32, what: &str) -> Feature {
    // r1 is the context on entry: bpf_get_netns_cookie(ctx); return 1.
    let prog = [
        Insn::call(HELPER_GET_NETNS_COOKIE),
        Insn::mov64_imm(0, 1),
        Insn::exit(),
    ];
    match bpf::trial_load(prog_type, &prog) {
        Ok(()) => yes(
            name,
            format!("the verifier accepted a {what} program calling bpf_get_netns_cookie"),
        ),
        Err(e) if is_perm(&e.error) => no(
            name,
            format!("cannot test: trial load not permitted ({e}); run as root"),
        ),
        Err(e) => no(
            name,
            format!("the verifier refused a {what} program calling bpf_get_netns_cookie: {e}"),
        ),
    }
}

fn is_perm(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EPERM) | Some(libc::EACCES))
}

const UDP_SEGMENT: libc::c_int = 103;
const UDP_GRO: libc::c_int = 104;

fn probe_udp_opt(
    name: &'static str,
    opt: libc::c_int,
    opt_name: &str,
    value: libc::c_int,
) -> Feature {
    let sock = match socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None) {
        Ok(s) => s,
        Err(e) => return no(name, format!("cannot test: UDP socket: {e}")),
    };
    match setsockopt_int(&sock, libc::SOL_UDP, opt, value) {
        Ok(()) => yes(
            name,
            format!("setsockopt({opt_name}) on a UDP socket succeeded"),
        ),
        Err(e) => no(
            name,
            format!("setsockopt({opt_name}) on a UDP socket failed: {e}"),
        ),
    }
}

fn setsockopt_int(
    sock: &socket2::Socket,
    level: libc::c_int,
    opt: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: the fd is a live socket owned by `sock`; the option value points to a c_int that
    // lives across the call and its exact size is passed.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            level,
            opt,
            &value as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn probe_vsock_sysctl(name: &'static str, key: &str, kv: KernelVersion) -> Feature {
    let path = format!("/proc/sys/net/vsock/{key}");
    match fs::read_to_string(&path) {
        Ok(v) => yes(name, format!("{path} = {}", v.trim())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let why = if !kv.at_least(7, 0) {
                format!("kernel {kv} < 7.0 has no vsock namespace modes")
            } else if !std::path::Path::new("/sys/module/vsock").exists() {
                "the vsock module is not loaded".to_string()
            } else {
                "this kernel's vsock has no namespace modes".to_string()
            };
            no(name, format!("{path} does not exist: {why}"))
        }
        Err(e) => no(name, format!("cannot read {path}: {e}")),
    }
}

/// Where a module stands on the running kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModuleState {
    Loaded,
    BuiltIn,
    /// Not loaded, but a module file is listed in modules.dep.
    Loadable,
    Absent,
}

impl ModuleState {
    /// Loaded, built in, or loadable on demand.
    pub fn usable(self) -> bool {
        self != ModuleState::Absent
    }

    fn describe(self, idx: &ModuleIndex) -> String {
        match self {
            ModuleState::Loaded => "is loaded (/proc/modules)".into(),
            ModuleState::BuiltIn => {
                "is built in (modules.builtin, or /sys/module entry without /proc/modules)".into()
            }
            ModuleState::Loadable => "is not loaded but loadable (listed in modules.dep)".into(),
            ModuleState::Absent => match &idx.dir {
                Some(d) => format!(
                    "is neither loaded, built in, nor listed in {}/modules.dep",
                    d.display()
                ),
                None => format!(
                    "is not loaded and there is no module directory for {} (/lib/modules)",
                    kernel::release()
                ),
            },
        }
    }
}

/// The running kernel's module lists: /proc/modules, modules.builtin and modules.dep.
#[derive(Debug, Default)]
pub struct ModuleIndex {
    dir: Option<PathBuf>,
    loaded: Vec<String>,
    builtin: Vec<String>,
    available: Vec<String>,
    /// Names under /sys/module (loaded modules, and built-in ones with parameters or a version).
    sysfs: Vec<String>,
}

/// `kernel/net/vmw_vsock/vsock-loopback.ko.xz` → `vsock_loopback`.
fn module_name_from_path(p: &str) -> String {
    let base = p.rsplit('/').next().unwrap_or(p);
    let base = base.split(".ko").next().unwrap_or(base);
    base.replace('-', "_")
}

impl ModuleIndex {
    /// Reads the lists of the running kernel; missing files give empty lists.
    pub fn load() -> Self {
        let rel = kernel::release();
        let dir = ["/lib/modules", "/usr/lib/modules"]
            .iter()
            .map(|b| PathBuf::from(b).join(&rel))
            .find(|d| d.is_dir());
        let read_paths = |file: &str| -> Vec<String> {
            dir.as_ref()
                .and_then(|d| fs::read_to_string(d.join(file)).ok())
                .map(|t| {
                    t.lines()
                        .filter_map(|l| l.split(':').next())
                        .filter(|p| !p.trim().is_empty())
                        .map(module_name_from_path)
                        .collect()
                })
                .unwrap_or_default()
        };
        let loaded = fs::read_to_string("/proc/modules")
            .map(|t| {
                t.lines()
                    .filter_map(|l| l.split_whitespace().next())
                    .map(|s| s.replace('-', "_"))
                    .collect()
            })
            .unwrap_or_default();
        let sysfs = fs::read_dir("/sys/module")
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .filter_map(|e| e.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default();
        Self {
            sysfs,
            builtin: read_paths("modules.builtin"),
            available: read_paths("modules.dep"),
            dir,
            loaded,
        }
    }

    /// The state of module `name` (`-` and `_` are the same).
    pub fn state(&self, name: &str) -> ModuleState {
        let n = name.replace('-', "_");
        if self.loaded.contains(&n) {
            ModuleState::Loaded
        } else if self.builtin.contains(&n) || self.sysfs.contains(&n) {
            // A /sys/module entry for a module that /proc/modules does not list is built in.
            ModuleState::BuiltIn
        } else if self.available.contains(&n) {
            ModuleState::Loadable
        } else {
            ModuleState::Absent
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_names_from_paths() {
        assert_eq!(
            module_name_from_path("kernel/net/vmw_vsock/vsock_loopback.ko.xz"),
            "vsock_loopback"
        );
        assert_eq!(module_name_from_path("kernel/drivers/net/veth.ko"), "veth");
        assert_eq!(module_name_from_path("kernel/x/hv-sock.ko.zst"), "hv_sock");
    }

    #[test]
    fn vsock_sockmap_from_kallsyms_then_version() {
        let v = |s| KernelVersion::parse(s).unwrap();
        let syms = "0000000000000000 t vsock_bpf_update_proto\t[vsock]\n";
        let other = "0000000000000000 T vsock_core_register\t[vsock]\n";
        assert!(probe_vsock_sockmap(v("6.1.0"), ModuleState::Loaded, syms).available);
        let f = probe_vsock_sockmap(v("6.12.0"), ModuleState::Loaded, other);
        assert!(!f.available, "loaded without the symbol: {}", f.reason);
        assert!(probe_vsock_sockmap(v("6.12.0"), ModuleState::Loadable, "").available);
        assert!(!probe_vsock_sockmap(v("6.1.0"), ModuleState::Loadable, other).available);
        assert!(!probe_vsock_sockmap(v("7.2.0"), ModuleState::Absent, syms).available);
        assert!(probe_vsock_zerocopy(v("6.7.0"), ModuleState::Loadable).available);
        assert!(!probe_vsock_zerocopy(v("6.6.9"), ModuleState::Loaded).available);
    }

    #[test]
    fn module_state_order() {
        let idx = ModuleIndex {
            dir: None,
            loaded: vec!["vsock".into()],
            builtin: vec!["netkit".into(), "vsock".into()],
            available: vec!["vsock_loopback".into()],
            sysfs: vec!["vsock".into(), "vmw_vsock_virtio_transport".into()],
        };
        assert_eq!(
            idx.state("vmw_vsock_virtio_transport"),
            ModuleState::BuiltIn
        );
        assert_eq!(idx.state("vsock"), ModuleState::Loaded);
        assert_eq!(idx.state("netkit"), ModuleState::BuiltIn);
        assert_eq!(idx.state("vsock-loopback"), ModuleState::Loadable);
        assert_eq!(idx.state("hv_sock"), ModuleState::Absent);
        assert!(!ModuleState::Absent.usable());
    }

    #[test]
    fn probe_all_answers_every_feature_with_a_reason() {
        let r = probe_all();
        let mut names: Vec<&str> = r.features.iter().map(|f| f.name).collect();
        for want in [
            "netkit",
            "tcx",
            "bpf_redirect_peer",
            "netns_cookie_sockops",
            "netns_cookie_sk_msg",
            "udp_gso",
            "udp_gro",
            "vsock",
            "vsock_loopback",
            "vsock_virtio",
            "vhost_vsock",
            "vsock_ns_mode",
            "vsock_child_ns_mode",
        ] {
            assert!(r.get(want).is_some(), "probe has no {want}");
        }
        for f in &r.features {
            assert!(!f.reason.is_empty(), "{} has no reason", f.name);
            assert!(
                !f.enables.is_empty() && !f.fallback.is_empty(),
                "{} has no use or fallback",
                f.name
            );
        }
        // The published name list is the report's, in its order.
        let order: Vec<&str> = r.features.iter().map(|f| f.name).collect();
        assert_eq!(
            order,
            feature_names()
                .filter(|n| !PROBED_BY_CALLER.contains(n))
                .collect::<Vec<_>>()
        );
        assert_eq!(
            feature_names().collect::<Vec<_>>()[order.len()..],
            *PROBED_BY_CALLER,
            "the caller's features come last"
        );
        names.sort();
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n, "duplicate feature names");
        assert_eq!(r.kernel_version, KernelVersion::current());
    }

    #[test]
    fn udp_probe_answers_without_root() {
        // Always answers; whether yes or no depends on the kernel, but the reason names the option.
        let f = probe_udp_opt("udp_gso", UDP_SEGMENT, "UDP_SEGMENT", 1200);
        assert!(f.reason.contains("UDP_SEGMENT"), "{}", f.reason);
    }
}
