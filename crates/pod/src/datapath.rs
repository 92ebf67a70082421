//! Loading the pod BPF object against a host's pinned maps, attaching its programs (TCX links
//! on veth and uplinks, pinned; classic tc cls_bpf filters where the kernel has no TCX,
//! remembered in the state; raw `BPF_LINK_CREATE` on netkit, pinned), and the endpoint table
//! and counters.

use std::net::IpAddr;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use aya::maps::{HashMap as BpfHashMap, Map, MapData, PerCpuArray};
use aya::programs::links::FdLink;
use aya::programs::tc::{self as aya_tc, NlOptions, SchedClassifierLink, TcAttachOptions, TcError};
use aya::programs::{LinkOrder, SchedClassifier, TcAttachType};
use aya::{Ebpf, EbpfLoader};
use nsfast_sys::bpf::netkit;

use crate::abi::{self, Endpoint};
use crate::error::PodError;
use crate::state::{ensure_bpffs, Host, TcFilter};

fn bpf_err<E: std::error::Error + Send + Sync + 'static>(
    what: impl Into<String>,
) -> impl FnOnce(E) -> PodError {
    let what = what.into();
    move |e| PodError::Bpf {
        what,
        source: Box::new(e),
    }
}

/// Pin path of the TCX link on a pod's host-side device.
pub fn link_pin(host: &Host, ifname: &str) -> PathBuf {
    host.pin_dir().join(format!("link-{ifname}"))
}

/// Pin path of the TCX egress link on a pod's host-side device.
pub fn egress_link_pin(host: &Host, ifname: &str) -> PathBuf {
    host.pin_dir().join(format!("link-egress-{ifname}"))
}

/// Pin path of a netkit link (`which` = "peer" or "primary").
pub fn netkit_pin(host: &Host, ifname: &str, which: &str) -> PathBuf {
    host.pin_dir().join(format!("netkit-{which}-{ifname}"))
}

/// Pin path of the wire program on an uplink.
pub fn uplink_pin(host: &Host, ifname: &str) -> PathBuf {
    host.pin_dir().join(format!("uplink-{ifname}"))
}

/// Creates the host's pin directory (mounting bpffs if needed).
pub fn prepare_pins(host: &Host) -> Result<(), PodError> {
    ensure_bpffs()?;
    crate::state::create_dir_all_racy(&host.pin_dir())
}

/// Removes the pins among `names` in `pins` whose map has another layout (key or value size,
/// entries, flags) than `object` defines, so that loading `object` makes them anew: the
/// pinned maps of an older nsfast with other table layouts. Programs already attached keep
/// the maps they hold (docs/security.md, "Known gaps": pods from an older nsfast keep their
/// programs until re-added).
pub fn replace_stale_pins(pins: &Path, object: &[u8], names: &[&str]) -> Result<(), PodError> {
    let mut layouts = None;
    for name in names {
        let p = pins.join(name);
        if !p.exists() {
            continue;
        }
        let layouts = layouts.get_or_insert_with(|| nsfast_bpf::map_layouts(object));
        let Some(&want) = layouts.get(*name) else {
            continue;
        };
        let info = aya::maps::MapInfo::from_pin(&p)
            .map_err(PodError::map(format!("open {}", p.display())))?;
        let have = nsfast_bpf::MapLayout {
            key_size: info.key_size(),
            value_size: info.value_size(),
            max_entries: info.max_entries(),
            map_flags: info.map_flags(),
        };
        if have != want {
            tracing::warn!(
                "{}: pinned by an nsfast with another layout ({have:?}, this one has {want:?}); made anew",
                p.display()
            );
            std::fs::remove_file(&p).map_err(PodError::io(format!("remove {}", p.display())))?;
        }
    }
    Ok(())
}

