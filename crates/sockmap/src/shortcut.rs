//! Load, configure and attach the shortcut; detach on drop.

use std::fs::File;
use std::path::{Path, PathBuf};

use aya::maps::{Array, HashMap as BpfHashMap, MapData, SockHash};
use aya::programs::{CgroupAttachMode, SkMsg, SockOps};
use aya::{Ebpf, EbpfLoader};
use nsfast_sys::cgroup::{cgroup2_mount, Cgroup};
use nsfast_sys::ports::PortList;
use tracing::{info, warn};

use crate::abi::{self, Config};
use crate::error::SockmapError;
use crate::status::{self, Stats};

/// What to attach to.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// cgroup2 directory (it must exist: the shortcut never creates one). Required: `None`
    /// is refused with [`SockmapError::NoCgroup`].
    pub cgroup: Option<PathBuf>,
    /// Only connections to these server ports take the shortcut (default: all).
    pub ports: Option<PortList>,
    /// Connections to these server ports never take the shortcut.
    pub exclude_ports: Option<PortList>,
    /// Bytes a receiver may have unread in its shortcut queue before that direction moves to
    /// TCP (default [`abi::DEFAULT_QUEUE_LIMIT`]).
    pub queue_limit: Option<u64>,
    /// After this many connections in a row between the same endpoints that the shortcut
    /// carried (almost) nothing for, new ones keep TCP without joining; 0: every connection
    /// joins (default [`abi::DEFAULT_ADMIT_AFTER`]).
    pub keep_tcp_after: Option<u32>,
    /// While admission keeps connections between the same endpoints on TCP, one of them
    /// joins anyway at most this often (default [`abi::DEFAULT_ADMIT_PROBE_NS`]).
    pub probe_interval: Option<std::time::Duration>,
    /// Run without the splice guard where it cannot attach (`--allow-splice-hole`): else
    /// attaching fails there (see [`nsfast_bpf::sockmap_readers`]).
    pub allow_splice_hole: bool,
}

impl Options {
    /// The admission settings these options ask for, defaults filled in.
    pub fn admission(&self) -> abi::Admission {
        abi::Admission::or_default(
            self.keep_tcp_after,
            self.probe_interval
                .map(|i| u64::try_from(i.as_nanos()).unwrap_or(u64::MAX)),
        )
    }
}

/// The attached shortcut. Dropping it detaches both programs; sockets already redirected keep
/// their redirect until they close (the kernel keeps the maps alive while they hold them), so
/// no queued byte is lost.
pub struct Shortcut {
    /// The reader programs' links (detached when dropped), dropped after `ebpf`'s programs.
    readers: Option<nsfast_bpf::sockmap_readers::ReaderHooks>,
    /// The socket-option hook's link on the cgroup (detached when dropped).
    sockopt: Option<std::os::fd::OwnedFd>,
    ebpf: Option<Ebpf>,
    cgroup: Cgroup,
    cgroup_id: u64,
}

impl std::fmt::Debug for Shortcut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shortcut")
            .field("cgroup", &self.cgroup.path())
            .field("cgroup_id", &self.cgroup_id)
            .finish()
    }
}

/// Resolves the cgroup to use without changing anything.
pub(crate) fn resolve_cgroup(opts: &Options) -> Result<Cgroup, SockmapError> {
    match &opts.cgroup {
        Some(p) => Ok(Cgroup::open(p)?),
        None => Err(SockmapError::NoCgroup),
    }
}

