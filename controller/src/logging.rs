//! Logging set-up: which filter (`--log-level`, klog-style `-v`, `RUST_LOG`), which format, and
//! colour only when a person is looking (never escape codes in log files).

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::cli::{LogArgs, LogFormat};

#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("--log-level={value}: {reason}")]
    LogLevel { value: String, reason: String },
    #[error("RUST_LOG={value}: {reason}")]
    RustLog { value: String, reason: String },
}

/// Where the filter came from, for the error message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Filter {
    Flag(String),
    Verbosity(&'static str),
    Env(String),
    Default,
}

/// `--log-level` (or NODEIPAM_LOG_LEVEL), else `-v`, else `RUST_LOG`, else `info`.
pub fn choose(args: &LogArgs, rust_log: Option<&str>) -> Filter {
    if let Some(level) = &args.log_level {
        return Filter::Flag(level.clone());
    }
    if let Some(v) = args.verbosity {
        return Filter::Verbosity(verbosity_level(v));
    }
    match rust_log.map(str::trim).filter(|s| !s.is_empty()) {
        Some(env) => Filter::Env(env.to_string()),
        None => Filter::Default,
    }
}

/// klog's levels as tracing's: 0-2 are what kube components log by default, 3-4 the
/// debugging detail, 5 and more everything.
pub fn verbosity_level(v: u8) -> &'static str {
    match v {
        0..=2 => "info",
        3..=4 => "debug",
        _ => "trace",
    }
}

/// The filter, or an error naming the flag or variable that holds a bad one.
pub fn env_filter(filter: &Filter) -> Result<EnvFilter, LogError> {
    match filter {
        Filter::Flag(value) => EnvFilter::try_new(value).map_err(|e| LogError::LogLevel {
            value: value.clone(),
            reason: e.to_string(),
        }),
        Filter::Env(value) => EnvFilter::try_new(value).map_err(|e| LogError::RustLog {
            value: value.clone(),
            reason: e.to_string(),
        }),
        Filter::Verbosity(level) => Ok(EnvFilter::new(quiet(level))),
        Filter::Default => Ok(EnvFilter::new(quiet("info"))),
    }
}

/// kube's client logs every failed request as an error of its own, without the URL, before
/// the caller (which retries and says what it was doing) logs it again: off unless asked for
/// by a filter that names it (`--log-level`, RUST_LOG) or -v 5 and more.
fn quiet(level: &str) -> String {
    if level == "trace" {
        return level.to_string();
    }
    format!("{level},kube_client::client::builder=off")
}

/// Colour only for a terminal, and never with NO_COLOR set (<https://no-color.org>).
pub fn use_colour(is_terminal: bool, no_color: Option<&str>) -> bool {
    is_terminal && no_color.is_none_or(str::is_empty)
}

/// Installs the global subscriber, writing to stdout.
pub fn init(args: &LogArgs) -> Result<(), LogError> {
    let rust_log = std::env::var("RUST_LOG").ok();
    let filter = env_filter(&choose(args, rust_log.as_deref()))?;
    let no_color = std::env::var("NO_COLOR").ok();
    let ansi = use_colour(std::io::stdout().is_terminal(), no_color.as_deref());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_ansi(ansi);
    match args.log_format {
        LogFormat::Json => builder.json().flatten_event(true).init(),
        LogFormat::Text => builder.init(),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(level: Option<&str>, v: Option<u8>) -> LogArgs {
        LogArgs {
            log_format: LogFormat::Text,
            log_level: level.map(Into::into),
            verbosity: v,
        }
    }

    #[test]
    fn precedence() {
        assert_eq!(
            choose(&args(Some("warn"), None), Some("trace")),
            Filter::Flag("warn".into())
        );
        assert_eq!(
            choose(&args(None, Some(4)), Some("trace")),
            Filter::Verbosity("debug")
        );
        assert_eq!(
            choose(&args(None, None), Some("nodeipam_controller=debug")),
            Filter::Env("nodeipam_controller=debug".into())
        );
        assert_eq!(choose(&args(None, None), Some("  ")), Filter::Default);
        assert_eq!(choose(&args(None, None), None), Filter::Default);
    }

    #[test]
    fn klog_levels() {
        assert_eq!(verbosity_level(0), "info");
        assert_eq!(verbosity_level(2), "info");
        assert_eq!(verbosity_level(4), "debug");
        assert_eq!(verbosity_level(10), "trace");
    }

    #[test]
    fn a_bad_filter_names_its_source() {
        let e = env_filter(&Filter::Flag("x=notalevel".into()))
            .expect_err("bad")
            .to_string();
        assert!(e.starts_with("--log-level=x=notalevel"), "{e}");
        let e = env_filter(&Filter::Env("x=notalevel".into()))
            .expect_err("bad")
            .to_string();
        assert!(e.starts_with("RUST_LOG="), "{e}");
    }

    #[test]
    fn colour_only_on_a_terminal() {
        assert!(use_colour(true, None));
        assert!(!use_colour(false, None));
        assert!(!use_colour(true, Some("1")));
        assert!(use_colour(true, Some("")));
    }
}
