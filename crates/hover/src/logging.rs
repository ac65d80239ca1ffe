//! Where log lines go: stderr (colour only for a person at a terminal,
//! <https://no-color.org>), until `hover firecracker` is given a log file
//! (`--log-path`, `PUT /logger`), which then takes them with its own level
//! and format.

use std::io::Write;
use std::sync::{Mutex, OnceLock};

use hover_vmm::firecracker::models::Logger;
use tracing_subscriber::fmt::format::{DefaultFields, Format};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{fmt, reload, EnvFilter, Registry};

/// The log file, once one is set.
static FILE: Mutex<Option<std::fs::File>> = Mutex::new(None);

type FmtLayer = fmt::Layer<
    tracing_subscriber::layer::Layered<reload::Layer<EnvFilter, Registry>, Registry>,
    DefaultFields,
    Format,
    MakeLogWriter,
>;

struct Handles {
    filter: reload::Handle<EnvFilter, Registry>,
    format: reload::Handle<
        FmtLayer,
        tracing_subscriber::layer::Layered<reload::Layer<EnvFilter, Registry>, Registry>,
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
        match FILE.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            Some(f) => f.write(buf),
            None => std::io::stderr().write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match FILE.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
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

/// Log to stderr at `RUST_LOG`'s level (default `warn`).
pub fn init() {
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let (filter, filter_handle) =
        reload::Layer::new(EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()));
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
pub fn set_firecracker_logger(l: &Logger) -> Result<(), String> {
    let file = hover_vmm::firecracker::open_log(std::path::Path::new(&l.log_path))
        .map_err(|e| format!("log_path {}: cannot open it: {e}", l.log_path))?;
    // Checked before the file takes the lines: a bad level changes nothing.
    let filter = filter(l.level.as_deref(), l.module.as_deref())?;
    *FILE.lock().unwrap_or_else(|p| p.into_inner()) = Some(file);
    reload(filter, false, l.show_level, l.show_log_origin)
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

fn filter(level: Option<&str>, module: Option<&str>) -> Result<EnvFilter, String> {
    let level = self::level(level)?;
    let filter = match module {
        Some(m) => format!("{m}={level}"),
        None => level.to_string(),
    };
    EnvFilter::try_new(&filter).map_err(|e| format!("module: {e}"))
}

fn reload(
    filter: EnvFilter,
    ansi: bool,
    show_level: bool,
    show_origin: bool,
) -> Result<(), String> {
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
}
