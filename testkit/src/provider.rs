//! `FakeProvider`: a model provider on loopback that speaks Anthropic's Messages API
//! (`/v1/messages`, streamed or not, `/v1/messages/count_tokens`) and OpenAI's
//! (`/v1/chat/completions` streamed or not, honouring `stream_options.include_usage`, and
//! `/v1/responses`), reporting usage as the real APIs do, and only for its one real key
//! (`x-api-key` or `Authorization: Bearer`; anything else is 401 in the provider's shape).
//! It keeps every key presented and every request body. A stream can be held after its
//! first event until the test releases it, cut mid-way, or the next answer made a 5xx.

use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use actix_web::web::Bytes;
use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use serde_json::{Value, json};
use tokio::sync::{Notify, mpsc};

/// The tokens each answer reports.
#[derive(Clone, Copy, Debug)]
pub struct Tokens {
    pub input: u64,
    pub cached: u64,
    pub output: u64,
}

/// One turn of a scripted model: text, and tool calls (name, input) for the agent to make.
#[derive(Clone, Debug, Default)]
pub struct Turn {
    pub text: String,
    pub tool_calls: Vec<(String, Value)>,
}

/// Plays the model's turn for a request (its path and body); `None`: the fixed answer.
pub type Script = Arc<dyn Fn(&str, &Value) -> Option<Turn> + Send + Sync>;

struct State {
    script: Option<Script>,
    key: String,
    keys: Vec<String>,
    requests: Vec<(String, Value)>,
    tokens: Tokens,
    fail_next: Option<u16>,
    cut_next: bool,
    hold: Option<Arc<Notify>>,
}

pub struct FakeProvider {
    state: Arc<Mutex<State>>,
    pub url: String,
    pub key: String,
    handle: actix_web::dev::ServerHandle,
}

impl FakeProvider {
    pub fn start() -> Self {
        let key = format!("sk-fake-{:032x}", rand::random::<u128>());
        let state = Arc::new(Mutex::new(State {
            script: None,
            key: key.clone(),
            keys: Vec::new(),
            requests: Vec::new(),
            tokens: Tokens {
                input: 1000,
                cached: 0,
                output: 100,
            },
            fail_next: None,
            cut_next: false,
            hold: None,
        }));
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let data = web::Data::new(state.clone());
        let server = HttpServer::new(move || {
            App::new()
                .app_data(data.clone())
                .app_data(web::PayloadConfig::new(64 * 1024 * 1024))
                .default_service(web::to(handle))
        })
        .listen(listener)
        .expect("listen")
        .workers(2)
        .disable_signals()
        .run();
        let handle = server.handle();
        tokio::spawn(server);
        Self {
            state,
            url: format!("http://127.0.0.1:{port}"),
            key,
            handle,
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.state.lock().expect("lock"))
    }

    /// Plays the model's turns: for each request, the turn `script` gives, in the protocol of
    /// the route asked (Anthropic's messages with `tool_use`, OpenAI's chat with
    /// `tool_calls`), streamed when asked, with the usage of [`FakeProvider::set_tokens`].
    pub fn script(&self, script: impl Fn(&str, &Value) -> Option<Turn> + Send + Sync + 'static) {
        self.with(|s| s.script = Some(Arc::new(script)));
    }

    /// What every later answer reports it used.
    pub fn set_tokens(&self, tokens: Tokens) {
        self.with(|s| s.tokens = tokens);
    }

    /// The next answer is this status, with the provider's error body.
    pub fn fail_next(&self, status: u16) {
        self.with(|s| s.fail_next = Some(status));
    }

    /// The next stream breaks after its first events (the usage of its start only).
    pub fn cut_next(&self) {
        self.with(|s| s.cut_next = true);
    }

    /// The next stream stops after its first event until the returned signal is given.
    pub fn hold_streams(&self) -> Arc<Notify> {
        let n = Arc::new(Notify::new());
        self.with(|s| s.hold = Some(n.clone()));
        n
    }

    /// Every credential presented, in order.
    pub fn keys(&self) -> Vec<String> {
        self.with(|s| s.keys.clone())
    }

    /// (path, body) of every request that carried the real key.
    pub fn requests(&self) -> Vec<(String, Value)> {
        self.with(|s| s.requests.clone())
    }
}

impl Drop for FakeProvider {
    fn drop(&mut self) {
        drop(self.handle.stop(false));
    }
}

