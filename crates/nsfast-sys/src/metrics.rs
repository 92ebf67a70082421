//! Metrics in the Prometheus formats, for `nsfast metrics` (one shot, for node_exporter's
//! textfile collector) and the daemons' `--metrics-listen` endpoints (docs/metrics.md).
//!
//! - [`Snapshot`] — counters and gauges with labels, read from a status at one moment and
//!   encoded by prometheus-client: the Prometheus text format 0.0.4 ([`Snapshot::to_text`],
//!   what the textfile collector reads and `promtool check metrics` checks) or OpenMetrics
//!   ([`Snapshot::to_openmetrics`], what Prometheus asks for first).
//! - [`serve`] — a `/metrics` HTTP endpoint on its own thread that renders a fresh snapshot
//!   for every scrape, so the numbers are the kernel's or the daemon's of that moment and
//!   nothing is cached between scrapes.
//! - [`parse_listen`], [`check_exposure`] — the `--metrics-listen ADDR` rule: a bare port
//!   listens on loopback; an address other than loopback needs `--metrics-public`, because
//!   the endpoint has no authentication and names cgroups, bridges and pods.

use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::{ACCEPT, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::args::ArgError;

/// `Content-Type` of the Prometheus text format.
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// `Content-Type` of OpenMetrics, served when the scraper's `Accept` names it.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// Connections served at once; more are closed at once (a scraper needs one).
pub const MAX_CONNECTIONS: usize = 16;
/// Time a client has to send its request headers.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

type Labels = Vec<(String, String)>;

#[derive(Clone)]
enum Metric {
    Counter(Family<Labels, Counter>),
    Gauge(Family<Labels, Gauge<u64, AtomicU64>>),
}

/// Counters and gauges read from a status at one moment, in the order they were added.
#[derive(Default, Clone)]
pub struct Snapshot {
    families: Vec<(String, String, Metric)>,
}

impl Snapshot {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `value` to the counter `name` with `labels`. `name` has no `_total` suffix (the
    /// encoders add it); `help` has no final period (the encoder adds one).
    pub fn counter(&mut self, name: &str, help: &str, labels: &[(&str, &str)], value: u64) {
        match self.family(name, help, || Metric::Counter(Family::default())) {
            Metric::Counter(f) => {
                f.get_or_create(&owned(labels)).inc_by(value);
            }
            Metric::Gauge(_) => debug_assert!(false, "{name} is a gauge"),
        }
    }

    /// Sets the gauge `name` with `labels` to `value`.
    pub fn gauge(&mut self, name: &str, help: &str, labels: &[(&str, &str)], value: u64) {
        match self.family(name, help, || Metric::Gauge(Family::default())) {
            Metric::Gauge(f) => {
                f.get_or_create(&owned(labels)).set(value);
            }
            Metric::Counter(_) => debug_assert!(false, "{name} is a counter"),
        }
    }

    /// Whether nothing was added.
    pub fn is_empty(&self) -> bool {
        self.families.is_empty()
    }

    fn family(&mut self, name: &str, help: &str, new: impl FnOnce() -> Metric) -> &Metric {
        let i = match self.families.iter().position(|(n, ..)| n == name) {
            Some(i) => i,
            None => {
                self.families.push((name.into(), help.into(), new()));
                self.families.len() - 1
            }
        };
        &self.families[i].2
    }

    fn registry(&self) -> Registry {
        let mut r = Registry::default();
        for (name, help, m) in &self.families {
            match m {
                Metric::Counter(f) => r.register(name, help, f.clone()),
                Metric::Gauge(f) => r.register(name, help, f.clone()),
            }
        }
        r
    }

    /// The Prometheus text format 0.0.4 (a counter's family is named with its `_total`).
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut s, &self.registry());
        s
    }

    /// OpenMetrics 1.0 (ends with `# EOF`).
    pub fn to_openmetrics(&self) -> String {
        let mut s = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut s, &self.registry());
        s
    }
}

fn owned(labels: &[(&str, &str)]) -> Labels {
    labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Parses `--metrics-listen`: `PORT` or `:PORT` (loopback, 127.0.0.1), `localhost:PORT`,
/// `IPV4:PORT` or `[IPV6]:PORT`; the port is 1-65535.
pub fn parse_listen(flag: &str, s: &str) -> Result<SocketAddr, ArgError> {
    let err = |reason: String| ArgError::new(flag, "address", s, reason);
    let t = s.trim();
    let port = |p: &str| {
        p.parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| err(format!("port {p:?} must be 1-65535")))
    };
    let (host, p) = if let Some(rest) = t.strip_prefix('[') {
        let (h, p) = rest
            .split_once("]:")
            .ok_or_else(|| err("expected [IPV6]:PORT, e.g. [::1]:9464".into()))?;
        let ip: Ipv6Addr = h
            .parse()
            .map_err(|_| err(format!("{h:?} is not an IPv6 address")))?;
        (IpAddr::V6(ip), p)
    } else if let Some((h, p)) = t.rsplit_once(':') {
        let ip = match h {
            "" | "localhost" => IpAddr::V4(Ipv4Addr::LOCALHOST),
            h => IpAddr::V4(h.parse().map_err(|_| {
                err(format!(
                    "{h:?} is not an IPv4 address or localhost (write IPv6 as [ADDR]:PORT)"
                ))
            })?),
        };
        (ip, p)
    } else if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        (IpAddr::V4(Ipv4Addr::LOCALHOST), t)
    } else {
        return Err(err(
            "expected PORT, :PORT, HOST:PORT or [IPV6]:PORT, e.g. 9464 or 127.0.0.1:9464".into(),
        ));
    };
    Ok(SocketAddr::new(host, port(p)?))
}

