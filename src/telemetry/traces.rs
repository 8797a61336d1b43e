//! Traces over OTLP/HTTP: one trace per issue, with a span for every decision, every action
//! and every run (`[telemetry] otlp_endpoint`).
//!
//! The director's work on one issue crosses processes (replicas, restarts), so no span is held
//! open in memory while it waits: each is made whole once what it covers has ended, from the
//! times the engine already keeps, and handed to the SDK's batch processor, which sends it
//! from a thread of its own. The trace's id and its root span's id are derived from the issue
//! (and the forge), so every replica, before and after a restart, adds to the same trace.
//!
//! Sending never waits: a span that finds the queue full, or whose batch the collector
//! refused or never answered, is dropped and counted (`director_trace_spans_total`).
//! Transcripts are never sent.

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{Array, InstrumentationScope, KeyValue, StringValue, Value};
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, SpanData, SpanEvents, SpanExporter, SpanLinks,
    SpanProcessor as _,
};
use prometheus::IntCounter;
use sha2::{Digest, Sha256};

use crate::domain::{IssueRef, RunRecord};
use crate::metrics::Metrics;
use crate::settings::TelemetrySettings;

/// How long one export may take before its spans count as dropped.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long stopping the service waits for the last spans to go out.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(2);
/// An action's error, cut to this many characters in its span.
const MAX_ERROR_CHARS: usize = 500;

/// Where spans go; `Traces::default()` sends nothing, and every call on it is free.
#[derive(Clone, Default)]
pub struct Traces {
    inner: Option<Arc<Inner>>,
    /// Spans held until [`Traces::release`] (what was decided is committed) or
    /// [`Traces::discard`] (it was not): see [`Traces::holding`].
    held: Option<Arc<std::sync::Mutex<Vec<Span>>>>,
}

struct Inner {
    processor: BatchSpanProcessor,
    /// Spans handed to the processor and not yet exported or dropped.
    queued: Arc<AtomicUsize>,
    limit: usize,
    dropped: IntCounter,
    /// Tells one forge's issues from another's with the same names, in a shared backend.
    salt: String,
    scope: InstrumentationScope,
}

/// One span, before it is sent.
struct Span {
    issue: IssueRef,
    /// The issue's root span, rather than one of its children.
    root: bool,
    name: String,
    start_ms: i64,
    end_ms: i64,
    attributes: Vec<KeyValue>,
    error: Option<String>,
}

impl Traces {
    /// Traces to `settings.otlp_endpoint`, or none when it is empty. `forge` (its URL) keeps
    /// traces of two forges' issues apart; `instance` names this replica.
    pub fn start(
        settings: &TelemetrySettings,
        forge: &str,
        instance: &str,
        metrics: &Metrics,
    ) -> anyhow::Result<Self> {
        let Some(url) = settings.traces_url() else {
            return Ok(Self::default());
        };
        let resource = Resource::builder()
            .with_service_name("director")
            .with_attribute(KeyValue::new("service.instance.id", instance.to_owned()))
            .with_attribute(KeyValue::new(
                "service.version",
                env!("CARGO_PKG_VERSION").to_owned(),
            ))
            .build();
        // The exporter's client is built here; TLS needs the process's provider.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(url.clone())
            .with_timeout(EXPORT_TIMEOUT)
            .with_headers(Default::default())
            .build()
            .context("building the OTLP span exporter")?;
        exporter.set_resource(&resource);
        let queued = Arc::new(AtomicUsize::new(0));
        let dropped = metrics.trace_spans.with_label_values(&["dropped"]);
        let counted = Counted {
            inner: exporter,
            queued: queued.clone(),
            exported: metrics.trace_spans.with_label_values(&["exported"]),
            dropped: dropped.clone(),
            failing: AtomicBool::new(false),
        };
        let limit = settings.max_queued_spans.max(1);
        let config = BatchConfigBuilder::default()
            // Twice ours: the processor never drops a span uncounted, `on_end` does first.
            .with_max_queue_size(limit.saturating_mul(2))
            .with_max_export_batch_size(limit.clamp(1, 512))
            .with_scheduled_delay(Duration::from_millis(settings.export_interval_ms))
            .build();
        let processor = BatchSpanProcessor::builder(counted)
            .with_batch_config(config)
            .build();
        tracing::info!(endpoint = %url, "sending traces over OTLP/HTTP");
        Ok(Self {
            held: None,
            inner: Some(Arc::new(Inner {
                processor,
                queued,
                limit,
                dropped,
                salt: forge.to_owned(),
                scope: InstrumentationScope::builder("director")
                    .with_version(env!("CARGO_PKG_VERSION"))
                    .build(),
            })),
        })
    }

