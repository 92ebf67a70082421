//! Where the `sockmap` topology meets crate `nsfast-sockmap`.
//!
//! The client and server workers are started inside `cgroup_dir/client` and
//! `cgroup_dir/server`, so the sockets they create are seen by the sockops program attached
//! to `cgroup_dir`; the shortcut's `Drop` detaches it before the cgroups are removed.

use std::any::Any;
use std::path::Path;

/// Why the topology cannot run here, if it cannot.
pub fn probe() -> Result<(), String> {
    nsfast_sys::cgroup::cgroup2_mount()
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Attaches the shortcut to `cgroup_dir`; returns a guard that detaches it and a note.
pub fn attach(cgroup_dir: &Path) -> Result<(Box<dyn Any>, String), String> {
    let opts = nsfast_sockmap::Options {
        cgroup: Some(cgroup_dir.to_path_buf()),
        ports: None,
        exclude_ports: None,
    };
    let sc =
        nsfast_sockmap::Shortcut::attach(&opts).map_err(|e| nsfast_sys::report::error_chain(&e))?;
    let note = format!(
        "sockmap shortcut attached to {}",
        sc.cgroup_path().display()
    );
    Ok((Box::new(sc), note))
}
