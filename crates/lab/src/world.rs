//! Throwaway topologies for root tests. Everything is named with a per-process prefix and
//! removed on drop, which also runs when a test panics.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

use nsfast_sys::cgroup::{cgroup2_mount, Cgroup};
use nsfast_sys::net;
use nsfast_sys::netns::NetNs;

pub use crate::name::unique;

/// A cgroup under the cgroup2 mount, removed on drop (processes in it must have exited).
#[derive(Debug)]
pub struct TestCgroup {
    cg: Cgroup,
}

impl TestCgroup {
    pub fn new() -> Self {
        let root = cgroup2_mount().expect("cgroup2 mount");
        let cg = Cgroup::create(root.join(unique("cg"))).expect("create test cgroup");
        Self { cg }
    }

    pub fn path(&self) -> &Path {
        self.cg.path()
    }

    pub fn procs(&self) -> PathBuf {
        self.cg.path().join("cgroup.procs")
    }
}

impl Default for TestCgroup {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        // Processes may take a moment to leave after exiting.
        for _ in 0..50 {
            if self.cg.remove().is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        eprintln!(
            "warning: could not remove test cgroup {}",
            self.cg.path().display()
        );
    }
}

/// Two namespaces, `client` and `server`, joined by a veth pair:
/// client 10.99.0.1/24 + fd99::1/64, server 10.99.0.2/24 + fd99::2/64 (in every instance:
/// namespaces are separate, so instances can coexist with identical addresses).
#[derive(Debug)]
pub struct VethPair {
    pub client: NetNs,
    pub server: NetNs,
}

impl VethPair {
    pub const CLIENT_V4: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 1);
    pub const SERVER_V4: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 2);
    pub const CLIENT_V6: Ipv6Addr = Ipv6Addr::new(0xfd99, 0, 0, 0, 0, 0, 0, 1);
    pub const SERVER_V6: Ipv6Addr = Ipv6Addr::new(0xfd99, 0, 0, 0, 0, 0, 0, 2);

    pub const CLIENT_IF: &'static str = "nsc0";
    pub const SERVER_IF: &'static str = "nss0";

    pub fn new() -> Self {
        let client = NetNs::create(&unique("c")).expect("create client netns");
        let server = NetNs::create(&unique("s")).expect("create server netns");
        for ns in [&client, &server] {
            // No DAD, so IPv6 addresses are usable at once.
            net::set_sysctl(Some(ns), "net.ipv6.conf.all.accept_dad", "0").expect("sysctl");
            net::set_sysctl(Some(ns), "net.ipv6.conf.default.accept_dad", "0").expect("sysctl");
        }
        let (c, s) = (
            client.netlink().expect("netlink in client"),
            server.netlink().expect("netlink in server"),
        );
        c.create_veth(Self::CLIENT_IF, &s, Self::SERVER_IF)
            .expect("create veth pair");
        for (nl, ifname, v4, v6) in [
            (&c, Self::CLIENT_IF, Self::CLIENT_V4, Self::CLIENT_V6),
            (&s, Self::SERVER_IF, Self::SERVER_V4, Self::SERVER_V6),
        ] {
            nl.add_address(ifname, IpAddr::V4(v4), 24).expect("addr");
            nl.add_address(ifname, IpAddr::V6(v6), 64).expect("addr6");
        }
        Self { client, server }
    }
}

impl Default for VethPair {
    fn default() -> Self {
        Self::new()
    }
}

/// [`VethPair`] as a [`crate::topology::Topology`] (names come from [`unique`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct VethSpec;

impl crate::topology::Topology for VethSpec {
    type Ctx = ();
    type Guard = VethPair;
    type Error = std::convert::Infallible;

    fn name(&self) -> &str {
        "veth-pair"
    }

    /// Tear-down: both namespaces (and the pair with them) when the guard drops.
    fn build(&self, _: &()) -> Result<VethPair, Self::Error> {
        Ok(VethPair::new())
    }
}

/// Device names in namespace `ns` (a name under /run/netns or a path), sorted, read from
/// /proc/thread-self/net/dev inside it (no `ip` needed: the VM guests have busybox only).
pub fn link_names(ns: &str) -> Vec<String> {
    let ns = NetNs::open(ns).expect("open namespace");
    let dev = ns
        .run(|| std::fs::read_to_string("/proc/thread-self/net/dev"))
        .unwrap()
        .expect("read net/dev");
    let mut v: Vec<String> = dev
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next())
        .map(|n| n.trim().to_string())
        .collect();
    v.sort();
    v
}