/// A clap `value_parser` for `flag`: [`parse_listen`].
pub fn listen_arg(
    flag: &'static str,
) -> impl Fn(&str) -> Result<SocketAddr, ArgError> + Clone + Send + Sync + 'static {
    move |s| parse_listen(flag, s)
}

/// Refuses an address other than loopback unless `public` (the flag `public_flag`) is given:
/// the endpoint has no authentication.
pub fn check_exposure(
    flag: &str,
    addr: SocketAddr,
    public: bool,
    public_flag: &str,
) -> Result<(), String> {
    if addr.ip().is_loopback() || public {
        return Ok(());
    }
    Err(format!(
        "invalid address {addr} for {flag}: not a loopback address, and the metrics endpoint \
         has no authentication; give {public_flag} as well to listen there, or use a \
         loopback address such as 127.0.0.1:{}",
        addr.port()
    ))
}

/// A running `/metrics` endpoint. Dropping it stops the server and waits for its thread.
pub struct Endpoint {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Endpoint {
    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Listens on `addr` (bound before this returns, so a port in use is an error here) and
/// serves `GET /metrics` on a thread of its own, calling `render` for every scrape.
pub fn serve<F>(addr: SocketAddr, render: F) -> std::io::Result<Endpoint>
where
    F: Fn() -> Snapshot + Send + Sync + 'static,
{
    let with_addr = |e: std::io::Error| {
        std::io::Error::new(e.kind(), format!("metrics endpoint on {addr}: {e}"))
    };
    let listener = std::net::TcpListener::bind(addr).map_err(with_addr)?;
    listener.set_nonblocking(true).map_err(with_addr)?;
    let local = listener.local_addr().map_err(with_addr)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let render: Arc<dyn Fn() -> Snapshot + Send + Sync> = Arc::new(render);
    let thread = std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || rt.block_on(accept_loop(listener, render, stopped)))?;
    Ok(Endpoint {
        addr: local,
        stop: Some(stop),
        thread: Some(thread),
    })
}

async fn accept_loop(
    listener: std::net::TcpListener,
    render: Arc<dyn Fn() -> Snapshot + Send + Sync>,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!("metrics endpoint: {e}");
            return;
        }
    };
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let stream = tokio::select! {
            _ = &mut stopped => return,
            a = listener.accept() => match a {
                Ok((s, _)) => s,
                Err(e) => {
                    // EMFILE and the like: wait a little instead of spinning.
                    tracing::debug!("metrics endpoint: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            continue;
        };
        let render = render.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let r = respond(&req, render.as_ref());
                async move { Ok::<_, Infallible>(r) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                .await;
            drop(slot);
        });
    }
}