    pub fn is_on(&self) -> bool {
        self.inner.is_some()
    }

    /// Traces to the same place whose spans wait for [`Traces::release`]: for decisions,
    /// which count once their commit has landed (a failed commit is decided again).
    pub fn holding(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            held: self.inner.as_ref().map(|_| Arc::default()),
        }
    }

    /// Sends what is held.
    pub fn release(&self) {
        for span in self.take_held() {
            self.send(span);
        }
    }

    /// Forgets what is held.
    pub fn discard(&self) {
        self.take_held();
    }

    fn take_held(&self) -> Vec<Span> {
        self.held
            .as_ref()
            .map(|held| std::mem::take(&mut *held.lock().unwrap_or_else(|e| e.into_inner())))
            .unwrap_or_default()
    }

    /// The issue's root span, sent once, when the director first records the issue: every
    /// other span of the issue is its child.
    pub fn issue(&self, issue: &IssueRef, at_ms: i64) {
        if self.inner.is_none() {
            return;
        }
        self.emit(Span {
            issue: issue.clone(),
            root: true,
            name: format!("issue {issue}"),
            start_ms: at_ms,
            end_ms: at_ms,
            attributes: issue_attributes(issue),
            error: None,
        });
    }

    /// A decision: `event` (its kind) moved the issue to `state` and called for `actions`.
    pub fn decision(
        &self,
        issue: &IssueRef,
        event: &str,
        state: &str,
        actions: &[&str],
        run_id: Option<&str>,
        at_ms: i64,
    ) {
        if self.inner.is_none() {
            return;
        }
        let mut attributes = issue_attributes(issue);
        attributes.push(KeyValue::new("director.event", event.to_owned()));
        attributes.push(KeyValue::new("director.state", state.to_owned()));
        attributes.push(KeyValue::new("director.outcome", state.to_owned()));
        let actions: Vec<StringValue> = actions.iter().map(|a| (*a).to_owned().into()).collect();
        attributes.push(KeyValue::new(
            "director.actions",
            Value::Array(Array::String(actions)),
        ));
        push_run(&mut attributes, run_id);
        self.emit(Span {
            issue: issue.clone(),
            root: false,
            name: format!("decide {event}"),
            start_ms: at_ms,
            end_ms: at_ms,
            attributes,
            error: None,
        });
    }

    /// One attempt at an action: `outcome` is `done`, `retried` or `gave_up`; `reported`,
    /// the kind of event it reported, if any.
    #[allow(clippy::too_many_arguments)]
    pub fn action(
        &self,
        issue: &IssueRef,
        kind: &str,
        run_id: Option<&str>,
        outcome: &str,
        reported: Option<&str>,
        error: Option<&str>,
        (start_ms, end_ms): (i64, i64),
    ) {
        if self.inner.is_none() {
            return;
        }
        let mut attributes = issue_attributes(issue);
        attributes.push(KeyValue::new("director.action.kind", kind.to_owned()));
        attributes.push(KeyValue::new("director.outcome", outcome.to_owned()));
        if let Some(reported) = reported {
            attributes.push(KeyValue::new("director.event", reported.to_owned()));
        }
        push_run(&mut attributes, run_id);
        self.emit(Span {
            issue: issue.clone(),
            root: false,
            name: format!("act {kind}"),
            start_ms,
            end_ms,
            attributes,
            error: error.map(|e| e.chars().take(MAX_ERROR_CHARS).collect()),
        });
    }

    /// A run, once it has ended: from its start to `ended_ms`, with how it ended.
    pub fn run(&self, run: &RunRecord, ended_ms: i64) {
        if self.inner.is_none() {
            return;
        }
        let issue = run.issue_ref();
        let mut attributes = issue_attributes(&issue);
        push_run(&mut attributes, Some(run.id.as_str()));
        attributes.push(KeyValue::new("director.outcome", run.state.as_str()));
        attributes.push(KeyValue::new("director.run.branch", run.branch.clone()));
        if let Some(pr) = run.pr_number {
            attributes.push(KeyValue::new(
                "director.pull",
                i64::try_from(pr).unwrap_or(0),
            ));
        }
        if let Some(code) = run.exit_code {
            attributes.push(KeyValue::new("director.run.exit_code", code));
        }
        if let Some(followup) = &run.followup {
            attributes.push(KeyValue::new(
                "director.run.followup",
                followup.feedback.key.clone(),
            ));
        }
        let failed = !matches!(run.state, crate::domain::RunState::Succeeded);
        self.emit(Span {
            issue,
            root: false,
            name: "run".to_owned(),
            start_ms: run.started_at_ms.unwrap_or(run.created_at_ms),
            end_ms: run
                .finished_at_ms
                .unwrap_or(ended_ms)
                .max(run.created_at_ms),
            attributes,
            error: failed.then(|| format!("the run ended {}", run.state)),
        });
    }

    /// Sends what is queued, waiting at most two seconds: for the service's stop.
    pub fn shutdown(&self) {
        if let Some(inner) = &self.inner
            && let Err(error) = inner.processor.shutdown_with_timeout(SHUTDOWN_WAIT)
        {
            tracing::debug!(%error, "the last spans were not all sent");
        }
    }

    fn emit(&self, span: Span) {
        match &self.held {
            Some(held) => held.lock().unwrap_or_else(|e| e.into_inner()).push(span),
            None => self.send(span),
        }
    }

    fn send(&self, span: Span) {
        let Some(inner) = &self.inner else { return };
        let (trace_id, root) = ids(&inner.salt, &span.issue);
        if span.root {
            inner.send(span, trace_id, root, SpanId::INVALID);
        } else {
            inner.send(span, trace_id, random_span_id(), root);
        }
    }
}

