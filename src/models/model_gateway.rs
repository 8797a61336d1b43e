//! The model gateway's HTTP face: who may call (a run's own key, while it is active), what
//! is forwarded (the metered routes, with the real key), and the answer metered as it
//! passes on its way back, recorded when it ends, is cut, or the client leaves.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use actix_web::http::StatusCode;
use actix_web::web::Bytes;
use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use base64::Engine as _;
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;
use tokio_util::sync::CancellationToken;

use super::ledger::Ledger;
use super::meter::{Meter, Record};
use super::usage::{Api, StreamMeter, Usage};
use super::{ActiveRun, Config, Counters, Provider, Runs, Spent, day_of, over_budget};
use crate::domain::{RepoName, RunId};

pub struct ModelGateway {
    key: Vec<u8>,
    runs: Arc<dyn Runs>,
    config: Config,
    client: reqwest::Client,
    counters: Option<Counters>,
    ledger: Arc<Ledger>,
}

impl ModelGateway {
    pub fn new(
        key: Vec<u8>,
        runs: Arc<dyn Runs>,
        config: Config,
        counters: Option<Counters>,
    ) -> Result<Arc<Self>, String> {
        let client = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(10))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("the model gateway's HTTP client: {e}"))?;
        Ok(Arc::new(Self {
            key,
            runs,
            config,
            client,
            counters,
            ledger: Arc::default(),
        }))
    }

    /// The providers runs get variables for.
    pub fn providers(&self) -> impl Iterator<Item = Provider> + '_ {
        self.config.upstreams.keys().copied()
    }

    /// The run's key: `director-<run id>.<MAC>`, taken by this gateway alone.
    pub fn key_of(&self, run_id: &RunId) -> String {
        let mac = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(self.mac(run_id).finalize().into_bytes());
        format!("director-{run_id}.{mac}")
    }

    /// The run a presented key names, if it is that run's key.
    fn run_of(&self, key: &str) -> Option<RunId> {
        let (run_id, mac) = key.strip_prefix("director-")?.rsplit_once('.')?;
        let run_id = RunId::parse(run_id).ok()?;
        let given = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(mac)
            .ok()?;
        self.mac(&run_id)
            .verify_slice(&given)
            .is_ok()
            .then_some(run_id)
    }

    fn mac(&self, run_id: &RunId) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256> as hmac::digest::KeyInit>::new_from_slice(&self.key)
            .expect("HMAC takes a key of any length");
        mac.update(b"model-gateway\0");
        mac.update(run_id.as_str().as_bytes());
        mac
    }

    fn refuse(&self, reason: &str) {
        if let Some(c) = &self.counters {
            c.refused.with_label_values(&[reason]).inc();
        }
    }

    /// Serves on `listener` until `shutdown`.
    pub fn serve(
        self: &Arc<Self>,
        listener: std::net::TcpListener,
        shutdown: CancellationToken,
    ) -> std::io::Result<SocketAddr> {
        let addr = listener.local_addr()?;
        let data = web::Data::from(self.clone());
        let server = HttpServer::new(move || {
            App::new()
                .app_data(data.clone())
                .app_data(web::PayloadConfig::new(usize::MAX))
                .default_service(web::to(handle))
        })
        // A stream's events are small writes: sent at once, not held for an ACK (Nagle's
        // algorithm against a delayed ACK costs 40 ms per event).
        .on_connect(|conn, _| {
            if let Some(tcp) = conn.downcast_ref::<actix_web::rt::net::TcpStream>() {
                let _ = tcp.set_nodelay(true);
            }
        })
        .workers(2)
        .disable_signals()
        .shutdown_timeout(5)
        .listen(listener)?
        .run();
        let handle = server.handle();
        tokio::spawn(server);
        tokio::spawn(async move {
            shutdown.cancelled().await;
            handle.stop(true).await;
        });
        Ok(addr)
    }
}

/// The per-run key a request carries: `x-api-key` (Anthropic's SDKs) or a Bearer token.
fn presented(req: &HttpRequest) -> Option<&str> {
    if let Some(v) = req.headers().get("x-api-key") {
        return v.to_str().ok();
    }
    req.headers()
        .get("authorization")?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
}

