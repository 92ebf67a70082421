//! Pod errors: one enum, each message naming the object and, for bad input, what is valid.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum PodError {
    /// Bad pod name.
    #[error("invalid pod name {0:?}: use 1-40 characters from [a-z0-9-], starting with a letter or digit")]
    BadName(String),
    /// Bad address.
    #[error("invalid --ip {0:?}: expected an IPv4 address with optional prefix, e.g. 10.244.1.5/24 (prefix 8-32), or an IPv6 one, e.g. fd00:10:244::5/64 (prefix 16-128; not link-local, multicast, loopback or unspecified)")]
    BadIp(String),
    /// Two addresses of one family, or none at all.
    #[error("invalid --ip {value:?}: {reason}; a pod has one IPv4 and/or one IPv6 address, e.g. --ip 10.244.1.5/24,fd00:10:244::5/64")]
    BadIpList { value: String, reason: String },
    /// Bad mode.
    #[error("invalid --mode {0:?}: expected netkit, netkit-l2, veth or auto")]
    BadMode(String),
    /// Bad interface name.
    #[error("invalid interface name {0:?}: must be 1-15 characters from A-Z a-z 0-9 _ . - and not \".\" or \"..\"")]
    BadIfName(String),
    /// Netkit requested on a kernel without it.
    #[error("kernel {0} lacks netkit (needs Linux >= 6.7 with CONFIG_NETKIT): use --mode veth or --mode auto; nothing was changed")]
    NoNetkit(String),
    /// TCX requested on a kernel without it.
    #[error("kernel {kernel} lacks TCX (BPF_TCX_INGRESS links, Linux >= 6.6), which NSFAST_POD_ATTACH=tcx asks for ({reason}): use tc or auto; nothing was changed")]
    NoTcx { kernel: String, reason: String },
    /// The caller runs in a mount namespace other than PID 1's (as `ip netns exec` makes).
    #[error("refusing to change pods from a private mount namespace, as `ip netns exec` makes ({0}): the pod namespaces and bpffs pins made here would vanish with it and leave a dead pod. Run nsfast in the host's mount namespace: `nsfast pod ... --host NS` instead of `ip netns exec NS nsfast pod ...`, or `nsenter --net=/run/netns/NS nsfast ...` (which keeps the mount namespace); nothing was changed")]
    PrivateMountNs(String),
    /// Bad attach method.
    #[error("invalid attach method {0:?}: expected auto, tcx or tc")]
    BadAttach(String),
    /// Bad NSFAST_POD_ATTACH.
    #[error("invalid NSFAST_POD_ATTACH={0:?}: expected auto, tcx or tc")]
    BadAttachEnv(String),
    /// A pod of that name exists on the host.
    #[error("pod {name:?} already exists on host {host}")]
    Exists { name: String, host: String },
    /// Address already used by another pod on the host.
    #[error("address {ip} is already used by pod {other:?} on host {host}")]
    IpInUse {
        ip: std::net::IpAddr,
        other: String,
        host: String,
    },
    /// No pod of that name on the host.
    #[error("no pod {name:?} on host {host} (see `nsfast pod list --host ...`)")]
    NotFound { name: String, host: String },
    /// The host namespace does not exist.
    #[error("host network namespace {0:?} not found under /run/netns")]
    NoHost(String),
    /// The uplink device does not exist on the host.
    #[error("uplink device {dev:?} not found in host namespace {host}")]
    NoUplink { dev: String, host: String },
    /// A network namespace operation failed.
    #[error(transparent)]
    Netns(#[from] nsfast_sys::netns::NetnsError),
    /// An rtnetlink operation failed.
    #[error(transparent)]
    Net(#[from] nsfast_sys::net::NetError),
    /// Loading the BPF object failed.
    #[error("load the pod BPF object")]
    Load(#[source] Box<aya::EbpfError>),
    /// A program operation failed.
    #[error("{what}")]
    Program {
        what: String,
        #[source]
        source: Box<aya::programs::ProgramError>,
    },
    /// A map operation failed.
    #[error("{what}")]
    Map {
        what: String,
        #[source]
        source: Box<aya::maps::MapError>,
    },
    /// A link or pin operation failed.
    #[error("{what}")]
    Bpf {
        what: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// File or syscall error.
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// A NetworkPolicy input, label or namespace that does not check.
    #[error("invalid policy input: {0}; nothing was changed")]
    BadPolicy(String),
    /// The stored policies do not check (the file was changed by hand?).
    #[error("stored policies {path} do not check: {why}")]
    BadPolicyState { path: PathBuf, why: String },
    /// State file unreadable.
    #[error("corrupt pod state file {path}")]
    State {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

impl PodError {
    /// A bad value the caller gave (name, address, mode, interface, attach method): the
    /// command lines exit 2 for these, 1 for the rest.
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            PodError::BadName(_)
                | PodError::BadIp(_)
                | PodError::BadIpList { .. }
                | PodError::BadMode(_)
                | PodError::BadIfName(_)
                | PodError::BadAttach(_)
                | PodError::BadAttachEnv(_)
                | PodError::BadPolicy(_)
        )
    }
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let what = what.into();
        move |source| PodError::Io { what, source }
    }
    pub(crate) fn prog(
        what: impl Into<String>,
    ) -> impl FnOnce(aya::programs::ProgramError) -> Self {
        let what = what.into();
        move |e| PodError::Program {
            what,
            source: Box::new(e),
        }
    }
    pub(crate) fn map(what: impl Into<String>) -> impl FnOnce(aya::maps::MapError) -> Self {
        let what = what.into();
        move |e| PodError::Map {
            what,
            source: Box::new(e),
        }
    }
}