/// Loads the object with the host's maps (created and pinned on first use).
fn load(host_pins: &Path) -> Result<Ebpf, PodError> {
    replace_stale_pins(host_pins, nsfast_bpf::POD, &abi::POLICY_MAPS)?;
    let mut loader = EbpfLoader::new();
    for m in [abi::MAP_ENDPOINTS, abi::MAP_ENDPOINTS6, abi::MAP_COUNTERS]
        .into_iter()
        .chain(abi::POLICY_MAPS)
    {
        loader.map_pin_path(m, host_pins.join(m));
    }
    loader
        .load(nsfast_bpf::POD)
        .map_err(|e| PodError::Load(Box::new(e)))
}

fn loaded<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut SchedClassifier, PodError> {
    let prog: &mut SchedClassifier = ebpf
        .program_mut(name)
        .ok_or_else(|| PodError::Io {
            what: format!("program {name} missing from the pod object"),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        })?
        .try_into()
        .map_err(PodError::prog(format!("{name}: not a classifier")))?;
    prog.load()
        .map_err(PodError::prog(format!("load {name} (verifier)")))?;
    Ok(prog)
}

/// Loads the pod object against the pins in `pins` and attaches `prog_name` at `at` (ingress
/// or egress) of `ifname` (in the calling thread's namespace) with `opts`; `how` names the
/// method in errors. The returned link owns the attachment.
fn attach_at(
    pins: &Path,
    prog_name: &str,
    ifname: &str,
    at: TcAttachType,
    opts: TcAttachOptions,
    how: &str,
) -> Result<SchedClassifierLink, PodError> {
    let mut ebpf = load(pins)?;
    let prog = loaded(&mut ebpf, prog_name)?;
    let id = prog
        .attach_with_options(ifname, at, opts)
        .map_err(PodError::prog(format!(
            "attach {prog_name} to {ifname} ({how})"
        )))?;
    prog.take_link(id).map_err(PodError::prog(format!(
        "take the {how} link of {prog_name}"
    )))
}

/// Attaches `prog_name` at TCX ingress of `ifname` in the host namespace and pins the link at
/// `pin`. Nothing stays attached on error.
pub fn attach_tcx(host: &Host, prog_name: &str, ifname: &str, pin: &Path) -> Result<(), PodError> {
    attach_tcx_at(host, prog_name, ifname, pin, false)
}

/// [`attach_tcx`] at TCX egress when `egress`.
pub fn attach_tcx_at(
    host: &Host,
    prog_name: &str,
    ifname: &str,
    pin: &Path,
    egress: bool,
) -> Result<(), PodError> {
    let pins = host.pin_dir();
    let (at, how) = if egress {
        (TcAttachType::Egress, "tcx egress")
    } else {
        (TcAttachType::Ingress, "tcx ingress")
    };
    host.ns.run(|| -> Result<(), PodError> {
        let link = attach_at(
            &pins,
            prog_name,
            ifname,
            at,
            TcAttachOptions::TcxOrder(LinkOrder::default()),
            how,
        )?;
        let link: FdLink = link.try_into().map_err(bpf_err("tcx link fd"))?;
        link.pin(pin)
            .map_err(bpf_err(format!("pin link at {}", pin.display())))?;
        Ok(())
    })?
}

/// Attaches `prog_name` as a cls_bpf direct-action filter on the clsact ingress hook of
/// `ifname` in the host namespace (classic tc, for kernels without TCX), adding the clsact
/// qdisc if the device has none. The kernel picks priority and handle; both are returned for
/// the state, since a tc filter cannot be pinned. Nothing stays attached on error.
pub fn attach_tc(host: &Host, prog_name: &str, ifname: &str) -> Result<TcFilter, PodError> {
    attach_tc_at(host, prog_name, ifname, false)
}

