//! Where the `sockmap` topology meets the sockmap shortcut (through `nsfast_lab::shortcut`).
//!
//! The client and server workers are started inside `cgroup_dir/client` and
//! `cgroup_dir/server`, so the sockets they create are seen by the sockops program attached
//! to `cgroup_dir`; the shortcut's `Drop` detaches it before the cgroups are removed.

pub use nsfast_lab::shortcut::{attach, probe};
