//! Errors of the sockmap shortcut.

use std::path::PathBuf;

/// Everything that can go wrong attaching or inspecting the shortcut.
#[derive(Debug, thiserror::Error)]
pub enum SockmapError {
    /// The cgroup could not be found or created.
    #[error(transparent)]
    Cgroup(#[from] nsfast_sys::cgroup::CgroupError),
    /// No cgroup was given (the shortcut never picks or creates one).
    #[error("no cgroup given: name the cgroup to accelerate with --cgroup PATH (an existing cgroup2 directory) or --slice NAME.slice (a started systemd slice), or run it as nsfast-sockmap@NAME.slice")]
    NoCgroup,
    /// A malformed systemd slice name.
    #[error("invalid slice name {name:?}: {why}")]
    BadSlice { name: String, why: String },
    /// The shortcut is already attached to this cgroup.
    #[error("nsfast sockmap is already attached to cgroup {path} (program id {prog_id}{}); stop it first", .pid.map(|p| format!(", loader pid {p}")).unwrap_or_default())]
    AlreadyAttached {
        path: PathBuf,
        prog_id: u32,
        pid: Option<u32>,
    },
    /// Loading the BPF object failed (verifier, missing kernel feature, permissions).
    #[error("loading the sockmap BPF programs (needs root or CAP_BPF+CAP_NET_ADMIN, and a kernel with sockmap and sk_storage, >= 5.10)")]
    Load(#[source] Box<aya::EbpfError>),
    /// A program operation failed.
    #[error("{what}")]
    Program {
        what: &'static str,
        #[source]
        source: Box<aya::programs::ProgramError>,
    },
    /// A map operation failed.
    #[error("{what}")]
    Map {
        what: &'static str,
        #[source]
        source: Box<aya::maps::MapError>,
    },
    /// The BPF object lacks an expected program or map (build mismatch).
    #[error("BPF object has no {0}")]
    Missing(&'static str),
    /// Neither hook that counts what receivers read could be attached (without one no sender
    /// may redirect), or the splice guard could not and the risk was not accepted.
    #[error(transparent)]
    Readers(#[from] nsfast_bpf::sockmap_readers::AttachError),
    /// Another system error.
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

impl SockmapError {
    pub(crate) fn prog(what: &'static str) -> impl FnOnce(aya::programs::ProgramError) -> Self {
        move |e| Self::Program {
            what,
            source: Box::new(e),
        }
    }

    pub(crate) fn map(what: &'static str) -> impl FnOnce(aya::maps::MapError) -> Self {
        move |e| Self::Map {
            what,
            source: Box::new(e),
        }
    }
}
