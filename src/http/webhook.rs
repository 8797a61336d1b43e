//! `POST /webhooks/forgejo` and `POST /webhooks/github`: read the raw body within the size
//! limit, verify its signature, parse it into the director's typed event, store it durably,
//! answer. Nothing else happens here; the consumer decides. The two differ only in their
//! headers and body shapes ([`Flavour`]).

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use futures_util::StreamExt;
use serde_json::json;
use sha2::{Digest, Sha256};

use super::AppState;
use crate::event::ForgeEvent;
use crate::forge::payload::{EventKind, PayloadError, parse_typed};
use crate::forge::signature::{SignatureHeaders, verify};
use crate::intake::Stored;
use crate::settings::ForgeKind;
use crate::store::NewDelivery;

fn header<'a>(req: &'a HttpRequest, name: &str) -> Option<&'a str> {
    req.headers().get(name).and_then(|v| v.to_str().ok())
}

fn first_header<'a>(req: &'a HttpRequest, names: &[&str]) -> Option<&'a str> {
    names.iter().find_map(|n| header(req, n))
}

const ACCEPTED: &str = r#"{"detail":"stored","status":"accepted"}"#;

fn answer(status: StatusCode, outcome: &str, detail: impl Into<String>) -> HttpResponse {
    HttpResponse::build(status).json(json!({ "status": outcome, "detail": detail.into() }))
}

/// Reads the body, refusing it as soon as it grows past `limit` bytes. `expected`: its
/// declared length, allocated at once (growing by doubling could take twice the budget).
async fn read_limited(
    mut payload: web::Payload,
    limit: usize,
    expected: Option<usize>,
) -> Result<web::Bytes, StatusCode> {
    let mut body = web::BytesMut::with_capacity(expected.unwrap_or(0).min(limit));
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|_| StatusCode::BAD_REQUEST)?;
        if body.len() + chunk.len() > limit {
            return Err(StatusCode::PAYLOAD_TOO_LARGE);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
}

/// The memory unverified webhook bodies may take at once (`server.body_memory_mb`), counted
/// in KiB. Anyone can send a body; only a signed one is stored, and the signature can only be
/// checked once the body is in. So the bodies being read share a fixed budget, and each must
/// arrive by its deadline: what an anonymous sender can hold is bounded in bytes and time.
#[derive(Clone)]
pub struct BodyBudget {
    kib: std::sync::Arc<tokio::sync::Semaphore>,
    total_kib: u32,
    timeout: std::time::Duration,
}

impl BodyBudget {
    pub fn new(server: &crate::settings::ServerSettings) -> Self {
        let total_kib =
            u32::try_from(server.body_memory_mb.saturating_mul(1024)).unwrap_or(u32::MAX);
        Self {
            kib: std::sync::Arc::new(tokio::sync::Semaphore::new(total_kib as usize)),
            total_kib,
            timeout: std::time::Duration::from_secs(server.body_timeout_secs),
        }
    }

    /// KiB of the budget in use now.
    pub fn in_use_kib(&self) -> u32 {
        let free = u32::try_from(self.kib.available_permits()).unwrap_or(u32::MAX);
        self.total_kib.saturating_sub(free)
    }
}

/// Whether the request shows `Authorization: Bearer <token>` with `webhook.authorization`, or
/// with the token derived from one of `webhook.secrets` (compared in constant time).
fn authorized(req: &HttpRequest, webhook: &crate::settings::WebhookSettings) -> bool {
    use subtle::ConstantTimeEq as _;
    let Some(given) = header(req, "authorization").and_then(|v| v.strip_prefix("Bearer ")) else {
        return false;
    };
    let given = Sha256::digest(given.trim().as_bytes());
    let derived = webhook
        .secrets
        .iter()
        .map(|s| crate::forge::signature::hook_token(s.expose()));
    let explicit =
        (!webhook.authorization.is_empty()).then(|| webhook.authorization.expose().to_owned());
    let mut found = false;
    for token in explicit.into_iter().chain(derived) {
        found |= bool::from(given.ct_eq(&Sha256::digest(token.as_bytes())));
    }
    found
}

