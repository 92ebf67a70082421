//! A host's NetworkPolicies and namespace labels (`nsfast policy`).
//!
//! Stored per host network namespace (the key of [`Host`]) in one file,
//! `/run/nsfast/policy/<key>/policies.json`: a generation number, the policy objects as the
//! schema writes them, and the namespaces' labels. Every change rewrites the whole file the
//! way pod records are written (a `0600` temporary file opened with `O_NOFOLLOW`, fsync'd,
//! renamed over the old one, the directory fsync'd; directories `0700`), so a reader sees the
//! old generation or the new one, never a mix, and a change killed at any point (SIGKILL
//! included) leaves one of the two. A temporary file found later belongs to a change that
//! died before its rename: the next command (which holds the lock) removes it, so that
//! change did not happen. Changes hold the lock file `.lock` of that directory.
//!
//! Input is parsed and checked in full before the lock is taken: bad input changes nothing.
//!
//! [`cluster`] is what policies are evaluated over: the host's pods (their records'
//! identities and addresses) and the namespace labels, each namespace also labelled
//! `kubernetes.io/metadata.name=<name>` as the API server labels every namespace.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use nsfast_policy::schema::NetworkPolicy;
use nsfast_policy::{Cluster, Labels, Parsed, PodInfo};
use serde::{Deserialize, Serialize};

use crate::abi;
use crate::datapath::{self, PolicyMaps};
use crate::error::PodError;
use crate::fault::crash_point;
pub use crate::state::POLICY_ROOT;
use crate::state::{Host, HostLock, PodRecord};
/// The label every namespace carries with its own name.
pub const NAME_LABEL: &str = "kubernetes.io/metadata.name";
/// The crash points of a policy change, in order ([`crate::fault::CRASH_ENV`]): after the new
/// generation is written to the temporary file, and after it is renamed into place.
pub const POLICY_STEPS: &[&str] = &["policy-written", "policy-renamed"];

const FILE: &str = "policies.json";
/// Largest state file read (it holds what `apply` accepted: at most a few inputs' worth).
const MAX_FILE: u64 = 64 << 20;

/// The stored form.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Stored {
    generation: u64,
    policies: Vec<NetworkPolicy>,
    #[serde(default)]
    namespaces: BTreeMap<String, Labels>,
}

/// A host's policies and namespace labels, as stored.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Policies {
    /// Counts every change; 0 before the first.
    pub generation: u64,
    /// Sorted by namespace, then name.
    pub policies: Vec<Parsed>,
    /// Labels set with `policy namespace`, without the implicit name label.
    pub namespaces: BTreeMap<String, Labels>,
}

impl Policies {
    /// The checked policies alone.
    pub fn checked(&self) -> Vec<nsfast_policy::Policy> {
        self.policies.iter().map(|p| p.policy.clone()).collect()
    }

    /// The JSON of `policy list -j`.
    pub fn output_json(&self, host: &str) -> serde_json::Value {
        serde_json::json!({
            "host": host,
            "generation": self.generation,
            "policies": self.policies.iter().map(|p| &p.object).collect::<Vec<_>>(),
            "namespaces": self.namespaces,
        })
    }
}

/// What `apply` did to each object, as `kubectl apply` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ApplyResult {
    pub generation: u64,
    /// `(namespace/name, "created" | "configured" | "unchanged")`, in input order.
    pub objects: Vec<(String, &'static str)>,
}

/// The policy directory of `host`.
pub fn dir(host: &Host) -> PathBuf {
    Path::new(POLICY_ROOT).join(&host.key)
}

/// Reads `host`'s policies (an empty set if it has none). Takes the lock, so that a change
/// that died is cleaned up first and a running one is waited for.
pub fn load(host: &Host) -> Result<Policies, PodError> {
    let d = dir(host);
    if !d.join(FILE).exists() && !d.join(format!("{FILE}.tmp")).exists() {
        return Ok(Policies::default());
    }
    let _lock = lock(&d)?;
    read(&d)
}

/// Creates or replaces every policy of `input` (YAML or JSON) on `host`, in one generation.
/// A bad input is [`PodError::BadPolicy`] and changes nothing.
pub fn apply(host: &Host, input: &str) -> Result<ApplyResult, PodError> {
    let parsed = nsfast_policy::parse(input).map_err(|e| PodError::BadPolicy(e.to_string()))?;
    changing(host, |d| apply_in(d, parsed))
}

