//! Where log lines go: stderr (colour only for a person at a terminal,
//! <https://no-color.org>), until `hover firecracker` is given a log file
//! (`--log-path`, `PUT /logger`), which then takes them with its own level
//! and format.

use hover_vmm::sync::Locked;
use std::io::Write;
use std::sync::{Mutex, OnceLock};

use hover_vmm::firecracker::models::Logger;
use hover_vmm::firecracker::refusal::Refusal;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::fmt::format::{DefaultFields, Format};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{fmt, reload, Registry};

/// The log file, once one is set.
static FILE: Mutex<Option<std::fs::File>> = Mutex::new(None);

type FmtLayer = fmt::Layer<
    tracing_subscriber::layer::Layered<reload::Layer<Targets, Registry>, Registry>,
    DefaultFields,
    Format,
    MakeLogWriter,
>;

struct Handles {
    filter: reload::Handle<Targets, Registry>,
    format: reload::Handle<
        FmtLayer,
        tracing_subscriber::layer::Layered<reload::Layer<Targets, Registry>, Registry>,
    >,
}

static HANDLES: OnceLock<Handles> = OnceLock::new();

/// Writes to the log file if one is set, else to stderr.
#[derive(Clone, Copy)]
pub struct MakeLogWriter;

/// One log line's writer.
pub struct LogWriter;

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match FILE.locked().as_mut() {
            Some(f) => f.write(buf),
            None => std::io::stderr().write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match FILE.locked().as_mut() {
            Some(f) => f.flush(),
            None => std::io::stderr().flush(),
        }
    }
}

impl<'a> fmt::MakeWriter<'a> for MakeLogWriter {
    type Writer = LogWriter;
    fn make_writer(&'a self) -> LogWriter {
        LogWriter
    }
}

fn format_layer(ansi: bool, level: bool, target: bool) -> FmtLayer {
    fmt::layer()
        .with_writer(MakeLogWriter)
        .with_ansi(ansi)
        .with_level(level)
        .with_target(target)
}

/// Log to stderr at `RUST_LOG`'s levels (default `warn`).
///
/// `RUST_LOG` is a list of `level` and `target=level` items (e.g.
/// `info,hover_vmm::migration=debug`); one that does not parse leaves the
/// default. A target list, not `EnvFilter`'s regular expressions: compiling
/// those at every start made the regex engine a part of every VMM's
/// resident memory (docs/BENCHMARKS.md, "The VMM's own memory").
pub fn init() {
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let (filter, filter_handle) =
        reload::Layer::new(env_filter(std::env::var("RUST_LOG").ok().as_deref()));
    let (format, format_handle) = reload::Layer::new(format_layer(colour, true, true));
    tracing_subscriber::registry()
        .with(filter)
        .with(format)
        .init();
    let _ = HANDLES.set(Handles {
        filter: filter_handle,
        format: format_handle,
    });
}

/// Firecracker's level names as a filter.
fn level(name: Option<&str>) -> Result<&'static str, String> {
    Ok(match name.unwrap_or("Warning") {
        "Error" => "error",
        "Warning" => "warn",
        "Info" => "info",
        "Debug" => "debug",
        "Trace" => "trace",
        "Off" => "off",
        other => {
            return Err(format!(
                "level {}: give Error, Warning, Info, Debug, Trace or Off",
                other.chars().take(40).collect::<String>()
            ))
        }
    })
}

/// Send log lines to `l.log_path` (appended; created if missing) at its
/// level, in its format.
pub fn set_firecracker_logger(l: &Logger) -> Result<(), Refusal> {
    // Checked before the file is opened: a bad level creates nothing.
    let filter = filter(l.level.as_deref(), l.module.as_deref())?;
    let file = hover_vmm::firecracker::open_log(std::path::Path::new(&l.log_path))
        .map_err(|e| format!("log_path {}: cannot open it: {e}", l.log_path))?;
    *FILE.locked() = Some(file);
    Ok(reload(filter, false, l.show_level, l.show_log_origin)?)
}

/// `--level` (and `--show-level`, `--show-log-origin`) without a log
/// file: the lines stay on stderr, at that level and in that format.
pub fn set_stderr_level(
    level: Option<&str>,
    show_level: bool,
    show_origin: bool,
) -> Result<(), String> {
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    reload(filter(level, None)?, colour, show_level, show_origin)
}

/// `RUST_LOG`'s filter, or `warn` where it is unset or does not parse.
fn env_filter(rust_log: Option<&str>) -> Targets {
    rust_log
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| Targets::new().with_default(tracing::Level::WARN))
}

fn filter(level: Option<&str>, module: Option<&str>) -> Result<Targets, String> {
    let level = self::level(level)?;
    let filter = match module {
        Some(m) => format!("{m}={level}"),
        None => level.to_string(),
    };
    filter.parse().map_err(|e| format!("module: {e}"))
}

fn reload(filter: Targets, ansi: bool, show_level: bool, show_origin: bool) -> Result<(), String> {
    let h = HANDLES.get().ok_or("logging is not set up")?;
    h.filter
        .reload(filter)
        .map_err(|e| format!("cannot change the log level: {e}"))?;
    h.format
        .reload(format_layer(ansi, show_level, show_origin))
        .map_err(|e| format!("cannot change the log format: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn firecracker_levels_map_to_filters() {
        assert_eq!(level(None).unwrap(), "warn");
        assert_eq!(level(Some("Debug")).unwrap(), "debug");
        assert!(level(Some("Loud")).unwrap_err().contains("Warning"));
    }

    #[test]
    fn rust_log_sets_levels_per_target_and_a_bad_one_leaves_warn() {
        use tracing::Level;
        let f = env_filter(Some("info,hover_vmm::migration=trace"));
        assert!(f.would_enable("hover_vmm::migration::sender", &Level::TRACE));
        assert!(f.would_enable("hover_vmm::vm", &Level::INFO));
        assert!(!f.would_enable("hover_vmm::vm", &Level::DEBUG));
        for bad in [None, Some("hover=loud")] {
            let f = env_filter(bad);
            assert!(f.would_enable("hover", &Level::WARN));
            assert!(!f.would_enable("hover", &Level::INFO));
        }
    }

    #[test]
    fn a_module_filter_logs_only_that_module() {
        let f = filter(Some("Debug"), Some("hover_vmm::api")).unwrap();
        assert!(f.would_enable("hover_vmm::api::server", &tracing::Level::DEBUG));
        assert!(!f.would_enable("hover_vmm::vm", &tracing::Level::ERROR));
    }
}