/// The cgroup2 directory of the systemd slice `name` (`a-b.slice` is
/// `<cgroup2 mount>/a.slice/a-b.slice`; `-.slice` is the root). Checks only the name.
pub fn slice_cgroup(name: &str) -> Result<PathBuf, SockmapError> {
    let bad = |why: &str| SockmapError::BadSlice {
        name: name.to_string(),
        why: why.to_string(),
    };
    let stem = name
        .strip_suffix(".slice")
        .ok_or_else(|| bad("a slice name ends in .slice, e.g. myapp.slice"))?;
    let mount = cgroup2_mount()?;
    if stem == "-" {
        return Ok(mount);
    }
    if stem.is_empty()
        || !stem
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || ":_.\\-".contains(c))
    {
        return Err(bad(
            "only letters, digits and ':_.-\\' may come before .slice",
        ));
    }
    let parts: Vec<&str> = stem.split('-').collect();
    if parts.iter().any(|p| p.is_empty()) {
        return Err(bad(
            "'-' separates parent slices: no leading, trailing or doubled '-'",
        ));
    }
    let mut path = mount;
    for i in 1..=parts.len() {
        path.push(format!("{}.slice", parts[..i].join("-")));
    }
    Ok(path)
}

/// Fails if an nsfast sockops program is already attached to the cgroup at `path`.
pub(crate) fn check_not_attached(path: &Path) -> Result<(), SockmapError> {
    let dir = File::open(path).map_err(|e| SockmapError::Io {
        what: format!("open cgroup {}", path.display()),
        source: e,
    })?;
    let ids = nsfast_sys::bpf::prog_query(
        std::os::fd::AsFd::as_fd(&dir),
        nsfast_sys::bpf::BPF_CGROUP_SOCK_OPS,
    )
    .map_err(|e| SockmapError::Io {
        what: format!("query programs attached to {}", path.display()),
        source: e,
    })?;
    for prog in aya::programs::loaded_programs().flatten() {
        if ids.contains(&prog.id()) && prog.name_as_str() == Some(abi::PROG_SOCKOPS) {
            let pid = status::instances()
                .ok()
                .and_then(|v| v.into_iter().find(|i| i.sockops_prog_id == Some(prog.id())))
                .filter(|i| !i.pod_mode) // the pod shortcut has no loader process
                .map(|i| i.loader_pid);
            return Err(SockmapError::AlreadyAttached {
                path: path.to_path_buf(),
                prog_id: prog.id(),
                pid,
            });
        }
    }
    Ok(())
}

impl Shortcut {
    /// Loads the programs and attaches them to the (existing) cgroup. On any error nothing
    /// stays attached.
    pub fn attach(opts: &Options) -> Result<Self, SockmapError> {
        let cgroup = resolve_cgroup(opts)?;
        check_not_attached(cgroup.path())?;
        let (ebpf, readers, sockopt, cgroup_id) = Self::attach_to(&cgroup, opts)?;
        Ok(Self {
            readers: Some(readers),
            sockopt: Some(sockopt),
            ebpf: Some(ebpf),
            cgroup,
            cgroup_id,
        })
    }

    /// Loads the object, writes its configuration, then attaches sk_msg and sockops, in that
    /// order. On error the `Ebpf` is dropped, which detaches what was attached.
    fn attach_to(
        cgroup: &Cgroup,
        opts: &Options,
    ) -> Result<
        (
            Ebpf,
            nsfast_bpf::sockmap_readers::ReaderHooks,
            std::os::fd::OwnedFd,
            u64,
        ),
        SockmapError,
    > {
        let cgroup_id = cgroup.id()?;
        let queue_limit = opts.queue_limit.unwrap_or(abi::DEFAULT_QUEUE_LIMIT);
        let admission = opts.admission();
        let mut ebpf = load(queue_limit, admission)?;
        // Configuration before anything is attached.
        let port_mode = write_ports(&mut ebpf, opts)?;
        let config = Config::of_loader(cgroup_id, port_mode, now_unix(), queue_limit, admission);
        write_config(&mut ebpf, config)?;
        // Read accounting before any socket can be redirected into.
        let readers = nsfast_bpf::sockmap_readers::attach(
            &mut ebpf,
            nsfast_bpf::sockmap_readers::SpliceGuard::allowing_hole(opts.allow_splice_hole),
        )?;
        let sockopt = attach_sockopt(&mut ebpf, cgroup)?;
        // sk_msg on the sockhash first, so every socket sockops adds is covered at once.
        attach_sk_msg(&mut ebpf)?;
        attach_sockops(&mut ebpf, cgroup, cgroup_id, opts)?;
        if !crate::fionread_counts_redirects() {
            warn!(
                "on this kernel ({}) FIONREAD reports 0 for bytes that arrived through the shortcut \
                 (fixed by 6.12): programs that size their reads with FIONREAD may wait for data \
                 that is already there; limit the shortcut with --ports if that matters",
                nsfast_sys::kernel::release()
            );
        }
        Ok((ebpf, readers, sockopt, cgroup_id))
    }