/// [`attach_tc`] on the clsact egress hook when `egress`.
pub fn attach_tc_at(
    host: &Host,
    prog_name: &str,
    ifname: &str,
    egress: bool,
) -> Result<TcFilter, PodError> {
    let (at, how) = if egress {
        (
            TcAttachType::Egress,
            "tc clsact egress, cls_bpf direct-action",
        )
    } else {
        (
            TcAttachType::Ingress,
            "tc clsact ingress, cls_bpf direct-action",
        )
    };
    let pins = host.pin_dir();
    let nl = host.netlink()?;
    let ifindex = nl.link_index(ifname)?;
    host.ns.run(|| -> Result<TcFilter, PodError> {
        let qdisc_added = match aya_tc::qdisc_add_clsact(ifname) {
            Ok(()) => true,
            Err(TcError::NetlinkError(e)) if e.raw_os_error() == Some(libc::EEXIST) => false,
            Err(e) => {
                return Err(bpf_err(format!(
                    "add clsact qdisc to {ifname} (needs CONFIG_NET_SCH_INGRESS / sch_ingress)"
                ))(e))
            }
        };
        let attach = || -> Result<(u16, u32), PodError> {
            let link = attach_at(
                &pins,
                prog_name,
                ifname,
                at,
                TcAttachOptions::Netlink(NlOptions::default()),
                how,
            )?;
            let priority = link.priority().map_err(PodError::prog("tc priority"))?;
            let handle = u32::from(link.handle().map_err(PodError::prog("tc handle"))?);
            // Dropping the link would delete the filter: it must outlive this process, like
            // a pinned link. Only its description (no fd) is leaked.
            std::mem::forget(link);
            Ok((priority, handle))
        };
        match attach() {
            Ok((priority, handle)) => Ok(TcFilter {
                ifname: ifname.to_string(),
                ifindex,
                priority,
                handle,
                program: prog_name.to_string(),
                qdisc_added,
                egress,
            }),
            Err(e) => {
                if qdisc_added {
                    let _ = nl.delete_clsact(ifname, Some(ifindex));
                }
                Err(e)
            }
        }
    })?
}

/// Whether the filter `f` is still on its device: same ifindex, priority, handle and program.
pub fn tc_present(host: &Host, f: &TcFilter) -> Result<bool, PodError> {
    let nl = host.netlink()?;
    match nl.link_index(&f.ifname) {
        Ok(i) if i == f.ifindex => {}
        Ok(_) | Err(nsfast_sys::net::NetError::NoSuchLink(_)) => return Ok(false),
        Err(e) => return Err(e.into()),
    }
    Ok(nl
        .tc_filters(&f.ifname, !f.egress)?
        .iter()
        .any(|x| is_ours(x, f)))
}

fn is_ours(x: &nsfast_sys::net::TcFilterInfo, f: &TcFilter) -> bool {
    x.priority == f.priority
        && x.handle == f.handle
        && x.kind == "bpf"
        && x.bpf_name.as_deref() == Some(f.program.as_str())
}

/// Removes exactly the filter `f` (if its device, with the same index, still carries it) and
/// the clsact qdisc if nsfast added it and no other filter is left on either hook. A device
/// that is gone took both with it.
pub fn detach_tc(host: &Host, f: &TcFilter) -> Result<(), PodError> {
    let nl = host.netlink()?;
    match nl.link_index(&f.ifname) {
        Ok(i) if i == f.ifindex => {}
        Ok(_) | Err(nsfast_sys::net::NetError::NoSuchLink(_)) => return Ok(()),
        Err(e) => return Err(e.into()),
    }
    let filters = nl.tc_filters(&f.ifname, !f.egress)?;
    if filters.iter().any(|x| is_ours(x, f)) {
        nl.tc_filter_delete(&f.ifname, Some(f.ifindex), !f.egress, f.priority, f.handle)?;
    } else if let Some(x) = filters
        .iter()
        .find(|x| x.priority == f.priority && x.handle == f.handle)
    {
        tracing::warn!(
            "{}: filter prio {} handle {:#x} is now {:?}, not {}: left alone",
            f.ifname,
            f.priority,
            f.handle,
            x.bpf_name,
            f.program
        );
    }
    if f.qdisc_added {
        let left = nl.tc_filters(&f.ifname, true)?.len() + nl.tc_filters(&f.ifname, false)?.len();
        if left == 0 {
            nl.delete_clsact(&f.ifname, Some(f.ifindex))?;
        } else {
            tracing::info!(
                "{}: clsact qdisc kept: {left} other filter(s) were added to it",
                f.ifname
            );
        }
    }
    Ok(())
}

