//! The read-only status page: `GET /status` (HTML) and `GET /status.json` (the rows of
//! `director status --json`). Public repositories' issues are shown to anyone who can reach
//! the page; private ones only to a request bearing `status.token`, and never when no token
//! is configured. Whether a repository is public is asked of the forge (cached for a few
//! minutes); a repository it cannot tell about counts as private.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix_web::{HttpRequest, HttpResponse, web};
use futures_util::StreamExt as _;
use serde_json::json;
use subtle::ConstantTimeEq as _;

use super::AppState;
use crate::domain::{RepoName, RunId};
use crate::forge::Forge;
use crate::status::Row;

/// How long a repository's visibility is trusted before the forge is asked again.
const VISIBILITY_TTL: Duration = Duration::from_secs(300);

/// Which repositories are public, as the forge last said.
#[derive(Default)]
pub struct Visibility {
    known: Mutex<HashMap<RepoName, (bool, Instant)>>,
}

impl Visibility {
    /// The repositories among `repos` known to be public; asks the forge about those not
    /// known (or known too long ago).
    pub(super) async fn public(
        &self,
        forge: Option<&Arc<dyn Forge>>,
        repos: BTreeSet<RepoName>,
    ) -> BTreeSet<RepoName> {
        let now = Instant::now();
        let (mut public, stale): (BTreeSet<RepoName>, Vec<RepoName>) = {
            let known = self.known.lock().unwrap_or_else(|e| e.into_inner());
            let mut public = BTreeSet::new();
            let mut stale = Vec::new();
            for repo in repos {
                match known.get(&repo) {
                    Some((is_public, at)) if now.duration_since(*at) < VISIBILITY_TTL => {
                        if *is_public {
                            public.insert(repo);
                        }
                    }
                    _ => stale.push(repo),
                }
            }
            (public, stale)
        };
        let Some(forge) = forge else {
            return public;
        };
        let answers: Vec<(RepoName, bool)> = futures_util::stream::iter(stale)
            .map(|repo| async move {
                let is_public = match forge.anonymous_can_see(&repo).await {
                    Ok(visible) => visible,
                    Err(e) => {
                        tracing::warn!(%repo, error = %e, "status page: cannot tell whether the repository is public; its issues stay hidden");
                        false
                    }
                };
                (repo, is_public)
            })
            .buffer_unordered(8)
            .collect()
            .await;
        let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        for (repo, is_public) in answers {
            known.insert(repo.clone(), (is_public, now));
            if is_public {
                public.insert(repo);
            }
        }
        public
    }
}

/// Why a request sees no rows.
pub(super) enum Refused {
    Disabled,
    BadToken,
    /// Transcripts are served with the status token only (`server.transcripts_public`).
    TokenNeeded,
    Unavailable,
}

impl Refused {
    pub(super) fn response(&self) -> HttpResponse {
        match self {
            Self::Disabled => HttpResponse::NotFound().finish(),
            Self::BadToken => HttpResponse::Unauthorized()
                .insert_header(("WWW-Authenticate", "Bearer realm=\"director status\""))
                .json(json!({ "error": "the status token is not valid" })),
            Self::TokenNeeded => HttpResponse::Unauthorized()
                .insert_header(("WWW-Authenticate", "Bearer realm=\"director status\""))
                .json(json!({ "error": "run pages and transcripts need the status token (server.transcripts_public is off)" })),
            Self::Unavailable => HttpResponse::ServiceUnavailable()
                .json(json!({ "error": "the database is unreachable" })),
        }
    }
}

/// Who is asking: `Ok(true)` with the status token, `Ok(false)` anonymous, `Err` for a
/// token that is wrong (or given when none is configured).
pub(super) fn authorised(req: &HttpRequest, state: &AppState) -> Result<bool, Refused> {
    let Some(value) = req.headers().get("authorization") else {
        return Ok(false);
    };
    let configured = state.settings.status.token.expose();
    let given = value
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .unwrap_or_default();
    if !configured.is_empty() && bool::from(given.as_bytes().ct_eq(configured.as_bytes())) {
        return Ok(true);
    }
    Err(Refused::BadToken)
}