fn error(anthropic: bool, status: u16, kind: &str, message: &str) -> HttpResponse {
    let body = if anthropic {
        json!({ "type": "error", "error": { "type": kind, "message": message }, "request_id": "req_fake" })
    } else {
        json!({ "error": { "message": message, "type": kind, "param": null, "code": null } })
    };
    HttpResponse::build(actix_web::http::StatusCode::from_u16(status).expect("status"))
        .content_type("application/json")
        .body(body.to_string())
}

async fn handle(
    req: HttpRequest,
    body: Bytes,
    state: web::Data<Arc<Mutex<State>>>,
) -> HttpResponse {
    let path = req.path().to_owned();
    let anthropic = path.starts_with("/v1/messages");
    let presented = req
        .headers()
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or_else(|| {
            req.headers()
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .map(str::to_owned)
        })
        .unwrap_or_default();
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let (tokens, fail, cut, hold, script) = {
        let mut s = state.lock().expect("lock");
        s.keys.push(presented.clone());
        if presented != s.key {
            return error(anthropic, 401, "authentication_error", "invalid x-api-key");
        }
        s.requests.push((path.clone(), request.clone()));
        let cut = std::mem::take(&mut s.cut_next);
        let hold = if streamed_request(&request) {
            s.hold.take()
        } else {
            None
        };
        (s.tokens, s.fail_next.take(), cut, hold, s.script.clone())
    };
    if let Some(status) = fail {
        return error(anthropic, status, "overloaded_error", "Overloaded");
    }
    let streamed = request["stream"].as_bool() == Some(true);
    let model = request["model"].clone();
    let turn = match (req.method().as_str(), path.as_str()) {
        ("POST", "/v1/messages" | "/v1/chat/completions") => {
            script.and_then(|play| play(&path, &request))
        }
        _ => None,
    };
    if let Some(turn) = turn {
        let usage = request["stream_options"]["include_usage"].as_bool() == Some(true);
        return match (anthropic, streamed) {
            (true, true) => sse(anthropic_turn_events(&model, tokens, &turn), cut, hold),
            (true, false) => HttpResponse::Ok().json(anthropic_turn(&model, tokens, &turn)),
            (false, true) => sse(chat_turn_events(&model, tokens, &turn, usage), cut, hold),
            (false, false) => HttpResponse::Ok().json(chat_turn(&model, tokens, &turn)),
        };
    }
    match (req.method().as_str(), path.as_str()) {
        ("POST", "/v1/messages/count_tokens") => {
            HttpResponse::Ok().json(json!({ "input_tokens": tokens.input }))
        }
        ("POST", "/v1/messages") if streamed => sse(anthropic_events(&model, tokens), cut, hold),
        ("POST", "/v1/messages") => HttpResponse::Ok().json(json!({
            "id": "msg_fake", "type": "message", "role": "assistant", "model": model,
            "content": [{ "type": "text", "text": "Hello world" }], "stop_reason": "end_turn",
            "usage": { "input_tokens": tokens.input, "cache_read_input_tokens": tokens.cached,
                "cache_creation_input_tokens": 0, "output_tokens": tokens.output }
        })),
        ("POST", "/v1/chat/completions") if streamed => {
            let usage = request["stream_options"]["include_usage"].as_bool() == Some(true);
            sse(chat_events(&model, tokens, usage), cut, hold)
        }
        ("POST", "/v1/chat/completions") => HttpResponse::Ok().json(json!({
            "id": "chatcmpl-fake", "object": "chat.completion", "model": model,
            "choices": [{ "index": 0, "message": { "role": "assistant", "content": "Hello world" }, "finish_reason": "stop" }],
            "usage": chat_usage(tokens)
        })),
        ("POST", "/v1/responses") => HttpResponse::Ok().json(json!({
            "id": "resp_fake", "object": "response", "status": "completed", "model": model,
            "output": [], "usage": { "input_tokens": tokens.input + tokens.cached,
                "input_tokens_details": { "cached_tokens": tokens.cached },
                "output_tokens": tokens.output, "total_tokens": tokens.input + tokens.cached + tokens.output }
        })),
        ("GET", "/v1/models") => HttpResponse::Ok().json(json!({ "data": [{ "id": "fake-model" }] })),
        _ => error(anthropic, 404, "not_found_error", "Not found"),
    }
}

