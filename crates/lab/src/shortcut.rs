//! The sockmap shortcut (crate nsfast-sockmap) attached to a throwaway cgroup, as the bench's
//! `sockmap` topology uses it.

use std::any::Any;
use std::path::Path;

/// Why the shortcut cannot be attached here, if it cannot (no cgroup2 mount).
pub fn probe() -> Result<(), String> {
    nsfast_sys::cgroup::cgroup2_mount()
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Attaches the shortcut to `cgroup_dir`; returns a guard that detaches it on drop and a note.
/// Without the splice guard where it cannot attach: the bench's peers read with recv(2) only,
/// never switching a socket to splice(2), so the hole it closes cannot open here (the note
/// says whether it runs).
pub fn attach(cgroup_dir: &Path) -> Result<(Box<dyn Any>, String), String> {
    let opts = nsfast_sockmap::Options {
        cgroup: Some(cgroup_dir.to_path_buf()),
        ports: None,
        exclude_ports: None,
        queue_limit: None,
        keep_tcp_after: None,
        probe_interval: None,
        allow_splice_hole: true,
    };
    let sc =
        nsfast_sockmap::Shortcut::attach(&opts).map_err(|e| nsfast_sys::report::error_chain(&e))?;
    let note = format!(
        "sockmap shortcut attached to {} (splice guard {})",
        sc.cgroup_path().display(),
        if sc.splice_guard() { "on" } else { "off" }
    );
    Ok((Box::new(sc), note))
}