/// Attaches the netkit programs to the pair whose primary is `primary` (in the host
/// namespace): the pod-egress program at `BPF_NETKIT_PEER` and the to-pod program at
/// `BPF_NETKIT_PRIMARY`, both on the primary's ifindex, and pins both links.
pub fn attach_netkit(
    host: &Host,
    primary: &str,
    primary_ifindex: u32,
    l3: bool,
    pins_out: &mut Vec<PathBuf>,
) -> Result<(), PodError> {
    let pins = host.pin_dir();
    let peer_pin = netkit_pin(host, primary, "peer");
    let primary_pin = netkit_pin(host, primary, "primary");
    let peer_prog = if l3 {
        abi::PROG_NETKIT_PEER_L3
    } else {
        abi::PROG_NETKIT_PEER_L2
    };
    let r = host.ns.run(|| -> Result<(), PodError> {
        let mut ebpf = load(&pins)?;
        for (prog_name, attach, pin) in [
            (peer_prog, netkit::BPF_NETKIT_PEER, &peer_pin),
            (
                abi::PROG_NETKIT_PRIMARY,
                netkit::BPF_NETKIT_PRIMARY,
                &primary_pin,
            ),
        ] {
            let prog = loaded(&mut ebpf, prog_name)?;
            let fd = prog.fd().map_err(PodError::prog("program fd"))?;
            let link = netkit::link_create(fd.as_fd(), primary_ifindex, attach).map_err(
                PodError::io(format!("BPF_LINK_CREATE netkit {prog_name} on {primary}")),
            )?;
            netkit::obj_pin(link.as_fd(), pin)
                .map_err(PodError::io(format!("pin {}", pin.display())))?;
        }
        Ok(())
    })?;
    for p in [peer_pin, primary_pin] {
        if p.exists() {
            pins_out.push(p);
        }
    }
    r
}

/// Removes a link pin, which detaches its program. Missing is fine.
pub fn unpin(pin: &Path) -> Result<(), PodError> {
    match std::fs::remove_file(pin) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(PodError::io(format!("remove pin {}", pin.display()))(e)),
    }
}

fn endpoints(host: &Host) -> Result<BpfHashMap<MapData, u32, Endpoint>, PodError> {
    let p = host.pin_dir().join(abi::MAP_ENDPOINTS);
    let md = MapData::from_pin(&p).map_err(PodError::map(format!("open {}", p.display())))?;
    BpfHashMap::try_from(Map::HashMap(md)).map_err(PodError::map("endpoint map type"))
}

fn endpoints6(host: &Host) -> Result<BpfHashMap<MapData, [u8; 16], Endpoint>, PodError> {
    let p = host.pin_dir().join(abi::MAP_ENDPOINTS6);
    let md = MapData::from_pin(&p).map_err(PodError::map(format!("open {}", p.display())))?;
    BpfHashMap::try_from(Map::HashMap(md)).map_err(PodError::map("IPv6 endpoint map type"))
}

/// Adds or replaces the endpoint of `ip` (either family).
pub fn endpoint_insert(host: &Host, ip: IpAddr, ep: Endpoint) -> Result<(), PodError> {
    match ip {
        IpAddr::V4(v4) => endpoints(host)?.insert(abi::ip_key(v4), ep, 0),
        IpAddr::V6(v6) => endpoints6(host)?.insert(abi::ip6_key(v6), ep, 0),
    }
    .map_err(PodError::map(format!("add endpoint {ip}")))
}

/// Removes the endpoint of `ip` if it still points at `ifindex`.
pub fn endpoint_remove(host: &Host, ip: IpAddr, ifindex: u32) -> Result<(), PodError> {
    let r = match ip {
        IpAddr::V4(v4) => {
            let Ok(mut m) = endpoints(host) else {
                return Ok(());
            };
            let k = abi::ip_key(v4);
            if !m.get(&k, 0).is_ok_and(|e| e.ifindex == ifindex) {
                return Ok(());
            }
            m.remove(&k)
        }
        IpAddr::V6(v6) => {
            let Ok(mut m) = endpoints6(host) else {
                return Ok(());
            };
            let k = abi::ip6_key(v6);
            if !m.get(&k, 0).is_ok_and(|e| e.ifindex == ifindex) {
                return Ok(());
            }
            m.remove(&k)
        }
    };
    r.map_err(PodError::map(format!("remove endpoint {ip}")))
}

