//! The tracing subscriber: JSON lines for the service, pretty text for people at a terminal.
//! And [`traces`]: spans of each issue's story, sent over OTLP.

pub mod traces;

pub use traces::Traces;

use tracing_subscriber::EnvFilter;

use crate::settings::LogFormat;

/// Libraries whose debug output carries secrets, held at `info` whatever `RUST_LOG` says:
/// bollard logs each container-create request whole, the run token in its environment.
const QUIET: &[&str] = &["bollard=info"];

/// Installs the global subscriber. `RUST_LOG` overrides the default `info` level, except for
/// [`QUIET`]. Safe to call more than once (later calls do nothing), so tests can call it freely.
pub fn init(format: LogFormat) {
    let mut filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    for directive in QUIET {
        if let Ok(d) = directive.parse() {
            filter = filter.add_directive(d);
        }
    }
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .try_init(),
        LogFormat::Pretty => builder.compact().try_init(),
    };
}
