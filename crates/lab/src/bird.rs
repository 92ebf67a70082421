//! Nodes joined by a real routing daemon: node namespaces on one L2 segment, each with its own
//! pod CIDR, nsfast pods (made by the `nsfast` binary, `pod add --host NODE`) and a BIRD 2
//! process speaking BGP to the other nodes with the shipped configuration
//! (`dist/bird/bird.conf`, rendered by [`render`]).
//!
//! ```text
//!                      segment namespace: bridge br0
//!          ┌────────────────────┼────────────────────┐
//!   seg0 10.249.0.1      seg0 10.249.0.2      seg0 10.249.0.3
//!   node 0 (AS 64513)    node 1 (AS 64514)    node 2 (AS 64515)
//!   pods 10.250.1.0/24   pods 10.250.2.0/24   pods 10.250.3.0/24
//!   bird: eBGP to the two others, each node's CIDR into the others' main table
//! ```
//!
//! Dropping the world kills the BIRD processes it started (by their pids, nothing else),
//! deletes its pods (`nsfast pod del`), then the node namespaces, the segment and the folder
//! with the configurations, sockets and logs. What a killed run left goes with
//! [`crate::cleanup::dead_runs`] (`nsfast bench --cleanup`): its BIRDs ([`kill_stale`], found by
//! their configuration in the dead run's folder), pods, namespaces and folder.

use std::fmt::Write as _;
use std::fs;
use std::net::Ipv4Addr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nsfast_sys::net::Route4;
use nsfast_sys::netns::NetNs;

use crate::peer::KillOnDrop;

/// The shipped node configuration template.
pub const TEMPLATE: &str = include_str!("../../../dist/bird/bird.conf");

/// Each node's device on the segment.
pub const SEGMENT_IF: &str = "seg0";
/// The segment's bridge (in the segment namespace).
pub const BRIDGE: &str = "br0";
/// The cluster's pod range; node `n` has [`pod_cidr`]`(n)` of it.
pub const CLUSTER_CIDR: (Ipv4Addr, u8) = (Ipv4Addr::new(10, 250, 0, 0), 16);
/// Prefix length of a node's pod CIDR.
pub const POD_PREFIX: u8 = 24;
/// `RTPROT_BIRD`: the protocol of the routes BIRD's kernel protocol installs.
pub const RTPROT_BIRD: u8 = 12;
/// The BGP hold time of the shipped configuration, seconds.
pub const HOLD_TIME: Duration = Duration::from_secs(3);

/// BIRD's daemon and its control client (Debian package `bird2`).
pub const BIRD_BIN: &str = "/usr/sbin/bird";
pub const BIRDC_BIN: &str = "/usr/sbin/birdc";

/// Node `n`'s address on the segment (also its BGP router id).
pub fn node_ip(n: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 249, 0, 1 + n as u8)
}

/// Node `n`'s AS number (private range; one per node: eBGP).
pub fn node_as(n: usize) -> u32 {
    64513 + n as u32
}

/// Node `n`'s pod CIDR (`/`[`POD_PREFIX`]).
pub fn pod_cidr(n: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 250, 1 + n as u8, 0)
}

/// Pod `i` of node `n`.
pub fn pod_ip(n: usize, i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 250, 1 + n as u8, 10 + i as u8)
}

/// One BGP neighbour of a node's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// BIRD protocol name: [a-z0-9_], starting with a letter.
    pub name: String,
    pub ip: Ipv4Addr,
    pub asn: u32,
}

/// What [`render`] fills into the template for one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeConfig {
    pub router_id: Ipv4Addr,
    pub local_ip: Ipv4Addr,
    pub local_as: u32,
    pub pod_cidr: (Ipv4Addr, u8),
    pub cluster_cidr: (Ipv4Addr, u8),
    pub peers: Vec<Peer>,
}

