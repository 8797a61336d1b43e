//! The HTTP surface: the webhook receiver, health and readiness probes, and metrics.

pub mod outcomes_cache;
pub mod status_page;
pub mod webhook;

use std::sync::Arc;
use std::time::Instant;

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::{HttpRequest, HttpResponse, web};
use serde_json::json;

use crate::intake::Intake;
use crate::metrics::Metrics;
use crate::settings::Settings;
use crate::store::Store;

/// What every handler can reach.
pub struct AppState {
    pub settings: Arc<Settings>,
    pub metrics: Metrics,
    pub intake: Intake,
    pub store: Store,
    /// The bot account's login, once known; its own events are ignored.
    pub bot_login: crate::forge::BotLogin,
    /// The container runtime: `ok`, `disabled` or `unavailable: ...`.
    pub runtime_state: crate::runtime::Health,
    /// For the status page: which repositories are public.
    pub forge: Option<Arc<dyn crate::forge::Forge>>,
    pub visibility: status_page::Visibility,
    /// `/status/outcomes`' pages, computed once per interval (`outcomes_cache`).
    pub outcomes: outcomes_cache::OutcomesCache,
    pub clock: crate::clock::SharedClock,
    /// The director's address on the runs' network (Docker, confined runs), where runs reach
    /// the egress proxy and nothing else of the director.
    pub runs_network: Option<std::net::IpAddr>,
    /// The memory webhook bodies may take while they are read, before they are verified:
    /// anyone's, and (apart) those that showed `webhook.authorization`.
    pub bodies: webhook::BodyBudget,
    pub authorized_bodies: webhook::BodyBudget,
}

impl AppState {
    /// The configuration watches `repo` (`scan.repos`, or its owner in `scan.orgs`): only
    /// those are acted on.
    pub fn watches(&self, repo: &crate::domain::RepoName) -> bool {
        let scan = &self.settings.scan;
        crate::domain::is_watched(&scan.repos, &scan.orgs, repo)
    }

    pub fn is_bot(&self, login: &str) -> bool {
        self.bot_login.is(login)
    }
}

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/webhooks/forgejo", web::post().to(webhook::receive))
        .route("/webhooks/github", web::post().to(webhook::receive_github))
        .route("/healthz", web::get().to(healthz))
        .route("/readyz", web::get().to(readyz))
        .route("/metrics", web::get().to(metrics))
        .route("/status", web::get().to(status_page::page))
        .route("/status.json", web::get().to(status_page::json))
        .route("/status/outcomes", web::get().to(status_page::outcomes))
        .route("/runs/{run_id}", web::get().to(status_page::run_page))
        .route("/runs/{run_id}/log", web::get().to(status_page::run_log))
        .route(
            "/runs/{run_id}/checks",
            web::get().to(status_page::run_checks_log),
        );
}

/// Records each request's latency under its route template (never the raw path).
/// The local address a connection came in on.
#[derive(Clone, Copy, Debug)]
pub struct LocalAddr(pub std::net::SocketAddr);

/// Refuses every request that came in on the director's address on the runs' network: a run
/// reaches the egress proxy there, never the director's own routes (a listener on every
/// address would otherwise answer it, bypassing the proxy and its allow-list).
pub async fn not_from_runs(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<actix_web::body::EitherBody<impl MessageBody>>, actix_web::Error> {
    let runs_network = req
        .app_data::<web::Data<AppState>>()
        .and_then(|s| s.runs_network);
    let local = req.conn_data::<LocalAddr>().map(|l| l.0.ip());
    if let (Some(runs), Some(local)) = (runs_network, local)
        && runs == local
    {
        let refused = HttpResponse::Forbidden()
            .json(json!({ "status": "rejected", "detail": "not served on the runs' network" }));
        return Ok(req.into_response(refused).map_into_right_body());
    }
    next.call(req)
        .await
        .map(ServiceResponse::map_into_left_body)
}

pub async fn observe_latency(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let started = Instant::now();
    let method = req.method().as_str().to_owned();
    let state = req.app_data::<web::Data<AppState>>().cloned();
    let res = next.call(req).await?;
    if let Some(state) = state {
        let route = res
            .request()
            .match_pattern()
            .unwrap_or_else(|| "unmatched".to_owned());
        state
            .metrics
            .request_duration
            .with_label_values(&[route.as_str(), method.as_str()])
            .observe(started.elapsed().as_secs_f64());
    }
    Ok(res)
}

async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({ "status": "ok" }))
}

/// Fails only when the database is unreachable: intake and pre-flights go on without the
/// container runtime, whose state is reported in the body.
async fn readyz(state: web::Data<AppState>) -> HttpResponse {
    let runtime = state.runtime_state.get();
    match state.store.ping().await {
        Ok(()) => {
            // What is waiting to be done, for a person looking: never a reason to fail.
            let events = state.store.pending_deliveries().await.unwrap_or(-1);
            let actions = state.store.due_actions().await.unwrap_or(-1);
            HttpResponse::Ok().json(json!({
                "status": "ready", "database": "ok", "runtime": runtime,
                "events_pending": events, "actions_due": actions,
            }))
        }
        Err(e) => {
            tracing::warn!(error = %e, "readiness: database unreachable");
            HttpResponse::ServiceUnavailable().json(
                json!({ "status": "not ready", "database": "unreachable", "runtime": runtime }),
            )
        }
    }
}

/// Prometheus' scrape. Series that name a repository are shown only for repositories an
/// anonymous visitor of the forge can see, unless the scrape bears the status token (as the
/// status page): `/metrics` is unauthenticated, and a name alone can be a secret.
async fn metrics(req: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    let full = match status_page::authorised(&req, &state) {
        Ok(full) => full,
        Err(refused) => return refused.response(),
    };
    if let Ok(pending) = state.store.pending_deliveries().await {
        state.metrics.deliveries_pending.set(pending);
    }
    if let Ok(due) = state.store.due_actions().await {
        state.metrics.actions_due.set(due);
    }
    let body = if full {
        state.metrics.render()
    } else {
        let repos = state
            .metrics
            .repos()
            .iter()
            .filter_map(|r| r.parse().ok())
            .collect();
        let public = state.visibility.public(state.forge.as_ref(), repos).await;
        state.metrics.render_where(|repo| {
            public
                .iter()
                .any(|p| p.to_string().eq_ignore_ascii_case(repo))
        })
    };
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4")
        .body(body)
}
