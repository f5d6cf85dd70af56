//! Where log lines go: `tracing` events on standard error, as human-readable
//! lines or as JSON lines (`--log-format json`). One line per start, stop,
//! recovery, snapshot and failure at `info` and above, one per request at
//! `debug`. Keys, secrets, `args`, `meta` and `result` are never logged:
//! events carry ids, names, sizes and times only.

use tracing_subscriber::fmt::format::FmtSpan;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// One readable line per event.
    #[default]
    Human,
    /// One JSON object per line.
    Json,
}

/// The least severe lines written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogLevel {
    Error,
    Warn,
    #[default]
    Info,
    /// Also one line per request.
    Debug,
    Trace,
}

impl From<LogLevel> for tracing::Level {
    fn from(level: LogLevel) -> tracing::Level {
        match level {
            LogLevel::Error => tracing::Level::ERROR,
            LogLevel::Warn => tracing::Level::WARN,
            LogLevel::Info => tracing::Level::INFO,
            LogLevel::Debug => tracing::Level::DEBUG,
            LogLevel::Trace => tracing::Level::TRACE,
        }
    }
}

/// Installs the process's log output; later calls change nothing.
pub fn init(format: LogFormat, level: LogLevel) {
    let level = tracing::Level::from(level);
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(level)
        .with_target(false)
        .with_span_events(FmtSpan::NONE);
    let _ = match format {
        LogFormat::Human => builder.with_ansi(false).try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}
