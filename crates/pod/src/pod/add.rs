//! `pod add`: the checked [`Plan`], the crash points of [`ADD_STEPS`], and the add under the
//! host's lock that builds the pod or undoes what it made.

use nsfast_sys::netns::{self, NetNs};
use serde::Serialize;
use tracing::{info, warn};

use super::build::{build, intent, Undo};
use super::*;
use crate::error::PodError;
use crate::state::{AttachMethod, Datapath, Host, HostLock, PodRecord};

/// Result of `add`.
#[derive(Debug, Clone, Serialize)]
pub struct Added {
    #[serde(serialize_with = "crate::state::ser_record")]
    pub record: PodRecord,
    /// How the mode was chosen, e.g. "auto: kernel lacks netkit, using veth + TCX".
    pub mode_note: String,
    /// How the veth and uplink programs are attached (`tcx` or `tc`; netkit pods use netkit
    /// links, see the record's `attach`).
    pub attach: AttachMethod,
}

pub use crate::fault::{crash_point, CRASH_ENV};

/// The steps of an `add` (CNI ADD and `nsfast pod add`) that [`CRASH_ENV`] can stop after:
/// - `intent` (CNI): the intent record is written, nothing else;
/// - `ipam` (CNI): the IPAM plugin leased the address, the intent does not name it yet;
/// - `planned`: the intent names the address;
/// - `netns` (`pod add` without a namespace): the pod's namespace is made;
/// - `devices`: the device pair exists;
/// - `addresses`: addresses and routes are set;
/// - `attach`: the programs are attached and pinned;
/// - `endpoint`: the endpoint map has the pod;
/// - `record`: the record is complete (CNI: the result is not printed yet).
pub const ADD_STEPS: &[&str] = &[
    "intent",
    "ipam",
    "planned",
    "netns",
    "devices",
    "addresses",
    "attach",
    "endpoint",
    "record",
];

/// A checked `add`: the host and how the pod will be made, before anything changes.
#[derive(Debug)]
pub struct Plan {
    pub host: Host,
    pub datapath: Datapath,
    pub attach: AttachMethod,
    pub mode_note: String,
}

/// Checks `opts` against the system without changing anything: names, the host, uplinks,
/// the mode and attach method.
pub fn plan(opts: &AddOptions) -> Result<Plan, PodError> {
    if !valid_pod_name(&opts.name) {
        return Err(PodError::BadName(opts.name.clone()));
    }
    if !valid_ifname(&opts.pod_if) {
        return Err(PodError::BadIfName(opts.pod_if.clone()));
    }
    for u in &opts.uplinks {
        if !valid_ifname(u) {
            return Err(PodError::BadIfName(u.clone()));
        }
    }
    let host = Host::open(opts.host.as_deref())?;
    for u in &opts.uplinks {
        if !host.netlink()?.link_exists(u)? {
            return Err(PodError::NoUplink {
                dev: u.clone(),
                host: host.display.clone(),
            });
        }
    }
    let (datapath, attach, mode_note) = resolve_mode(opts.mode, opts.attach)?;
    Ok(Plan {
        host,
        datapath,
        attach,
        mode_note,
    })
}

/// Makes a pod. Input is checked before anything changes; on error everything made is
/// removed again. A pending record of the same name (an `add` that was killed) is undone
/// first.
pub fn add(opts: &AddOptions) -> Result<Added, PodError> {
    let plan = plan(opts)?;
    info!("pod {}: {}", opts.name, plan.mode_note);
    let lock = plan.host.lock()?;
    if let Some(r) = plan.host.record(&opts.name)? {
        if r.pending {
            warn!(
                "pod {}: undoing an add that did not finish (pending record)",
                r.name
            );
            undo_pending(&plan.host, &r)?;
            plan.host.remove_record(&r.name)?;
        }
    }
    // Repairs the shortcut's pod map after a killed add/del (e.g. a pod whose add died after
    // its record was complete): a retry of the add leaves the pod known either way.
    if let Err(e) = crate::shortcut::sync(&plan.host, &lock) {
        warn!(
            "host {}: shortcut pod map not repaired: {e}",
            plan.host.display
        );
    }
    add_locked(&plan, &lock, opts)
}