/// Request headers passed on to the provider: everything but what names the caller (and,
/// on OpenAI, which of the key's organisations and projects pays: the operator's key
/// decides that, not the run), the connection and the body's encoding on this hop.
fn forwarded_header(name: &str) -> bool {
    !matches!(
        name,
        "host"
            | "authorization"
            | "x-api-key"
            | "openai-organization"
            | "openai-project"
            | "content-length"
            | "connection"
            | "keep-alive"
            | "transfer-encoding"
            | "accept-encoding"
            | "proxy-authorization"
            | "te"
            | "upgrade"
            | "cookie"
    )
}

async fn handle(
    req: HttpRequest,
    payload: web::Payload,
    gw: web::Data<ModelGateway>,
) -> HttpResponse {
    let path = req.path().trim_start_matches('/').to_owned();
    let (name, route) = path.split_once('/').unwrap_or((path.as_str(), ""));
    let (provider, run_id) = match caller(&req, &gw, name) {
        Ok(caller) => caller,
        Err(refused) => return refused,
    };
    // One run's calls at once are capped before anything is looked up for it: a run that
    // floods the gateway waits on its own slots, never on the store other runs need.
    let slot = match gw.config.requests.slot(&run_id) {
        Ok(slot) => slot,
        Err(refused) => {
            gw.refuse("busy");
            return request_refused(&gw, provider, &refused);
        }
    };
    let ActiveRun {
        repo,
        run_usd,
        continued_usd,
        ..
    } = match active(&gw, provider, &run_id).await {
        Ok(active) => active,
        Err(refused) => return refused,
    };
    let api = if req.method() == actix_web::http::Method::POST {
        provider.metered(route)
    } else {
        None
    };
    if api.is_none() && !provider.free(route) && !gw.config.allow_unmetered {
        gw.refuse("unmetered");
        return provider.error(
            StatusCode::NOT_FOUND,
            "not_found_error",
            &format!(
                "{} {route} is not metered, so the director does not forward it (models.allow_unmetered)",
                req.method()
            ),
        );
    }
    if provider == Provider::Anthropic {
        let betas = req.headers().get_all("anthropic-beta");
        let betas = betas.map(|v| v.to_str().unwrap_or("\u{fffd}"));
        if let Err(refusal) = gw.config.policy.check_betas(betas) {
            return reaches_out(&gw, provider, &refusal);
        }
    }
    let max =
        usize::try_from(gw.config.max_request_mb.saturating_mul(1024 * 1024)).unwrap_or(usize::MAX);
    let read = gw
        .config
        .requests
        .read(
            &run_id,
            payload,
            crate::git_gateway::request::declared(&req),
            max,
        )
        .await;
    let (body, room) = match read {
        Ok((_, true, _)) => {
            gw.refuse("too_large");
            return provider.error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "request_too_large",
                &format!(
                    "the request is over {} MB (models.max_request_mb)",
                    gw.config.max_request_mb
                ),
            );
        }
        Ok((body, false, room)) => (body, room),
        Err(refused) => return request_refused(&gw, provider, &refused),
    };
    // What the body asks the provider to do beyond answering, on every route it goes to
    // (Anthropic's token count reads the same content and would fetch it too; an unmetered
    // route the operator opened is read as its provider's widest API).
    let checked = api.unwrap_or(match provider {
        Provider::Anthropic => Api::AnthropicMessages,
        Provider::Openai => Api::OpenaiResponses,
    });
    if let Err(refusal) = gw.config.policy.check_body(checked, &body) {
        return reaches_out(&gw, provider, &refusal);
    }
    let call = Call {
        provider,
        run_id,
        repo,
        route: route.to_owned(),
        budget: match continued_usd {
            // A writer's `/director continue` set this run's own budget (0: none).
            Some(usd) => crate::settings::BudgetSettings {
                run_usd: usd,
                ..gw.config.budget.clone()
            },
            None => gw.config.budget.for_run(run_usd),
        },
    };
    let answer = match api {
        Some(api) => metered(&gw, &req, body, call, api, slot).await,
        None => {
            let answer = forward(&gw, &req, body, &call).await;
            answer
                .map_body(move |_, body| Held { body, _slot: slot })
                .map_into_boxed_body()
        }
    };
    // The body was sent: its room is free again.
    drop(room);
    answer
}