/// The rows this request may see, and whether any were held back.
async fn visible(req: &HttpRequest, state: &AppState) -> Result<(Vec<Row>, bool), Refused> {
    if !state.settings.status.enabled {
        return Err(Refused::Disabled);
    }
    let full = authorised(req, state)?;
    let web = state.settings.forge.links();
    let queueing = crate::status::Queueing::from_settings(&state.settings);
    let rows = crate::status::collect(&state.store, web.as_ref(), &queueing, state.clock.now_ms())
        .await
        .map_err(|e| {
            tracing::warn!(error = %format!("{e:#}"), "status page: the store cannot be read");
            Refused::Unavailable
        })?;
    if full {
        return Ok((rows, false));
    }
    let repos: BTreeSet<RepoName> = rows.iter().filter_map(|r| r.repo.parse().ok()).collect();
    let public = state.visibility.public(state.forge.as_ref(), repos).await;
    let total = rows.len();
    let shown: Vec<Row> = rows
        .into_iter()
        .filter(|r| {
            r.repo
                .parse::<RepoName>()
                .is_ok_and(|repo| public.contains(&repo))
        })
        .collect();
    let hidden = shown.len() < total;
    Ok((shown, hidden))
}

/// What each repository shown spent on model calls today.
async fn spend(state: &AppState, rows: &[Row]) -> Vec<(String, f64)> {
    let now = state.clock.now_ms();
    let spent = match state.store.spent_by_repo(&crate::models::day_of(now)).await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %format!("{e:#}"), "status page: the spend cannot be read");
            return Vec::new();
        }
    };
    let shown: BTreeSet<&str> = rows.iter().map(|r| r.repo.as_str()).collect();
    spent
        .into_iter()
        .filter(|(repo, _)| shown.contains(repo.as_str()))
        .collect()
}

/// A page of ours: never cached, and under a policy that runs no script at all.
fn html(body: String) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .insert_header(("Cache-Control", "no-store"))
        .insert_header((
            "Content-Security-Policy",
            "default-src 'none'; style-src 'unsafe-inline'",
        ))
        .insert_header(("X-Content-Type-Options", "nosniff"))
        .body(body)
}

pub async fn page(req: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    match visible(&req, &state).await {
        Ok((rows, hidden)) => html(crate::status::html_with_spend(
            &rows,
            state.clock.now_ms(),
            hidden,
            &spend(&state, &rows).await,
        )),
        Err(refused) => refused.response(),
    }
}

pub async fn json(req: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    match visible(&req, &state).await {
        Ok((rows, _)) => HttpResponse::Ok()
            .insert_header(("Cache-Control", "no-store"))
            .json(rows),
        Err(refused) => refused.response(),
    }
}

/// `GET /status/outcomes?days=7|30|90`: what the agents delivered over the window, with
/// charts. Without the status token only public repositories count. Served from
/// [`super::outcomes_cache`]: computed at most once per window and audience per interval.
pub async fn outcomes(req: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    if !state.settings.status.enabled {
        return Refused::Disabled.response();
    }
    let full = match authorised(&req, &state) {
        Ok(full) => full,
        Err(refused) => return refused.response(),
    };
    let days = web::Query::<HashMap<String, String>>::from_query(req.query_string())
        .ok()
        .and_then(|q| q.get("days").and_then(|d| d.parse::<u32>().ok()))
        .filter(|d| crate::status::outcomes::WINDOWS.contains(d))
        .unwrap_or(30);
    let page = state
        .outcomes
        .get((days, full), || outcomes_page(&state, days, full))
        .await;
    match page {
        Ok(page) => html(page.as_str().to_owned()),
        Err(refused) => refused.response(),
    }
}

/// The outcomes page of the last `days`, with every repository (`full`) or the public ones.
async fn outcomes_page(state: &AppState, days: u32, full: bool) -> Result<String, Refused> {
    state.metrics.outcomes_computed.inc();
    let now = state.clock.now_ms();
    let since = now - i64::from(days) * 86_400_000;
    let mut facts = match state.store.outcome_facts(since, now).await {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!(error = %format!("{e:#}"), "outcomes: the store cannot be read");
            return Err(Refused::Unavailable);
        }
    };
    let mut hidden = false;
    if !full {
        let repos = facts.repos();
        let total = repos.len();
        let public = state.visibility.public(state.forge.as_ref(), repos).await;
        hidden = public.len() < total;
        facts.retain(|repo| public.contains(repo));
    }
    let outcomes = crate::domain::outcomes::compute(&facts, days, now);
    let scan = &state.settings.scan;
    let watched = |repo: &str| {
        repo.parse::<RepoName>().is_ok_and(|r| {
            scan.repos.contains(&r) || scan.orgs.iter().any(|o| o.eq_ignore_ascii_case(r.owner()))
        })
    };
    Ok(crate::status::outcomes::page(&outcomes, &watched, hidden))
}