fn respond<B>(
    req: &Request<B>,
    render: &(dyn Fn() -> Snapshot + Send + Sync),
) -> Response<Full<Bytes>> {
    let reply = |code: StatusCode, ctype: &'static str, body: String| {
        Response::builder()
            .status(code)
            .header(CONTENT_TYPE, ctype)
            .body(Full::new(Bytes::from(body)))
            .unwrap_or_default()
    };
    const PLAIN: &str = "text/plain; charset=utf-8";
    if req.uri().path() != "/metrics" {
        return reply(
            StatusCode::NOT_FOUND,
            PLAIN,
            "not found: the metrics are at /metrics\n".into(),
        );
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return reply(
            StatusCode::METHOD_NOT_ALLOWED,
            PLAIN,
            "only GET and HEAD\n".into(),
        );
    }
    let openmetrics = req.headers().get_all(ACCEPT).iter().any(|v| {
        v.to_str()
            .is_ok_and(|v| v.contains("application/openmetrics-text"))
    });
    let snap = render();
    if openmetrics {
        reply(
            StatusCode::OK,
            OPENMETRICS_CONTENT_TYPE,
            snap.to_openmetrics(),
        )
    } else {
        reply(StatusCode::OK, TEXT_CONTENT_TYPE, snap.to_text())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn sample() -> Snapshot {
        let mut s = Snapshot::new();
        s.counter(
            "nsfast_test_bytes",
            "Bytes moved",
            &[("cgroup", "/sys/fs/cgroup/a\"b")],
            5,
        );
        s.counter("nsfast_test_bytes", "Bytes moved", &[("cgroup", "/c")], 7);
        s.gauge("nsfast_test_sockets", "Sockets now", &[], 3);
        s
    }

    #[test]
    fn text_names_a_counter_family_with_its_total() {
        let t = sample().to_text();
        assert!(
            t.contains("# HELP nsfast_test_bytes_total Bytes moved.\n"),
            "{t}"
        );
        assert!(
            t.contains("# TYPE nsfast_test_bytes_total counter\n"),
            "{t}"
        );
        assert!(
            t.contains("nsfast_test_bytes_total{cgroup=\"/sys/fs/cgroup/a\\\"b\"} 5\n"),
            "{t}"
        );
        assert!(
            t.contains("nsfast_test_bytes_total{cgroup=\"/c\"} 7\n"),
            "{t}"
        );
        assert!(
            t.contains("# TYPE nsfast_test_sockets gauge\nnsfast_test_sockets 3\n"),
            "{t}"
        );
        assert!(!t.contains("# EOF"), "{t}");
        let o = sample().to_openmetrics();
        assert!(o.contains("# TYPE nsfast_test_bytes counter\n"), "{o}");
        assert!(o.ends_with("# EOF\n"), "{o}");
    }

    #[test]
    fn listen_addresses() {
        let p = |s| parse_listen("--metrics-listen", s);
        let lo = |port| SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port);
        assert_eq!(p("9464").unwrap(), lo(9464));
        assert_eq!(p(":9464").unwrap(), lo(9464));
        assert_eq!(p("localhost:9464").unwrap(), lo(9464));
        assert_eq!(p("127.0.0.2:80").unwrap().to_string(), "127.0.0.2:80");
        assert_eq!(p("[::1]:9464").unwrap().to_string(), "[::1]:9464");
        assert_eq!(p("0.0.0.0:9464").unwrap().to_string(), "0.0.0.0:9464");
        for (bad, why) in [
            ("0", "must be 1-65535"),
            ("70000", "must be 1-65535"),
            (":x", "must be 1-65535"),
            ("node1:9464", "not an IPv4 address or localhost"),
            ("[::1]9464", "expected [IPV6]:PORT"),
            ("", "expected PORT"),
        ] {
            let e = p(bad).unwrap_err().to_string();
            assert!(
                e.contains(why) && e.contains("--metrics-listen"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn only_loopback_without_public() {
        let f = |s: &str, public| {
            check_exposure(
                "--metrics-listen",
                s.parse().unwrap(),
                public,
                "--metrics-public",
            )
        };
        assert!(f("127.0.0.1:9464", false).is_ok());
        assert!(f("[::1]:9464", false).is_ok());
        let e = f("0.0.0.0:9464", false).unwrap_err();
        assert!(
            e.contains("0.0.0.0:9464") && e.contains("--metrics-public"),
            "{e}"
        );
        assert!(f("0.0.0.0:9464", true).is_ok());
    }

    fn get(addr: SocketAddr, path: &str, accept: &str) -> String {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: x\r\nAccept: {accept}\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn endpoint_renders_each_scrape_in_the_format_asked_for() {
        let n = Arc::new(AtomicU64::new(0));
        let m = n.clone();
        let ep = serve("127.0.0.1:0".parse().unwrap(), move || {
            let v = m.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            let mut s = Snapshot::new();
            s.counter("nsfast_test_scrapes", "Scrapes", &[], v);
            s
        })
        .unwrap();
        let a = get(ep.addr(), "/metrics", "*/*");
        assert!(a.starts_with("HTTP/1.1 200"), "{a}");
        assert!(a.contains(TEXT_CONTENT_TYPE), "{a}");
        assert!(a.contains("nsfast_test_scrapes_total 1\n"), "{a}");
        let b = get(
            ep.addr(),
            "/metrics",
            "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
        );
        assert!(b.contains(OPENMETRICS_CONTENT_TYPE), "{b}");
        assert!(
            b.contains("nsfast_test_scrapes_total 2\n") && b.contains("# EOF"),
            "{b}"
        );
        let c = get(ep.addr(), "/", "*/*");
        assert!(c.starts_with("HTTP/1.1 404"), "{c}");
        let addr = ep.addr();
        drop(ep);
        assert!(
            std::net::TcpStream::connect(addr).is_err(),
            "still listening after drop"
        );
    }

    #[test]
    fn a_port_in_use_is_an_error_naming_the_address() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let e = serve(addr, Snapshot::new).err().expect("bind must fail");
        assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse);
        assert!(e.to_string().contains(&addr.to_string()), "{e}");
    }
}