/// A request refused for what it would have the provider reach: nothing was forwarded.
fn reaches_out(
    gw: &ModelGateway,
    provider: Provider,
    refusal: &super::policy::Refusal,
) -> HttpResponse {
    gw.refuse("reaches_out");
    provider.error(
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        &format!("the director does not forward this request: {refusal}"),
    )
}

/// Who calls: a configured provider named by the path's first part, and a run by the key
/// it presents (checked by its MAC alone, nothing looked up); or the answer that refuses.
#[allow(clippy::result_large_err)] // an answer, made once for a refused call
fn caller(
    req: &HttpRequest,
    gw: &ModelGateway,
    name: &str,
) -> Result<(Provider, RunId), HttpResponse> {
    let Some(provider) = Provider::parse(name).filter(|p| gw.config.upstreams.contains_key(p))
    else {
        return Err(HttpResponse::NotFound()
            .content_type("text/plain; charset=utf-8")
            .body("no such model provider here\n"));
    };
    let Some(run_id) = presented(req).and_then(|k| gw.run_of(k)) else {
        gw.refuse("credential");
        return Err(provider.error(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "a run's own key is required (the run's environment has it)",
        ));
    };
    Ok((provider, run_id))
}

/// The run, if it is active and may call `provider` (its agent's profile may name the
/// providers it talks to); or the answer that refuses the call.
async fn active(
    gw: &ModelGateway,
    provider: Provider,
    run_id: &RunId,
) -> Result<ActiveRun, HttpResponse> {
    match gw.runs.active(run_id).await {
        Ok(Some(ActiveRun {
            providers: Some((agent, allowed)),
            ..
        })) if !allowed.contains(&provider) => {
            gw.refuse("provider");
            let allowed: Vec<_> = allowed.iter().map(|p| p.as_str()).collect();
            Err(provider.error(
                StatusCode::FORBIDDEN,
                "permission_error",
                &format!(
                    "the run's agent `{agent}` talks to {} only (agents.{agent}.providers)",
                    allowed.join(", ")
                ),
            ))
        }
        Ok(Some(active)) => Ok(active),
        Ok(None) => {
            gw.refuse("ended");
            Err(provider.error(
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "the run has ended: its key opens nothing",
            ))
        }
        Err(e) => {
            tracing::warn!(run_id = %run_id, error = %e, "the model gateway cannot look up a run");
            Err(provider.error(
                StatusCode::SERVICE_UNAVAILABLE,
                "api_error",
                "the director cannot say now",
            ))
        }
    }
}

/// A request the gateway did not read, answered in the provider's own error shape.
fn request_refused(
    gw: &ModelGateway,
    provider: Provider,
    refused: &crate::git_gateway::request::Refused,
) -> HttpResponse {
    use crate::git_gateway::request::Refused;
    let (status, why) = refused.answer(gw.config.requests.max_per_run());
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    let kind = match refused {
        Refused::Busy | Refused::OverShare => "rate_limit_error",
        Refused::NoRoom => "overloaded_error",
        Refused::TooSlow | Refused::Unreadable => "invalid_request_error",
    };
    let mut answer = provider.error(status, kind, &why);
    if matches!(
        refused,
        Refused::Busy | Refused::NoRoom | Refused::OverShare
    ) {
        answer
            .headers_mut()
            .insert(actix_web::http::header::RETRY_AFTER, 2.into());
    }
    answer
}

/// An answer's body, holding the run's slot until it has passed (a stream may last minutes).
struct Held<B> {
    body: B,
    _slot: crate::git_gateway::request::Slot,
}

