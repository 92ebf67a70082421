//! The routing policy: which member a guest's connection goes to, or why it is denied. A
//! pure function of the validated configuration.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use nsfast_sys::vsock::VMADDR_CID_HOST;

use super::args::Transport;
use crate::addr::UNIX_PATH_MAX;

/// Why a connection was not bridged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Deny {
    #[error("{src} is in no group")]
    NotMember { src: u32 },
    #[error("{src} dialled the host, but no group of {src} has another member")]
    Alone { src: u32 },
    #[error("{src} dialled the host, but its groups have {} other members ({}): a host dial needs exactly one partner per bridge (run one bridge per pair on its own ports), or a dial to the sibling's CID with VMADDR_FLAG_TO_HOST where the host delivers those (vhost-vsock drops them)", .candidates.len(), list(.candidates))]
    Ambiguous { src: u32, candidates: Vec<u32> },
    #[error("{src} dialled {dst}, and the two share no group")]
    NoSharedGroup { src: u32, dst: u32 },
    #[error("{src} dialled its own CID")]
    SelfDial { src: u32 },
}

pub(super) fn list(c: &[u32]) -> String {
    c.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

/// A validated bridge configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    groups: Vec<Vec<u32>>,
    members: BTreeMap<u32, Transport>,
    ports: Vec<u32>,
}

/// A configuration that does not hold together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("no --group given: give at least one, e.g. --group 3,4")]
    NoGroup,
    #[error("no --ports given: give at least one port, e.g. --ports 5000")]
    NoPorts,
    #[error("--vm {cid}={transport}: CID {cid} is in no --group")]
    VmNotInGroup { cid: u32, transport: Transport },
    #[error("--vm given twice for CID {0}")]
    VmTwice(u32),
    #[error("--vm {a} and --vm {b} use the same hybrid path {}", .path.display())]
    SamePath { a: u32, b: u32, path: PathBuf },
    #[error("--vm {cid}=hybrid:{}: the listening path {}_{port} is longer than {UNIX_PATH_MAX} bytes", .path.display(), .path.display())]
    PathTooLong { cid: u32, path: PathBuf, port: u32 },
}

impl Config {
    /// Builds a configuration: every CID of a group is a member, reached over AF_VSOCK unless
    /// `vms` says `hybrid:PATH`.
    pub fn new(
        groups: Vec<Vec<u32>>,
        vms: Vec<(u32, Transport)>,
        ports: Vec<u32>,
    ) -> Result<Self, ConfigError> {
        if groups.is_empty() {
            return Err(ConfigError::NoGroup);
        }
        if ports.is_empty() {
            return Err(ConfigError::NoPorts);
        }
        let mut members: BTreeMap<u32, Transport> = groups
            .iter()
            .flatten()
            .map(|&c| (c, Transport::Vsock))
            .collect();
        let mut seen = BTreeSet::new();
        let mut paths: BTreeMap<PathBuf, u32> = BTreeMap::new();
        let max_port_len = ports.iter().max().map_or(1, |p| p.to_string().len());
        for (cid, t) in vms {
            if !seen.insert(cid) {
                return Err(ConfigError::VmTwice(cid));
            }
            let Some(slot) = members.get_mut(&cid) else {
                return Err(ConfigError::VmNotInGroup { cid, transport: t });
            };
            if let Transport::Hybrid(p) = &t {
                if let Some(&a) = paths.get(p) {
                    return Err(ConfigError::SamePath {
                        a,
                        b: cid,
                        path: p.clone(),
                    });
                }
                paths.insert(p.clone(), cid);
                if p.as_os_str().len() + 1 + max_port_len > UNIX_PATH_MAX {
                    return Err(ConfigError::PathTooLong {
                        cid,
                        path: p.clone(),
                        port: ports.iter().copied().max().unwrap_or(0),
                    });
                }
            }
            *slot = t;
        }
        Ok(Self {
            groups,
            members,
            ports,
        })
    }

