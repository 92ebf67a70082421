//! `vpnrelay` — fast VPN tunnels for containers under rootless Docker (docs/vpnrelay.md).

#[path = "../version.rs"]
mod version;

fn main() -> std::process::ExitCode {
    nsfast_vpnrelay::cli::main_with_version(version::long())
}