impl<B: actix_web::body::MessageBody + Unpin> actix_web::body::MessageBody for Held<B> {
    type Error = B::Error;

    fn size(&self) -> actix_web::body::BodySize {
        self.body.size()
    }

    fn poll_next(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, Self::Error>>> {
        Pin::new(&mut self.body).poll_next(cx)
    }
}

/// One request from a run.
struct Call {
    provider: Provider,
    run_id: RunId,
    repo: RepoName,
    route: String,
    /// `[budget]`, with the run's own budget when its repository set a lower one.
    budget: crate::settings::BudgetSettings,
}

/// What the gateway reads of a request: the fields that say what the call may cost, the
/// rest skipped unread (a body of small numbers parsed whole takes ten times its size).
#[derive(serde::Deserialize, Default)]
#[serde(default)]
struct Shape {
    model: String,
    stream: bool,
    /// Anthropic's and OpenAI chat's output limit.
    max_tokens: Option<u64>,
    /// OpenAI chat's newer name for it.
    max_completion_tokens: Option<u64>,
    /// OpenAI responses'.
    max_output_tokens: Option<u64>,
    /// OpenAI chat's completions per call: all are in its usage, and in its reservation.
    n: Option<u64>,
    /// OpenAI responses run later and are fetched apart: nothing the gateway sees reports
    /// their usage.
    background: bool,
    stream_options: Option<serde::de::IgnoredAny>,
}

impl Shape {
    fn max_output(&self, default: u64) -> u64 {
        // Every limit the request names: a provider that honours the larger must not be
        // reserved for the smaller.
        let per_choice = [
            self.max_tokens,
            self.max_completion_tokens,
            self.max_output_tokens,
        ]
        .into_iter()
        .flatten()
        .max()
        .unwrap_or(default);
        per_choice.saturating_mul(self.n.unwrap_or(1).max(1))
    }
}

/// A metered call: the model named, its price and the budgets checked with what calls in
/// flight may spend, its worst case reserved, the request made to report its usage, and the
/// answer read as it passes.
async fn metered(
    gw: &ModelGateway,
    req: &HttpRequest,
    body: Vec<u8>,
    call: Call,
    api: Api,
    slot: crate::git_gateway::request::Slot,
) -> HttpResponse {
    let p = call.provider;
    let Ok(shape) = serde_json::from_slice::<Shape>(&body) else {
        return p.error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "the request body is not JSON of this API",
        );
    };
    if shape.background && !gw.config.allow_unmetered {
        gw.refuse("unmeterable");
        return p.error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "`background: true` answers later, where the director cannot meter it, so it does not forward it (models.allow_unmetered)",
        );
    }
    let model = shape.model.clone();
    let price = crate::settings::prices::price_of(&gw.config.prices, &model);
    if price.is_none() && call.budget.any() {
        gw.refuse("unpriced");
        return p.error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            &format!(
                "the model `{model}` has no price in [models.prices] or the director's own table (set models.prices.\"{model}\"), and budgets are in dollars: the director does not forward it"
            ),
        );
    }
    if let Some(refused) = budget_refusal(gw, &call).await {
        return refused;
    }
    let worst = Usage {
        output: shape.max_output(gw.config.default_max_output_tokens),
        ..Usage::estimate(body.len(), 0)
    };
    let reservation = gw.ledger.reserve(
        &call.run_id,
        &call.repo,
        price.as_ref().map_or(0.0, |p| worst.cost(p)),
    );
    let request_bytes = body.len();
    // OpenAI's chat stream reports usage only when asked.
    let body = if api == Api::OpenaiChat && shape.stream {
        ask_for_usage(body, shape.stream_options.is_some())
    } else {
        body
    };
    let meter = Meter {
        api,
        streamed: shape.stream,
        sse: StreamMeter::new(api),
        whole: Vec::new(),
        tail: false,
        bytes: 0,
        request_bytes,
        answered: None,
        record: Some(Record {
            runs: gw.runs.clone(),
            counters: gw.counters.clone(),
            reservation,
            run_id: call.run_id.clone(),
            repo: call.repo.clone(),
            provider: p,
            model,
            price,
            worst,
        }),
    };
    let out = upstream_request(gw, req, body, &call);
    let (head_tx, head_rx) = tokio::sync::oneshot::channel();
    let (chunks_tx, chunks_rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(read_answer(
        out,
        meter,
        gw.config.drain,
        head_tx,
        chunks_tx,
        slot,
    ));
    let Ok(Some((status, headers))) = head_rx.await else {
        tracing::warn!(
            provider = p.as_str(),
            "the model provider could not be reached"
        );
        return p.error(
            StatusCode::BAD_GATEWAY,
            "api_error",
            "the model provider could not be reached",
        );
    };
    let mut reply = reply_head(status, &headers);
    reply.streaming(futures_util::stream::unfold(
        chunks_rx,
        |mut rx| async move { rx.recv().await.map(|chunk| (chunk, rx)) },
    ))
}

