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
use futures_util::{Stream, StreamExt as _};
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;
use tokio_util::sync::CancellationToken;

use super::usage::{self, Api, StreamMeter};
use super::{ActiveRun, Config, Counters, Metered, Provider, Runs, Spent, day_of, over_budget};
use crate::domain::RepoName;
use crate::settings::Price;

pub struct ModelGateway {
    key: Vec<u8>,
    runs: Arc<dyn Runs>,
    config: Config,
    client: reqwest::Client,
    counters: Option<Counters>,
    pending: Arc<Pending>,
}

/// Costs metered by this process and not yet in the store: counted at once, so a run's next
/// call, arriving before the write lands, already sees them.
#[derive(Default)]
struct Pending(std::sync::Mutex<Vec<(String, RepoName, f64)>>);

impl Pending {
    fn add(&self, run_id: &str, repo: &RepoName, cost: f64) {
        if let Ok(mut p) = self.0.lock() {
            p.push((run_id.to_owned(), repo.clone(), cost));
        }
    }

    fn remove(&self, run_id: &str, cost: f64) {
        if let Ok(mut p) = self.0.lock()
            && let Some(i) = p.iter().position(|(r, _, c)| r == run_id && *c == cost)
        {
            p.swap_remove(i);
        }
    }

    /// `spent`, with what is pending added.
    fn on_top(&self, mut spent: Spent, run_id: &str, repo: &RepoName) -> Spent {
        if let Ok(p) = self.0.lock() {
            for (r, rp, c) in p.iter() {
                spent.day += c;
                if rp == repo {
                    spent.repo_day += c;
                }
                if r == run_id {
                    spent.run += c;
                }
            }
        }
        spent
    }
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
            pending: Arc::default(),
        }))
    }

    /// The providers runs get variables for.
    pub fn providers(&self) -> impl Iterator<Item = Provider> + '_ {
        self.config.upstreams.keys().copied()
    }

    /// The run's key: `director-<run id>.<MAC>`, taken by this gateway alone.
    pub fn key_of(&self, run_id: &str) -> String {
        let mac = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(self.mac(run_id).finalize().into_bytes());
        format!("director-{run_id}.{mac}")
    }

    /// The run a presented key names, if it is that run's key.
    fn run_of(&self, key: &str) -> Option<String> {
        let (run_id, mac) = key.strip_prefix("director-")?.rsplit_once('.')?;
        let given = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(mac)
            .ok()?;
        self.mac(run_id)
            .verify_slice(&given)
            .is_ok()
            .then(|| run_id.to_owned())
    }

    fn mac(&self, run_id: &str) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256> as hmac::digest::KeyInit>::new_from_slice(&self.key)
            .expect("HMAC takes a key of any length");
        mac.update(b"model-gateway\0");
        mac.update(run_id.as_bytes());
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
    let Some(provider) = Provider::parse(name).filter(|p| gw.config.upstreams.contains_key(p))
    else {
        return HttpResponse::NotFound()
            .content_type("text/plain; charset=utf-8")
            .body("no such model provider here\n");
    };
    let Some(run_id) = presented(&req).and_then(|k| gw.run_of(k)) else {
        gw.refuse("credential");
        return provider.error(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "a run's own key is required (the run's environment has it)",
        );
    };
    let ActiveRun { repo, run_usd } = match gw.runs.active(&run_id).await {
        Ok(Some(active)) => active,
        Ok(None) => {
            gw.refuse("ended");
            return provider.error(
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "the run has ended: its key opens nothing",
            );
        }
        Err(e) => {
            tracing::warn!(run_id = %run_id, error = %e, "the model gateway cannot look up a run");
            return provider.error(
                StatusCode::SERVICE_UNAVAILABLE,
                "api_error",
                "the director cannot say now",
            );
        }
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
    let max =
        usize::try_from(gw.config.max_request_mb.saturating_mul(1024 * 1024)).unwrap_or(usize::MAX);
    let body = match crate::gateway::body(payload, max).await {
        Ok((_, true)) => {
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
        Ok((body, false)) => body,
        Err(()) => {
            return provider.error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "the request body could not be read",
            );
        }
    };
    let call = Call {
        provider,
        run_id,
        repo,
        route: route.to_owned(),
        budget: gw.config.budget.for_run(run_usd),
    };
    match api {
        Some(api) => metered(&gw, &req, body, call, api).await,
        None => forward(&gw, &req, body, &call, None)
            .await
            .unwrap_or_else(|r| r),
    }
}

