//! Prometheus metrics, registered once and shared by every part of the service.

use prometheus::proto::{LabelPair, Metric};
use prometheus::{
    CounterVec, Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts,
    Registry, TextEncoder,
};

/// The label that names a repository: series with it are shown to a scrape without the status
/// token only for repositories an anonymous visitor of the forge can see.
pub const REPO_LABEL: &str = "repo";
/// The label naming the repository an aggregate's observation came from (a run's duration,
/// a pre-flight's verdict). Never exposed: a scrape sees each aggregate summed over the
/// repositories it may see, so an anonymous scrape's histograms hold public repositories'
/// observations only and cannot show a private repository's activity.
pub const OF_REPO_LABEL: &str = "of_repo";

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
    /// Provider answer time, by repository (hidden, [`OF_REPO_LABEL`]).
    pub preflight_latency: HistogramVec,
    /// A first run's actual cost and wall time over its forecast's median, as it ends.
    pub forecast_ratio: HistogramVec,
    /// Runs' wall time and metered cost as they end, by outcome (the repository only in the
    /// hidden [`OF_REPO_LABEL`]: one an anonymous visitor cannot see is never named).
    pub run_duration: HistogramVec,
    pub run_cost: HistogramVec,
    /// Pull requests of the director's that ended: `merged`, `closed`, `reverted`.
    pub prs: IntCounterVec,
    /// Actions performed, by kind and outcome (done, retried, gave_up).
    pub actions: IntCounterVec,
    /// Stored events that no longer parse, set aside.
    pub events_set_aside: IntCounter,
    /// Outbox actions not done yet (due, backing off, or being performed).
    pub actions_due: IntGauge,
    /// Memory the bodies of gateway requests being read hold (`runner.gateway_memory_mb`).
    pub gateway_body_memory: IntGauge,
    /// 1 while the database answers, 0 during an outage.
    pub store_up: IntGauge,
    /// Outages of the database seen, each counted once.
    pub store_outages: IntCounter,
    /// 1 while runs can be started (the container engine or the Kubernetes API answers and
    /// allows what runs need), 0 when not; absent when runs are not configured.
    pub runtime_up: IntGauge,
    /// Requests the egress proxy refused, by reason: not_allowed, forbidden_address,
    /// unauthenticated, malformed, busy.
    pub egress_refused: IntCounterVec,
    /// Pushes the git gateway refused, by reason: refused (a rule), too_large, malformed.
    pub git_pushes_refused: IntCounterVec,
    /// Tokens of model calls (runs' and the pre-flight's), by provider and kind: input,
    /// cache_read, cache_write, output.
    pub model_tokens: IntCounterVec,
    /// Dollars spent on model calls, by repository (`other` beyond the watched set).
    pub model_cost: CounterVec,
    /// Model calls the gateway refused, by reason: credential, ended, unmetered, too_large,
    /// unpriced, budget.
    pub model_refused: IntCounterVec,
    pub model_estimated: IntCounterVec,
    /// `/status/outcomes` pages computed (not served from the cache).
    pub outcomes_computed: IntCounter,
    /// Trace spans by outcome: exported, or dropped (the collector failed or the queue was
    /// full).
    pub trace_spans: IntCounterVec,
}

