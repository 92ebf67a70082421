//! `pod del` and everything that removes pod state: one pod, a pending record (an `add` that
//! died), every pod of a host, the host's shared state once its last pod is gone, and the
//! state of namespaces that no longer exist.

use std::path::PathBuf;

use nsfast_sys::netns;
use tracing::{info, warn};

use super::*;
use crate::datapath;
use crate::error::PodError;
use crate::state::{Host, HostLock, PodRecord};

/// Undoes whatever exists of the pending record `r` (an `add` that died): its endpoint entry
/// (unless a complete pod of the host owns that address now), its pins, its device pair (and
/// with it the pod's addresses and routes), and the namespace if `add` was making it. The
/// record itself stays: the caller removes it ([`forget`]) once everything else (the CNI
/// plugin: the IPAM lease) is released. Lock held.
pub fn undo_pending(host: &Host, r: &PodRecord) -> Result<(), PodError> {
    for ip in endpoint_keys(&r.addrs()) {
        if let Some(ep) = datapath::endpoint_get(host, ip)? {
            let owned_by_other = host.records()?.iter().any(|o| {
                !o.pending
                    && o.name != r.name
                    && endpoint_keys(&o.addrs()).contains(&ip)
                    && o.host_ifindex == ep.ifindex
            });
            if !owned_by_other {
                datapath::endpoint_remove(host, ip, ep.ifindex)?;
            }
        }
    }
    remove_attachments(host, r)
}

/// Removes the record of pod `name` and, if it was the host's last, the host's state. Lock
/// held.
pub fn forget(host: &Host, name: &str) -> Result<(), PodError> {
    host.remove_record(name)?;
    gc_host(host).map(|_| ())
}

/// [`forget`] for an `add` that failed: the record goes; the host's state too if the add
/// left no pod, unless the shortcut was on before the add (`shortcut_was_on`) — it stays
/// enabled, as the add found it. Lock held.
pub fn forget_failed_add(host: &Host, name: &str, shortcut_was_on: bool) -> Result<(), PodError> {
    host.remove_record(name)?;
    gc_after_failed_add(host, shortcut_was_on).map(|_| ())
}

pub(super) fn gc_after_failed_add(host: &Host, shortcut_was_on: bool) -> Result<bool, PodError> {
    if shortcut_was_on && crate::shortcut::is_enabled(host) {
        return Ok(false);
    }
    gc_host(host)
}

/// Deletes pod `name` on `host`: endpoint, programs, devices, routes, the namespace if `add`
/// made it, the record; with the host's last pod also its maps, uplink programs and state
/// directories. A pending record (an `add` that died) is undone. `Ok(None)` if there was no
/// such pod (nothing changed).
pub fn del(name: &str, host: Option<&str>) -> Result<Option<PodRecord>, PodError> {
    if !valid_pod_name(name) {
        return Err(PodError::BadName(name.into()));
    }
    let host = Host::open(host)?;
    if !host.state_dir().exists() {
        return Ok(None);
    }
    let lock = host.lock()?;
    let r = del_locked(&host, &lock, name)?;
    gc_host(&host)?;
    Ok(r)
}

/// Deletes pod `name` (complete or pending) with the host's lock held; leaves the host's
/// state for [`gc_host`].
pub fn del_locked(
    host: &Host,
    _lock: &HostLock,
    name: &str,
) -> Result<Option<PodRecord>, PodError> {
    let Some(r) = host.record(name)? else {
        return Ok(None);
    };
    remove(host, &r)?;
    if let Err(e) = crate::policy::sync(host, _lock) {
        warn!("pod {name}: the policy maps were not updated: {e}");
    }
    if let Err(e) = crate::shortcut::sync(host, _lock) {
        warn!("pod {name}: the shortcut did not forget it: {e}");
    }
    Ok(Some(r))
}

/// Deletes every pod of `host` and the host's maps, uplink programs and state directories
/// (including pins an interrupted run left without a record), and the stale state of dead
/// namespaces that had this namespace's inode (their devices are gone with them: only their
/// pins and records are removed, nothing in this namespace).
pub fn del_all(host: Option<&str>) -> Result<Vec<PodRecord>, PodError> {
    let host = Host::open(host)?;
    remove_stale_of(&host)?;
    if !host.state_dir().exists() && !host.pin_dir().exists() {
        return Ok(Vec::new());
    }
    remove_where(&host, |_| false)
}

