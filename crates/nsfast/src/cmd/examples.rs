//! EXAMPLES of every visible `nsfast` command, shown by `--help` (clap's `after_help`) and
//! in the man pages (`__gen-docs`), from this one table. A test parses each command line
//! with the real parser.

use nsfast_sys::helpdoc::{Example, Table};

const fn ex(what: &'static str, cmd: &'static str) -> Example {
    Example { what, cmd }
}

pub const EXAMPLES: Table = &[
    (
        "nsfast",
        &[
            ex("What this kernel offers nsfast", "nsfast probe"),
            ex(
                "Attach the TCP shortcut to a systemd slice",
                "nsfast sockmap run --slice myapp.slice",
            ),
            ex("Make a pod with a veth pair", "nsfast pod add web --ip 10.244.1.5/24 --mode veth"),
            ex("Every path side by side, about a minute", "nsfast bench --quick"),
        ],
    ),
    (
        "nsfast sockmap",
        &[
            ex("Run the shortcut on a cgroup", "nsfast sockmap run --cgroup /sys/fs/cgroup/myapp"),
            ex("What is loaded, as JSON", "nsfast sockmap status -j"),
        ],
    ),
    (
        "nsfast sockmap run",
        &[
            ex("Attach to a running slice", "nsfast sockmap run --slice myapp.slice"),
            ex(
                "Only connections to the web ports, counters logged each minute",
                "nsfast sockmap run --cgroup /sys/fs/cgroup/myapp --ports 80,443,8000-8100 --stats-interval 1m",
            ),
            ex(
                "Serve the counters to Prometheus on loopback port 9464",
                "nsfast sockmap run --slice myapp.slice --metrics-listen 9464",
            ),
        ],
    ),
    (
        "nsfast sockmap status",
        &[
            ex("Every instance with its counters", "nsfast sockmap status"),
            ex("The same as indented JSON", "nsfast sockmap status -p"),
        ],
    ),
    (
        "nsfast vsock",
        &[
            ex("Forward host TCP port 8080 to port 80 of guest CID 3", "nsfast vsock relay tcp-listen:8080 vsock-connect:3:80 --fork"),
            ex("Let guests 3 and 4 reach each other on port 5000", "nsfast vsock bridge --group 3,4 --ports 5000"),
        ],
    ),
    (
        "nsfast vsock relay",
        &[
            ex(
                "Forward host TCP port 8080 to port 80 of guest CID 3, every connection",
                "nsfast vsock relay tcp-listen:8080 vsock-connect:3:80 --fork",
            ),
            ex(
                "In a guest: expose vsock port 5000 as a UNIX socket",
                "nsfast vsock relay unix-listen:/run/app.sock vsock-connect:2:5000 --fork",
            ),
            ex(
                "Reach a Firecracker guest's port 52 through its hybrid vsock socket",
                "nsfast vsock relay tcp-listen:2222 hybrid:/run/fc/v.sock:52 --fork",
            ),
        ],
    ),
    (
        "nsfast vsock bridge",
        &[
            ex(
                "Guests 3 and 4 reach each other on ports 5000 and 6000-6010",
                "nsfast vsock bridge --group 3,4 --ports 5000,6000-6010",
            ),
            ex(
                "Two pairs, one of them Firecracker guests on hybrid vsock",
                "nsfast vsock bridge --group 3,4 --group 5,6 --vm 5=hybrid:/run/fc5.sock --vm 6=hybrid:/run/fc6.sock --ports 5000",
            ),
            ex(
                "One JSON line per connection event, counters for Prometheus",
                "nsfast vsock bridge --group 3,4 --ports 5000 -j --metrics-listen 9465",
            ),
        ],
    ),
    (
        "nsfast vsock ns",
        &[
            ex("The current namespace's vsock modes", "nsfast vsock ns show"),
            ex("A namespace with a vsock space of its own", "nsfast vsock ns create vm1 --mode local"),
        ],
    ),
    (
        "nsfast vsock ns show",
        &[
            ex("The current namespace", "nsfast vsock ns show"),
            ex("Namespace vm1 (/run/netns/vm1), as JSON", "nsfast vsock ns show vm1 -j"),
        ],
    ),
    (
        "nsfast vsock ns create",
        &[ex(
            "Namespace vm1 with its own vsock space",
            "nsfast vsock ns create vm1 --mode local",
        )],
    ),
    (
        "nsfast vsock bench",
        &[
            ex("In guest CID 3: the server, for one connection", "nsfast vsock bench --server --once"),
            ex("On the host: send 4 GiB to it", "nsfast vsock bench --cid 3 --bytes 4G"),
        ],
    ),
    (
        "nsfast pod",
        &[
            ex("A pod on netkit if the kernel has it", "nsfast pod add web --ip 10.244.1.5/24"),
            ex("The host's pods and counters", "nsfast pod list"),
            ex("Remove it again", "nsfast pod del web"),
        ],
    ),
    (
        "nsfast pod add",
        &[
            ex(
                "A dual-stack pod on a veth pair, wire traffic from eth0",
                "nsfast pod add web --ip 10.244.1.5/24,fd00:10:244::5/64 --mode veth --uplink eth0",
            ),
            ex(
                "A pod whose traffic goes through the host's netfilter rules",
                "nsfast pod add db --ip 10.244.1.6/24 --host-firewall",
            ),
            ex(
                "In host namespace node1, printing the record as JSON",
                "nsfast pod add web --ip 10.244.1.5/24 --host node1 -j",
            ),
        ],
    ),
    (
        "nsfast pod del",
        &[
            ex("One pod", "nsfast pod del web"),
            ex("Every pod of host namespace node1, and the host's maps", "nsfast pod del --all --host node1"),
        ],
    ),
    (
        "nsfast pod list",
        &[
            ex("The current namespace's pods", "nsfast pod list"),
            ex("Host namespace node1, as JSON", "nsfast pod list --host node1 -j"),
        ],
    ),
    (
        "nsfast pod shortcut",
        &[
            ex("Turn it on for the host's pods", "nsfast pod shortcut enable"),
            ex("Its counters per pod", "nsfast pod shortcut status"),
        ],
    ),
    (
        "nsfast pod shortcut enable",
        &[
            ex("For the current namespace's pods", "nsfast pod shortcut enable"),
            ex("For host namespace node1", "nsfast pod shortcut enable --host node1"),
        ],
    ),
    (
        "nsfast pod shortcut disable",
        &[ex("Turn it off; redirected connections drain", "nsfast pod shortcut disable")],
    ),
    (
        "nsfast pod shortcut status",
        &[
            ex("On or off, and the counters per pod", "nsfast pod shortcut status"),
            ex("As JSON", "nsfast pod shortcut status -j"),
        ],
    ),
    (
        "nsfast bench",
        &[
            ex("About a minute: host, veth, routed, sockmap", "nsfast bench --quick"),
            ex("Which topologies this machine can run", "nsfast bench --list"),
            ex(
                "Request/response on two paths, both CPU placements, JSON and charts",
                "nsfast bench --topologies veth,sockmap --workloads rr,crr --placement same-cpu,cross-cpu --json bench.json",
            ),
            ex("Remove what killed runs left", "nsfast bench --cleanup"),
        ],
    ),
    (
        "nsfast probe",
        &[
            ex("The table (each reason with -v)", "nsfast probe"),
            ex("For a script: exit 1 naming what is missing", "nsfast probe --require tcx,bpf_redirect_peer"),
            ex("Every field as JSON", "nsfast probe -j"),
        ],
    ),
    (
        "nsfast metrics",
        &[
            ex("The counters in the Prometheus text format", "nsfast metrics"),
            ex(
                "For node_exporter's textfile collector (written whole)",
                "nsfast metrics -o /var/lib/prometheus/node-exporter/nsfast.prom",
            ),
            ex("Including the pods of host namespace node1", "nsfast metrics --pod-host node1"),
        ],
    ),
    (
        "nsfast policy",
        &[
            ex("Apply NetworkPolicies from a file", "nsfast policy apply -f web-policy.yaml"),
            ex("What is applied, as JSON", "nsfast policy list -j"),
        ],
    ),
    (
        "nsfast policy apply",
        &[
            ex("From a YAML or JSON file", "nsfast policy apply -f web-policy.yaml --host node1"),
            ex("From standard input", "nsfast policy apply -f -"),
        ],
    ),
    (
        "nsfast policy list",
        &[
            ex("Policies, the pods they select, namespace labels", "nsfast policy list"),
            ex("The stored objects as JSON", "nsfast policy list -j --host node1"),
        ],
    ),
    (
        "nsfast policy delete",
        &[
            ex("A policy of namespace shop", "nsfast policy delete web -n shop"),
            ex("A policy of namespace default", "nsfast policy delete deny-all"),
        ],
    ),
    (
        "nsfast policy namespace",
        &[
            ex("Label a namespace", "nsfast policy namespace shop --label team=a"),
            ex("Remove its labels", "nsfast policy namespace shop"),
        ],
    ),
];
