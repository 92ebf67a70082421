//! `nsfast policy apply | list | delete | namespace`.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Subcommand;
use nsfast_pod::{policy, Host};

use crate::cmd::output::json;

#[derive(Subcommand, Debug)]
pub enum PolicyCmd {
    /// Create or replace Kubernetes NetworkPolicies (networking.k8s.io/v1, the schema
    /// unchanged) from a YAML or JSON file: every object of it in one atomic change, or none
    /// if any object is bad (exit 2, naming the field and value).
    Apply {
        /// The file (YAML documents or JSON; `-`: standard input).
        #[arg(short = 'f', long = "filename", value_name = "FILE")]
        file: PathBuf,
        /// Host network namespace (under /run/netns); default: the current namespace.
        #[arg(long)]
        host: Option<String>,
    },
    /// List the host's policies (with the pods each selects) and namespace labels.
    List {
        /// Host network namespace (under /run/netns); default: the current namespace.
        #[arg(long)]
        host: Option<String>,
    },
    /// Delete a policy.
    Delete {
        /// The policy's name.
        #[arg(value_parser = policy_name)]
        name: String,
        /// Its namespace.
        #[arg(short = 'n', long, default_value = "default", value_parser = namespace)]
        namespace: String,
        /// Host network namespace (under /run/netns); default: the current namespace.
        #[arg(long)]
        host: Option<String>,
    },
    /// Set a namespace's labels (what namespaceSelectors match): exactly the --label
    /// pairs given; none removes them. Every namespace also carries
    /// kubernetes.io/metadata.name=<its name>.
    Namespace {
        /// The namespace (a DNS label).
        #[arg(value_parser = namespace)]
        name: String,
        /// A label KEY=VALUE (repeatable).
        #[arg(long = "label", value_name = "KEY=VALUE", value_parser = label)]
        labels: Vec<(String, String)>,
        /// Host network namespace (under /run/netns); default: the current namespace.
        #[arg(long)]
        host: Option<String>,
    },
}

/// `--label KEY=VALUE`, checked as Kubernetes checks labels (a bad one exits 2).
pub fn label(s: &str) -> Result<(String, String), String> {
    nsfast_policy::parse::parse_label(s)
}

/// A namespace name (a DNS label).
pub fn namespace(s: &str) -> Result<String, String> {
    nsfast_policy::parse::check_namespace(s).map(|()| s.to_string())
}

fn policy_name(s: &str) -> Result<String, String> {
    nsfast_policy::parse::check_policy_name(s).map(|()| s.to_string())
}

pub fn run(cmd: PolicyCmd) -> Result<()> {
    // A change is finished once started: SIGINT/SIGTERM wait until it is (or is undone).
    if !matches!(cmd, PolicyCmd::List { .. }) {
        nsfast_sys::signals::block_termination()?;
    }
    match cmd {
        PolicyCmd::Apply { file, host } => {
            let input = read_input(&file)?;
            let h = Host::open(host.as_deref())?;
            let r = policy::apply(&h, &input)?;
            if let Some(j) = json() {
                j.print(&r)?;
                return Ok(());
            }
            for (id, what) in &r.objects {
                nsfast_sys::outln!("networkpolicy {id} {what}")?;
            }
            nsfast_sys::outln!("generation {}", r.generation)?;
        }
        PolicyCmd::List { host } => {
            let h = Host::open(host.as_deref())?;
            let p = policy::load(&h)?;
            if let Some(j) = json() {
                j.print(&p.output_json(&h.display))?;
                return Ok(());
            }
            // What the policies select among the pods made (not one being added).
            let pods: Vec<_> = h.records()?.into_iter().filter(|r| !r.pending).collect();
            let world = policy::cluster(&p, &pods);
            nsfast_sys::outln!("host {}  generation {}", h.display, p.generation)?;
            nsfast_sys::outln!(
                "{:<16} {:<24} {:<16} {:>7} {:>6}  SELECTS",
                "NAMESPACE",
                "NAME",
                "TYPES",
                "INGRESS",
                "EGRESS"
            )?;
            for q in &p.policies {
                let c = &q.policy;
                let types = match (c.ingress_isolates, c.egress_isolates) {
                    (true, true) => "Ingress,Egress",
                    (true, false) => "Ingress",
                    (false, true) => "Egress",
                    (false, false) => "-",
                };
                let selected: Vec<&str> = world
                    .pods
                    .iter()
                    .filter(|pod| nsfast_policy::eval::selects(c, pod))
                    .map(|pod| pod.name.as_str())
                    .collect();
                nsfast_sys::outln!(
                    "{:<16} {:<24} {:<16} {:>7} {:>6}  {}",
                    c.namespace,
                    c.name,
                    types,
                    c.ingress.len(),
                    c.egress.len(),
                    if selected.is_empty() {
                        "(no pod)".to_string()
                    } else {
                        selected.join(",")
                    }
                )?;
            }
            for (n, labels) in &world.namespaces {
                let l: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
                nsfast_sys::outln!("namespace {n}: {}", l.join(" "))?;
            }
        }
        PolicyCmd::Delete {
            name,
            namespace,
            host,
        } => {
            let h = Host::open(host.as_deref())?;
            if !policy::delete(&h, &namespace, &name)? {
                anyhow::bail!(
                    "no policy {name:?} in namespace {namespace:?} on host {} (see `nsfast policy list`)",
                    h.display
                );
            }
            if let Some(j) = json() {
                j.print(&serde_json::json!({"deleted": format!("{namespace}/{name}")}))?;
                return Ok(());
            }
            nsfast_sys::outln!("networkpolicy {namespace}/{name} deleted")?;
        }
        PolicyCmd::Namespace { name, labels, host } => {
            let h = Host::open(host.as_deref())?;
            let labels: BTreeMap<String, String> = labels.into_iter().collect();
            let g = policy::set_namespace(&h, &name, labels.clone())?;
            if let Some(j) = json() {
                j.print(
                    &serde_json::json!({"namespace": name, "labels": labels, "generation": g}),
                )?;
                return Ok(());
            }
            let l: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
            nsfast_sys::outln!(
                "namespace {name} labels: [{}] (generation {g})",
                l.join(" ")
            )?;
        }
    }
    if let Some(sig) = nsfast_sys::signals::pending_termination() {
        eprintln!("nsfast: {sig} received; the change was completed or undone first");
    }
    Ok(())
}

/// The text of `-f FILE` (`-`: stdin), at most [`nsfast_policy::parse::MAX_INPUT`] bytes of
/// UTF-8; anything else is a usage error naming the file.
fn read_input(file: &std::path::Path) -> Result<String> {
    let limit = nsfast_policy::parse::MAX_INPUT as u64 + 1;
    let mut body = Vec::new();
    if file.as_os_str() == "-" {
        std::io::stdin()
            .take(limit)
            .read_to_end(&mut body)
            .context("read standard input")?;
    } else {
        std::fs::File::open(file)
            .and_then(|f| f.take(limit).read_to_end(&mut body))
            .map_err(|e| crate::usage(format!("cannot read -f {}: {e}", file.display())))?;
    }
    String::from_utf8(body)
        .map_err(|e| crate::usage(format!("-f {}: not UTF-8 text ({e})", file.display())))
}