fn anthropic_content(turn: &Turn) -> Vec<Value> {
    let mut content = Vec::new();
    if !turn.text.is_empty() {
        content.push(json!({ "type": "text", "text": turn.text }));
    }
    for (i, (name, input)) in turn.tool_calls.iter().enumerate() {
        content.push(json!({ "type": "tool_use", "id": format!("toolu_fake{i}{:08x}", rand::random::<u32>()), "name": name, "input": input }));
    }
    content
}

fn stop_reason(turn: &Turn, tools: &str, done: &str) -> String {
    if turn.tool_calls.is_empty() {
        done
    } else {
        tools
    }
    .to_owned()
}

fn anthropic_turn(model: &Value, t: Tokens, turn: &Turn) -> Value {
    json!({ "id": "msg_fake", "type": "message", "role": "assistant", "model": model,
        "content": anthropic_content(turn), "stop_reason": stop_reason(turn, "tool_use", "end_turn"),
        "stop_sequence": null,
        "usage": { "input_tokens": t.input, "cache_read_input_tokens": t.cached,
            "cache_creation_input_tokens": 0, "output_tokens": t.output } })
}

/// A scripted turn as Anthropic streams it: each block started, its text or its input's JSON
/// as deltas, stopped; then the stop reason with the output count.
fn anthropic_turn_events(model: &Value, t: Tokens, turn: &Turn) -> Vec<String> {
    let ev = |name: &str, data: Value| format!("event: {name}\ndata: {data}\n\n");
    let mut out = vec![ev(
        "message_start",
        json!({ "type": "message_start", "message": { "id": "msg_fake", "type": "message",
        "role": "assistant", "content": [], "model": model, "stop_reason": null, "stop_sequence": null,
        "usage": { "input_tokens": t.input, "cache_read_input_tokens": t.cached,
            "cache_creation_input_tokens": 0, "output_tokens": 1 } } }),
    )];
    for (i, block) in anthropic_content(turn).into_iter().enumerate() {
        let (start, delta) = if block["type"] == "text" {
            (
                json!({ "type": "text", "text": "" }),
                json!({ "type": "text_delta", "text": block["text"] }),
            )
        } else {
            (
                json!({ "type": "tool_use", "id": block["id"], "name": block["name"], "input": {} }),
                json!({ "type": "input_json_delta", "partial_json": block["input"].to_string() }),
            )
        };
        out.push(ev(
            "content_block_start",
            json!({ "type": "content_block_start", "index": i, "content_block": start }),
        ));
        out.push(ev(
            "content_block_delta",
            json!({ "type": "content_block_delta", "index": i, "delta": delta }),
        ));
        out.push(ev(
            "content_block_stop",
            json!({ "type": "content_block_stop", "index": i }),
        ));
    }
    out.push(ev(
        "message_delta",
        json!({ "type": "message_delta", "delta": { "stop_reason": stop_reason(turn, "tool_use", "end_turn"), "stop_sequence": null },
        "usage": { "output_tokens": t.output } }),
    ));
    out.push(ev("message_stop", json!({ "type": "message_stop" })));
    out
}

fn chat_tool_calls(turn: &Turn) -> Vec<Value> {
    turn.tool_calls
        .iter()
        .enumerate()
        .map(|(i, (name, input))| json!({ "index": i, "id": format!("call_fake{i}{:08x}", rand::random::<u32>()), "type": "function",
            "function": { "name": name, "arguments": input.to_string() } }))
        .collect()
}

fn chat_turn(model: &Value, t: Tokens, turn: &Turn) -> Value {
    let mut message = json!({ "role": "assistant", "content": turn.text });
    if !turn.tool_calls.is_empty() {
        message["tool_calls"] = Value::Array(chat_tool_calls(turn));
    }
    json!({ "id": "chatcmpl-fake", "object": "chat.completion", "created": 1_700_000_000, "model": model,
        "choices": [{ "index": 0, "message": message, "finish_reason": stop_reason(turn, "tool_calls", "stop") }],
        "usage": chat_usage(t) })
}

