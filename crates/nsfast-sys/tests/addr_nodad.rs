//! An IPv6 address added with `Netlink::add_address` is usable as soon as the call returns:
//! it is added without duplicate address detection (IFA_F_NODAD), so it is never tentative and
//! bind(2) to it works at once, also where DAD is on (a fresh namespace's default). Two
//! throwaway namespaces; needs root.

use std::net::{IpAddr, Ipv6Addr, SocketAddrV6, UdpSocket};
use std::process::Command;

use nsfast_sys::net::set_sysctl;
use nsfast_sys::netns::NetNs;

#[test]
fn ipv6_addresses_are_usable_as_soon_as_they_are_added() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "needs root (network namespaces): run as root"
    );
    // Names in nsfast_lab::name's test form (nsfast-sys cannot depend on the lab), so the
    // dead-run cleanup finds them after a kill.
    let id = std::process::id();
    let (name_a, name_b) = (format!("nsft{id}x0-dad"), format!("nsft{id}x1-dad"));
    let a = NetNs::create(&name_a).unwrap();
    let b = NetNs::create(&name_b).unwrap();
    let (na, nb) = (a.netlink().unwrap(), b.netlink().unwrap());
    na.create_veth_into("dad0", "dadtmp0", &nb, "eth0").unwrap();
    // DAD on, as in any fresh namespace; made explicit so the test does not hang on defaults.
    for (ns, dev) in [(&a, "dad0"), (&b, "eth0")] {
        for k in ["all", dev] {
            set_sysctl(Some(ns), &format!("net.ipv6.conf.{k}.accept_dad"), "1").unwrap();
        }
    }
    na.link_up("dad0").unwrap();
    nb.link_up("eth0").unwrap();
    let ours = |i: u16| Ipv6Addr::new(0xfd00, 0xdad, 0, 0, 0, 0, 0, i);
    for i in 1..=10 {
        let addr = ours(i);
        nb.add_address("eth0", IpAddr::V6(addr), 64).unwrap();
        b.run(|| UdpSocket::bind(SocketAddrV6::new(addr, 0, 0, 0)).map(drop))
            .unwrap()
            .unwrap_or_else(|e| panic!("bind to {addr} right after adding it: {e}"));
    }
    let out = Command::new("ip")
        .args([
            "-n",
            &name_b,
            "-6",
            "addr",
            "show",
            "dev",
            "eth0",
            "tentative",
        ])
        .output()
        .expect("run ip");
    let tentative = String::from_utf8_lossy(&out.stdout);
    assert!(
        !tentative.contains("fd00:dad::"),
        "tentative addresses (under DAD): {tentative}"
    );
    na.delete_link("dad0").unwrap();
    a.delete().unwrap();
    b.delete().unwrap();
}