impl Inner {
    fn send(&self, span: Span, trace_id: TraceId, span_id: SpanId, parent: SpanId) {
        // Counted here, never by the processor: the processor's queue is twice this bound.
        if self.queued.fetch_add(1, Ordering::AcqRel) >= self.limit {
            release(&self.queued, 1);
            self.dropped.inc();
            return;
        }
        let status = match span.error {
            Some(message) => Status::error(message),
            None => Status::Unset,
        };
        self.processor.on_end(SpanData {
            span_context: SpanContext::new(
                trace_id,
                span_id,
                TraceFlags::SAMPLED,
                false,
                TraceState::default(),
            ),
            parent_span_id: parent,
            parent_span_is_remote: false,
            span_kind: SpanKind::Internal,
            name: Cow::Owned(span.name),
            start_time: time_of(span.start_ms),
            end_time: time_of(span.end_ms.max(span.start_ms)),
            attributes: span.attributes,
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status,
            instrumentation_scope: self.scope.clone(),
        });
    }
}

/// The exporter, counting what it sent and what it lost.
#[derive(Debug)]
struct Counted<E> {
    inner: E,
    queued: Arc<AtomicUsize>,
    exported: IntCounter,
    dropped: IntCounter,
    /// The last export failed: the next failure is logged at debug, not again as a warning.
    failing: AtomicBool,
}

impl<E: SpanExporter> SpanExporter for Counted<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let n = batch.len();
        let result = self.inner.export(batch).await;
        release(&self.queued, n);
        let count = u64::try_from(n).unwrap_or(u64::MAX);
        match &result {
            Ok(()) => {
                self.exported.inc_by(count);
                if self.failing.swap(false, Ordering::Relaxed) {
                    tracing::info!("the trace collector takes spans again");
                }
            }
            Err(error) => {
                self.dropped.inc_by(count);
                if self.failing.swap(true, Ordering::Relaxed) {
                    tracing::debug!(%error, spans = n, "spans dropped: the collector failed");
                } else {
                    tracing::warn!(%error, spans = n, "spans dropped: the collector failed");
                }
            }
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

fn release(queued: &AtomicUsize, n: usize) {
    let _ = queued.fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
        Some(q.saturating_sub(n))
    });
}

