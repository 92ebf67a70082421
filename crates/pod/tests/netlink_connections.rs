//! One netlink connection per namespace per operation: a `pod add`, a `check` and a `pod del`
//! through the pod crate's API, in throwaway namespaces, counted with
//! `nsfast_sys::net::connections_opened`. Needs root. This file holds a single test so that
//! no other test of the same process opens connections while it counts (the counter is
//! process-wide); keep it that way.
//!
//! Uses no test-support crate on purpose (plain `std` + the crates under test).

use nsfast_pod::pod::{self, AddOptions, ModeRequest};
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

#[test]
fn pod_add_check_del_open_one_netlink_connection_per_namespace() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "needs root (network namespaces, BPF): run as root"
    );
    let id = format!("{}-{:x}", std::process::id(), connections_opened());
    let (host, pod_name) = (format!("nsft-nlh-{id}"), format!("nsft-nlp-{id}"));
    let host_ns = NetNs::create(&host).expect("host namespace");
    // Dropped before `host_ns`: the pods go while their host still exists.
    let cleanup = Cleanup {
        host,
        pod: pod_name,
    };

    // add touches two namespaces: the host (device pair, /32 route) and the pod (its end of
    // the pair, address, routes).
    let mut opts = AddOptions::new(&cleanup.pod, "10.250.7.2/24".parse().unwrap());
    opts.mode = ModeRequest::Veth;
    opts.host = Some(cleanup.host.clone());
    let (added, n) = opened_by(|| pod::add(&opts));
    let added = added.expect("pod add");
    assert_eq!(n, 2, "pod add: one connection to the host, one to the pod");
    assert!(!added.record.pending);

    // check reads the host device and the pod's addresses: again one connection each.
    let (problems, n) = opened_by(|| {
        let host = Host::open(Some(&cleanup.host)).expect("open host");
        pod::check(&host, &added.record)
    });
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(n, 2, "check: one connection to the host, one to the pod");

    // del touches only the host (deleting the host end of the pair takes the pod's with it).
    let (gone, n) = opened_by(|| pod::del(&cleanup.pod, Some(&cleanup.host)));
    assert!(gone.expect("pod del").is_some());
    assert_eq!(n, 1, "pod del: one connection to the host");
    assert!(!netns::list_named().contains(&cleanup.pod));
    drop(cleanup);
    drop(host_ns);
}
