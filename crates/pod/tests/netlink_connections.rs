//! One netlink connection per namespace per operation: a `pod add`, a `check` and a `pod del`
//! through the pod crate's API, in throwaway namespaces, counted with
//! `nsfast_sys::net::connections_opened`. Needs root. This file holds a single test so that
//! no other test of the same process opens connections while it counts (the counter is
//! process-wide); keep it that way.
//!
//! Uses nothing of the lab but its names (`nsfast_lab::name`, which opens no connection), so
//! every connection counted is the pod crate's.

use nsfast_pod::pod::{self, AddOptions, AttachRequest, ModeRequest};
use nsfast_pod::Host;
use nsfast_sys::net::connections_opened;
use nsfast_sys::netns::{self, NetNs};

/// Removes the pod's state and namespaces even when the test fails half-way.
struct Cleanup {
    host: String,
    pod: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = pod::del_all(Some(&self.host));
        let _ = netns::delete_named(&self.pod);
        let _ = netns::delete_named(&self.host);
    }
}

/// Connections opened by `f`.
fn opened_by<R>(f: impl FnOnce() -> R) -> (R, usize) {
    let before = connections_opened();
    let r = f();
    (r, connections_opened() - before)
}

/// One add, check and del of a veth pod attached with `attach` (TCX: a pinned link; tc: a
/// cls_bpf filter, which del finds, checks and removes over netlink).
fn add_check_del(host: &str, pod_name: &str, attach: AttachRequest) {
    // add touches two namespaces: the host (device pair, /32 route) and the pod (its end of
    // the pair, address, routes).
    let mut opts = AddOptions::new(pod_name, "10.250.7.2/24".parse().unwrap());
    opts.mode = ModeRequest::Veth;
    opts.attach = attach;
    opts.host = Some(host.to_string());
    let (added, n) = opened_by(|| pod::add(&opts));
    let added = added.expect("pod add");
    assert_eq!(
        n, 2,
        "{attach:?} pod add: one connection to the host, one to the pod"
    );
    assert!(!added.record.pending);

    // check reads the host device (and tc filters) and the pod's addresses: one each.
    let (problems, n) = opened_by(|| {
        let host = Host::open(Some(host)).expect("open host");
        pod::check(&host, &added.record)
    });
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(
        n, 2,
        "{attach:?} check: one connection to the host, one to the pod"
    );

    // del touches only the host (deleting the host end of the pair takes the pod's with it).
    let (gone, n) = opened_by(|| pod::del(pod_name, Some(host)));
    assert!(gone.expect("pod del").is_some());
    assert_eq!(n, 1, "{attach:?} pod del: one connection to the host");
    assert!(!netns::list_named().contains(&pod_name.to_string()));
}

#[test]
fn pod_add_check_del_open_one_netlink_connection_per_namespace() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "needs root (network namespaces, BPF): run as root"
    );
    let (host, pod_name) = (
        nsfast_lab::name::unique("nlh"),
        nsfast_lab::name::unique("nlp"),
    );
    let host_ns = NetNs::create(&host).expect("host namespace");
    // Dropped before `host_ns`: the pods go while their host still exists.
    let cleanup = Cleanup {
        host,
        pod: pod_name,
    };
    for attach in [AttachRequest::Auto, AttachRequest::Tc] {
        add_check_del(&cleanup.host, &cleanup.pod, attach);
    }
    drop(cleanup);
    drop(host_ns);
}
