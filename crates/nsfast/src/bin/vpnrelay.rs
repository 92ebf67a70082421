//! `vpnrelay` — fast VPN tunnels for containers under rootless Docker (docs/vpnrelay.md).

fn main() -> std::process::ExitCode {
    nsfast_vpnrelay::cli::main()
}