    /// Whether the splice guard is attached (see [`nsfast_bpf::sockmap_readers`]).
    pub fn splice_guard(&self) -> bool {
        self.readers.as_ref().is_some_and(|r| r.splice_guard)
    }

    /// The cgroup the shortcut is attached to.
    pub fn cgroup_path(&self) -> &Path {
        self.cgroup.path()
    }

    /// The cgroup's id.
    pub fn cgroup_id(&self) -> u64 {
        self.cgroup_id
    }

    /// Current counters and the number of sockets in the map.
    pub fn stats(&self) -> Result<Stats, SockmapError> {
        let ebpf = self.ebpf.as_ref().ok_or(SockmapError::Missing("maps"))?;
        let stats = ebpf
            .map(abi::MAP_STATS)
            .ok_or(SockmapError::Missing(abi::MAP_STATS))?;
        let hash = ebpf
            .map(abi::MAP_SOCKHASH)
            .ok_or(SockmapError::Missing(abi::MAP_SOCKHASH))?;
        status::read_stats(
            aya::maps::PerCpuArray::try_from(stats).map_err(SockmapError::map("open nsf_stats"))?,
            SockHash::try_from(hash).map_err(SockmapError::map("open nsf_sockhash"))?,
        )
    }

    /// Entries in the pairing and read-accounting maps now (see
    /// [`nsfast_bpf::sockmap_entries`]).
    pub fn map_entries(&self) -> Result<nsfast_bpf::sockmap_entries::MapEntries, SockmapError> {
        let ebpf = self.ebpf.as_ref().ok_or(SockmapError::Missing("maps"))?;
        let prog: &aya::programs::SockOps = ebpf
            .program(abi::PROG_SOCKOPS)
            .ok_or(SockmapError::Missing(abi::PROG_SOCKOPS))?
            .try_into()
            .map_err(|_| SockmapError::Missing(abi::PROG_SOCKOPS))?;
        prog.info()
            .ok()
            .and_then(|i| nsfast_bpf::sockmap_entries::of_program(&i))
            .ok_or(SockmapError::Missing("the pairing maps"))
    }

    /// The connection ends that kept TCP, numbered `from` and later (see
    /// [`nsfast_bpf::sockmap_kept`]).
    pub fn kept_since(
        &self,
        from: u64,
    ) -> Result<nsfast_bpf::sockmap_kept::KeptBatch, SockmapError> {
        let ebpf = self.ebpf.as_ref().ok_or(SockmapError::Missing("maps"))?;
        let events = ebpf
            .map(abi::MAP_KEPT)
            .ok_or(SockmapError::Missing(abi::MAP_KEPT))?;
        let head = ebpf
            .map(abi::MAP_KEPT_HEAD)
            .ok_or(SockmapError::Missing(abi::MAP_KEPT_HEAD))?;
        nsfast_bpf::sockmap_kept::KeptLog::from_arrays(
            aya::maps::Array::try_from(events).map_err(SockmapError::map("open nsf_kept"))?,
            aya::maps::Array::try_from(head).map_err(SockmapError::map("open nsf_kept_head"))?,
        )
        .since(from)
        .map_err(SockmapError::map("read nsf_kept"))
    }

    /// Detaches now (same as dropping, but reports errors).
    pub fn detach(mut self) -> Result<(), SockmapError> {
        self.detach_inner()
    }

    fn detach_inner(&mut self) -> Result<(), SockmapError> {
        if let Some(ebpf) = self.ebpf.take() {
            drop(ebpf);
            drop(self.sockopt.take());
            drop(self.readers.take());
            info!(
                "detached sockops from {} and sk_msg from its map",
                self.cgroup.path().display()
            );
        }
        Ok(())
    }
}

