//! `vpnrelay supervise`: one per bridge (a cron line every minute is enough), runs
//! `vpnrelay transparent` as a child, cleans up after every exit and restarts it with backoff
//! 5 s → 60 s (Docker down, bridge missing, crash). SIGTERM stops the relay, removes the rule,
//! resets conntrack and leaves no process.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::config::Config;
use crate::state::{self, Lock, TryLock};

pub(crate) const BACKOFF_MIN: Duration = Duration::from_secs(5);
pub(crate) const BACKOFF_MAX: Duration = Duration::from_secs(60);

/// Sleeps up to `d`, returning early with the signal if one arrives.
fn sleep_or_signal(d: Duration) -> Option<nix::sys::signal::Signal> {
    let until = Instant::now() + d;
    while Instant::now() < until {
        if let Some(s) = nsfast_sys::signals::pending_stop() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    None
}

/// Supervises `cfg`'s relay; with `metrics`, serves its counters there
/// ([`crate::metrics`]) while it holds the supervisor lock.
pub fn supervise(cfg: &Config, metrics: Option<std::net::SocketAddr>) -> anyhow::Result<()> {
    let lock_path = state::lock_path("supervise", &cfg.bridge);
    let _lock = match Lock::try_take(&lock_path)? {
        TryLock::Taken(l) => l,
        TryLock::Busy(pid) => {
            tracing::info!(
                "a supervisor for bridge {:?} already runs{}; exiting",
                cfg.bridge,
                pid.map(|p| format!(" (pid {p})")).unwrap_or_default()
            );
            return Ok(());
        }
    };
    // Only the supervisor that holds the lock listens: the next cron start exits above
    // instead of failing on a port in use.
    let restarts = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let _endpoint = match metrics {
        None => None,
        Some(addr) => {
            let (r, bridge, dir) = (restarts.clone(), cfg.bridge.clone(), state::lock_dir());
            let ep = nsfast_sys::metrics::serve(addr, move || {
                let n = r.load(std::sync::atomic::Ordering::Relaxed);
                crate::metrics::snapshot(&dir, &bridge, n)
            })?;
            tracing::info!("metrics at http://{}/metrics", ep.addr());
            Some(ep)
        }
    };
    let mut backoff = BACKOFF_MIN;
    loop {
        let started = Instant::now();
        let mut cmd = Command::new("/proc/self/exe");
        cmd.arg("transparent")
            .arg(&cfg.bridge)
            .arg(cfg.ports.to_compact_string())
            .env("VPNRELAY_RULE", cfg.rule.to_string())
            .env("VPNRELAY_SOCKBUF", cfg.sockbuf.to_string())
            .env(
                "VPNRELAY_IDLE_TIMEOUT",
                nsfast_sys::args::duration::format(cfg.idle),
            )
            .env(
                "VPNRELAY_MAX_FLOWS_PER_CLIENT",
                cfg.max_flows_per_client.to_string(),
            );
        // A SIGKILLed supervisor must not leave an orphan relay that the next one (from cron)
        // could not replace: the relay gets SIGTERM and hands the tunnels back.
        nsfast_sys::signals::die_with_parent(&mut cmd, nix::sys::signal::Signal::SIGTERM);
        let mut child = cmd.spawn().context("starting vpnrelay transparent")?;
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let status = loop {
            if let Some(sig) = nsfast_sys::signals::pending_stop() {
                tracing::info!("{sig}: stopping");
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
                let until = Instant::now() + Duration::from_secs(15);
                while child.try_wait()?.is_none() && Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(50));
                }
                if child.try_wait()?.is_none() {
                    let _ = child.kill();
                    let _ = child.wait();
                }
                quiet_cleanup(cfg);
                return Ok(());
            }
            if let Some(s) = child.try_wait()? {
                break s;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        quiet_cleanup(cfg);
        if started.elapsed() > BACKOFF_MAX {
            backoff = BACKOFF_MIN;
        }
        tracing::warn!(
            "relay exited ({status}); tunnels use Docker's normal path; restarting in {} s",
            backoff.as_secs()
        );
        if let Some(sig) = sleep_or_signal(backoff) {
            tracing::info!("{sig}: stopping");
            return Ok(());
        }
        backoff = (backoff * 2).min(BACKOFF_MAX);
        restarts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

fn quiet_cleanup(cfg: &Config) {
    if let Err(e) = crate::host::cleanup(cfg) {
        tracing::debug!("cleanup: {e:#}");
    }
}