/// [`add`](fn@add) with the host's lock held (from [`Plan::host`]). A pending record of the same name
/// is taken to be the caller's own intent (the CNI plugin writes one before asking IPAM) and
/// is overwritten. On error what was made is undone; the intent record is removed, except for
/// CNI pods, whose caller still has to release the IPAM lease and then calls [`forget`].
pub fn add_locked(plan: &Plan, _lock: &HostLock, opts: &AddOptions) -> Result<Added, PodError> {
    let host = &plan.host;
    let (dp, attach) = (plan.datapath, plan.attach);
    // A failed add leaves the shortcut as it found it (`pod add` never enables it; the CNI
    // plugin, which may, passes what it found to [`forget_failed_add`] itself).
    let shortcut_was_on = crate::shortcut::is_enabled(host);
    let precheck = || -> Result<(), PodError> {
        if host.record(&opts.name)?.is_some_and(|r| !r.pending) {
            return Err(PodError::Exists {
                name: opts.name.clone(),
                host: host.display.clone(),
            });
        }
        // Pending records are intents of adds that died: they block nothing.
        let want = opts.addrs();
        if opts.ip.ip.is_unspecified() && opts.ip6.is_none() {
            return Err(PodError::BadIpList {
                value: String::new(),
                reason: "no address".into(),
            });
        }
        for other in host.records()? {
            if other.pending || other.name == opts.name {
                continue;
            }
            if let Some(ip) = other.addrs().into_iter().find(|a| want.contains(a)) {
                return Err(PodError::IpInUse {
                    ip,
                    other: other.name,
                    host: host.display.clone(),
                });
            }
        }
        if opts.netns.is_none() && netns::list_named().contains(&opts.name) {
            return Err(PodError::Netns(netns::NetnsError::Exists(
                opts.name.clone(),
            )));
        }
        Ok(())
    };
    if let Err(e) = precheck() {
        if opts.cni.is_none() {
            let _ = gc_after_failed_add(host, shortcut_was_on);
        }
        return Err(e);
    }
    let mut record = intent(host, opts, dp, attach);
    host.write_record(&record)?;
    crash_point("planned");

    let fail = |e: PodError, undo: Undo, pod_ns: Option<NetNs>| -> PodError {
        warn!("pod {}: add failed, undoing: {e}", opts.name);
        undo.run(host);
        drop(pod_ns); // deletes a namespace made here
        if opts.cni.is_none() {
            let _ = forget_failed_add(host, &opts.name, shortcut_was_on);
        }
        e
    };
    // The pod's namespace: made here (deleted again on error by the owned handle) or given.
    let pod_ns = match &opts.netns {
        None => match NetNs::create(&opts.name) {
            Ok(ns) => ns,
            Err(e) => return Err(fail(e.into(), Undo::default(), None)),
        },
        Some(p) => match NetNs::open(p) {
            Ok(ns) => ns,
            Err(e) => return Err(fail(e.into(), Undo::default(), None)),
        },
    };
    if opts.netns.is_none() {
        crash_point("netns");
    }
    let mut undo = Undo::default();
    match build(host, _lock, &pod_ns, opts, dp, attach, &mut undo) {
        Ok(mut built) => {
            built.netns = record.netns.clone();
            built.netns_owned = record.netns_owned;
            built.pending = false;
            built.netns_cookie = pod_ns.cookie().ok();
            record = built;
            if let Err(e) = host.write_record(&record) {
                return Err(fail(e, undo, Some(pod_ns)));
            }
            crash_point("record");
            // The shortcut (if on) learns the pod; a failure leaves the pod on the kernel
            // path, and the next add/del/enable of the host retries.
            if crate::shortcut::is_enabled(host) {
                if let Err(e) = crate::shortcut::sync(host, _lock) {
                    warn!("pod {}: the shortcut did not learn it: {e}", opts.name);
                }
                crash_point("shortcut");
            }
            if record.netns_owned {
                let _ = pod_ns.persist();
            }
            Ok(Added {
                record,
                mode_note: plan.mode_note.clone(),
                attach,
            })
        }
        Err(e) => Err(fail(e, undo, Some(pod_ns))),
    }
}