/// Why a body was not read.
enum Unread {
    TooLarge,
    Unreadable,
    TooSlow,
    NoRoom,
}

/// Reads a body of at most `limit` bytes within the budget: room for `declared` bytes (or
/// `limit` when the length is not declared) is reserved first, waiting unread while there is
/// none, then the body must arrive in time. The room is handed out in arrival order, and every
/// body holding some must be done within its own time, so a delivery that waits gets room
/// before its wait ends, however many bodies others send meanwhile.
async fn read_within(
    budget: &BodyBudget,
    payload: web::Payload,
    declared: Option<usize>,
    limit: usize,
) -> Result<web::Bytes, Unread> {
    let kib = u32::try_from(declared.unwrap_or(limit).div_ceil(1024).max(1)).unwrap_or(u32::MAX);
    let _room = tokio::time::timeout(budget.timeout, budget.kib.acquire_many(kib))
        .await
        .map_err(|_| Unread::NoRoom)?
        .map_err(|_| Unread::NoRoom)?;
    // A body longer than it declared is refused as it passes its declared length.
    let limit = declared.map_or(limit, |d| d.min(limit));
    match tokio::time::timeout(budget.timeout, read_limited(payload, limit, declared)).await {
        Err(_) => Err(Unread::TooSlow),
        Ok(Err(StatusCode::PAYLOAD_TOO_LARGE)) => Err(Unread::TooLarge),
        Ok(Err(_)) => Err(Unread::Unreadable),
        Ok(Ok(body)) => Ok(body),
    }
}

/// What differs between the forges' webhooks.
struct Flavour {
    kind: ForgeKind,
    /// Where the event's name is, first found wins.
    event_headers: &'static [&'static str],
    delivery_headers: &'static [&'static str],
    signature: for<'a> fn(&'a HttpRequest) -> SignatureHeaders<'a>,
    /// The metric label of a used event; `None`: not used (answered and dropped).
    used: fn(&str) -> Option<&'static str>,
    parse: fn(&str, &[u8]) -> Result<ForgeEvent, PayloadError>,
}

const FORGEJO: Flavour = Flavour {
    kind: ForgeKind::Forgejo,
    event_headers: &[
        "X-Forgejo-Event-Type",
        "X-Gitea-Event-Type",
        "X-Forgejo-Event",
        "X-Gitea-Event",
    ],
    delivery_headers: &[
        "X-Forgejo-Delivery",
        "X-Gitea-Delivery",
        "X-GitHub-Delivery",
    ],
    signature: |req| SignatureHeaders {
        forgejo: header(req, "X-Forgejo-Signature"),
        gitea: header(req, "X-Gitea-Signature"),
        hub_sha256: header(req, "X-Hub-Signature-256"),
    },
    used: |event| EventKind::from_header(event).map(EventKind::as_str),
    parse: |event, body| match EventKind::from_header(event) {
        Some(kind) => parse_typed(event, kind, body),
        None => Err(PayloadError::Invalid(
            "X-Forgejo-Event-Type",
            event.to_owned(),
        )),
    },
};

const GITHUB: Flavour = Flavour {
    kind: ForgeKind::Github,
    event_headers: &["X-GitHub-Event"],
    delivery_headers: &["X-GitHub-Delivery"],
    signature: |req| SignatureHeaders {
        hub_sha256: header(req, "X-Hub-Signature-256"),
        ..Default::default()
    },
    used: |event| match event {
        "issues" => Some("issues"),
        "issue_comment" => Some("issue_comment"),
        "pull_request" => Some("pull_request"),
        "pull_request_review" => Some("pull_request_review"),
        _ => None,
    },
    parse: crate::forge::github::payload::parse,
};