impl Metrics {
    pub fn new() -> Self {
        let r = Registry::new();
        let store_up = gauge(
            &r,
            "director_store_up",
            "1 while the database answers, 0 during an outage",
        );
        store_up.set(1);
        Self {
            deliveries: counter_vec(
                &r,
                "director_webhook_deliveries_total",
                "Webhook deliveries by event type and outcome",
                &["event", "outcome"],
            ),
            request_duration: histogram_vec(
                &r,
                "director_http_request_duration_seconds",
                "HTTP request latency",
                &[
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                ],
                &["route", "method"],
            ),
            forge_requests: counter_vec(
                &r,
                "director_forge_requests_total",
                "Forge API requests by endpoint template and status",
                &["endpoint", "status"],
            ),
            deliveries_pending: gauge(
                &r,
                "director_deliveries_pending",
                "Deliveries stored and not yet processed",
            ),
            preflight_verdicts: counter_vec(
                &r,
                "director_preflight_verdicts_total",
                "Pre-flight outcomes",
                &["outcome", OF_REPO_LABEL],
            ),
            preflight_errors: counter_vec(
                &r,
                "director_preflight_provider_errors_total",
                "Pre-flight provider failures",
                &["kind", OF_REPO_LABEL],
            ),
            preflight_latency: histogram_vec(
                &r,
                "director_preflight_provider_seconds",
                "Pre-flight provider latency",
                &[
                    0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0, 180.0, 300.0,
                ],
                &[OF_REPO_LABEL],
            ),
            forecast_ratio: histogram_vec(
                &r,
                "director_forecast_ratio",
                "A run's actual cost or duration over its forecast's median",
                &[0.25, 0.5, 0.8, 1.0, 1.25, 2.0, 4.0, 8.0],
                &["what", OF_REPO_LABEL],
            ),
            run_duration: histogram_vec(
                &r,
                "director_run_duration_seconds",
                "A run's wall time, from its start to its end, by outcome",
                &[60.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0, 7200.0, 14400.0],
                &["outcome", OF_REPO_LABEL],
            ),
            run_cost: histogram_vec(
                &r,
                "director_run_cost_usd",
                "A run's metered model cost in dollars, by outcome",
                &[0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0],
                &["outcome", OF_REPO_LABEL],
            ),
            prs: counter_vec(
                &r,
                "director_prs_total",
                "The director's pull requests that ended: merged, closed (unmerged), reverted",
                &["end", OF_REPO_LABEL],
            ),
            outcomes_computed: counter(
                &r,
                "director_outcomes_pages_computed_total",
                "Pages of /status/outcomes computed from the store (the others came from the cache)",
            ),
            trace_spans: counter_vec(
                &r,
                "director_trace_spans_total",
                "Trace spans, exported or dropped",
                &["outcome"],
            ),
            actions: counter_vec(
                &r,
                "director_actions_total",
                "Outbox actions performed, by kind and outcome",
                &["kind", "outcome"],
            ),
            events_set_aside: counter(
                &r,
                "director_events_set_aside_total",
                "Stored events that no longer parse, kept aside",
            ),
            actions_due: gauge(
                &r,
                "director_actions_due",
                "Outbox actions not done yet (due, backing off, or being performed)",
            ),
            gateway_body_memory: gauge(
                &r,
                "director_gateway_body_memory_bytes",
                "Memory reserved by the bodies of git and model gateway requests being read",
            ),
            store_up,
            store_outages: counter(
                &r,
                "director_store_outages_total",
                "Database outages seen (each counted once)",
            ),
            runtime_up: gauge(
                &r,
                "director_runtime_up",
                "1 while runs can be started (the container runtime answers and allows them), else 0",
            ),
            egress_refused: counter_vec(
                &r,
                "director_egress_refused_total",
                "Requests of runs the egress proxy refused, by reason",
                &["reason"],
            ),
            git_pushes_refused: counter_vec(
                &r,
                "director_git_pushes_refused_total",
                "Pushes of runs the git gateway refused, by reason",
                &["reason"],
            ),
            model_tokens: counter_vec(
                &r,
                "director_model_tokens_total",
                "Tokens of model calls, by provider and kind",
                &["provider", "kind"],
            ),
            model_cost: register(
                &r,
                CounterVec::new(
                    Opts::new(
                        "director_model_cost_usd_total",
                        "Dollars spent on model calls, by repository",
                    ),
                    &[REPO_LABEL],
                )
                .expect("static metric definition"),
            ),
            model_refused: counter_vec(
                &r,
                "director_model_requests_refused_total",
                "Model calls of runs the model gateway refused, by reason",
                &["reason"],
            ),
            model_estimated: counter_vec(
                &r,
                "director_model_usage_estimated_total",
                "Model calls charged an estimate of what passed, their usage not reported whole (cut, unreadable)",
                &["provider", "reason"],
            ),
            registry: r,
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        self.render_where(|_| true)
    }

    /// The repositories named by a `repo` (or hidden `of_repo`) label of any series.
    pub fn repos(&self) -> std::collections::BTreeSet<String> {
        self.registry
            .gather()
            .iter()
            .flat_map(|f| f.get_metric().iter())
            .flat_map(|m| m.get_label().iter())
            .filter(|l| l.name() == REPO_LABEL || l.name() == OF_REPO_LABEL)
            .map(|l| l.value().to_owned())
            .collect()
    }

    /// The exposition without the series whose `repo` label `keep` refuses (a private
    /// repository's, for a scrape without the status token), and with each aggregate summed
    /// over the repositories `keep` allows, its hidden `of_repo` label dropped.
    pub fn render_where(&self, keep: impl Fn(&str) -> bool) -> String {
        let mut families = self.registry.gather();
        for f in &mut families {
            f.mut_metric().retain(|m| {
                m.get_label().iter().all(|l| {
                    (l.name() != REPO_LABEL && l.name() != OF_REPO_LABEL) || keep(l.value())
                })
            });
            let metrics = f.take_metric();
            f.set_metric(sum_over_repos(metrics));
        }
        families.retain(|f| !f.get_metric().is_empty());
        let mut buf = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&families, &mut buf) {
            return format!("# encoding failed: {e}\n");
        }
        String::from_utf8(buf).unwrap_or_default()
    }
}