/// Reads the provider's answer to a metered call, in a task of its own: the head and each
/// chunk are passed to the run while it listens; once it has gone (or never got the head),
/// the rest is read for the usage, for `drain` at most. The meter records the call at the
/// end, and the run's slot is held until then.
async fn read_answer(
    out: reqwest::RequestBuilder,
    mut meter: Meter,
    drain: std::time::Duration,
    head: tokio::sync::oneshot::Sender<Option<(StatusCode, reqwest::header::HeaderMap)>>,
    chunks: tokio::sync::mpsc::Sender<Result<Bytes, std::io::Error>>,
    _slot: crate::git_gateway::request::Slot,
) {
    use futures_util::StreamExt as _;
    let answer = match out.send().await {
        Ok(answer) => answer,
        Err(e) => {
            tracing::debug!(error = %e.without_url(), "a metered call found no provider");
            let _ = head.send(None);
            return;
        }
    };
    let status = StatusCode::from_u16(answer.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    meter.answered = Some(status);
    // An event stream gets a comment line when the provider is silent (thinking): it keeps
    // the run's connection alive, and a write is how a hang-up is noticed (a peer that
    // closes is read as a half-close until a write fails).
    let sse = meter.streamed
        && answer
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
    let keepalive = (drain / 2).min(std::time::Duration::from_secs(15));
    let mut listening = head.send(Some((status, answer.headers().clone()))).is_ok();
    let mut left_at = (!listening).then(tokio::time::Instant::now);
    let mut line_start = true;
    let mut stream = answer.bytes_stream();
    loop {
        let next = match left_at {
            None => tokio::select! {
                next = stream.next() => next,
                // The run hung up between chunks: from now on the bound runs.
                () = chunks.closed() => {
                    listening = false;
                    left_at = Some(tokio::time::Instant::now());
                    continue;
                }
                () = tokio::time::sleep(keepalive), if sse && line_start => {
                    if chunks.send(Ok(Bytes::from_static(b":\n"))).await.is_err() {
                        listening = false;
                        left_at = Some(tokio::time::Instant::now());
                    }
                    continue;
                }
            },
            Some(at) => match tokio::time::timeout_at(at + drain, stream.next()).await {
                Ok(next) => next,
                // Still generating at the bound: charged its reservation.
                Err(_) => break,
            },
        };
        match next {
            Some(Ok(chunk)) => {
                meter.feed(&chunk);
                if let Some(last) = chunk.last() {
                    line_start = *last == b'\n';
                }
                if listening && chunks.send(Ok(chunk)).await.is_err() {
                    // The run hung up: the provider goes on (and bills), so reading does.
                    listening = false;
                    left_at = Some(tokio::time::Instant::now());
                }
            }
            Some(Err(e)) => {
                if listening {
                    let _ = chunks
                        .send(Err(std::io::Error::other(e.without_url())))
                        .await;
                }
                break;
            }
            None => break,
        }
    }
    meter.done();
}

/// The answer that refuses a call because a budget is spent (a stop for the run), or
/// because calls in flight may spend the rest of it (retry later); `None`: it may go.
async fn budget_refusal(gw: &ModelGateway, call: &Call) -> Option<HttpResponse> {
    let p = call.provider;
    let now = gw.runs.now_ms();
    // In a reading turn: a metered cost is in the store or in the ledger, counted once.
    let seen = {
        let _turn = gw.ledger.reading().await;
        match gw.runs.spent(&call.run_id, &call.repo, &day_of(now)).await {
            Ok(s) => gw.ledger.on_top(s, &call.run_id, &call.repo),
            Err(e) => {
                tracing::warn!(run_id = %call.run_id, error = %e, "the model gateway cannot read what was spent");
                return Some(p.error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "api_error",
                    "the director cannot say now",
                ));
            }
        }
    };
    if let Some((key, why)) = over_budget(&call.budget, &seen.settled) {
        gw.refuse("budget");
        tracing::info!(run_id = %call.run_id, budget = key, "a run's model call was refused: budget spent");
        gw.runs.over_budget(&call.run_id, &why).await;
        return Some(p.error(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", &why));
    }
    // What calls in flight may still spend counts too: the budget is crossed by one call
    // at most, never by as many as run at once. Such a wait is not the budget's end.
    let with_in_flight = Spent {
        run: seen.settled.run + seen.in_flight.run,
        repo_day: seen.settled.repo_day + seen.in_flight.repo_day,
        day: seen.settled.day + seen.in_flight.day,
    };
    if let Some((key, _)) = over_budget(&call.budget, &with_in_flight) {
        gw.refuse("budget_in_flight");
        let mut answer = p.error(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            &format!("calls in flight may spend the rest of {key}: retry when they have ended"),
        );
        answer
            .headers_mut()
            .insert(actix_web::http::header::RETRY_AFTER, 2.into());
        return Some(answer);
    }
    None
}

/// An OpenAI chat request that streams, made to end with its usage (`stream_options:
/// {include_usage: true}`). Without `stream_options` of its own the field is put in front,
/// the rest left unread; one that has its own is read whole (rare, and within the cap).
fn ask_for_usage(body: Vec<u8>, has_options: bool) -> Vec<u8> {
    if !has_options {
        let Some(open) = body.iter().position(|b| !b.is_ascii_whitespace()) else {
            return body;
        };
        if body[open] != b'{' {
            return body;
        }
        let rest = body[open + 1..].trim_ascii_start();
        let sep: &[u8] = if rest.starts_with(b"}") { b"" } else { b"," };
        let mut out = Vec::with_capacity(body.len() + 48);
        out.extend_from_slice(b"{\"stream_options\":{\"include_usage\":true}");
        out.extend_from_slice(sep);
        out.extend_from_slice(rest);
        return out;
    }
    let Ok(mut request) = serde_json::from_slice::<Value>(&body) else {
        return body;
    };
    if request["stream_options"]["include_usage"].as_bool() == Some(true) {
        return body;
    }
    if !request["stream_options"].is_object() {
        request["stream_options"] = json!({});
    }
    request["stream_options"]["include_usage"] = json!(true);
    request.to_string().into_bytes()
}

/// The request to the provider: the run's route and query, its headers but those that
/// name the caller, and the real key.
fn upstream_request(
    gw: &ModelGateway,
    req: &HttpRequest,
    body: Vec<u8>,
    call: &Call,
) -> reqwest::RequestBuilder {
    let p = call.provider;
    let upstream = &gw.config.upstreams[&p];
    let mut url = format!("{}/{}", upstream.base_url.trim_end_matches('/'), call.route);
    if !req.query_string().is_empty() {
        url.push('?');
        url.push_str(req.query_string());
    }
    let method = reqwest::Method::from_bytes(req.method().as_str().as_bytes())
        .unwrap_or(reqwest::Method::POST);
    let mut out = gw.client.request(method, &url);
    for (name, value) in req.headers() {
        if forwarded_header(name.as_str()) {
            out = out.header(name.as_str(), value.as_bytes());
        }
    }
    out = match p {
        Provider::Anthropic => out.header("x-api-key", upstream.api_key.expose()),
        Provider::Openai => out.bearer_auth(upstream.api_key.expose()),
    };
    // Plain bytes, so the meter can read them.
    out.header("accept-encoding", "identity").body(body)
}

/// The answer's status and headers as the run gets them.
fn reply_head(
    status: StatusCode,
    headers: &reqwest::header::HeaderMap,
) -> actix_web::HttpResponseBuilder {
    let mut reply = HttpResponse::build(status);
    for (name, value) in headers {
        let n = name.as_str();
        if !matches!(
            n,
            "content-length" | "transfer-encoding" | "connection" | "keep-alive" | "set-cookie"
        ) {
            reply.insert_header((n, value.as_bytes()));
        }
    }
    reply
}

/// Sends an unmetered request on with the real key; the answer is streamed back.
async fn forward(gw: &ModelGateway, req: &HttpRequest, body: Vec<u8>, call: &Call) -> HttpResponse {
    let p = call.provider;
    let answer = match upstream_request(gw, req, body, call).send().await {
        Ok(answer) => answer,
        Err(e) => {
            tracing::warn!(provider = p.as_str(), error = %e.without_url(), "the model provider could not be reached");
            return p.error(
                StatusCode::BAD_GATEWAY,
                "api_error",
                "the model provider could not be reached",
            );
        }
    };
    let status = StatusCode::from_u16(answer.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    reply_head(status, answer.headers()).streaming(answer.bytes_stream())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::run::test_id;
    use crate::settings::BudgetSettings;
    use std::collections::BTreeMap;

    #[test]
    fn the_runs_credentials_and_billing_choices_are_not_forwarded() {
        for name in [
            "authorization",
            "x-api-key",
            "openai-organization",
            "openai-project",
            "host",
            "accept-encoding",
        ] {
            assert!(!forwarded_header(name), "{name}");
        }
        for name in [
            "anthropic-version",
            "anthropic-beta",
            "content-type",
            "accept",
        ] {
            assert!(forwarded_header(name), "{name}");
        }
    }

    #[test]
    fn a_runs_key_is_its_own_and_no_other_runs() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        struct None_;
        #[async_trait::async_trait]
        impl Runs for None_ {
            async fn active(&self, _: &RunId) -> Result<Option<ActiveRun>, String> {
                Ok(None)
            }
            async fn spent(&self, _: &RunId, _: &RepoName, _: &str) -> Result<Spent, String> {
                Ok(Spent::default())
            }
            async fn record(&self, _: &crate::models::Metered) -> Result<(), String> {
                Ok(())
            }
            async fn over_budget(&self, _: &RunId, _: &str) {}
            fn now_ms(&self) -> i64 {
                0
            }
        }
        let config = || Config {
            upstreams: BTreeMap::new(),
            prices: BTreeMap::new(),
            budget: BudgetSettings::default(),
            allow_unmetered: false,
            max_request_mb: 1,
            requests: crate::git_gateway::request::Budget::new(
                64,
                4,
                std::time::Duration::from_secs(5),
            ),
            default_max_output_tokens: 1000,
            policy: Default::default(),
            drain: std::time::Duration::from_secs(5),
        };
        let gw = ModelGateway::new(b"k".to_vec(), Arc::new(None_), config(), None).expect("gw");
        let id = test_id("0000000abc12");
        let key = gw.key_of(&id);
        assert_eq!(gw.run_of(&key), Some(id));
        let other = key.replace("0000000abc12", "0000000abc13");
        assert_eq!(gw.run_of(&other), None, "a key names one run only");
        let hostile = key.replace("0000000abc12", "../0000000abc12");
        assert_eq!(gw.run_of(&hostile), None, "what is not an id names no run");
        assert_eq!(gw.run_of("sk-ant-real-key"), None);
        assert_eq!(gw.run_of("director-abc123."), None);
        let elsewhere =
            ModelGateway::new(b"k2".to_vec(), Arc::new(None_), config(), None).expect("gw");
        assert_eq!(elsewhere.run_of(&key), None, "another director's key");
        assert_eq!(day_of(0), "1970-01-01");
    }
}