/// The endpoint of `ip`, if any.
pub fn endpoint_get(host: &Host, ip: IpAddr) -> Result<Option<Endpoint>, PodError> {
    Ok(match ip {
        IpAddr::V4(v4) => endpoints(host)
            .ok()
            .and_then(|m| m.get(&abi::ip_key(v4), 0).ok()),
        IpAddr::V6(v6) => endpoints6(host)
            .ok()
            .and_then(|m| m.get(&abi::ip6_key(v6), 0).ok()),
    })
}

/// The host's datapath counters, summed over CPUs, in [`abi::COUNTERS`] order (zeros before
/// the first pod; zeros for slots a counter map pinned by an older nsfast lacks, e.g.
/// `spoofed`, until the host's last pod is deleted and the maps are made anew).
pub fn counters(host: &Host) -> Result<Vec<u64>, PodError> {
    let p = host.pin_dir().join(abi::MAP_COUNTERS);
    if !p.exists() {
        return Ok(vec![0; abi::COUNTERS.len()]);
    }
    let md = MapData::from_pin(&p).map_err(PodError::map(format!("open {}", p.display())))?;
    let arr: PerCpuArray<MapData, u64> =
        PerCpuArray::try_from(Map::PerCpuArray(md)).map_err(PodError::map("counter map type"))?;
    let slots = arr.len();
    (0..abi::COUNTERS.len() as u32)
        .map(|i| {
            if i >= slots {
                return Ok(0);
            }
            arr.get(&i, 0)
                .map(|v| v.iter().sum())
                .map_err(PodError::map("read counters"))
        })
        .collect()
}

/// Names of the programs attached at TCX ingress of `ifname` in the host namespace.
pub fn tcx_ingress_programs(host: &Host, ifname: &str) -> Result<Vec<String>, PodError> {
    tcx_programs(&host.ns, ifname, true)
}

/// Names of the programs attached at TCX ingress (`ingress`) or egress of `ifname` in `ns`.
pub fn tcx_programs(
    ns: &nsfast_sys::netns::NetNs,
    ifname: &str,
    ingress: bool,
) -> Result<Vec<String>, PodError> {
    let at = if ingress {
        TcAttachType::Ingress
    } else {
        TcAttachType::Egress
    };
    ns.run(|| -> Result<Vec<String>, PodError> {
        let (_, progs) = SchedClassifier::query_tcx(ifname, at)
            .map_err(PodError::prog(format!("query tcx of {ifname}")))?;
        Ok(progs
            .iter()
            .map(|p| p.name_as_str().unwrap_or("?").to_string())
            .collect())
    })?
}

/// An uplink carrying the wire program, as `pod list` shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Uplink {
    pub ifname: String,
    /// `tcx` (pinned link) or `tc` (cls_bpf filter).
    pub attach: crate::state::AttachMethod,
    /// The filter, for `tc`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tc: Option<TcFilter>,
}

/// Uplinks with the wire program attached on this host: TCX links pinned, tc filters
/// remembered in the state.
pub fn uplinks(host: &Host) -> Vec<Uplink> {
    let mut v: Vec<Uplink> = tcx_uplinks(host)
        .into_iter()
        .map(|ifname| Uplink {
            ifname,
            attach: crate::state::AttachMethod::Tcx,
            tc: None,
        })
        .collect();
    v.extend(
        host.uplink_tcs()
            .unwrap_or_default()
            .into_iter()
            .map(|f| Uplink {
                ifname: f.ifname.clone(),
                attach: crate::state::AttachMethod::Tc,
                tc: Some(f),
            }),
    );
    v.sort_by(|a, b| a.ifname.cmp(&b.ifname));
    v
}