/// Removes the stale state of dead namespaces that had `host`'s inode (see
/// [`crate::state::orphaned_keys_of_inode`]): their pins and records only, nothing in `host`.
/// Returns the directories removed.
pub fn remove_stale_of(host: &Host) -> Result<Vec<PathBuf>, PodError> {
    let mut gone = Vec::new();
    for k in crate::state::orphaned_keys_of_inode(host.ns.inode()) {
        for d in crate::state::remove_orphan(&k)? {
            info!("removed stale pod state {}", d.display());
            gone.push(d);
        }
    }
    Ok(gone)
}

/// With no pod left on `host`: detaches the uplinks' tc filters (TCX uplinks go with their
/// pins), then removes the host's pins and state directories. Lock held.
pub fn gc_host(host: &Host) -> Result<bool, PodError> {
    if !host.records()?.is_empty() {
        return Ok(false);
    }
    for f in host.uplink_tcs()? {
        datapath::detach_tc(host, &f)?;
        host.remove_uplink_tc(&f.ifname)?;
    }
    host.gc_if_empty()
}

/// Removes the pod state of host namespaces that no longer exist (see
/// [`crate::state::orphaned_keys`]). Returns the directories removed.
pub fn remove_orphaned_state() -> Result<Vec<PathBuf>, PodError> {
    let mut gone = Vec::new();
    for k in crate::state::orphaned_keys() {
        gone.extend(crate::state::remove_orphan(&k)?);
    }
    Ok(gone)
}

/// The steps of a `del` (`nsfast pod del`, CNI DEL, GC) that [`CRASH_ENV`] can stop after:
/// - `del-marked`: the record is marked pending, nothing else changed;
/// - `del-endpoint`: the endpoint map no longer has the pod;
/// - `del-attachments`: pins, filters, devices and the namespace nsfast made are gone, the
///   record not yet.
pub const DEL_STEPS: &[&str] = &["del-marked", "del-endpoint", "del-attachments"];

/// Tears down what `r` describes (lock held); a pending record through [`undo_pending`].
/// A complete record is marked pending first: a `del` killed part way leaves a record that
/// says so (`pod list` shows it pending, never as a working pod), and the next `del` or an
/// `add` of the name undoes the rest.
fn remove(host: &Host, r: &PodRecord) -> Result<(), PodError> {
    if r.pending {
        undo_pending(host, r)?;
        return host.remove_record(&r.name);
    }
    let mut marked = r.clone();
    marked.pending = true;
    host.write_record(&marked)?;
    crash_point("del-marked");
    for ip in endpoint_keys(&r.addrs()) {
        datapath::endpoint_remove(host, ip, r.host_ifindex)?;
    }
    crash_point("del-endpoint");
    remove_attachments(host, r)?;
    crash_point("del-attachments");
    host.remove_record(&r.name)
}

/// What a pod holds beyond its endpoint entry and record, complete or pending alike: link
/// pins, tc filters, the device pair (with it the pod's addresses and routes) and the
/// namespace if nsfast made it. Lock held.
fn remove_attachments(host: &Host, r: &PodRecord) -> Result<(), PodError> {
    for p in &r.link_pins {
        datapath::unpin(p)?;
    }
    for f in &r.tc_filters {
        datapath::detach_tc(host, f)?;
    }
    host.netlink()?.delete_link(&r.host_if)?;
    if r.netns_owned {
        netns::delete_named(&r.netns)?;
    }
    Ok(())
}

/// Deletes every pod on `host` whose record fails `keep` (used by CNI GC). Returns the names.
pub fn remove_where(
    host: &Host,
    keep: impl Fn(&PodRecord) -> bool,
) -> Result<Vec<PodRecord>, PodError> {
    let _lock = host.lock()?;
    let mut gone = Vec::new();
    for r in host.records()? {
        if !keep(&r) {
            remove(host, &r)?;
            gone.push(r);
        }
    }
    gc_host(host)?;
    Ok(gone)
}
