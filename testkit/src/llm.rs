//! A fake language-model server speaking Anthropic's Messages API and OpenAI's Chat
//! Completions on loopback. Replies are scripted; every prompt and API key it receives is kept.

use std::collections::VecDeque;
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use serde_json::{Value, json};

#[derive(Clone, Debug)]
pub enum Reply {
    Text(String),
    Status(u16),
    /// Answers after a delay (longer than the client's timeout, in the timeout tests).
    Slow(Duration, String),
}

pub fn text(s: &str) -> Reply {
    Reply::Text(s.to_owned())
}

/// Answers a prompt, or leaves it to the script (`None`).
type Responder = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

#[derive(Default)]
struct State {
    responder: Option<Responder>,
    replies: VecDeque<Reply>,
    default: Option<String>,
    prompts: Vec<String>,
    keys: Vec<String>,
}

pub struct FakeLlm {
    state: Arc<Mutex<State>>,
    pub url: String,
    handle: actix_web::dev::ServerHandle,
}

impl FakeLlm {
    pub fn start() -> Self {
        let state = Arc::new(Mutex::new(State::default()));
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let data = web::Data::new(state.clone());
        let server = HttpServer::new(move || {
            App::new()
                .app_data(data.clone())
                .route("/v1/messages", web::post().to(anthropic))
                .route("/v1/chat/completions", web::post().to(openai))
        })
        .listen(listener)
        .expect("listen")
        .workers(1)
        .disable_signals()
        .run();
        let handle = server.handle();
        tokio::spawn(server);
        Self {
            state,
            url: format!("http://127.0.0.1:{port}"),
            handle,
        }
    }

    /// Replies used in order; then `default` (or a 500 when none is set).
    pub fn script(&self, replies: Vec<Reply>) {
        self.state.lock().expect("lock").replies.extend(replies);
    }

    /// Answers each prompt with what `f` makes of it, before any scripted reply; `None`
    /// leaves the prompt to the script.
    pub fn respond_with(&self, f: impl Fn(&str) -> Option<String> + Send + Sync + 'static) {
        self.state.lock().expect("lock").responder = Some(Arc::new(f));
    }

    pub fn always(&self, answer: &str) {
        self.state.lock().expect("lock").default = Some(answer.to_owned());
    }

    pub fn prompts(&self) -> Vec<String> {
        self.state.lock().expect("lock").prompts.clone()
    }

    pub fn keys(&self) -> Vec<String> {
        self.state.lock().expect("lock").keys.clone()
    }
}

impl Drop for FakeLlm {
    fn drop(&mut self) {
        drop(self.handle.stop(false));
    }
}

async fn next_reply(state: &Mutex<State>, req: &HttpRequest, body: &Value) -> Reply {
    let reply = {
        let mut s = state.lock().expect("lock");
        let prompt = body["messages"][0]["content"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        s.prompts.push(prompt);
        let key = req
            .headers()
            .get("x-api-key")
            .or_else(|| req.headers().get("authorization"))
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        s.keys.push(key);
        let prompt = s.prompts.last().cloned().unwrap_or_default();
        if let Some(text) = s.responder.as_ref().and_then(|f| f(&prompt)) {
            return Reply::Text(text);
        }
        s.replies
            .pop_front()
            .or_else(|| s.default.clone().map(Reply::Text))
            .unwrap_or(Reply::Status(500))
    };
    if let Reply::Slow(delay, text) = reply {
        tokio::time::sleep(delay).await;
        return Reply::Text(text);
    }
    reply
}

async fn anthropic(
    req: HttpRequest,
    body: web::Json<Value>,
    state: web::Data<Arc<Mutex<State>>>,
) -> HttpResponse {
    match next_reply(&state, &req, &body).await {
        Reply::Text(t) => HttpResponse::Ok().json(json!({
            "id": "msg_1", "type": "message", "role": "assistant", "model": body["model"],
            "content": [{ "type": "text", "text": t }],
            "stop_reason": "end_turn", "usage": { "input_tokens": 10, "output_tokens": 10 }
        })),
        Reply::Status(code) => HttpResponse::build(actix_web::http::StatusCode::from_u16(code).expect("status"))
            .json(json!({ "type": "error", "error": { "type": "overloaded_error", "message": "Overloaded" } })),
        Reply::Slow(..) => HttpResponse::InternalServerError().finish(),
    }
}

async fn openai(
    req: HttpRequest,
    body: web::Json<Value>,
    state: web::Data<Arc<Mutex<State>>>,
) -> HttpResponse {
    match next_reply(&state, &req, &body).await {
        Reply::Text(t) => HttpResponse::Ok().json(json!({
            "id": "chatcmpl-1", "object": "chat.completion", "model": body["model"],
            "choices": [{ "index": 0, "message": { "role": "assistant", "content": t }, "finish_reason": "stop" }],
            "usage": { "prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20 }
        })),
        Reply::Status(code) => HttpResponse::build(actix_web::http::StatusCode::from_u16(code).expect("status"))
            .json(json!({ "error": { "message": "overloaded", "type": "server_error" } })),
        Reply::Slow(..) => HttpResponse::InternalServerError().finish(),
    }
}