pub async fn receive(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> HttpResponse {
    receive_as(&FORGEJO, req, payload, state).await
}

pub async fn receive_github(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> HttpResponse {
    receive_as(&GITHUB, req, payload, state).await
}

async fn receive_as(
    flavour: &Flavour,
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> HttpResponse {
    let event_header = first_header(&req, flavour.event_headers)
        .unwrap_or("")
        .to_owned();
    let event_label = (flavour.used)(&event_header).unwrap_or("other");
    let handled = async {
        let body = read_body(&req, payload, &state).await?;
        verify_signature(flavour, &req, &body, &state)?;
        let event = take_event(flavour, &event_header, &body, &state)?;
        Ok(store_delivery(flavour, &req, &body, event, &state).await)
    };
    let (outcome, response) = match handled.await {
        Ok(stored) => stored,
        Err(Turned { outcome, answer }) => (outcome, *answer),
    };
    state
        .metrics
        .deliveries
        .with_label_values(&[event_label, outcome])
        .inc();
    response
}

/// A delivery turned away before it is stored: the metric's outcome, and the answer.
struct Turned {
    outcome: &'static str,
    answer: Box<HttpResponse>,
}

fn turned(outcome: &'static str, answer: HttpResponse) -> Turned {
    Turned {
        outcome,
        answer: Box::new(answer),
    }
}

/// Reads the body within `server.max_body_bytes`, `body_timeout_secs` and the memory budget
/// (the authorized hooks' own, when the delivery shows their token).
async fn read_body(
    req: &HttpRequest,
    payload: web::Payload,
    state: &AppState,
) -> Result<web::Bytes, Turned> {
    let limit = state.settings.server.max_body_bytes;
    let too_large = || {
        turned(
            "too_large",
            answer(
                StatusCode::PAYLOAD_TOO_LARGE,
                "rejected",
                format!("body over {limit} bytes"),
            ),
        )
    };
    let declared = header(req, "content-length").and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|len| len > limit) {
        return Err(too_large());
    }
    // A delivery that shows the hook's authorization token is read in a budget of its own.
    let budget = if authorized(req, &state.settings.webhook) {
        &state.authorized_bodies
    } else {
        &state.bodies
    };
    read_within(budget, payload, declared, limit)
        .await
        .map_err(|unread| match unread {
            Unread::TooLarge => too_large(),
            Unread::Unreadable => turned(
                "bad_request",
                answer(
                    StatusCode::BAD_REQUEST,
                    "rejected",
                    "the body could not be read",
                ),
            ),
            Unread::TooSlow => turned(
                "too_slow",
                answer(
                    StatusCode::REQUEST_TIMEOUT,
                    "rejected",
                    format!(
                        "the body did not arrive within {} s (server.body_timeout_secs)",
                        state.settings.server.body_timeout_secs
                    ),
                ),
            ),
            Unread::NoRoom => {
                let mut busy = answer(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "busy",
                    "too many webhook bodies are being read; send it again",
                );
                busy.headers_mut().insert(
                    actix_web::http::header::RETRY_AFTER,
                    actix_web::http::header::HeaderValue::from_static("5"),
                );
                turned("busy", busy)
            }
        })
}

/// The body's signature, against every configured secret, before anything reads it.
fn verify_signature(
    flavour: &Flavour,
    req: &HttpRequest,
    body: &[u8],
    state: &AppState,
) -> Result<(), Turned> {
    verify(
        (flavour.signature)(req),
        body,
        &state.settings.webhook.secrets,
    )
    .map_err(|e| {
        tracing::warn!(reason = %e, "webhook signature rejected");
        turned(
            "unauthorized",
            answer(StatusCode::UNAUTHORIZED, "rejected", e.to_string()),
        )
    })
}

/// The signed delivery as an event the director acts on, or why it is not one: no or an
/// unused event type, the other forge's, malformed, the bot's own, an unwatched repository.
fn take_event(
    flavour: &Flavour,
    event_header: &str,
    body: &[u8],
    state: &AppState,
) -> Result<crate::event::ForgeEvent, Turned> {
    if event_header.is_empty() {
        return Err(turned(
            "bad_request",
            answer(
                StatusCode::BAD_REQUEST,
                "rejected",
                format!("missing {} header", flavour.event_headers[0]),
            ),
        ));
    }
    if (flavour.used)(event_header).is_none() {
        return Err(turned(
            "ignored",
            answer(
                StatusCode::OK,
                "ignored",
                format!("event type `{event_header}` is not used"),
            ),
        ));
    }
    if state.settings.forge.kind != flavour.kind {
        // Signed, but this director acts on the other forge: the names would mean nothing.
        return Err(turned(
            "wrong_forge",
            answer(
                StatusCode::BAD_REQUEST,
                "rejected",
                format!(
                    "this director serves {} (forge.kind); {} webhooks are not taken",
                    state.settings.forge.kind.display_name(),
                    flavour.kind.display_name()
                ),
            ),
        ));
    }
    let event = (flavour.parse)(event_header, body).map_err(|e| match e {
        PayloadError::NotUsed(why) => turned("ignored", answer(StatusCode::OK, "ignored", why)),
        e => turned(
            "bad_request",
            answer(StatusCode::BAD_REQUEST, "rejected", e.to_string()),
        ),
    })?;
    if state.is_bot(&event.sender) {
        return Err(turned(
            "own_event",
            answer(
                StatusCode::OK,
                "ignored",
                "event caused by the director itself",
            ),
        ));
    }
    if !state.watches(&event.issue.repo) {
        // Signed, so the sender holds a webhook secret, but not for a repository watched here.
        tracing::info!(repo = %event.issue.repo, "delivery for a repository not watched; ignored");
        return Err(turned(
            "unwatched",
            answer(
                StatusCode::OK,
                "ignored",
                "the repository is not watched (scan.repos, scan.orgs)",
            ),
        ));
    }
    Ok(event)
}

/// Stores the delivery (once: by its id and by its body's digest) and says how it went.
async fn store_delivery(
    flavour: &Flavour,
    req: &HttpRequest,
    body: &[u8],
    event: crate::event::ForgeEvent,
    state: &AppState,
) -> (&'static str, HttpResponse) {
    let content_sha256 = hex::encode(Sha256::digest(body));
    let delivery_id = first_header(req, flavour.delivery_headers)
        .map(str::trim)
        .filter(|id| !id.is_empty() && id.len() <= 200)
        .map_or_else(|| format!("sha256:{content_sha256}"), str::to_owned);
    let span = tracing::info_span!(
        "delivery",
        delivery = %delivery_id,
        event = event.kind.as_str(),
        repo = %event.issue.repo,
        issue = event.issue.number,
    );
    let delivery = NewDelivery {
        delivery_id,
        content_sha256,
        issue: event.issue.clone(),
        event: crate::event::Event::Forge(event),
        received_at_ms: crate::clock::now_ms(),
    };
    // The row's values are made here, on the HTTP workers, not by the one writer: a value
    // the database cannot hold is this delivery's error, never its batch's.
    let Ok(ready) = delivery.ready() else {
        return (
            "bad_request",
            answer(
                StatusCode::BAD_REQUEST,
                "rejected",
                "the issue number is out of range",
            ),
        );
    };
    match state.intake.store(ready).await {
        Ok(Stored::New) => {
            span.in_scope(|| tracing::debug!("delivery stored"));
            // The answer to nearly every delivery, made once: what `answer` would render.
            (
                "accepted",
                HttpResponse::Accepted()
                    .content_type("application/json")
                    .body(ACCEPTED),
            )
        }
        Ok(Stored::Duplicate) => {
            span.in_scope(|| tracing::info!("duplicate delivery ignored"));
            (
                "duplicate",
                answer(StatusCode::OK, "duplicate", "already received"),
            )
        }
        Err(e) => {
            // During a database outage (logged once by the store's monitor) each refused
            // delivery is a debug line, not another error.
            if state.store.is_up() {
                span.in_scope(|| tracing::error!(error = %e, "delivery not stored"));
            } else {
                span.in_scope(|| tracing::debug!(error = %e, "delivery not stored: the database is unreachable"));
            }
            (
                "error",
                answer(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "error",
                    "could not store the delivery; retry",
                ),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_accepted_answer_made_once_is_the_one_answer_renders() {
        let rendered = serde_json::to_string(&json!({ "status": "accepted", "detail": "stored" }))
            .expect("renders");
        assert_eq!(ACCEPTED, rendered);
    }
}
