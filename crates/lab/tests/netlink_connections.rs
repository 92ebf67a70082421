//! Lab worlds hold one netlink handle per namespace while they build: a veth pair opens two
//! connections (one-call-one-connection code opened six: the pair, then four addresses), the
//! two-host pod world without pods two (was six: the wire, an address and a route per host).
//! Counted with `nsfast_sys::net::connections_opened`, which is process-wide: this file holds
//! a single test so that nothing else in the process opens connections while it counts; keep
//! it that way. Needs root.

use nsfast_lab::pods::{ModeRequest, PodsSpec};
use nsfast_lab::topology::Topology as _;
use nsfast_lab::world::{unique, VethPair};
use nsfast_sys::net::connections_opened;

#[test]
fn lab_worlds_open_one_netlink_connection_per_namespace() {
    nsfast_lab::require_root();
    let before = connections_opened();
    let pair = VethPair::new();
    assert_eq!(
        connections_opened() - before,
        2,
        "veth pair: client + server"
    );
    drop(pair);

    let before = connections_opened();
    let world = PodsSpec {
        mode: ModeRequest::Veth,
        attach: nsfast_lab::pods::AttachRequest::Auto,
        pods_per_host: 0,
    }
    .expect_built(&unique("nl"));
    assert_eq!(connections_opened() - before, 2, "two hosts and their wire");
    drop(world);
}
