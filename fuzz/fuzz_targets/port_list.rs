//! Port lists: `--ports`/`--exclude-ports` of sockmap and vpnrelay (TCP/UDP ports) and the
//! vsock bridge's `--ports`, `--group` and `--vm`.
#![no_main]
use libfuzzer_sys::fuzz_target;
use nsfast_sys::ports::PortList;
use nsfast_vsock::bridge;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    match PortList::parse("--ports", s) {
        Ok(p) => {
            assert!(!p.is_empty());
            assert!(p.iter().all(|port| port >= 1), "{s:?}: port 0 in {p:?}");
            let compact = p.to_compact_string();
            assert_eq!(
                PortList::parse("--ports", &compact).as_ref(),
                Ok(&p),
                "{compact}"
            );
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
    match nsfast_sys::ports::parse_list("--ports", s, 1, bridge::MAX_VALUE, Some(bridge::MAX_PORTS))
    {
        Ok(v) => {
            assert!(!v.is_empty() && v.len() <= bridge::MAX_PORTS, "{}", v.len());
            assert!(v.windows(2).all(|w| w[0] < w[1]), "sorted and distinct");
            assert!(v.iter().all(|&p| (1..=bridge::MAX_VALUE).contains(&p)));
        }
        Err(e) => assert_eq!(e.flag(), "--ports"),
    }
    if let Ok(g) = bridge::parse_group(s) {
        assert!(g
            .iter()
            .all(|&c| (bridge::MIN_GUEST_CID..=bridge::MAX_VALUE).contains(&c)));
    }
    if let Ok((cid, _)) = bridge::parse_vm(s) {
        assert!((bridge::MIN_GUEST_CID..=bridge::MAX_VALUE).contains(&cid));
    }
});