/// Runs the change `f` on the policy directory under the host's lock and then the policy
/// lock, then has the datapath enforce the result ([`sync`]), also when `f` changed nothing:
/// so the next change finishes what a change killed after its rename left undone.
fn changing<T>(host: &Host, f: impl FnOnce(&Path) -> Result<T, PodError>) -> Result<T, PodError> {
    let host_lock = host.lock()?;
    let out = {
        let d = dir(host);
        let _lock = lock(&d)?;
        f(&d)?
    };
    let synced = sync(host, &host_lock);
    // `host.lock()` made the host's state directory; without pods it goes again.
    host.gc_if_empty()?;
    synced?;
    Ok(out)
}

fn apply_in(d: &Path, parsed: Vec<Parsed>) -> Result<ApplyResult, PodError> {
    let mut cur = read(d)?;
    let mut objects = Vec::new();
    for p in parsed {
        let id = format!("{}/{}", p.policy.namespace, p.policy.name);
        let old = cur.policies.iter().position(|q| {
            q.policy.namespace == p.policy.namespace && q.policy.name == p.policy.name
        });
        let what = match old {
            Some(i) if cur.policies[i].policy == p.policy => "unchanged",
            Some(i) => {
                cur.policies[i] = p;
                "configured"
            }
            None => {
                cur.policies.push(p);
                "created"
            }
        };
        objects.push((id, what));
    }
    let generation = if objects.iter().all(|(_, w)| *w == "unchanged") {
        cur.generation
    } else {
        write(d, &mut cur)?
    };
    Ok(ApplyResult {
        generation,
        objects,
    })
}

/// Deletes policy `name` of namespace `namespace`; `Ok(false)` if there is none.
pub fn delete(host: &Host, namespace: &str, name: &str) -> Result<bool, PodError> {
    if !dir(host).join(FILE).exists() {
        return Ok(false);
    }
    changing(host, |d| {
        let mut cur = read(d)?;
        let before = cur.policies.len();
        cur.policies
            .retain(|p| !(p.policy.namespace == namespace && p.policy.name == name));
        if cur.policies.len() == before {
            return Ok(false);
        }
        write(d, &mut cur)?;
        Ok(true)
    })
}

/// Sets namespace `namespace`'s labels to `labels` (an empty set removes them).
pub fn set_namespace(host: &Host, namespace: &str, labels: Labels) -> Result<u64, PodError> {
    nsfast_policy::parse::check_namespace(namespace).map_err(PodError::BadPolicy)?;
    if labels.contains_key(NAME_LABEL) {
        return Err(PodError::BadPolicy(format!(
            "invalid label {NAME_LABEL}: every namespace carries it with its own name"
        )));
    }
    changing(host, |d| {
        let mut cur = read(d)?;
        if labels.is_empty() {
            cur.namespaces.remove(namespace);
        } else {
            cur.namespaces.insert(namespace.to_string(), labels);
        }
        write(d, &mut cur)
    })
}

/// The world policies are evaluated over: `pods` and the namespaces of `p`, every namespace
/// with its name label. Pending pods count: `pod add` writes the policies of a pod before its
/// endpoint exists, so a pod being added (or one whose add was killed) is policed from its
/// first packet.
pub fn cluster(p: &Policies, pods: &[PodRecord]) -> Cluster {
    let mut c = Cluster::default();
    // (A CNI intent written before IPAM leased the address has none yet.)
    for r in pods.iter().filter(|r| !r.addrs().is_empty()) {
        c.pods.push(PodInfo {
            namespace: r.identity.namespace.clone(),
            name: r.name.clone(),
            labels: r.identity.labels.clone(),
            ips: r.addrs(),
            ports: r.identity.named_ports.clone(),
        });
    }
    let names = c
        .pods
        .iter()
        .map(|p| p.namespace.clone())
        .chain(p.namespaces.keys().cloned())
        .chain(p.policies.iter().map(|q| q.policy.namespace.clone()))
        .collect::<Vec<_>>();
    for n in names {
        let mut labels = p.namespaces.get(&n).cloned().unwrap_or_default();
        labels.insert(NAME_LABEL.to_string(), n.clone());
        c.namespaces.insert(n, labels);
    }
    c
}