/// The run named by the path, with its transcript, if this request may see it: unknown runs,
/// and runs of repositories an anonymous visitor cannot see (without the status token), are
/// all the same 404. Without `server.transcripts_public` every run needs the token (401).
async fn visible_run(
    req: &HttpRequest,
    state: &AppState,
    run_id: &str,
) -> Result<Option<(crate::domain::RunRecord, Option<crate::store::Transcript>)>, Refused> {
    if !state.settings.status.enabled {
        return Err(Refused::Disabled);
    }
    let full = authorised(req, state)?;
    if !full && !state.settings.server.transcripts_public {
        return Err(Refused::TokenNeeded);
    }
    // Not a run id: the same 404 as a run never made.
    let Ok(run_id) = RunId::parse(run_id) else {
        return Ok(None);
    };
    let unavailable = |e: anyhow::Error| {
        tracing::warn!(error = %format!("{e:#}"), "run page: the store cannot be read");
        Refused::Unavailable
    };
    let Some(run) = state.store.run(&run_id).await.map_err(unavailable)? else {
        return Ok(None);
    };
    if !full {
        let public = state
            .visibility
            .public(state.forge.as_ref(), BTreeSet::from([run.repo.clone()]))
            .await;
        if !public.contains(&run.repo) {
            return Ok(None);
        }
    }
    let transcript = state.store.transcript(&run_id).await.map_err(unavailable)?;
    Ok(Some((run, transcript)))
}

/// `GET /runs/{run_id}`: the run's facts and transcript.
pub async fn run_page(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<AppState>,
) -> HttpResponse {
    match visible_run(&req, &state, &path).await {
        Ok(Some((run, transcript))) => html(crate::status::run_html(
            &run,
            transcript.as_ref(),
            state.settings.forge.links().as_ref(),
            state.clock.now_ms(),
        )),
        Ok(None) => HttpResponse::NotFound().finish(),
        Err(refused) => refused.response(),
    }
}

/// `GET /runs/{run_id}/log`: the transcript as text (the cut, if any, said on its first line).
pub async fn run_log(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<AppState>,
) -> HttpResponse {
    match visible_run(&req, &state, &path).await {
        Ok(Some((_, transcript))) => {
            let t = transcript.unwrap_or_default();
            let mut body = String::with_capacity(t.text.len() + 80);
            if t.dropped_bytes > 0 {
                body.push_str(&format!(
                    "[director: the first {} bytes were dropped at runner.transcript_max_mb]\n",
                    t.dropped_bytes
                ));
            }
            body.push_str(&t.text);
            HttpResponse::Ok()
                .content_type("text/plain; charset=utf-8")
                .insert_header(("Cache-Control", "no-store"))
                .insert_header(("X-Content-Type-Options", "nosniff"))
                .body(body)
        }
        Ok(None) => HttpResponse::NotFound().finish(),
        Err(refused) => refused.response(),
    }
}

/// `GET /runs/{run_id}/checks`: the transcript of the run's checks (`[checks]`) as text, the
/// `target_url` of its `director/checks` status; seen by whoever may see the run.
pub async fn run_checks_log(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<AppState>,
) -> HttpResponse {
    match visible_run(&req, &state, &path).await {
        Ok(Some((run, _))) => {
            let id = crate::engine::act::run::checks_id(&run.id, "transcript");
            let t = match state.store.transcript(&id).await {
                Ok(t) => t.unwrap_or_default(),
                Err(e) => {
                    tracing::warn!(error = %format!("{e:#}"), "checks page: the store cannot be read");
                    return Refused::Unavailable.response();
                }
            };
            let mut body = String::with_capacity(t.text.len() + 80);
            if t.dropped_bytes > 0 {
                body.push_str(&format!(
                    "[director: the first {} bytes were dropped at runner.transcript_max_mb]\n",
                    t.dropped_bytes
                ));
            }
            if t.text.is_empty() {
                body.push_str("[director: no checks have run for this run]\n");
            }
            body.push_str(&t.text);
            HttpResponse::Ok()
                .content_type("text/plain; charset=utf-8")
                .insert_header(("Cache-Control", "no-store"))
                .insert_header(("X-Content-Type-Options", "nosniff"))
                .body(body)
        }
        Ok(None) => HttpResponse::NotFound().finish(),
        Err(refused) => refused.response(),
    }
}