impl NodeConfig {
    /// Node `n` of a world of `nodes`: peers with every other node.
    pub fn for_node(n: usize, nodes: usize) -> Self {
        Self {
            router_id: node_ip(n),
            local_ip: node_ip(n),
            local_as: node_as(n),
            pod_cidr: (pod_cidr(n), POD_PREFIX),
            cluster_cidr: CLUSTER_CIDR,
            peers: (0..nodes)
                .filter(|&m| m != n)
                .map(|m| Peer {
                    name: format!("node{m}"),
                    ip: node_ip(m),
                    asn: node_as(m),
                })
                .collect(),
        }
    }
}

const PEER_BEGIN: &str = "# @BEGIN PEER@";
const PEER_END: &str = "# @END PEER@";

/// Renders `template` (the shipped `dist/bird/bird.conf`) for one node: every `@NAME@` is
/// replaced, and the lines between the `# @BEGIN PEER@` and `# @END PEER@` lines are repeated
/// once per peer with that peer's `@PEER_*@`. An error when the markers are missing or a
/// placeholder is left unreplaced.
pub fn render(template: &str, c: &NodeConfig) -> Result<String> {
    let lines: Vec<&str> = template.lines().collect();
    let begin = lines.iter().position(|l| *l == PEER_BEGIN);
    let end = lines.iter().position(|l| *l == PEER_END);
    let (Some(begin), Some(end)) = (begin, end) else {
        bail!("template has no \"{PEER_BEGIN}\" ... \"{PEER_END}\" block");
    };
    if end < begin {
        bail!("template: \"{PEER_END}\" before \"{PEER_BEGIN}\"");
    }
    let node = |s: &str| {
        s.replace("@ROUTER_ID@", &c.router_id.to_string())
            .replace("@LOCAL_IP@", &c.local_ip.to_string())
            .replace("@LOCAL_AS@", &c.local_as.to_string())
            .replace("@POD_CIDR@", &format!("{}/{}", c.pod_cidr.0, c.pod_cidr.1))
            .replace(
                "@CLUSTER_CIDR@",
                &format!("{}/{}", c.cluster_cidr.0, c.cluster_cidr.1),
            )
    };
    let mut out = String::new();
    for l in &lines[..begin] {
        writeln!(out, "{}", node(l)).unwrap();
    }
    let block = lines[begin + 1..end].join("\n");
    for p in &c.peers {
        let b = block
            .replace("@PEER_NAME@", &p.name)
            .replace("@PEER_IP@", &p.ip.to_string())
            .replace("@PEER_AS@", &p.asn.to_string());
        writeln!(out, "{}", node(&b)).unwrap();
    }
    for l in &lines[end + 1..] {
        writeln!(out, "{}", node(l)).unwrap();
    }
    if let Some(at) = out.lines().find(|l| {
        l.split('@')
            .skip(1)
            .step_by(2)
            .any(|w| !w.is_empty() && w.bytes().all(|b| b.is_ascii_uppercase() || b == b'_'))
    }) {
        bail!("placeholder left after rendering: {at:?}");
    }
    Ok(out)
}

/// A running BIRD: the process (killed on drop), its control socket and log.
#[derive(Debug)]
pub struct Bird {
    process: KillOnDrop,
    pub socket: PathBuf,
    pub log: PathBuf,
}

impl Bird {
    /// The pid of the BIRD process this world started.
    pub fn pid(&self) -> u32 {
        self.process.id()
    }
}

/// A pod of the world.
#[derive(Debug, Clone)]
pub struct NodePod {
    pub node: usize,
    pub name: String,
    pub ip: Ipv4Addr,
}

impl NodePod {
    /// The pod's namespace (`nsfast pod add` names it after the pod).
    pub fn netns(&self) -> NetNs {
        NetNs::open(&self.name).unwrap_or_else(|e| panic!("pod {} namespace: {e}", self.name))
    }
}

/// A folder removed on drop.
#[derive(Debug)]
struct Folder(PathBuf);