/// Takes the lock of policy directory `d`, creating it. A lock whose directory was removed
/// meanwhile (the host's last policy and label went) is retaken.
fn lock(d: &Path) -> Result<nix::fcntl::Flock<File>, PodError> {
    use std::os::unix::fs::MetadataExt;
    let path = d.join(".lock");
    let mut held = None;
    for _ in 0..50 {
        crate::state::create_dir_all_racy(d)?;
        let f = match nsfast_sys::lockfile::open_private(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(PodError::io(format!("open {}", path.display()))(e)),
        };
        let lock = nsfast_sys::lockfile::lock_exclusive(
            f,
            &path,
            nsfast_sys::lockfile::timeout_from_env(),
        )
        .map_err(|e| PodError::Io {
            what: format!("lock the host's policies: {e}"),
            source: std::io::Error::from(e.kind()),
        })?;
        let ino = lock.metadata().map(|m| m.ino()).ok();
        if ino.is_some() && ino == fs::metadata(&path).map(|m| m.ino()).ok() {
            held = Some(lock);
            break;
        }
    }
    let Some(lock) = held else {
        return Err(PodError::Io {
            what: format!("lock {}: it keeps disappearing", path.display()),
            source: std::io::Error::from(std::io::ErrorKind::WouldBlock),
        });
    };
    // A change that died before its rename left its temporary file: it did not happen.
    let tmp = d.join(format!("{FILE}.tmp"));
    match fs::remove_file(&tmp) {
        Ok(()) => tracing::warn!(
            "removed {}: a policy change was interrupted before it took effect",
            tmp.display()
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(PodError::io(format!("remove {}", tmp.display()))(e)),
    }
    Ok(lock)
}

/// Reads the stored file (none: the empty set). Every object is checked again as on input:
/// a file that does not parse is reported, not half-used.
fn read(d: &Path) -> Result<Policies, PodError> {
    use std::os::unix::fs::OpenOptionsExt;
    let p = d.join(FILE);
    let f = match fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&p)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Policies::default()),
        Err(e) => return Err(PodError::io(format!("open {}", p.display()))(e)),
    };
    let mut body = Vec::new();
    f.take(MAX_FILE)
        .read_to_end(&mut body)
        .map_err(PodError::io(format!("read {}", p.display())))?;
    let stored: Stored = serde_json::from_slice(&body).map_err(|e| PodError::State {
        path: p.clone(),
        source: e,
    })?;
    let text = serde_json::to_string(&stored.policies).map_err(|e| PodError::State {
        path: p.clone(),
        source: e,
    })?;
    let policies = nsfast_policy::parse(&text).map_err(|e| PodError::BadPolicyState {
        path: p.clone(),
        why: e.to_string(),
    })?;
    Ok(Policies {
        generation: stored.generation,
        policies,
        namespaces: stored.namespaces,
    })
}

/// Writes `p` as the next generation; returns it.
fn write(d: &Path, p: &mut Policies) -> Result<u64, PodError> {
    use std::os::unix::fs::OpenOptionsExt;
    p.generation += 1;
    p.policies.sort_by(|a, b| {
        (&a.policy.namespace, &a.policy.name).cmp(&(&b.policy.namespace, &b.policy.name))
    });
    let stored = Stored {
        generation: p.generation,
        policies: p.policies.iter().map(|q| q.object.clone()).collect(),
        namespaces: p.namespaces.clone(),
    };
    let path = d.join(FILE);
    let body = serde_json::to_vec_pretty(&stored).map_err(|e| PodError::State {
        path: path.clone(),
        source: e,
    })?;
    let tmp = d.join(format!("{FILE}.tmp"));
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)
        .map_err(PodError::io(format!("create {}", tmp.display())))?;
    f.write_all(&body)
        .and_then(|()| f.sync_all())
        .map_err(PodError::io(format!("write {}", tmp.display())))?;
    drop(f);
    crash_point(POLICY_STEPS[0]);
    fs::rename(&tmp, &path).map_err(PodError::io(format!("write {}", path.display())))?;
    File::open(d)
        .and_then(|f| f.sync_all())
        .map_err(PodError::io(format!("fsync {}", d.display())))?;
    crash_point(POLICY_STEPS[1]);
    if p.policies.is_empty() && p.namespaces.is_empty() {
        // Nothing left: the directory goes (with its lock, which waiters then retake).
        fs::remove_dir_all(d).map_err(PodError::io(format!("remove {}", d.display())))?;
        let _ = fs::remove_dir(POLICY_ROOT);
        let _ = fs::remove_dir("/run/nsfast");
    }
    Ok(p.generation)
}