/// One request from a run.
struct Call {
    provider: Provider,
    run_id: String,
    repo: RepoName,
    route: String,
    /// `[budget]`, with the run's own budget when its repository set a lower one.
    budget: crate::settings::BudgetSettings,
}

/// A metered call: the model named, its price and the budgets checked, the request made to
/// report its usage, and the answer read as it passes.
async fn metered(
    gw: &ModelGateway,
    req: &HttpRequest,
    body: Vec<u8>,
    call: Call,
    api: Api,
) -> HttpResponse {
    let p = call.provider;
    let Ok(mut request) = serde_json::from_slice::<Value>(&body) else {
        return p.error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "the request body is not JSON",
        );
    };
    let model = request["model"].as_str().unwrap_or_default().to_owned();
    let price = gw.config.prices.get(&model).cloned();
    if price.is_none() && call.budget.any() {
        gw.refuse("unpriced");
        return p.error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            &format!(
                "the model `{model}` has no price (models.prices.\"{model}\"), and budgets are in dollars: the director does not forward it"
            ),
        );
    }
    let now = gw.runs.now_ms();
    let spent = match gw.runs.spent(&call.run_id, &call.repo, &day_of(now)).await {
        Ok(s) => gw.pending.on_top(s, &call.run_id, &call.repo),
        Err(e) => {
            tracing::warn!(run_id = %call.run_id, error = %e, "the model gateway cannot read what was spent");
            return p.error(
                StatusCode::SERVICE_UNAVAILABLE,
                "api_error",
                "the director cannot say now",
            );
        }
    };
    if let Some((key, why)) = over_budget(&call.budget, &spent) {
        gw.refuse("budget");
        tracing::info!(run_id = %call.run_id, budget = key, "a run's model call was refused: budget spent");
        gw.runs.over_budget(&call.run_id, &why).await;
        return p.error(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", &why);
    }
    let streamed = request["stream"].as_bool() == Some(true);
    // OpenAI's chat stream reports usage only when asked.
    let body = if api == Api::OpenaiChat
        && streamed
        && request["stream_options"]["include_usage"].as_bool() != Some(true)
    {
        if !request["stream_options"].is_object() {
            request["stream_options"] = json!({});
        }
        request["stream_options"]["include_usage"] = json!(true);
        request.to_string().into_bytes()
    } else {
        body
    };
    let meter = Meter {
        api,
        streamed,
        sse: StreamMeter::new(api),
        whole: Vec::new(),
        record: Some(Record {
            runs: gw.runs.clone(),
            counters: gw.counters.clone(),
            pending: gw.pending.clone(),
            run_id: call.run_id.clone(),
            repo: call.repo.clone(),
            provider: p,
            model,
            price,
        }),
    };
    forward(gw, req, body, &call, Some(meter))
        .await
        .unwrap_or_else(|r| r)
}