/// A scripted turn as OpenAI streams it: the role, the text, each tool call whole in one
/// chunk, the finish reason, the usage when asked, `[DONE]`.
fn chat_turn_events(model: &Value, t: Tokens, turn: &Turn, usage: bool) -> Vec<String> {
    let chunk = |delta: Value, finish: Value| {
        format!(
            "data: {}\n\n",
            json!({ "id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1_700_000_000, "model": model,
            "choices": [{ "index": 0, "delta": delta, "finish_reason": finish }] })
        )
    };
    let mut out = vec![chunk(
        json!({ "role": "assistant", "content": "" }),
        Value::Null,
    )];
    if !turn.text.is_empty() {
        out.push(chunk(json!({ "content": turn.text }), Value::Null));
    }
    for call in chat_tool_calls(turn) {
        out.push(chunk(json!({ "tool_calls": [call] }), Value::Null));
    }
    out.push(chunk(
        json!({}),
        json!(stop_reason(turn, "tool_calls", "stop")),
    ));
    if usage {
        out.push(format!(
            "data: {}\n\n",
            json!({ "id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1_700_000_000, "model": model,
            "choices": [], "usage": chat_usage(t) })
        ));
    }
    out.push("data: [DONE]\n\n".to_owned());
    out
}

fn streamed_request(request: &Value) -> bool {
    request["stream"].as_bool() == Some(true)
}

fn chat_usage(t: Tokens) -> Value {
    json!({ "prompt_tokens": t.input + t.cached, "completion_tokens": t.output,
        "total_tokens": t.input + t.cached + t.output,
        "prompt_tokens_details": { "cached_tokens": t.cached } })
}

fn anthropic_events(model: &Value, t: Tokens) -> Vec<String> {
    let ev = |name: &str, data: Value| format!("event: {name}\ndata: {data}\n\n");
    vec![
        ev(
            "message_start",
            json!({ "type": "message_start", "message": { "id": "msg_fake", "type": "message",
            "role": "assistant", "content": [], "model": model, "stop_reason": null,
            "usage": { "input_tokens": t.input, "cache_read_input_tokens": t.cached,
                "cache_creation_input_tokens": 0, "output_tokens": 1 } } }),
        ),
        ev(
            "content_block_start",
            json!({ "type": "content_block_start", "index": 0, "content_block": { "type": "text", "text": "" } }),
        ),
        ev(
            "content_block_delta",
            json!({ "type": "content_block_delta", "index": 0, "delta": { "type": "text_delta", "text": "Hello" } }),
        ),
        ev("ping", json!({ "type": "ping" })),
        ev(
            "content_block_delta",
            json!({ "type": "content_block_delta", "index": 0, "delta": { "type": "text_delta", "text": " world" } }),
        ),
        ev(
            "content_block_stop",
            json!({ "type": "content_block_stop", "index": 0 }),
        ),
        ev(
            "message_delta",
            json!({ "type": "message_delta", "delta": { "stop_reason": "end_turn", "stop_sequence": null },
            "usage": { "output_tokens": t.output } }),
        ),
        ev("message_stop", json!({ "type": "message_stop" })),
    ]
}

fn chat_events(model: &Value, t: Tokens, usage: bool) -> Vec<String> {
    let chunk = |delta: Value, finish: Value| {
        format!(
            "data: {}\n\n",
            json!({ "id": "chatcmpl-fake", "object": "chat.completion.chunk", "model": model,
            "choices": [{ "index": 0, "delta": delta, "finish_reason": finish }], "usage": null })
        )
    };
    let mut out = vec![
        chunk(json!({ "role": "assistant", "content": "" }), Value::Null),
        chunk(json!({ "content": "Hello" }), Value::Null),
        chunk(json!({ "content": " world" }), Value::Null),
        chunk(json!({}), json!("stop")),
    ];
    if usage {
        out.push(format!(
            "data: {}\n\n",
            json!({ "id": "chatcmpl-fake", "object": "chat.completion.chunk", "model": model,
            "choices": [], "usage": chat_usage(t) })
        ));
    }
    out.push("data: [DONE]\n\n".to_owned());
    out
}

/// Sends `events` as a stream: all at once, or the first one and then the rest once `hold`
/// is given; `cut` ends it with a broken connection after the first events.
fn sse(events: Vec<String>, cut: bool, hold: Option<Arc<Notify>>) -> HttpResponse {
    let (tx, mut rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(64);
    tokio::spawn(async move {
        for (i, e) in events.into_iter().enumerate() {
            if i == 1
                && let Some(h) = &hold
            {
                h.notified().await;
            }
            if cut && i == 5 {
                let _ = tx
                    .send(Err(std::io::Error::other("the provider went away")))
                    .await;
                return;
            }
            if tx.send(Ok(Bytes::from(e))).await.is_err() {
                return;
            }
        }
    });
    HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header(("cache-control", "no-cache"))
        .streaming(futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx)))
}
