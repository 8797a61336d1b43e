//! A fake OpenTelemetry collector: takes OTLP/HTTP trace exports (protobuf, `POST
//! /v1/traces`) on loopback, as a real collector does, and keeps every span it receives.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, any_value};
use prost::Message as _;

/// A span as the collector received it; ids in lowercase hex, as backends show them.
#[derive(Clone, Debug)]
pub struct ReceivedSpan {
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    pub name: String,
    /// Each attribute's value as text (an array as its items joined by `,`).
    pub attributes: BTreeMap<String, String>,
    /// The resource's attributes (`service.name`...).
    pub resource: BTreeMap<String, String>,
    pub start_unix_nano: u64,
    pub end_unix_nano: u64,
    /// The status code: 0 unset, 1 ok, 2 error.
    pub status: i32,
}

impl ReceivedSpan {
    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

#[derive(Default)]
struct State {
    spans: Vec<ReceivedSpan>,
    /// Requests that were not a trace export it could read.
    refused: usize,
}

pub struct FakeOtlp {
    state: Arc<Mutex<State>>,
    /// The base URL, as `telemetry.otlp_endpoint` takes it.
    pub url: String,
    handle: actix_web::dev::ServerHandle,
}

impl FakeOtlp {
    pub fn start() -> Self {
        let state = Arc::new(Mutex::new(State::default()));
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let data = web::Data::new(state.clone());
        let server = HttpServer::new(move || {
            App::new()
                .app_data(data.clone())
                .app_data(web::PayloadConfig::new(16 * 1024 * 1024))
                .route("/v1/traces", web::post().to(export))
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

    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.state.lock().expect("lock").spans.clone()
    }

    /// Requests it could not read as an OTLP/HTTP trace export.
    pub fn refused(&self) -> usize {
        self.state.lock().expect("lock").refused
    }
}

impl Drop for FakeOtlp {
    fn drop(&mut self) {
        drop(self.handle.stop(false));
    }
}

async fn export(
    state: web::Data<Arc<Mutex<State>>>,
    req: HttpRequest,
    body: web::Bytes,
) -> HttpResponse {
    let protobuf = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/x-protobuf"));
    let decoded = ExportTraceServiceRequest::decode(body.as_ref());
    let (true, Ok(request)) = (protobuf, decoded) else {
        state.lock().expect("lock").refused += 1;
        return HttpResponse::BadRequest().finish();
    };
    let mut received = Vec::new();
    for resource_spans in request.resource_spans {
        let resource = resource_spans
            .resource
            .map(|r| attributes(&r.attributes))
            .unwrap_or_default();
        for scope in resource_spans.scope_spans {
            for span in scope.spans {
                received.push(ReceivedSpan {
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    name: span.name,
                    attributes: attributes(&span.attributes),
                    resource: resource.clone(),
                    start_unix_nano: span.start_time_unix_nano,
                    end_unix_nano: span.end_time_unix_nano,
                    status: span.status.map_or(0, |s| s.code),
                });
            }
        }
    }
    state.lock().expect("lock").spans.extend(received);
    HttpResponse::Ok()
        .content_type("application/x-protobuf")
        .body(ExportTraceServiceResponse::default().encode_to_vec())
}

fn attributes(
    kvs: &[opentelemetry_proto::tonic::common::v1::KeyValue],
) -> BTreeMap<String, String> {
    kvs.iter()
        .map(|kv| {
            (
                kv.key.clone(),
                kv.value.as_ref().map(text).unwrap_or_default(),
            )
        })
        .collect()
}

fn text(value: &AnyValue) -> String {
    match &value.value {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        Some(any_value::Value::ArrayValue(a)) => {
            a.values.iter().map(text).collect::<Vec<_>>().join(",")
        }
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