/// Sends the request on with the real key; the answer is streamed back, through `meter`
/// when given.
async fn forward(
    gw: &ModelGateway,
    req: &HttpRequest,
    body: Vec<u8>,
    call: &Call,
    meter: Option<Meter>,
) -> Result<HttpResponse, HttpResponse> {
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
    out = out.header("accept-encoding", "identity");
    let answer = out.body(body).send().await.map_err(|e| {
        tracing::warn!(provider = p.as_str(), error = %e.without_url(), "the model provider could not be reached");
        p.error(
            StatusCode::BAD_GATEWAY,
            "api_error",
            "the model provider could not be reached",
        )
    })?;
    let status = StatusCode::from_u16(answer.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let mut reply = HttpResponse::build(status);
    for (name, value) in answer.headers() {
        let n = name.as_str();
        if !matches!(
            n,
            "content-length" | "transfer-encoding" | "connection" | "keep-alive" | "set-cookie"
        ) {
            reply.insert_header((n, value.as_bytes()));
        }
    }
    let stream = answer.bytes_stream();
    Ok(match meter {
        Some(meter) => reply.streaming(Metering {
            inner: Box::pin(stream),
            meter,
        }),
        None => reply.streaming(stream),
    })
}

/// Who to tell what a call used, once its answer has passed.
struct Record {
    runs: Arc<dyn Runs>,
    counters: Option<Counters>,
    pending: Arc<Pending>,
    run_id: String,
    repo: RepoName,
    provider: Provider,
    model: String,
    price: Option<Price>,
}

/// Reads an answer as it passes: a stream event by event, a whole answer kept (bounded)
/// and read at its end.
struct Meter {
    api: Api,
    streamed: bool,
    sse: StreamMeter,
    whole: Vec<u8>,
    record: Option<Record>,
}

/// A whole answer is read for its usage up to this size.
const MAX_WHOLE: usize = 16 * 1024 * 1024;

impl Meter {
    fn feed(&mut self, chunk: &[u8]) {
        if self.streamed {
            self.sse.feed(chunk);
        } else if self.whole.len() + chunk.len() <= MAX_WHOLE {
            self.whole.extend_from_slice(chunk);
        }
    }

    /// Records what was read: at the answer's end, or when it was cut (the provider failed,
    /// the client went away); a stream's usage so far counts.
    fn done(&mut self) {
        let Some(r) = self.record.take() else {
            return;
        };
        let usage = if self.streamed {
            self.sse.finish()
        } else {
            usage::from_body(self.api, &self.whole)
        };
        let Some(usage) = usage else {
            return;
        };
        let metered = Metered {
            run_id: Some(r.run_id),
            repo: r.repo,
            provider: r.provider,
            cost_usd: r.price.as_ref().map(|p| usage.cost(p)),
            model: r.model,
            usage,
            at_ms: r.runs.now_ms(),
        };
        if let Some(c) = &r.counters {
            c.count(&metered);
        }
        let (runs, pending) = (r.runs, r.pending);
        let cost = metered.cost_usd.unwrap_or(0.0);
        let run_id = metered.run_id.clone().unwrap_or_default();
        pending.add(&run_id, &metered.repo, cost);
        tokio::spawn(async move {
            runs.record(metered).await;
            pending.remove(&run_id, cost);
        });
    }
}

/// The provider's answer, passed on chunk by chunk as it arrives and read by the meter.
struct Metering {
    inner: Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>,
    meter: Meter,
}

impl Stream for Metering {
    type Item = Result<Bytes, std::io::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match self.inner.poll_next_unpin(cx) {
            Poll::Ready(Some(Ok(chunk))) => {
                self.meter.feed(&chunk);
                Poll::Ready(Some(Ok(chunk)))
            }
            Poll::Ready(Some(Err(e))) => {
                self.meter.done();
                Poll::Ready(Some(Err(std::io::Error::other(e.without_url()))))
            }
            Poll::Ready(None) => {
                self.meter.done();
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Drop for Metering {
    fn drop(&mut self) {
        // The client went away mid-answer: what passed so far still counts.
        self.meter.done();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
            async fn active(&self, _: &str) -> Result<Option<ActiveRun>, String> {
                Ok(None)
            }
            async fn spent(&self, _: &str, _: &RepoName, _: &str) -> Result<Spent, String> {
                Ok(Spent::default())
            }
            async fn record(&self, _: Metered) {}
            async fn over_budget(&self, _: &str, _: &str) {}
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
        };
        let gw = ModelGateway::new(b"k".to_vec(), Arc::new(None_), config(), None).expect("gw");
        let key = gw.key_of("abc123");
        assert_eq!(gw.run_of(&key).as_deref(), Some("abc123"));
        let other = key.replace("abc123", "abc124");
        assert_eq!(gw.run_of(&other), None, "a key names one run only");
        assert_eq!(gw.run_of("sk-ant-real-key"), None);
        assert_eq!(gw.run_of("director-abc123."), None);
        let elsewhere =
            ModelGateway::new(b"k2".to_vec(), Arc::new(None_), config(), None).expect("gw");
        assert_eq!(elsewhere.run_of(&key), None, "another director's key");
        assert_eq!(day_of(0), "1970-01-01");
    }
}