/// Uplinks with the wire program pinned (TCX) on this host.
pub fn tcx_uplinks(host: &Host) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(host.pin_dir())
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_prefix("uplink-"))
                .map(str::to_string)
        })
        .collect();
    v.sort();
    v
}

/// What the policy maps of a host should hold (`bpf/lib/pod_policy_rules.h`): built by
/// `crate::policy::sync` from the compiled tables, without table slots (directions are
/// `POL_INGRESS`/`POL_EGRESS`): [`write_policy_maps`] puts them in one.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct PolicyMaps {
    /// Every address of every local pod → the pod's id (nonzero).
    pub ids: std::collections::BTreeMap<abi::PolAddr, u32>,
    pub iso: std::collections::BTreeSet<abi::PolIsoKey>,
    pub peers: std::collections::BTreeMap<abi::PolPeerKey, abi::PolPorts>,
    /// (prefix length including the 64 bits of pod and direction, data) → ports.
    pub cidrs: std::collections::BTreeMap<(u32, abi::PolCidrData), abi::PolPorts>,
}

fn pinned(host: &Host, name: &str) -> Result<Option<MapData>, PodError> {
    let p = host.pin_dir().join(name);
    if !p.exists() {
        return Ok(None);
    }
    MapData::from_pin(&p)
        .map(Some)
        .map_err(PodError::map(format!("open {}", p.display())))
}

/// The keys of `m` that `pick` chooses (collected first: a map is not changed while its keys
/// are walked).
fn keys_where<K: aya::Pod, V: aya::Pod>(
    m: &aya::maps::HashMap<MapData, K, V>,
    pick: impl Fn(&K) -> bool,
) -> Vec<K> {
    m.keys()
        .filter_map(Result::ok)
        .filter(|k| pick(k))
        .collect()
}

/// The generation after `gen`: one more, skipping 0 (which means "never written"), so that
/// the table slot (the low bit) alternates also across the wrap.
pub fn next_generation(gen: u32) -> u32 {
    match gen.wrapping_add(1) {
        0 => 2,
        n => n,
    }
}

/// The crash point of a policy map write ([`crate::fault::CRASH_ENV`]): the new slot is
/// written, the generation not advanced yet.
pub const POLICY_MAPS_WRITTEN: &str = "policy-maps-written";

