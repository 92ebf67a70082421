//! `nsfast sockmap ...`

use clap::Subcommand;

#[derive(Subcommand, Debug)]
pub enum SockmapCmd {
    /// Attach the shortcut to a cgroup and run until SIGINT/SIGTERM.
    Run {},
}

pub fn run(cmd: SockmapCmd) -> anyhow::Result<()> {
    match cmd {
        SockmapCmd::Run {} => anyhow::bail!("not implemented yet"),
    }
}
