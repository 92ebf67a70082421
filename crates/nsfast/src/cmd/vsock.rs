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
        /// Bytes moved per call (splice pipe size / copy buffer), e.g. 256K, 1M.
        #[arg(long, value_name = "SIZE", default_value = "256K", value_parser = parse_buffer)]
        buffer: u64,
        /// SO_VM_SOCKETS_BUFFER_SIZE for vsock sockets, e.g. 1M.
        #[arg(long, value_name = "SIZE", value_parser = parse_vsock_buffer)]
        vsock_buffer: Option<u64>,
        /// Print one JSON object per finished connection on stdout.
        #[arg(long)]
        json: bool,
    },
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
    }
}
