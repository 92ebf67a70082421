//! The one log setup of the nsfast binaries (`nsfast`, `vpnrelay`, `nsfast-cni`, `vmtest`):
//! `tracing` to stderr, filtered by `RUST_LOG` (else a default), without targets, as text or
//! (`NSFAST_LOG_FORMAT=json`) one JSON object per line. Under systemd (stderr is the journal,
//! [`crate::systemd::stderr_is_journal`]) no timestamps (the journal adds them), no colour,
//! and each line starts with its syslog priority (`<3>` error, `<4>` warning, `<6>` info,
//! `<7>` debug and trace: sd-daemon(3)'s prefixes, which journald turns into the entry's
//! priority, so `journalctl -p warning` finds warnings); elsewhere colour only on a terminal.

use std::fmt;
use std::io::IsTerminal;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::{FormatEvent, FormatFields, Writer};
use tracing_subscriber::fmt::{FmtContext, MakeWriter};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// The variable that picks the log format: `text` (the default) or `json`.
pub const FORMAT_ENV: &str = "NSFAST_LOG_FORMAT";

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    /// One JSON object per line (`timestamp`, `level`, `fields.message`, ...).
    Json,
}

impl LogFormat {
    /// From [`FORMAT_ENV`]; an unknown value is text, with a note on stderr (the logger is
    /// not up yet).
    pub fn from_env() -> Self {
        match std::env::var(FORMAT_ENV).ok().as_deref().map(str::trim) {
            None | Some("") | Some("text") => LogFormat::Text,
            Some("json") => LogFormat::Json,
            Some(other) => {
                crate::out::errln(&format!(
                    "{FORMAT_ENV}={other:?} is not a log format (text or json): using text"
                ));
                LogFormat::Text
            }
        }
    }
}

/// `RUST_LOG`, else `default` (e.g. `info`).
pub fn env_filter(default: &str) -> EnvFilter {
    EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default))
}

/// The syslog priority of `level` (sd-daemon(3)).
pub fn priority(level: &Level) -> u8 {
    match *level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        _ => 7,
    }
}

/// Writes `<N>` (the event's [`priority`]) before what `F` writes.
struct PriorityPrefix<F>(F);

impl<S, N, F> FormatEvent<S, N> for PriorityPrefix<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        write!(writer, "<{}>", priority(event.metadata().level()))?;
        self.0.format_event(ctx, writer, event)
    }
}

/// The log layer writing to `w`, filtered by `filter`: `journal` gives priorities and no
/// timestamps, `ansi` colour.
pub fn layer_to<S, W>(
    filter: EnvFilter,
    w: W,
    format: LogFormat,
    journal: bool,
    ansi: bool,
) -> Box<dyn Layer<S> + Send + Sync>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let base = tracing_subscriber::fmt::layer()
        .with_writer(w)
        .with_target(false)
        .with_ansi(ansi && !journal && format == LogFormat::Text);
    let f = tracing_subscriber::fmt::format().with_target(false);
    match (format, journal) {
        (LogFormat::Text, false) => base.event_format(f).with_filter(filter).boxed(),
        (LogFormat::Text, true) => base
            .event_format(PriorityPrefix(f.without_time()))
            .with_filter(filter)
            .boxed(),
        (LogFormat::Json, false) => base
            .event_format(f.json())
            .fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
            .with_filter(filter)
            .boxed(),
        (LogFormat::Json, true) => base
            .event_format(PriorityPrefix(f.json().without_time()))
            .fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
            .with_filter(filter)
            .boxed(),
    }
}

/// The stderr layer, filtered by `filter`; for a binary that adds layers of its own (the CNI
/// plugin's `logFile`).
pub fn stderr_layer<S>(filter: EnvFilter) -> Box<dyn Layer<S> + Send + Sync>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    layer_to(
        filter,
        std::io::stderr,
        LogFormat::from_env(),
        crate::systemd::stderr_is_journal(),
        std::io::stderr().is_terminal(),
    )
}

/// Installs the stderr layer at [`env_filter`]`(default)`. A second call does nothing.
pub fn init(default: &str) {
    let _ = tracing_subscriber::registry()
        .with(stderr_layer(env_filter(default)))
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// The lines `format`/`journal` writes for one event per level.
    fn lines(format: LogFormat, journal: bool) -> Vec<String> {
        let buf = Buf::default();
        let w = buf.clone();
        let sub = tracing_subscriber::registry().with(layer_to(
            EnvFilter::new("trace"),
            move || w.clone(),
            format,
            journal,
            false,
        ));
        tracing::subscriber::with_default(sub, || {
            tracing::error!("e1");
            tracing::warn!(pod = "a", "w1");
            tracing::info!("i1");
            tracing::debug!("d1");
        });
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        text.lines().map(str::to_string).collect()
    }

    #[test]
    fn the_journal_gets_each_line_with_its_priority() {
        let l = lines(LogFormat::Text, true);
        assert_eq!(l.len(), 4, "{l:?}");
        let want = [("<3>", "e1"), ("<4>", "w1"), ("<6>", "i1"), ("<7>", "d1")];
        for (line, (p, msg)) in l.iter().zip(want) {
            assert!(line.starts_with(p) && line.contains(msg), "{line}");
        }
        // No timestamp: the journal adds its own.
        assert!(
            l[0].trim_start_matches("<3>")
                .trim_start()
                .starts_with("ERROR"),
            "{:?}",
            l[0]
        );
    }

    #[test]
    fn a_terminal_or_file_gets_no_priority_prefix() {
        for l in lines(LogFormat::Text, false) {
            assert!(!l.starts_with('<'), "{l}");
        }
    }

    #[test]
    fn json_lines_are_objects_with_level_and_message() {
        let l = lines(LogFormat::Json, false);
        assert_eq!(l.len(), 4, "{l:?}");
        let v: serde_json::Value = serde_json::from_str(&l[1]).unwrap();
        assert_eq!(v["level"], "WARN", "{v}");
        assert_eq!(v["fields"]["message"], "w1", "{v}");
        assert_eq!(v["fields"]["pod"], "a", "{v}");
        let j = lines(LogFormat::Json, true);
        assert!(j[1].starts_with("<4>{"), "{}", j[1]);
        let v: serde_json::Value = serde_json::from_str(&j[1][3..]).unwrap();
        assert_eq!(v["fields"]["message"], "w1", "{v}");
    }
}
