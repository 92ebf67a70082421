//! Where the `sockmap` topology meets crate `nsfast-sockmap`.
//!
//! That crate is not on this branch yet, so [`probe`] reports the topology as skipped. Wiring
//! it at merge (add `nsfast-sockmap.workspace = true` to this crate's dependencies):
//!
//! ```ignore
//! pub fn probe() -> Result<(), String> { Ok(()) }
//!
//! pub fn attach(cgroup_dir: &Path) -> Result<(Box<dyn Any>, String), String> {
//!     let opts = nsfast_sockmap::Options { cgroup: Some(cgroup_dir.to_path_buf()), ports: None, exclude_ports: None };
//!     let sc = nsfast_sockmap::Shortcut::attach(&opts).map_err(|e| e.to_string())?;
//!     let note = format!("sockmap shortcut attached to {}", sc.cgroup_path().display());
//!     Ok((Box::new(sc), note))
//! }
//! ```
//!
//! The client and server workers are started inside `cgroup_dir/client` and
//! `cgroup_dir/server`, so the sockets they create are seen by the sockops program attached
//! to `cgroup_dir`; the shortcut's `Drop` detaches it before the cgroups are removed.

use std::any::Any;
use std::path::Path;

/// Why the topology cannot run here, if it cannot.
pub fn probe() -> Result<(), String> {
    Err("sockmap crate not merged yet".into())
}

/// Attaches the shortcut to `cgroup_dir`; returns a guard that detaches it and a note.
pub fn attach(cgroup_dir: &Path) -> Result<(Box<dyn Any>, String), String> {
    Err(format!(
        "cannot attach the sockmap shortcut to {}: sockmap crate not merged yet",
        cgroup_dir.display()
    ))
}
