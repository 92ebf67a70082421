//! The netlink handle: one connection per namespace, reused for a whole sequence of link,
//! address, route, neighbour, rule and tc calls, each call doing what it says. Two throwaway
//! namespaces; needs root. A single test in this file: the connection counter is
//! process-wide, so nothing else in this process may open connections while it counts.

use std::net::{IpAddr, Ipv4Addr, SocketAddrV4};

use nsfast_sys::net::{connections_opened, PortRule};
use nsfast_sys::netns::NetNs;

#[test]
fn one_handle_per_namespace_serves_a_whole_sequence() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "needs root (network namespaces): run as root"
    );
    // Names in nsfast_lab::name's test form (nsfast-sys cannot depend on the lab), so the
    // dead-run cleanup finds them after a kill.
    let id = std::process::id();
    let a = NetNs::create(&format!("nsft{id}x0-nla")).unwrap();
    let b = NetNs::create(&format!("nsft{id}x1-nlb")).unwrap();
    let before = connections_opened();
    let na = a.netlink().unwrap();
    let nb = b.netlink().unwrap();

    // Links: a pair across the namespaces, made under a temporary name in b.
    na.create_veth_into("nlt0", "nltmp0", &nb, "eth0").unwrap();
    assert!(na.link_exists("nlt0").unwrap());
    assert!(!na.link_exists("nltmp0").unwrap());
    assert!(nb.link_exists("eth0").unwrap());
    assert!(!nb.link_exists("nltmp0").unwrap());
    let mac_b = nb.link_mac("eth0").unwrap();
    assert_ne!(mac_b, [0; 6]);
    assert!(na.link_index("nlt0").unwrap() > 1);

    // Addresses and routes.
    na.add_address("nlt0", IpAddr::V4(Ipv4Addr::new(10, 251, 0, 1)), 24)
        .unwrap();
    nb.add_address("eth0", IpAddr::V4(Ipv4Addr::new(10, 251, 0, 2)), 24)
        .unwrap();
    assert_eq!(
        nb.link_ipv4_addresses("eth0").unwrap(),
        vec![(Ipv4Addr::new(10, 251, 0, 2), 24)]
    );
    nb.add_link_route(Ipv4Addr::new(169, 254, 9, 9), 32, "eth0")
        .unwrap();
    nb.add_route(
        IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        0,
        Some(IpAddr::V4(Ipv4Addr::new(10, 251, 0, 1))),
        None,
    )
    .unwrap();
    na.add_neighbour("nlt0", IpAddr::V4(Ipv4Addr::new(10, 251, 0, 2)), mac_b)
        .unwrap();

    // Rules steering to a local table, found, counted and deleted again.
    na.add_local_default_route(4999).unwrap();
    let rule = PortRule {
        iif: "nlt0".into(),
        ip_proto: libc::IPPROTO_UDP as u8,
        dport: (5000, 5010),
        table: 4999,
        priority: 4999,
        from: None,
    };
    na.add_port_rule(&rule).unwrap();
    na.add_port_rule(&rule).unwrap(); // EEXIST is success
    let from = SocketAddrV4::new(Ipv4Addr::new(10, 251, 0, 2), 5555);
    na.add_port_rule(&PortRule {
        from: Some(from),
        ..rule.clone()
    })
    .unwrap();
    assert_eq!(na.count_port_rules("nlt0", 4999, 4999).unwrap(), 2);
    assert_eq!(na.count_any_rules_to_table(4999).unwrap(), 2);
    assert_eq!(
        na.delete_port_rules_from("nlt0", 4999, 4999, from).unwrap(),
        1
    );
    assert_eq!(na.delete_port_rules("nlt0", 4999, 4999).unwrap(), 1);
    assert_eq!(na.count_any_rules_to_table(4999).unwrap(), 0);
    na.delete_local_default_route(4999).unwrap();
    na.delete_local_default_route(4999).unwrap(); // missing is fine

    // tc: no clsact qdisc, so no filters and nothing to delete.
    assert!(!na.has_clsact("nlt0").unwrap());
    assert!(na.tc_filters("nlt0", true).unwrap().is_empty());
    assert!(!na.delete_clsact("nlt0", None).unwrap());

    // A pair inside one namespace; deleting one end takes the peer with it (renaming was
    // done by create_veth_into above: nltmp0 became eth0).
    na.create_veth("nlx0", &na, "nlx1").unwrap();
    na.delete_link("nlx1").unwrap();
    assert!(!na.link_exists("nlx0").unwrap());
    na.delete_link("nlt0").unwrap();
    na.delete_link("nlt0").unwrap(); // missing is fine
    assert!(!nb.link_exists("eth0").unwrap());

    assert_eq!(
        connections_opened() - before,
        2,
        "one connection per namespace for the whole sequence"
    );
}