    pub fn groups(&self) -> &[Vec<u32>] {
        &self.groups
    }

    pub fn ports(&self) -> &[u32] {
        &self.ports
    }

    /// Members and how each is reached.
    pub fn members(&self) -> &BTreeMap<u32, Transport> {
        &self.members
    }

    /// Whether any member is reached over AF_VSOCK (then the bridge opens vsock listeners).
    pub fn uses_vsock(&self) -> bool {
        self.members.values().any(|t| *t == Transport::Vsock)
    }

    /// The other members of `src`'s groups, sorted.
    fn partners(&self, src: u32) -> Vec<u32> {
        let set: BTreeSet<u32> = self
            .groups
            .iter()
            .filter(|g| g.contains(&src))
            .flatten()
            .copied()
            .filter(|&c| c != src)
            .collect();
        set.into_iter().collect()
    }

    /// Where a connection from guest `src` that dialled CID `dialled` goes: the target CID,
    /// or why it is denied. A pure function of the configuration.
    pub fn route(&self, src: u32, dialled: u32) -> Result<u32, Deny> {
        if !self.members.contains_key(&src) {
            return Err(Deny::NotMember { src });
        }
        if dialled == VMADDR_CID_HOST {
            let p = self.partners(src);
            return match p.as_slice() {
                [] => Err(Deny::Alone { src }),
                [one] => Ok(*one),
                _ => Err(Deny::Ambiguous { src, candidates: p }),
            };
        }
        if dialled == src {
            return Err(Deny::SelfDial { src });
        }
        if self
            .groups
            .iter()
            .any(|g| g.contains(&src) && g.contains(&dialled))
        {
            Ok(dialled)
        } else {
            Err(Deny::NoSharedGroup { src, dst: dialled })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cfg(groups: &[&[u32]], vms: &[(u32, &str)]) -> Config {
        Config::new(
            groups.iter().map(|g| g.to_vec()).collect(),
            vms.iter()
                .map(|(c, p)| (*c, Transport::Hybrid(PathBuf::from(p))))
                .collect(),
            vec![5000],
        )
        .unwrap()
    }

    #[test]
    fn config_checks_members() {
        let g = || vec![vec![3, 4]];
        assert_eq!(
            Config::new(vec![], vec![], vec![1]).unwrap_err(),
            ConfigError::NoGroup
        );
        assert_eq!(
            Config::new(g(), vec![], vec![]).unwrap_err(),
            ConfigError::NoPorts
        );
        let e = Config::new(g(), vec![(5, Transport::Vsock)], vec![1]).unwrap_err();
        assert_eq!(e.to_string(), "--vm 5=vsock: CID 5 is in no --group");
        let e = Config::new(
            g(),
            vec![(3, Transport::Vsock), (3, Transport::Vsock)],
            vec![1],
        )
        .unwrap_err();
        assert_eq!(e, ConfigError::VmTwice(3));
        let p = || Transport::Hybrid("/tmp/x".into());
        assert!(matches!(
            Config::new(g(), vec![(3, p()), (4, p())], vec![1]).unwrap_err(),
            ConfigError::SamePath { a: 3, b: 4, .. }
        ));
        let long = Transport::Hybrid(PathBuf::from(format!("/{}", "a".repeat(100))));
        assert!(matches!(
            Config::new(g(), vec![(3, long)], vec![4000000000]).unwrap_err(),
            ConfigError::PathTooLong { cid: 3, .. }
        ));
        let c = Config::new(g(), vec![(4, p())], vec![1]).unwrap();
        assert_eq!(c.members()[&3], Transport::Vsock);
        assert_eq!(c.members()[&4], p());
        assert!(c.uses_vsock());
        let c = Config::new(
            g(),
            vec![(3, Transport::Hybrid("/a".into())), (4, p())],
            vec![1],
        )
        .unwrap();
        assert!(!c.uses_vsock());
    }

    #[test]
    fn routing_within_and_across_groups() {
        let c = cfg(&[&[3, 4], &[5, 6, 7], &[8]], &[]);
        // Dialling the host: the one other member.
        assert_eq!(c.route(3, 2), Ok(4));
        assert_eq!(c.route(4, 2), Ok(3));
        // Sibling by CID (VMADDR_FLAG_TO_HOST), same group.
        assert_eq!(c.route(3, 4), Ok(4));
        assert_eq!(c.route(6, 7), Ok(7));
        // Across groups.
        assert_eq!(c.route(3, 5), Err(Deny::NoSharedGroup { src: 3, dst: 5 }));
        assert_eq!(c.route(5, 3), Err(Deny::NoSharedGroup { src: 5, dst: 3 }));
        // Not a member at all, as source or target.
        assert_eq!(c.route(9, 2), Err(Deny::NotMember { src: 9 }));
        assert_eq!(c.route(9, 3), Err(Deny::NotMember { src: 9 }));
        assert_eq!(c.route(3, 9), Err(Deny::NoSharedGroup { src: 3, dst: 9 }));
        // Reserved CIDs dialled with to-host.
        assert_eq!(c.route(3, 0), Err(Deny::NoSharedGroup { src: 3, dst: 0 }));
        assert_eq!(c.route(3, 1), Err(Deny::NoSharedGroup { src: 3, dst: 1 }));
        // Host dial in a group of three: ambiguous, and the message says what to do.
        let e = c.route(5, 2).unwrap_err();
        assert_eq!(
            e,
            Deny::Ambiguous {
                src: 5,
                candidates: vec![6, 7]
            }
        );
        assert!(e.to_string().contains("VMADDR_FLAG_TO_HOST"), "{e}");
        // A group of one reaches nobody.
        assert_eq!(c.route(8, 2), Err(Deny::Alone { src: 8 }));
        assert_eq!(c.route(3, 3), Err(Deny::SelfDial { src: 3 }));
    }

    #[test]
    fn routing_over_several_groups() {
        // 4 is in two groups: it reaches both, the host dial is ambiguous for it only.
        let c = cfg(&[&[3, 4], &[4, 5]], &[]);
        assert_eq!(c.route(3, 2), Ok(4));
        assert_eq!(c.route(5, 2), Ok(4));
        assert!(matches!(c.route(4, 2), Err(Deny::Ambiguous { .. })));
        assert_eq!(c.route(4, 5), Ok(5));
        assert_eq!(c.route(3, 5), Err(Deny::NoSharedGroup { src: 3, dst: 5 }));
        // The same pair in two groups is one partner, not two.
        let c = cfg(&[&[3, 4], &[4, 3]], &[]);
        assert_eq!(c.route(3, 2), Ok(4));
    }

    proptest! {
        // Routing invariants over random groups: a route is never to the source, always to a
        // member sharing a group with it, and a sibling dial succeeds exactly when the two
        // share a group.
        #[test]
        fn routing_invariants(
            groups in proptest::collection::vec(proptest::collection::btree_set(3u32..10, 1..4), 1..4),
            src in 2u32..11,
            dialled in 0u32..11,
        ) {
            let groups: Vec<Vec<u32>> = groups.into_iter().map(|g| g.into_iter().collect()).collect();
            let c = Config::new(groups.clone(), vec![], vec![1]).unwrap();
            let share = |a: u32, b: u32| groups.iter().any(|g| g.contains(&a) && g.contains(&b));
            match c.route(src, dialled) {
                Ok(dst) => {
                    prop_assert_ne!(dst, src);
                    prop_assert!(share(src, dst));
                    if dialled != VMADDR_CID_HOST {
                        prop_assert_eq!(dst, dialled);
                    }
                }
                Err(_) => {
                    if dialled != VMADDR_CID_HOST && dialled != src {
                        prop_assert!(!share(src, dialled));
                    }
                }
            }
        }
    }
}