/// Makes the datapath enforce the host's stored policies over its pods: compiles them
/// (`nsfast_policy::compile`) and writes the policy maps. Called with the host's lock held
/// by every policy change and by `pod add`/`del` (a pod's arrival or departure changes what
/// selectors choose). `Ok(false)`: the host has no maps yet (no pod).
pub fn sync(host: &Host, _lock: &HostLock) -> Result<bool, PodError> {
    let p = load(host)?;
    let maps = tables(&p, &host.records()?)?;
    datapath::write_policy_maps(host, &maps)
}

/// The policy maps' contents for `p` over `pods`: pod `i` of the cluster has id `i + 1`; an
/// IPv4 prefix is held in its `::ffff:` form (96 more bits).
///
/// Only a pod the tables name has its addresses in `ids`: one that is isolated, or a peer of
/// an isolated pod's rules. For any other pod the id would only lead to lookups that find
/// nothing (it is isolated in no direction and no peer entry names it), so leaving it out
/// gives the same verdicts, and a packet between two such pods costs the datapath one id
/// lookup per end that misses, instead of three that find nothing to check.
pub fn tables(p: &Policies, pods: &[PodRecord]) -> Result<PolicyMaps, PodError> {
    use std::net::IpAddr;
    let c = cluster(p, pods);
    let compiled = nsfast_policy::compile(&c, &p.checked());
    let id = |i: usize| i as u32 + 1;
    let mut m = PolicyMaps::default();
    let mut named = std::collections::BTreeSet::new();
    for (i, pod) in c.pods.iter().enumerate() {
        for (dir, d) in [
            (abi::POL_INGRESS, &compiled.pods[i].ingress),
            (abi::POL_EGRESS, &compiled.pods[i].egress),
        ] {
            if !d.isolated {
                continue;
            }
            let (me, name) = (id(i), &pod.name);
            named.insert(i);
            m.iso.insert(abi::PolIsoKey { pod: me, dir });
            if !d.any.is_empty() {
                m.peers.insert(
                    abi::PolPeerKey {
                        pod: me,
                        peer: 0,
                        dir,
                    },
                    ports(&d.any, name)?,
                );
            }
            for (j, s) in &d.peers {
                named.insert(*j);
                m.peers.insert(
                    abi::PolPeerKey {
                        pod: me,
                        peer: id(*j),
                        dir,
                    },
                    ports(s, name)?,
                );
            }
            for (cidr, s) in &d.cidrs {
                let bits = match cidr.addr {
                    IpAddr::V4(_) => 96 + u32::from(cidr.prefix),
                    IpAddr::V6(_) => u32::from(cidr.prefix),
                };
                let data = abi::PolCidrData {
                    pod: me,
                    dir_be: dir.to_be(),
                    addr: abi::PolAddr::new(cidr.addr),
                };
                m.cidrs.insert((64 + bits, data), ports(s, name)?);
            }
        }
    }
    for i in named {
        for a in &c.pods[i].ips {
            m.ids.insert(abi::PolAddr::new(*a), id(i));
        }
    }
    Ok(m)
}