/// `metrics` without their `of_repo` label, those then alike summed into one (counters'
/// values; histograms' counts, sums and buckets, which one family's series share).
fn sum_over_repos(metrics: Vec<Metric>) -> Vec<Metric> {
    let mut out: Vec<Metric> = Vec::with_capacity(metrics.len());
    for mut m in metrics {
        let labels = m.take_label();
        if !labels.iter().any(|l| l.name() == OF_REPO_LABEL) {
            m.set_label(labels);
            out.push(m);
            continue;
        }
        let labels: Vec<LabelPair> = labels
            .into_iter()
            .filter(|l| l.name() != OF_REPO_LABEL)
            .collect();
        let same = |o: &&mut Metric| {
            o.get_label().len() == labels.len()
                && o.get_label()
                    .iter()
                    .zip(&labels)
                    .all(|(a, b)| a.name() == b.name() && a.value() == b.value())
        };
        let Some(into) = out.iter_mut().find(|o| same(o)) else {
            m.set_label(labels);
            out.push(m);
            continue;
        };
        let mut counter = prometheus::proto::Counter::default();
        counter.set_value(into.get_counter().get_value() + m.get_counter().get_value());
        into.set_counter(counter);
        let (a, b) = (into.get_histogram(), m.get_histogram());
        let mut histogram = prometheus::proto::Histogram::default();
        histogram.set_sample_count(a.get_sample_count() + b.get_sample_count());
        histogram.set_sample_sum(a.get_sample_sum() + b.get_sample_sum());
        histogram.set_bucket(
            a.get_bucket()
                .iter()
                .zip(b.get_bucket())
                .map(|(x, y)| {
                    let mut bucket = prometheus::proto::Bucket::default();
                    bucket.set_upper_bound(x.upper_bound());
                    bucket.set_cumulative_count(x.cumulative_count() + y.cumulative_count());
                    bucket
                })
                .collect(),
        );
        into.set_histogram(histogram);
    }
    out
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

// Each metric is defined in code, so a failure to build or register one (a bad name, the
// same name twice) is a programming error found by the first test that starts the service.

fn register<C: prometheus::core::Collector + Clone + 'static>(r: &Registry, c: C) -> C {
    r.register(Box::new(c.clone()))
        .expect("metric names are unique");
    c
}

fn counter(r: &Registry, name: &str, help: &str) -> IntCounter {
    register(
        r,
        IntCounter::new(name, help).expect("static metric definition"),
    )
}

fn counter_vec(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    register(
        r,
        IntCounterVec::new(Opts::new(name, help), labels).expect("static metric definition"),
    )
}

fn gauge(r: &Registry, name: &str, help: &str) -> IntGauge {
    register(
        r,
        IntGauge::new(name, help).expect("static metric definition"),
    )
}

fn histogram_vec(
    r: &Registry,
    name: &str,
    help: &str,
    buckets: &[f64],
    labels: &[&str],
) -> HistogramVec {
    let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
    register(
        r,
        HistogramVec::new(opts, labels).expect("static metric definition"),
    )
}