/// Makes the host's policy maps enforce `want`, at once: the slot that the current
/// generation does not use is emptied and filled with `want`, then the generation advances,
/// which makes packets and shortcut pairs read that slot (`bpf/lib/pod_policy_rules.h`).
/// A packet sees the old rules or the new ones, never a mix; a write killed before the
/// generation advanced left the rules packets see as they were, and the next write (every
/// policy change and `pod add`/`del` writes) empties that slot again. Every reply flow and
/// shortcut pair recorded before is checked again against the new rules when next used (a
/// change that now denies a connection stops it; one that allows it keeps it). Nothing to do
/// on a host whose maps are not pinned yet (no pod).
pub fn write_policy_maps(host: &Host, want: &PolicyMaps) -> Result<bool, PodError> {
    use aya::maps::lpm_trie::{Key, LpmTrie};
    use aya::maps::HashMap as H;
    let (Some(ids), Some(iso), Some(peers), Some(cidrs), Some(flows), Some(gen)) = (
        pinned(host, abi::MAP_POL_IDS)?,
        pinned(host, abi::MAP_POL_ISO)?,
        pinned(host, abi::MAP_POL_PEERS)?,
        pinned(host, abi::MAP_POL_CIDRS)?,
        pinned(host, abi::MAP_POL_FLOWS)?,
        pinned(host, abi::MAP_POL_GEN)?,
    ) else {
        return Ok(false);
    };
    let e = |what: &'static str| PodError::map(format!("policy map {what}"));
    let mut ids: H<MapData, abi::PolIdKey, u32> =
        H::try_from(Map::HashMap(ids)).map_err(e("ids type"))?;
    let mut iso: H<MapData, abi::PolIsoKey, u32> =
        H::try_from(Map::HashMap(iso)).map_err(e("iso type"))?;
    let mut peers: H<MapData, abi::PolPeerKey, abi::PolPorts> =
        H::try_from(Map::HashMap(peers)).map_err(e("peers type"))?;
    let mut cidrs: LpmTrie<MapData, abi::PolCidrData, abi::PolPorts> =
        LpmTrie::try_from(Map::LpmTrie(cidrs)).map_err(e("cidrs type"))?;
    let mut gen: aya::maps::Array<MapData, u32> =
        aya::maps::Array::try_from(Map::Array(gen)).map_err(e("generation type"))?;
    let next = next_generation(gen.get(&0, 0).map_err(e("generation read"))?);
    let slot = next & 1;
    let in_slot = |dir: u32| dir >> 1 == slot;
    // Empty the slot (what a write two generations ago, or a killed one, left there).
    for k in keys_where(&ids, |k| k.slot == slot) {
        ids.remove(&k).map_err(e("ids remove"))?;
    }
    for k in keys_where(&iso, |k| in_slot(k.dir)) {
        iso.remove(&k).map_err(e("iso remove"))?;
    }
    for k in keys_where(&peers, |k| in_slot(k.dir)) {
        peers.remove(&k).map_err(e("peers remove"))?;
    }
    let old: Vec<Key<abi::PolCidrData>> = cidrs
        .keys()
        .filter_map(Result::ok)
        .filter(|k| in_slot(u32::from_be(k.data().dir_be)))
        .collect();
    for k in old {
        cidrs.remove(&k).map_err(e("cidrs remove"))?;
    }
    // Fill it.
    for (addr, id) in &want.ids {
        let k = abi::PolIdKey { slot, addr: *addr };
        ids.insert(k, id, 0).map_err(e("ids insert"))?;
    }
    for k in &want.iso {
        let k = abi::PolIsoKey {
            dir: abi::pol_slot_dir(k.dir, slot),
            ..*k
        };
        iso.insert(k, 1, 0).map_err(e("iso insert"))?;
    }
    for (k, v) in &want.peers {
        let k = abi::PolPeerKey {
            dir: abi::pol_slot_dir(k.dir, slot),
            ..*k
        };
        peers.insert(k, v, 0).map_err(e("peers insert"))?;
    }
    for ((len, d), v) in &want.cidrs {
        let d = abi::PolCidrData {
            dir_be: abi::pol_slot_dir(u32::from_be(d.dir_be), slot).to_be(),
            ..*d
        };
        cidrs
            .insert(&Key::new(*len, d), v, 0)
            .map_err(e("cidrs insert"))?;
    }
    crate::fault::crash_point(POLICY_MAPS_WRITTEN);
    // Flows without a connection (UDP and the rest: any packet records one, either way) are
    // forgotten: the next packet of an allowed one records it again. TCP flows, recorded by
    // their SYN alone, are kept and checked again under the new generation.
    let mut flows: H<MapData, abi::PolFlow, u32> =
        H::try_from(Map::LruHashMap(flows)).map_err(e("flows type"))?;
    for k in keys_where(&flows, |f| f.proto != abi::PROTO_TCP) {
        let _ = flows.remove(&k);
    }
    gen.set(0, next, 0).map_err(e("generation write"))?;
    Ok(true)
}

/// Packets the policies dropped, per pod address (summed over CPUs).
pub fn policy_drops(
    host: &Host,
) -> Result<std::collections::BTreeMap<std::net::IpAddr, u64>, PodError> {
    use aya::maps::PerCpuHashMap;
    let mut out = std::collections::BTreeMap::new();
    let Some(md) = pinned(host, abi::MAP_POL_DROPS)? else {
        return Ok(out);
    };
    let m: PerCpuHashMap<MapData, abi::PolAddr, u64> =
        PerCpuHashMap::try_from(Map::PerCpuHashMap(md))
            .map_err(PodError::map("policy drop map type"))?;
    for (k, v) in m.iter().filter_map(Result::ok) {
        out.insert(k.ip(), v.iter().sum());
    }
    Ok(out)
}