impl Drop for Shortcut {
    fn drop(&mut self) {
        let _ = self.detach_inner();
    }
}

/// Loads the sockmap object with its per-connection queue limit (bytes) and admission
/// settings. The NetworkPolicy tables it shares with the pod datapath in pod mode are left
/// empty here, one entry each: outside pod mode no socket consults them.
pub fn load(queue_limit: u64, admission: abi::Admission) -> Result<Ebpf, SockmapError> {
    let mut loader = EbpfLoader::new();
    loader.override_global(abi::GLOBAL_QUEUE_LIMIT, &queue_limit, true);
    admission.set_globals(&mut loader);
    for m in nsfast_bpf::pod_abi::POLICY_RULE_MAPS {
        loader.map_max_entries(m, 1);
    }
    loader
        .load(nsfast_bpf::SOCKMAP)
        .map_err(|e| SockmapError::Load(Box::new(e)))
}

/// Fills `nsf_ports` from `--ports` / `--exclude-ports`; returns the `port_mode` bits.
fn write_ports(ebpf: &mut Ebpf, opts: &Options) -> Result<u32, SockmapError> {
    let mut port_mode = 0;
    let mut ports: BpfHashMap<&mut MapData, u16, u8> = BpfHashMap::try_from(
        ebpf.map_mut(abi::MAP_PORTS)
            .ok_or(SockmapError::Missing(abi::MAP_PORTS))?,
    )
    .map_err(SockmapError::map("open nsf_ports"))?;
    let mut bits: std::collections::BTreeMap<u16, u8> = Default::default();
    if let Some(inc) = &opts.ports {
        port_mode |= abi::PORTS_INCLUDE;
        for p in inc.iter() {
            *bits.entry(p).or_default() |= abi::PORT_INCLUDE;
        }
    }
    if let Some(exc) = &opts.exclude_ports {
        for p in exc.iter() {
            *bits.entry(p).or_default() |= abi::PORT_EXCLUDE;
        }
    }
    for (p, b) in bits {
        ports
            .insert(p, b, 0)
            .map_err(SockmapError::map("fill nsf_ports"))?;
    }
    Ok(port_mode)
}

/// Seconds since the epoch (0 if the clock is before it).
fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Writes `nsf_config`: the cgroup, this process as loader, the port mode, the start time and
/// the settings the object was loaded with.
fn write_config(ebpf: &mut Ebpf, config: Config) -> Result<(), SockmapError> {
    let mut cfg: Array<&mut MapData, Config> = Array::try_from(
        ebpf.map_mut(abi::MAP_CONFIG)
            .ok_or(SockmapError::Missing(abi::MAP_CONFIG))?,
    )
    .map_err(SockmapError::map("open nsf_config"))?;
    cfg.set(0, config, 0)
        .map_err(SockmapError::map("write nsf_config"))
}

/// Loads the sk_msg program and attaches it to `nsf_sockhash`.
fn attach_sk_msg(ebpf: &mut Ebpf) -> Result<(), SockmapError> {
    let sockhash_fd = {
        let map = ebpf
            .map(abi::MAP_SOCKHASH)
            .ok_or(SockmapError::Missing(abi::MAP_SOCKHASH))?;
        let hash: SockHash<&MapData, u64> =
            SockHash::try_from(map).map_err(SockmapError::map("open nsf_sockhash"))?;
        hash.fd().try_clone().map_err(|e| SockmapError::Io {
            what: "dup sockhash fd".into(),
            source: e,
        })?
    };
    let sk_msg: &mut SkMsg = ebpf
        .program_mut(abi::PROG_SK_MSG)
        .ok_or(SockmapError::Missing(abi::PROG_SK_MSG))?
        .try_into()
        .map_err(SockmapError::prog("sk_msg program type"))?;
    sk_msg
        .load()
        .map_err(SockmapError::prog("load sk_msg program"))?;
    sk_msg
        .attach(&sockhash_fd)
        .map_err(SockmapError::prog("attach sk_msg to nsf_sockhash"))?;
    info!(
        "attached sk_msg program {} to map {}",
        abi::PROG_SK_MSG,
        abi::MAP_SOCKHASH
    );
    Ok(())
}

