//! Real coding agents, installed unmodified from their own packages into Debian images built
//! here without a registry (`tests/agents/build.sh`: mmdebstrap, the agent from PyPI, the
//! examples' entrypoint; cached), each run confined on the real Docker engine through the git
//! and model gateways, against a scripted provider that plays the model's turns in the
//! agent's own protocol. Each must end in a pull request with the change it was asked for,
//! its usage metered exactly, its transcript kept as it ran and free of secrets.

use std::process::Command;

use director::domain::{IssueRef, Lifecycle};
use director::settings::{ProviderSettings, Secret};
use director_testkit::provider::{FakeProvider, Turn};
use serde_json::{Value, json};

use crate::forge_helpers::ForgeApp;
use crate::runs::{labelled, run_comments, spawn_runs};

/// The agent's image, built once per content.
fn image(agent: &str) -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/agents/build.sh");
    let out = Command::new("bash")
        .args([script, agent])
        .output()
        .expect("bash runs");
    assert!(
        out.status.success(),
        "the {agent} image builds: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// A network of the test's own, removed after it.
struct Network(String);

impl Drop for Network {
    fn drop(&mut self) {
        let _ = Command::new("docker")
            .args(["network", "rm", &self.0])
            .output();
    }
}

struct Setup {
    t: ForgeApp,
    provider: FakeProvider,
    _llm: director_testkit::llm::FakeLlm,
    _network: Network,
    _git: tempfile::TempDir,
}

/// The director with `image` as its runs' image, confined, and the provider behind `[models]`
/// (`anthropic` or `openai`).
async fn setup(image: String, openai: bool) -> Setup {
    setup_with(image, openai, |_| {}).await
}

async fn setup_with(
    image: String,
    openai: bool,
    configure: impl FnOnce(&mut director::settings::Settings),
) -> Setup {
    let provider = FakeProvider::start();
    let network = Network(format!(
        "director-agents-test-{:08x}",
        rand::random::<u32>()
    ));
    let (name, url, key) = (
        network.0.clone(),
        provider.url.clone(),
        provider.key.clone(),
    );
    let (t, llm) = spawn_runs(|s| {
        s.runner.image = image;
        s.runner.command = Vec::new();
        crate::egress::confine(s, &name);
        // What a real agent needs: room to start its runtime, and time.
        s.runner.memory_mb = 2048;
        s.runner.tmp_mb = Some(256);
        s.runner.pids_limit = 512;
        s.runner.timeout_secs = 240;
        let provider = ProviderSettings {
            base_url: if openai { format!("{url}/v1") } else { url },
            api_key: Secret::new(key),
            api_key_file: None,
        };
        if openai {
            s.models.openai = Some(provider);
        } else {
            s.models.anthropic = Some(provider);
        }
        configure(s);
    })
    .await;
    let root = tempfile::tempdir().expect("dir");
    t.forge.serve_git(&t.repo, root.path()).expect("git serves");
    Setup {
        t,
        provider,
        _llm: llm,
        _network: network,
        _git: root,
    }
}

/// Runs one labelled issue to its end and checks what every real agent must deliver: a pull
/// request holding `VERBOSE.md` as asked, the usage the gateway metered equal to what the
/// provider reported for the calls it answered, and a transcript with the agent's output and
/// none of the run's secrets.
async fn delivers(s: &Setup, agent: &str) -> IssueRef {
    let issue = labelled(
        &s.t,
        "Add a verbose flag",
        "Create VERBOSE.md holding the line `verbose: true`.",
    )
    .await;
    let ended = |r: &director::store::IssueRecord| {
        !matches!(
            r.lifecycle,
            Lifecycle::Untracked
                | Lifecycle::Pending
                | Lifecycle::Queued
                | Lifecycle::Launching
                | Lifecycle::Running
        )
    };
    // A real agent takes its time: polled on the engine's signal, up to five minutes, and on
    // failure what it printed is shown.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(300);
    let mut steps = s.t.app.settled.watch();
    let record = loop {
        steps.borrow_and_update();
        let record = s.t.record(&issue).await;
        if let Some(r) = record.filter(|r| ended(r)) {
            break r;
        }
        if tokio::time::Instant::now() > deadline {
            let runs = s.t.app.store.runs_of(&issue).await.expect("runs");
            let id = runs.last().map(|r| r.id.clone()).expect("a run");
            let text =
                s.t.app
                    .store
                    .transcript(&id)
                    .await
                    .ok()
                    .flatten()
                    .map(|t| t.text);
            panic!(
                "{agent} did not end: {text:?}\n{:?}",
                s.provider.requests().len()
            );
        }
        // The run's end is the engine's step; the container's own progress is not, so the
        // wait also wakes each second.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(1), steps.changed()).await;
    };
    let runs = s.t.app.store.runs_of(&issue).await.expect("runs");
    let Some(run) = runs.last() else {
        panic!(
            "{agent}: no run ({:?}, {:?}): {:?}",
            record.lifecycle,
            record.preflight.last_error,
            s.t.forge
                .comments_on(&issue)
                .iter()
                .map(|c| &c.body)
                .collect::<Vec<_>>()
        );
    };
    let transcript =
        s.t.app
            .store
            .transcript(&run.id)
            .await
            .expect("store")
            .map(|t| t.text)
            .unwrap_or_default();
    assert_eq!(
        record.lifecycle,
        Lifecycle::Succeeded,
        "{agent}: {:?}\n{transcript}",
        run_comments(&s.t, &issue)
    );
    assert_eq!(
        s.t.forge
            .git_show(&s.t.repo, &run.branch, "VERBOSE.md")
            .as_deref()
            .map(str::trim),
        Some("verbose: true"),
        "{agent}: the change asked for\n{transcript}"
    );
    assert_eq!(
        s.t.forge.pulls_of(&s.t.repo).len(),
        1,
        "{agent}: one pull request"
    );
    // Metered exactly: every call the provider answered, at the tokens it reported.
    let calls = s
        .provider
        .requests()
        .iter()
        .filter(|(path, _)| path == "/v1/messages" || path == "/v1/chat/completions")
        .count() as u64;
    assert!(calls >= 1, "{agent}: the model was called");
    let usage =
        s.t.app
            .store
            .run_usage(&run.id)
            .await
            .expect("store")
            .expect("usage");
    assert_eq!(
        (usage.requests, usage.input_tokens, usage.output_tokens),
        (calls, calls * 1000, calls * 100),
        "{agent}: metered as the provider reported"
    );
    // The transcript holds the entrypoint's and the agent's output, and no secret.
    assert!(
        transcript.contains("entrypoint: running the agent")
            && transcript.contains("entrypoint: pushed"),
        "{agent}: {transcript}"
    );
    assert!(
        !transcript.contains(&s.provider.key),
        "{agent}: the provider's key"
    );
    let model_key = format!("director-{}.", run.id);
    assert!(
        !transcript.contains(&model_key),
        "{agent}: the run's model key: {transcript}"
    );
    issue
}

/// The last message of a request, as the agent sent it.
fn last_message(request: &Value) -> &Value {
    request["messages"]
        .as_array()
        .and_then(|m| m.last())
        .unwrap_or(&Value::Null)
}

/// Whether the request offers a tool named `name`, in either provider's shape.
fn offers(request: &Value, name: &str) -> bool {
    request["tools"].as_array().is_some_and(|tools| {
        tools
            .iter()
            .any(|t| t["name"] == name || t["function"]["name"] == name)
    })
}

#[tokio::test]
async fn claude_code_unmodified_ends_in_a_pull_request_metered_exactly() {
    // Given by name, as its example profile (examples/claude-code/agent.toml) gives it: its
    // provider alone, and its own turn limit.
    let s = setup_with(image("claude-code"), false, |s| {
        let image = std::mem::take(&mut s.runner.image);
        s.agents.insert(
            "claude-code".into(),
            director::settings::agents::AgentSettings {
                image,
                providers: vec!["anthropic".into()],
                max_turns: Some(5),
                ..Default::default()
            },
        );
        s.runner.agent = "claude-code".into();
    })
    .await;
    // Anthropic's tool use: write the file, then, given the tool's result, say what was done.
    s.provider.script(|_, request| {
        let last = last_message(request);
        let answered = last["content"]
            .as_array()
            .is_some_and(|c| c.iter().any(|b| b["type"] == "tool_result"));
        Some(if answered {
            Turn {
                text: "Added `VERBOSE.md` with `verbose: true`.".into(),
                ..Turn::default()
            }
        } else if offers(request, "Write") {
            Turn {
                text: String::new(),
                tool_calls: vec![(
                    "Write".into(),
                    json!({ "file_path": "/workspace/checkout/VERBOSE.md", "content": "verbose: true\n" }),
                )],
            }
        } else {
            Turn {
                text: "ok".into(),
                ..Turn::default()
            }
        })
    });
    let issue = delivers(&s, "claude-code").await;
    s.t.app.wait_processed().await;
    let runs = s.t.app.store.runs_of(&issue).await.expect("runs");
    let run = runs.last().expect("a run");
    assert_eq!(
        run.agent.as_ref().map(|a| a.name.as_str()),
        Some("claude-code")
    );
    let report = run_comments(&s.t, &issue).join("\n");
    assert!(report.contains("Agent: `claude-code`"), "{report}");
}

/// How many tool results the agent has sent back (OpenAI's `tool` messages).
fn tool_results(request: &Value) -> usize {
    request["messages"]
        .as_array()
        .map_or(0, |m| m.iter().filter(|m| m["role"] == "tool").count())
}

#[tokio::test]
async fn mini_swe_agent_unmodified_ends_in_a_pull_request_metered_exactly() {
    let s = setup(image("mini-swe-agent"), true).await;
    // OpenAI's tool calls to its one `bash` tool: write the file, then its own way to finish.
    s.provider.script(|_, request| {
        let command = if tool_results(request) == 0 {
            "printf 'verbose: true\\n' > VERBOSE.md"
        } else {
            "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
        };
        Some(Turn {
            text: "Writing the file.".into(),
            tool_calls: vec![("bash".into(), json!({ "command": command }))],
        })
    });
    delivers(&s, "mini-swe-agent").await;
}

#[tokio::test]
async fn aider_unmodified_ends_in_a_pull_request_metered_exactly() {
    let s = setup(image("aider"), true).await;
    // aider edits in text: a search and replace block, empty search for a new file.
    s.provider.script(|_, _| {
        Some(Turn {
            text: "VERBOSE.md\n```\n<<<<<<< SEARCH\n=======\nverbose: true\n>>>>>>> REPLACE\n```\n"
                .into(),
            ..Turn::default()
        })
    });
    let issue = delivers(&s, "aider").await;
    // Its chat history stayed out of the commit, and it left .gitignore alone.
    let runs = s.t.app.store.runs_of(&issue).await.expect("runs");
    let branch = &runs.last().expect("a run").branch;
    assert_eq!(
        s.t.forge
            .git_show(&s.t.repo, branch, ".aider.chat.history.md"),
        None
    );
    assert_eq!(
        s.t.forge.git_show(&s.t.repo, branch, ".gitignore"),
        s.t.forge.git_show(&s.t.repo, "main", ".gitignore")
    );
}

#[test]
fn each_example_dockerfile_sets_what_its_tested_image_sets_and_uses_the_shared_entrypoint() {
    let examples = concat!(env!("CARGO_MANIFEST_DIR"), "/examples");
    for agent in ["claude-code", "aider", "mini-swe-agent", "codex"] {
        let read = |name: &str| {
            std::fs::read_to_string(format!("{examples}/{agent}/{name}"))
                .unwrap_or_else(|e| panic!("{agent}/{name}: {e}"))
        };
        let dockerfile = read("Dockerfile");
        let mut set: Vec<&str> = dockerfile
            .lines()
            .filter_map(|l| l.strip_prefix("ENV "))
            .filter(|l| !l.starts_with("PATH="))
            .collect();
        let env = read("image.env");
        let mut tested: Vec<&str> = env
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .collect();
        set.sort_unstable();
        tested.sort_unstable();
        assert_eq!(
            set, tested,
            "{agent}: the Dockerfile's variables are image.env's"
        );
        assert!(
            dockerfile.contains(
                "COPY entrypoint/director-entrypoint.sh /usr/local/bin/director-entrypoint"
            ) && dockerfile.contains("USER 1000:1000"),
            "{agent}"
        );
    }
}