impl Drop for Folder {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// The world (see the module doc). Fields drop in this order after [`Drop`] has stopped the
/// BIRDs and deleted the pods: nodes, segment, folder.
#[derive(Debug)]
pub struct BirdWorld {
    prefix: String,
    nsfast: PathBuf,
    birds: Vec<Option<Bird>>,
    pods: Vec<NodePod>,
    nodes: Vec<NetNs>,
    segment: NetNs,
    dir: Folder,
}

impl BirdWorld {
    /// Builds the segment `<prefix>-seg` and `nodes` node namespaces `<prefix>-n<i>` on it,
    /// and the folder `<tmp>/<prefix>`; no pods, no BIRD yet. `nsfast`: the binary that makes
    /// and deletes the pods.
    pub fn build(prefix: &str, nodes: usize, nsfast: &Path) -> Result<Self> {
        let dir = std::env::temp_dir().join(prefix);
        fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        let dir = Folder(dir);
        let segment = NetNs::create(&format!("{prefix}-seg"))?;
        let mut w = BirdWorld {
            prefix: prefix.into(),
            nsfast: nsfast.into(),
            birds: Vec::new(),
            pods: Vec::new(),
            nodes: Vec::new(),
            segment,
            dir,
        };
        let seg = w.segment.netlink()?;
        seg.create_bridge(BRIDGE)?;
        for n in 0..nodes {
            let ns = NetNs::create(&format!("{prefix}-n{n}"))?;
            let nl = ns.netlink()?;
            w.nodes.push(ns);
            let port = format!("n{n}");
            nl.create_veth_into(SEGMENT_IF, "segtmp0", &seg, &port)?;
            seg.set_controller(&port, BRIDGE)?;
            nl.add_address(SEGMENT_IF, node_ip(n).into(), 24)?;
            w.birds.push(None);
        }
        Ok(w)
    }

    /// Node `n`'s namespace.
    pub fn node(&self, n: usize) -> &NetNs {
        &self.nodes[n]
    }

    /// Node `n`'s namespace name (for `--host`).
    pub fn node_name(&self, n: usize) -> &str {
        self.nodes[n].name()
    }

    /// The world's folder (configurations, sockets, logs).
    pub fn dir(&self) -> &Path {
        &self.dir.0
    }

    /// The pods made so far, in order.
    pub fn pods(&self) -> &[NodePod] {
        &self.pods
    }

    /// Makes pod `i` of node `n` with `nsfast pod add <prefix>-n<n>p<i> --ip` [`pod_ip`]`/24
    /// --host <node> --mode veth --uplink seg0`; deleted with the world.
    pub fn add_pod(&mut self, n: usize, i: usize) -> Result<NodePod> {
        let pod = NodePod {
            node: n,
            name: format!("{}-n{n}p{i}", self.prefix),
            ip: pod_ip(n, i),
        };
        let ip = format!("{}/{POD_PREFIX}", pod.ip);
        let host = self.node_name(n).to_string();
        let out = Command::new(&self.nsfast)
            .args(["pod", "add", &pod.name, "--ip", &ip, "--host", &host])
            .args(["--mode", "veth", "--uplink", SEGMENT_IF])
            .env("RUST_LOG", "warn")
            .output()
            .with_context(|| format!("run {}", self.nsfast.display()))?;
        if !out.status.success() {
            bail!(
                "nsfast pod add {} --host {host}: {}: {}",
                pod.name,
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        self.pods.push(pod.clone());
        Ok(pod)
    }

    /// Writes node `n`'s configuration (the shipped template, [`render`]ed) and starts BIRD
    /// in the node's namespace: `bird -f -c n<n>.conf -s n<n>.ctl -P n<n>.pid`, stderr into
    /// `n<n>.log`, all in [`BirdWorld::dir`].
    pub fn start_bird(&mut self, n: usize) -> Result<()> {
        if self.birds[n].is_some() {
            bail!("BIRD of node {n} already runs");
        }
        let conf = render(TEMPLATE, &NodeConfig::for_node(n, self.nodes.len()))?;
        let d = self.dir().to_path_buf();
        let (conf_path, socket, pid, log) = (
            d.join(format!("n{n}.conf")),
            d.join(format!("n{n}.ctl")),
            d.join(format!("n{n}.pid")),
            d.join(format!("n{n}.log")),
        );
        fs::write(&conf_path, conf)?;
        let mut cmd = Command::new(BIRD_BIN);
        cmd.arg("-f")
            .arg("-c")
            .arg(&conf_path)
            .arg("-s")
            .arg(&socket)
            .arg("-P")
            .arg(&pid)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log)?);
        self.nodes[n].configure_command(&mut cmd, None);
        let process = KillOnDrop::new(
            cmd.spawn()
                .with_context(|| format!("start {BIRD_BIN} (Debian package bird2)"))?,
        );
        let bird = Bird {
            process,
            socket,
            log,
        };
        self.birds[n] = Some(bird);
        // The control socket answers once the configuration is read.
        self.wait_socket(n, Instant::now() + Duration::from_secs(10))
    }