/// Loads the socket-option hook and links it to the cgroup (before sockops: an option set on a
/// connecting socket is seen before the connection could join).
fn attach_sockopt(ebpf: &mut Ebpf, cgroup: &Cgroup) -> Result<std::os::fd::OwnedFd, SockmapError> {
    use std::os::fd::AsFd;
    let prog = nsfast_bpf::sockmap_readers::load_sockopt(ebpf).map_err(|e| SockmapError::Io {
        what: e,
        source: std::io::Error::from(std::io::ErrorKind::Unsupported),
    })?;
    let dir = File::open(cgroup.path()).map_err(|e| SockmapError::Io {
        what: format!("open cgroup {}", cgroup.path().display()),
        source: e,
    })?;
    nsfast_sys::bpf::cgroup_link(
        prog.as_fd(),
        dir.as_fd(),
        nsfast_sys::bpf::BPF_CGROUP_SETSOCKOPT,
    )
    .map_err(|e| SockmapError::Io {
        what: format!(
            "attach {} to cgroup {}",
            abi::PROG_SETSOCKOPT,
            cgroup.path().display()
        ),
        source: e,
    })
}

/// Loads the sockops program and attaches it to the cgroup.
fn attach_sockops(
    ebpf: &mut Ebpf,
    cgroup: &Cgroup,
    cgroup_id: u64,
    opts: &Options,
) -> Result<(), SockmapError> {
    let sockops: &mut SockOps = ebpf
        .program_mut(abi::PROG_SOCKOPS)
        .ok_or(SockmapError::Missing(abi::PROG_SOCKOPS))?
        .try_into()
        .map_err(SockmapError::prog("sockops program type"))?;
    sockops
        .load()
        .map_err(SockmapError::prog("load sockops program"))?;
    let dir = File::open(cgroup.path()).map_err(|e| SockmapError::Io {
        what: format!("open cgroup {}", cgroup.path().display()),
        source: e,
    })?;
    sockops
        // With a BPF link the attachment is always multi-program; flags must be 0 ("Single").
        .attach(&dir, CgroupAttachMode::Single)
        .map_err(SockmapError::prog("attach sockops to the cgroup"))?;
    info!(
        "attached sockops program {} to cgroup {} (id {cgroup_id}); ports: {}{}",
        abi::PROG_SOCKOPS,
        cgroup.path().display(),
        opts.ports
            .as_ref()
            .map(|p| p.to_compact_string())
            .unwrap_or_else(|| "all".into()),
        opts.exclude_ports
            .as_ref()
            .map(|p| format!(" except {}", p.to_compact_string()))
            .unwrap_or_default(),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slice_names_map_to_nested_cgroups() {
        let m = cgroup2_mount().unwrap();
        assert_eq!(slice_cgroup("myapp.slice").unwrap(), m.join("myapp.slice"));
        assert_eq!(
            slice_cgroup("a-b-c.slice").unwrap(),
            m.join("a.slice/a-b.slice/a-b-c.slice")
        );
        assert_eq!(slice_cgroup("-.slice").unwrap(), m);
        for bad in [
            "myapp",
            "a--b.slice",
            "-a.slice",
            "a-.slice",
            "../x.slice",
            "a/b.slice",
            ".slice",
        ] {
            let e = slice_cgroup(bad).unwrap_err().to_string();
            assert!(e.contains(&format!("{bad:?}")), "{bad}: {e}");
        }
    }

    #[test]
    fn no_cgroup_is_refused_and_nothing_is_created() {
        let e = Shortcut::attach(&Options::default()).unwrap_err();
        assert!(matches!(e, SockmapError::NoCgroup), "{e}");
        assert!(e.to_string().contains("--cgroup"), "{e}");
    }
}
