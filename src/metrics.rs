//! Prometheus metrics, registered once and shared by every part of the service.

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, Opts, Registry, TextEncoder,
};

#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    /// Webhook deliveries by event type and outcome (accepted, duplicate, ignored, rejected...).
    pub deliveries: IntCounterVec,
    /// HTTP request latency by route.
    pub request_duration: HistogramVec,
    /// Forge API calls by endpoint template and status.
    pub forge_requests: IntCounterVec,
    /// Deliveries stored but not yet processed.
    pub deliveries_pending: IntGauge,
    /// Pre-flight outcomes: go, no_go, wrong_repo, skipped, error, capped.
    pub preflight_verdicts: IntCounterVec,
    /// Provider failures by kind: timeout, status, unclear, other.
    pub preflight_errors: IntCounterVec,
    /// Provider answer time.
    pub preflight_latency: prometheus::Histogram,
    /// Actions performed, by kind and outcome (done, retried, gave_up).
    pub actions: IntCounterVec,
    /// Stored events that no longer parse, set aside.
    pub events_set_aside: prometheus::IntCounter,
    /// Outbox actions not done yet (due, backing off, or being performed).
    pub actions_due: IntGauge,
    /// 1 while the database answers, 0 during an outage.
    pub store_up: IntGauge,
    /// Outages of the database seen, each counted once.
    pub store_outages: prometheus::IntCounter,
    /// 1 while runs can be started (the container engine or the Kubernetes API answers and
    /// allows what runs need), 0 when not; absent when runs are not configured.
    pub runtime_up: IntGauge,
    /// Requests the egress proxy refused, by reason: not_allowed, forbidden_address,
    /// unauthenticated, malformed, busy.
    pub egress_refused: IntCounterVec,
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let deliveries = IntCounterVec::new(
            Opts::new(
                "director_webhook_deliveries_total",
                "Webhook deliveries by event type and outcome",
            ),
            &["event", "outcome"],
        )
        .expect("static metric definition");
        let request_duration = HistogramVec::new(
            HistogramOpts::new(
                "director_http_request_duration_seconds",
                "HTTP request latency",
            )
            .buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
            ]),
            &["route", "method"],
        )
        .expect("static metric definition");
        let forge_requests = IntCounterVec::new(
            Opts::new(
                "director_forge_requests_total",
                "Forge API requests by endpoint template and status",
            ),
            &["endpoint", "status"],
        )
        .expect("static metric definition");
        let deliveries_pending = IntGauge::new(
            "director_deliveries_pending",
            "Deliveries stored and not yet processed",
        )
        .expect("static metric definition");
        let preflight_verdicts = IntCounterVec::new(
            Opts::new("director_preflight_verdicts_total", "Pre-flight outcomes"),
            &["outcome"],
        )
        .expect("static metric definition");
        let preflight_errors = IntCounterVec::new(
            Opts::new(
                "director_preflight_provider_errors_total",
                "Pre-flight provider failures",
            ),
            &["kind"],
        )
        .expect("static metric definition");
        let preflight_latency = prometheus::Histogram::with_opts(
            HistogramOpts::new(
                "director_preflight_provider_seconds",
                "Pre-flight provider latency",
            )
            .buckets(vec![
                0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0, 180.0, 300.0,
            ]),
        )
        .expect("static metric definition");
        let actions = IntCounterVec::new(
            Opts::new(
                "director_actions_total",
                "Outbox actions performed, by kind and outcome",
            ),
            &["kind", "outcome"],
        )
        .expect("static metric definition");
        let events_set_aside = prometheus::IntCounter::new(
            "director_events_set_aside_total",
            "Stored events that no longer parse, kept aside",
        )
        .expect("static metric definition");
        let actions_due = IntGauge::new(
            "director_actions_due",
            "Outbox actions not done yet (due, backing off, or being performed)",
        )
        .expect("static metric definition");
        let store_up = IntGauge::new(
            "director_store_up",
            "1 while the database answers, 0 during an outage",
        )
        .expect("static metric definition");
        store_up.set(1);
        let store_outages = prometheus::IntCounter::new(
            "director_store_outages_total",
            "Database outages seen (each counted once)",
        )
        .expect("static metric definition");
        let runtime_up = IntGauge::new(
            "director_runtime_up",
            "1 while runs can be started (the container runtime answers and allows them), else 0",
        )
        .expect("static metric definition");
        let egress_refused = IntCounterVec::new(
            Opts::new(
                "director_egress_refused_total",
                "Requests of runs the egress proxy refused, by reason",
            ),
            &["reason"],
        )
        .expect("static metric definition");
        for c in [
            Box::new(deliveries.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(egress_refused.clone()),
            Box::new(runtime_up.clone()),
            Box::new(store_up.clone()),
            Box::new(store_outages.clone()),
            Box::new(request_duration.clone()),
            Box::new(forge_requests.clone()),
            Box::new(deliveries_pending.clone()),
            Box::new(preflight_verdicts.clone()),
            Box::new(preflight_errors.clone()),
            Box::new(preflight_latency.clone()),
            Box::new(actions.clone()),
            Box::new(events_set_aside.clone()),
            Box::new(actions_due.clone()),
        ] {
            registry.register(c).expect("metric names are unique");
        }
        Self {
            registry,
            deliveries,
            request_duration,
            forge_requests,
            deliveries_pending,
            preflight_verdicts,
            preflight_errors,
            preflight_latency,
            actions,
            events_set_aside,
            actions_due,
            store_up,
            store_outages,
            runtime_up,
            egress_refused,
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let encoder = TextEncoder::new();
        if let Err(e) = encoder.encode(&self.registry.gather(), &mut buf) {
            return format!("# encoding failed: {e}\n");
        }
        String::from_utf8(buf).unwrap_or_default()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