/// The issue's trace id and its root span's id: the same on every replica and after every
/// restart.
fn ids(salt: &str, issue: &IssueRef) -> (TraceId, SpanId) {
    let mut hash = Sha256::new();
    hash.update(b"director trace\0");
    hash.update(salt.as_bytes());
    hash.update(b"\0");
    hash.update(issue.repo.to_string().as_bytes());
    hash.update(b"#");
    hash.update(issue.number.to_be_bytes());
    let digest = hash.finalize();
    let mut trace = [0u8; 16];
    trace.copy_from_slice(&digest[..16]);
    let mut span = [0u8; 8];
    span.copy_from_slice(&digest[16..24]);
    // All zeroes is the invalid id; one bit keeps it valid.
    trace[15] |= u8::from(trace == [0; 16]);
    span[7] |= u8::from(span == [0; 8]);
    (TraceId::from_bytes(trace), SpanId::from_bytes(span))
}

fn random_span_id() -> SpanId {
    SpanId::from_bytes(rand::random::<u64>().max(1).to_be_bytes())
}

fn time_of(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

fn issue_attributes(issue: &IssueRef) -> Vec<KeyValue> {
    vec![
        KeyValue::new("director.repo", issue.repo.to_string()),
        KeyValue::new(
            "director.issue",
            i64::try_from(issue.number).unwrap_or(i64::MAX),
        ),
    ]
}

fn push_run(attributes: &mut Vec<KeyValue>, run_id: Option<&str>) {
    if let Some(run_id) = run_id {
        attributes.push(KeyValue::new("director.run_id", run_id.to_owned()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn issue(repo: &str, number: u64) -> IssueRef {
        IssueRef {
            repo: repo.parse().expect("a repository name"),
            number,
        }
    }

    #[test]
    fn an_issue_has_one_trace_whatever_replica_asks_and_two_issues_have_two() {
        let a = ids("https://forge.example", &issue("team/app", 7));
        assert_eq!(a, ids("https://forge.example", &issue("team/app", 7)));
        assert_ne!(a.0, ids("https://forge.example", &issue("team/app", 8)).0);
        assert_ne!(a.0, ids("https://other.example", &issue("team/app", 7)).0);
        assert_ne!(a.0, TraceId::INVALID);
        assert_ne!(a.1, SpanId::INVALID);
    }

    /// Traces to a collector that takes the connection and never answers (the first export
    /// hangs), at most `queue` spans waiting; the listener lives as long as the traces.
    fn silent(queue: usize) -> (Traces, Metrics, std::net::TcpListener) {
        let metrics = Metrics::new();
        let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let settings = TelemetrySettings {
            otlp_endpoint: format!("http://{}", silent.local_addr().expect("addr")),
            export_interval_ms: 60_000,
            max_queued_spans: queue,
        };
        let traces = Traces::start(&settings, "f", "test", &metrics).expect("traces");
        (traces, metrics, silent)
    }

    #[test]
    fn held_spans_are_sent_on_release_and_forgotten_on_discard() {
        let (traces, _metrics, _collector) = silent(100);
        let held = traces.holding();
        let queued = || {
            traces
                .inner
                .as_ref()
                .expect("on")
                .queued
                .load(Ordering::Acquire)
        };
        held.issue(&issue("team/app", 1), 0);
        held.decision(
            &issue("team/app", 1),
            "issue_labeled",
            "pending",
            &[],
            None,
            0,
        );
        assert_eq!(queued(), 0, "held, not sent");
        held.discard();
        held.release();
        assert_eq!(queued(), 0, "discarded");
        held.decision(
            &issue("team/app", 1),
            "issue_labeled",
            "pending",
            &[],
            None,
            0,
        );
        held.release();
        assert_eq!(queued(), 1, "released");
        traces.shutdown();
    }

    #[test]
    fn a_full_queue_drops_and_counts_instead_of_waiting() {
        let (traces, metrics, _collector) = silent(3);
        for n in 0..10 {
            traces.decision(
                &issue("team/app", n),
                "issue_labeled",
                "pending",
                &[],
                None,
                0,
            );
        }
        let dropped = metrics.trace_spans.with_label_values(&["dropped"]).get();
        assert_eq!(dropped, 7, "three wait in the queue, seven found it full");
        traces.shutdown();
    }
}
