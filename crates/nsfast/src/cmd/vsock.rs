//! `nsfast vsock ...`

use anyhow::Context;
use clap::Subcommand;
use nsfast_vsock::conn::SockOpts;
use nsfast_vsock::relay::{self, ConnStats};
use nsfast_vsock::Address;
use tracing::{info, warn};

fn parse_addr(s: &str) -> Result<Address, String> {
    s.parse::<Address>().map_err(|e| e.to_string())
}

fn parse_buffer(s: &str) -> Result<u64, String> {
    nsfast_vsock::size::parse_size("--buffer", s)
}

fn parse_vsock_buffer(s: &str) -> Result<u64, String> {
    nsfast_vsock::size::parse_size("--vsock-buffer", s)
}

#[derive(Subcommand, Debug)]
pub enum VsockCmd {
    /// Relay between two addresses, socat-style; half-close is propagated both ways.
    ///
    /// Addresses: vsock-listen:PORT[,cid=CID], vsock-connect:CID:PORT[,to-host],
    /// tcp-listen:PORT[,bind=ADDR], tcp:HOST:PORT, unix-listen:PATH, unix:PATH,
    /// hybrid:PATH:PORT (Firecracker / Cloud Hypervisor host side: CONNECT PORT),
    /// hybrid-listen:PATH[:PORT] (guest-initiated: the VMM connects to PATH_PORT), stdio.
    Relay {
        /// First address (usually a listening one).
        #[arg(value_parser = parse_addr)]
        a: Address,
        /// Second address, opened for each connection of the first.
        #[arg(value_parser = parse_addr)]
        b: Address,
        /// Serve every connection of the first address, each in its own thread.
        #[arg(long)]
        fork: bool,
        /// With --fork: at most N connections at once.
        #[arg(long, value_name = "N", default_value_t = 64)]
        max_children: usize,
        /// Most bytes moved per call (splice pipe size and largest request / copy buffer),
        /// e.g. 256K, 1M.
        #[arg(long, value_name = "SIZE", default_value = "256K", value_parser = parse_buffer)]
        buffer: u64,
        /// SO_VM_SOCKETS_BUFFER_SIZE for vsock sockets, e.g. 1M.
        #[arg(long, value_name = "SIZE", value_parser = parse_vsock_buffer)]
        vsock_buffer: Option<u64>,
        /// Print one JSON object per finished connection on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Linux 7.0 vsock namespace modes (ns_mode / child_ns_mode).
    #[command(subcommand)]
    Ns(NsCmd),
    /// Throughput test (iperf-vsock-like): `--server` on one end, `--cid` on the other.
    Bench {
        /// Run the server (count what arrives, answer with the count).
        #[arg(long, conflicts_with_all = ["cid", "connect"])]
        server: bool,
        /// With --server: serve one connection, then exit.
        #[arg(long, requires = "server")]
        once: bool,
        /// Client: the server's CID.
        #[arg(long)]
        cid: Option<u32>,
        /// vsock port.
        #[arg(long, default_value_t = 5201)]
        port: u32,
        /// Any address instead of vsock (client: a connecting one, server: a listening one).
        #[arg(long, value_parser = parse_addr, value_name = "ADDR")]
        connect: Option<Address>,
        #[arg(long, value_parser = parse_addr, value_name = "ADDR", requires = "server")]
        listen: Option<Address>,
        /// Bytes to send, e.g. 1G.
        #[arg(long, default_value = "1G", value_parser = parse_bytes)]
        bytes: u64,
        /// Bytes per write/read, e.g. 256K.
        #[arg(long, value_name = "SIZE", default_value = "256K", value_parser = parse_buffer)]
        buffer: u64,
        /// SO_VM_SOCKETS_BUFFER_SIZE for vsock sockets.
        #[arg(long, value_name = "SIZE", value_parser = parse_vsock_buffer)]
        vsock_buffer: Option<u64>,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand, Debug)]
pub enum NsCmd {
    /// Print ns_mode and child_ns_mode of the current namespace or of NAME (/run/netns/NAME
    /// or a path such as /proc/PID/ns/net).
    Show {
        name: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Create network namespace NAME (at /run/netns/NAME) in the given vsock mode, setting
    /// child_ns_mode in a throwaway parent so the current namespace is never locked.
    Create {
        name: String,
        #[arg(long, value_parser = parse_mode)]
        mode: nsfast_vsock::nsmode::Mode,
        #[arg(long)]
        json: bool,
    },
}

fn parse_mode(s: &str) -> Result<nsfast_vsock::nsmode::Mode, String> {
    s.parse()
}

fn parse_bytes(s: &str) -> Result<u64, String> {
    nsfast_vsock::size::parse_size("--bytes", s)
}

pub fn run(cmd: VsockCmd) -> anyhow::Result<()> {
    match cmd {
        VsockCmd::Relay {
            a,
            b,
            fork,
            max_children,
            buffer,
            vsock_buffer,
            json,
        } => {
            if json && (a == Address::Stdio || b == Address::Stdio) {
                anyhow::bail!(
                    "--json writes to stdout, which the stdio address uses: drop one of them"
                );
            }
            if buffer > 64 << 20 {
                anyhow::bail!("invalid size {buffer} for --buffer: at most 64M");
            }
            let opts = relay::Options {
                fork,
                max_children,
                buffer: buffer as usize,
                sock: SockOpts { vsock_buffer },
            };
            let report = move |s: &ConnStats| {
                if let Some(e) = &s.error {
                    warn!("connection {}: {e}", s.id);
                } else {
                    info!(
                        "connection {} ({} <-> {}): {} bytes ->, {} bytes <-, {} ms{}",
                        s.id,
                        s.a,
                        s.b,
                        s.bytes_a_to_b,
                        s.bytes_b_to_a,
                        s.millis,
                        if s.spliced { ", spliced" } else { "" }
                    );
                }
                if json {
                    if let Ok(line) = serde_json::to_string(s) {
                        println!("{line}");
                    }
                }
            };
            relay::run(&a, &b, &opts, &report).context("vsock relay")
        }
        VsockCmd::Ns(NsCmd::Show { name, json }) => {
            let m = match name {
                Some(n) => nsfast_vsock::nsmode::show(&n)?,
                None => nsfast_vsock::nsmode::current()?,
            };
            print_modes(&m, json)
        }
        VsockCmd::Ns(NsCmd::Create { name, mode, json }) => {
            let m = nsfast_vsock::nsmode::create(&name, mode)?;
            print_modes(&m, json)
        }
        VsockCmd::Bench {
            server,
            once,
            cid,
            port,
            connect,
            listen,
            bytes,
            buffer,
            vsock_buffer,
            json,
        } => {
            let sock = SockOpts { vsock_buffer };
            if buffer > 64 << 20 {
                anyhow::bail!("invalid size {buffer} for --buffer: at most 64M");
            }
            if server {
                let addr = listen.unwrap_or(Address::VsockListen { port, cid: None });
                info!("vsock bench server on {addr}");
                nsfast_vsock::bench::server(&addr, buffer as usize, sock, once, &|n| {
                    info!("received {n} bytes")
                })?;
                return Ok(());
            }
            let addr = match (connect, cid) {
                (Some(a), _) => a,
                (None, Some(cid)) => Address::VsockConnect {
                    cid,
                    port,
                    to_host: false,
                },
                (None, None) => {
                    anyhow::bail!("give --cid CID (or --connect ADDR) for the client, or --server")
                }
            };
            let r = nsfast_vsock::bench::client(&addr, bytes, buffer as usize, sock)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                println!(
                    "{}: {} bytes in {:.3} s = {:.2} Gbit/s (buffer {}){}",
                    r.address,
                    r.bytes,
                    r.seconds,
                    r.gbit_per_s,
                    r.buffer,
                    r.cpu_s_per_gb
                        .map(|c| format!(", machine CPU {c:.2} s/GB"))
                        .unwrap_or_default()
                );
            }
            Ok(())
        }
    }
}

fn print_modes(m: &nsfast_vsock::nsmode::Modes, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(m)?);
    } else {
        println!(
            "{}: ns_mode {}, child_ns_mode {}",
            m.namespace, m.ns_mode, m.child_ns_mode
        );
    }
    Ok(())
}