    fn wait_socket(&mut self, n: usize, deadline: Instant) -> Result<()> {
        loop {
            let b = self.birds[n].as_mut().expect("started");
            if birdc(&b.socket, &["show", "status"]).is_ok() {
                return Ok(());
            }
            if let Ok(Some(st)) = b.process.child_mut().try_wait() {
                bail!("BIRD of node {n} exited ({st}): {}", self.bird_log(n));
            }
            if Instant::now() > deadline {
                bail!(
                    "BIRD of node {n}: no control socket after 10 s: {}",
                    self.bird_log(n)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts BIRD on every node.
    pub fn start_birds(&mut self) -> Result<()> {
        (0..self.nodes.len()).try_for_each(|n| self.start_bird(n))
    }

    /// Node `n`'s BIRD, if it runs.
    pub fn bird(&self, n: usize) -> Option<&Bird> {
        self.birds[n].as_ref()
    }

    /// Kills node `n`'s BIRD (SIGKILL to the pid this world started, as a crash) and reaps
    /// it; its pid.
    pub fn kill_bird(&mut self, n: usize) -> Result<u32> {
        let mut b = self.birds[n]
            .take()
            .with_context(|| format!("BIRD of node {n} does not run"))?;
        let pid = b.pid();
        let child = b.process.child_mut();
        let killed = child.kill();
        let reaped = child.wait();
        killed.context("kill BIRD")?;
        reaped.context("reap BIRD")?;
        Ok(pid)
    }

    /// Node `n`'s BIRD log (stderr), for failure messages.
    pub fn bird_log(&self, n: usize) -> String {
        let p = self.dir().join(format!("n{n}.log"));
        fs::read_to_string(&p).unwrap_or_else(|e| format!("({}: {e})", p.display()))
    }

    /// `birdc show protocols` of node `n` (or why it failed).
    pub fn protocols(&self, n: usize) -> String {
        match &self.birds[n] {
            Some(b) => {
                birdc(&b.socket, &["show", "protocols"]).unwrap_or_else(|e| format!("{e:#}"))
            }
            None => "(BIRD not running)".into(),
        }
    }

    /// Waits up to `within` until every running BIRD has all its BGP sessions to running
    /// BIRDs established; the error carries each node's `show protocols` and log.
    pub fn wait_established(&self, within: Duration) -> Result<()> {
        let deadline = Instant::now() + within;
        loop {
            let pending: Vec<usize> = (0..self.nodes.len())
                .filter(|&n| {
                    let Some(b) = &self.birds[n] else {
                        return false;
                    };
                    let out = birdc(&b.socket, &["show", "protocols"]).unwrap_or_default();
                    (0..self.nodes.len())
                        .filter(|&m| m != n && self.birds[m].is_some())
                        .any(|m| {
                            !out.lines().any(|l| {
                                l.split_whitespace().next() == Some(&format!("node{m}"))
                                    && l.contains("Established")
                            })
                        })
                })
                .collect();
            if pending.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                let mut msg = format!("BGP sessions not established after {within:?}:");
                for n in pending {
                    write!(
                        msg,
                        "\nnode {n}:\n{}\nlog:\n{}",
                        self.protocols(n),
                        self.bird_log(n)
                    )
                    .unwrap();
                }
                bail!(msg);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The routes BIRD installed in node `n`'s kernel tables (`proto bird`).
    pub fn bird_routes(&self, n: usize) -> Result<Vec<Route4>> {
        let mut r = self.nodes[n].netlink()?.ipv4_routes()?;
        r.retain(|r| r.protocol == RTPROT_BIRD);
        r.sort_by_key(|r| (r.dst, r.prefix));
        Ok(r)
    }

    /// Whether node `n`'s kernel has a route to node `m`'s pod CIDR.
    pub fn has_cidr_of(&self, n: usize, m: usize) -> Result<bool> {
        Ok(self
            .bird_routes(n)?
            .iter()
            .any(|r| r.dst == pod_cidr(m) && r.prefix == POD_PREFIX))
    }
}

impl Drop for BirdWorld {
    fn drop(&mut self) {
        // The processes this world started, by their own handles (pids).
        self.birds.clear();
        for p in self.pods.drain(..).rev() {
            let host = self.nodes[p.node].name().to_string();
            let ok = Command::new(&self.nsfast)
                .args(["pod", "del", &p.name, "--host", &host])
                .env("RUST_LOG", "warn")
                .output()
                .is_ok_and(|o| o.status.success());
            if !ok {
                eprintln!(
                    "bird world cleanup: nsfast pod del {} --host {host} failed",
                    p.name
                );
            }
        }
        // Then the nodes, the segment and the folder, as the fields drop.
    }
}

/// Runs `birdc -s SOCKET ARGS...`; its output, or an error with it.
pub fn birdc(socket: &Path, args: &[&str]) -> Result<String> {
    let out = Command::new(BIRDC_BIN)
        .arg("-s")
        .arg(socket)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("run {BIRDC_BIN}"))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!(
            "birdc {args:?}: {}: {text}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(text)
}

/// Whether a process's command line (`/proc/PID/cmdline`, NUL-separated) is a BIRD this lab
/// started with its configuration inside `dir`.
fn is_bird_of(cmdline: &[u8], dir: &Path) -> bool {
    let mut args = cmdline.split(|b| *b == 0).filter(|a| !a.is_empty());
    let exe_ok = args.next().is_some_and(|a| a == BIRD_BIN.as_bytes());
    let mut conf = None;
    while let Some(a) = args.next() {
        if a == b"-c" {
            conf = args.next();
        }
    }
    let inside = conf.is_some_and(|c| {
        Path::new(std::ffi::OsStr::from_bytes(c))
            .parent()
            .is_some_and(|p| p == dir)
    });
    exe_ok && inside
}

/// Kills (SIGKILL) the BIRD processes a killed run left: those started by this lab with a
/// configuration in one of `dirs` (dead runs' folders, [`crate::cleanup`]). What was killed.
pub fn kill_stale(dirs: &[PathBuf]) -> Vec<String> {
    let mut done = Vec::new();
    let Ok(procs) = fs::read_dir("/proc") else {
        return done;
    };
    for e in procs.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|p| p.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(cmdline) = fs::read(e.path().join("cmdline")) else {
            continue;
        };
        if let Some(d) = dirs.iter().find(|d| is_bird_of(&cmdline, d)) {
            let pid = nix::unistd::Pid::from_raw(pid);
            if nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).is_ok() {
                done.push(format!("BIRD process {pid} of {}", d.display()));
            }
        }
    }
    done
}

/// The world as a [`crate::topology::Topology`]: `nodes` nodes, no pods or BIRD yet (the test
/// adds them); built under the name prefix given as the context, pods made by `nsfast`.
#[derive(Debug, Clone)]
pub struct BirdSpec {
    pub nodes: usize,
    pub nsfast: PathBuf,
}

impl crate::topology::Topology for BirdSpec {
    type Ctx = str;
    type Guard = BirdWorld;
    type Error = anyhow::Error;

    fn name(&self) -> &str {
        "bird"
    }

    fn probe(&self) -> Result<(), String> {
        for b in [BIRD_BIN, BIRDC_BIN] {
            if !Path::new(b).is_file() {
                return Err(format!(
                    "{b} is missing: install BIRD 2 (Debian package bird2; `make test` installs it)"
                ));
            }
        }
        Ok(())
    }

    /// Tear-down ([`BirdWorld`]'s drop): the BIRD processes, the pods (`nsfast pod del`), the
    /// node namespaces, the segment namespace, the folder.
    fn build(&self, prefix: &str) -> Result<BirdWorld> {
        BirdWorld::build(prefix, self.nodes, &self.nsfast)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_template_renders_one_block_per_peer_and_no_placeholder() {
        let c = NodeConfig::for_node(1, 3);
        let out = render(TEMPLATE, &c).unwrap();
        assert!(out.contains("router id 10.249.0.2;"), "{out}");
        assert!(out.contains("local 10.249.0.2 as 64514;"), "{out}");
        assert!(out.contains("define POD_CIDR = 10.250.2.0/24;"), "{out}");
        assert!(out.contains("[ 10.250.0.0/16+ ]"), "{out}");
        assert!(
            out.contains(
                "protocol bgp node0 from nsfast_peer {\n\tneighbor 10.249.0.1 as 64513;\n}"
            ),
            "{out}"
        );
        assert!(
            out.contains(
                "protocol bgp node2 from nsfast_peer {\n\tneighbor 10.249.0.3 as 64515;\n}"
            ),
            "{out}"
        );
        assert_eq!(out.matches("protocol bgp node").count(), 2, "{out}");
        assert!(
            !out.contains("@BEGIN PEER@") && !out.contains("@END PEER@"),
            "{out}"
        );
    }

    #[test]
    fn stale_birds_are_found_by_their_configuration_folder() {
        let d = Path::new("/tmp/nsft1x2-bgp");
        let ours =
            b"/usr/sbin/bird\0-f\0-c\0/tmp/nsft1x2-bgp/n0.conf\0-s\0/tmp/nsft1x2-bgp/n0.ctl\0";
        assert!(is_bird_of(ours, d));
        assert!(!is_bird_of(ours, Path::new("/tmp/nsft1x3-bgp")));
        assert!(!is_bird_of(
            b"/usr/sbin/bird\0-f\0-c\0/etc/bird/bird.conf\0",
            d
        ));
        assert!(!is_bird_of(
            b"/usr/bin/vim\0-c\0/tmp/nsft1x2-bgp/n0.conf\0",
            d
        ));
        assert!(!is_bird_of(b"", d));
    }

    #[test]
    fn render_refuses_a_template_without_the_block_or_with_a_stray_placeholder() {
        let c = NodeConfig::for_node(0, 2);
        let e = render("router id @ROUTER_ID@;\n", &c).unwrap_err();
        assert!(format!("{e}").contains("@BEGIN PEER@"), "{e}");
        let t = format!("router id @ROUTER_ID@;\nx @NEW_THING@;\n{PEER_BEGIN}\n{PEER_END}\n");
        let e = render(&t, &c).unwrap_err();
        assert!(format!("{e}").contains("@NEW_THING@"), "{e}");
    }
}