/// A port set as the datapath holds it; more ranges than it has room for is an error naming
/// the pod.
fn ports(s: &nsfast_policy::compile::PortSet, pod: &str) -> Result<abi::PolPorts, PodError> {
    let mut out = abi::PolPorts::default();
    let ranges: Vec<abi::PolRange> = if s.all {
        vec![abi::PolRange {
            lo: 0,
            hi: u16::MAX,
            proto: 0,
            pad: [0; 3],
        }]
    } else {
        s.ranges
            .iter()
            .map(|&(p, lo, hi)| abi::PolRange {
                lo,
                hi,
                proto: p.number(),
                pad: [0; 3],
            })
            .collect()
    };
    if ranges.len() > abi::POL_RANGES {
        return Err(PodError::BadPolicy(format!(
            "pod {pod:?}: its policies allow {} separate port ranges with one peer, more than the {} the datapath holds",
            ranges.len(),
            abi::POL_RANGES
        )));
    }
    out.n = ranges.len() as u32;
    out.r[..ranges.len()].copy_from_slice(&ranges);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(name: &str, ip: &str, ip6: Option<&str>, app: &str) -> PodRecord {
        let ip6 = ip6.map_or(String::new(), |a| format!(r#""ip6":"{a}","prefix6":64,"#));
        let body = format!(
            r#"{{"name":"{name}","ip":"{ip}","prefix":24,"gateway":"169.254.1.1",{ip6}
            "datapath":"veth","host":"h","netns":"n-{name}","netns_owned":true,
            "host_if":"nsf-{name}","host_ifindex":3,"pod_if":"eth0","pod_mac":"","host_mac":"",
            "link_pins":[],"namespace":"x","labels":{{"app":"{app}"}}}}"#
        );
        crate::state::parse_record(body.as_bytes()).unwrap()
    }

    fn policies(yaml: &str) -> Policies {
        Policies {
            generation: 1,
            policies: nsfast_policy::parse(yaml).unwrap(),
            namespaces: BTreeMap::new(),
        }
    }

    /// Every address of a pod names the same id, IPv6-only pods included; rules name pods by
    /// id; an IPv4 prefix is held in its ::ffff: form, an IPv6 one as it is.
    #[test]
    fn tables_name_pods_by_id_in_both_families() {
        let pods = [
            record("a", "10.1.0.2", Some("fd00::2"), "db"),
            record("b", "10.1.0.3", None, "web"),
            record("c", "0.0.0.0", Some("fd00::4"), "web"),
        ];
        let p = policies(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\n\
             metadata: {name: db, namespace: x}\n\
             spec:\n  podSelector: {matchLabels: {app: db}}\n  ingress:\n\
             \x20 - from: [{podSelector: {matchLabels: {app: web}}}]\n\
             \x20 - from: [{ipBlock: {cidr: 192.0.2.0/24}}, {ipBlock: {cidr: '2001:db8::/32'}}]\n",
        );
        let m = tables(&p, &pods).unwrap();
        let id = |a: &str| m.ids[&abi::PolAddr::new(a.parse().unwrap())];
        assert_eq!(m.ids.len(), 4);
        assert_eq!(id("10.1.0.2"), id("fd00::2"));
        assert_ne!(id("10.1.0.3"), id("fd00::4"));
        let a = id("10.1.0.2");
        assert_eq!(
            m.iso.iter().copied().collect::<Vec<_>>(),
            [abi::PolIsoKey {
                pod: a,
                dir: abi::POL_INGRESS
            }]
        );
        let peers: Vec<u32> = m.peers.keys().map(|k| k.peer).collect();
        assert_eq!(peers, [id("10.1.0.3"), id("fd00::4")]);
        let cidrs: Vec<(u32, std::net::IpAddr)> =
            m.cidrs.keys().map(|(len, d)| (*len, d.addr.ip())).collect();
        assert!(
            cidrs.contains(&(64 + 96 + 24, "192.0.2.0".parse().unwrap())),
            "{cidrs:?}"
        );
        assert!(
            cidrs.contains(&(64 + 32, "2001:db8::".parse().unwrap())),
            "{cidrs:?}"
        );
    }

    /// A pod that no policy isolates and no rule names as a peer has no id: the datapath's
    /// lookup of its address misses and it checks nothing more. A host without policies
    /// has no ids at all.
    #[test]
    fn only_pods_the_tables_name_have_ids() {
        let pods = [
            record("a", "10.1.0.2", None, "db"),
            record("b", "10.1.0.3", None, "web"),
            record("c", "10.1.0.4", Some("fd00::4"), "cache"),
        ];
        let p = policies(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\n\
             metadata: {name: db, namespace: x}\n\
             spec:\n  podSelector: {matchLabels: {app: db}}\n  ingress:\n\
             \x20 - from: [{podSelector: {matchLabels: {app: web}}}]\n",
        );
        let m = tables(&p, &pods).unwrap();
        let ips: Vec<String> = m.ids.keys().map(|a| a.ip().to_string()).collect();
        assert_eq!(ips, ["10.1.0.2", "10.1.0.3"], "{:?}", m.ids);
        let none = tables(&policies(""), &pods).unwrap();
        assert!(none.ids.is_empty(), "{:?}", none.ids);
        assert!(none.iso.is_empty() && none.peers.is_empty() && none.cidrs.is_empty());
    }

    #[test]
    fn generations_skip_zero_so_slots_alternate() {
        assert_eq!(datapath::next_generation(0), 1);
        assert_eq!(datapath::next_generation(1), 2);
        assert_eq!(datapath::next_generation(u32::MAX), 2);
        assert_eq!(
            datapath::next_generation(u32::MAX) & 1,
            0,
            "u32::MAX is odd"
        );
    }
}
