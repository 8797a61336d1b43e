//! Agents by name (`[agents.<name>]`): the operator's default, a repository's choice within
//! the ceiling, a writer's `agent:<name>` label; a reader's label ignored, an unknown name
//! refused in the GO comment and at the start. On the in-memory FakeRuntime with FakeForge.

use std::collections::BTreeMap;

use director::domain::{IssueRef, Lifecycle, RunState};
use director::settings::agents::AgentSettings;

use crate::fake_runs::{env, reports, spawn, status_json};
use crate::forge_helpers::{ForgeApp, TRIGGER, WRITER};

fn agents(s: &mut director::settings::Settings) {
    s.agents.insert(
        "claude-code".into(),
        AgentSettings {
            image: "fake/claude-code:2".into(),
            max_turns: Some(7),
            env: BTreeMap::from([(
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC".into(),
                "1".into(),
            )]),
            ..AgentSettings::default()
        },
    );
    s.agents.insert(
        "aider".into(),
        AgentSettings {
            image: "fake/aider:0.86".into(),
            command: vec!["aider-run".into(), "--yes".into()],
            env: BTreeMap::from([("AIDER_MODEL".into(), "openai/gpt-5".into())]),
            ..AgentSettings::default()
        },
    );
    s.runner.agent = "claude-code".into();
}

/// An issue opened by the reporter, labelled `agent_label` by `by`, then given the trigger
/// by a writer.
async fn labelled_for(t: &ForgeApp, by: &str, agent_label: &str) -> IssueRef {
    labelled_with(t, by, agent_label, "Print each step.").await
}

/// The same, with `body` (the fake agent's `mode:` and `result:`).
async fn labelled_with(t: &ForgeApp, by: &str, agent_label: &str, body: &str) -> IssueRef {
    t.forge.define_label(&t.repo, agent_label);
    let issue = t
        .forge
        .open_issue(&t.repo, "reporter", "Add --verbose", body)
        .await;
    t.forge.label(by, &issue, agent_label).await;
    t.forge.label(WRITER, &issue, TRIGGER).await;
    issue
}

async fn only_run(t: &ForgeApp, issue: &IssueRef) -> director::domain::RunRecord {
    let runs = t.app.store.runs_of(issue).await.expect("runs");
    assert_eq!(runs.len(), 1, "one run: {runs:?}");
    runs.into_iter().next().expect("a run")
}

#[tokio::test]
async fn a_writers_agent_label_gives_the_run_that_agent_and_every_report_names_it() {
    let (t, _llm, fake) = spawn(agents).await;
    let issue = labelled_for(&t, WRITER, "agent:aider").await;
    t.app.wait_state(&issue, Lifecycle::Succeeded).await;
    t.app.wait_processed().await;
    let run = only_run(&t, &issue).await;
    let spec = fake.spec_of(&run.id).expect("the run's container");
    assert_eq!(spec.image, "fake/aider:0.86");
    assert_eq!(spec.command, ["aider-run", "--yes"]);
    assert_eq!(env(&spec, "AIDER_MODEL"), "openai/gpt-5");
    assert_eq!(env(&spec, "DIRECTOR_AGENT"), "aider");
    assert_eq!(
        env(&spec, "DIRECTOR_MAX_TURNS"),
        "",
        "aider's profile sets none"
    );
    let chosen = run.agent.clone().expect("the agent recorded");
    assert_eq!(chosen.name, "aider");

    // Named in the GO comment, the report, the pull request and the status.
    let go = t.preflight_comment(&issue);
    assert!(
        go.contains(&format!(
            "Agent: `aider` (the label `agent:aider` by @\u{200B}{WRITER})."
        )),
        "{go}"
    );
    let report = reports(&t, &issue).join("\n");
    assert!(report.contains("Agent: `aider`"), "{report}");
    let pulls = t.forge.pulls_of(&t.repo);
    let body = &pulls[0].4;
    assert!(body.contains("Agent: `aider`"), "{body}");
    let row = crate::pulls::status_row(&status_json(&t).await, &issue);
    assert_eq!(row["run"]["agent"]["name"], "aider", "{row}");
    assert_eq!(row["run"]["agent"]["from"], "label", "{row}");
    assert_eq!(row["run"]["agent"]["by"], WRITER, "{row}");
}

#[tokio::test]
async fn a_readers_agent_label_is_ignored_and_the_operators_default_runs() {
    let (t, _llm, fake) = spawn(agents).await;
    // The reporter (read access) labels: the operator's default still runs.
    let issue = labelled_for(&t, "reporter", "agent:aider").await;
    t.app.wait_state(&issue, Lifecycle::Succeeded).await;
    let run = only_run(&t, &issue).await;
    let spec = fake.spec_of(&run.id).expect("the run's container");
    assert_eq!(spec.image, "fake/claude-code:2");
    assert!(spec.command.is_empty(), "the image's entry point");
    assert_eq!(env(&spec, "DIRECTOR_AGENT"), "claude-code");
    assert_eq!(env(&spec, "DIRECTOR_MAX_TURNS"), "7");
    assert_eq!(env(&spec, "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"), "1");
    assert_eq!(env(&spec, "AIDER_MODEL"), "");
    let go = t.preflight_comment(&issue);
    assert!(
        go.contains("Agent: `claude-code` (the operator's default, `runner.agent`)."),
        "{go}"
    );
    // Said in the log only: nothing on the issue names the reader's label.
    assert!(!go.contains("agent:aider"), "{go}");
}

#[tokio::test]
async fn an_unknown_agent_is_refused_in_the_comment_and_no_container_starts() {
    let (t, _llm, fake) = spawn(agents).await;
    let issue = labelled_for(&t, WRITER, "agent:gpt-engineer").await;
    let go = {
        crate::helpers::wait_on_engine(
            &t.app.settled,
            "the GO comment",
            std::time::Duration::from_secs(20),
            || async {
                t.forge
                    .comments_on(&issue)
                    .iter()
                    .any(|c| c.body.starts_with("<!-- director:preflight"))
            },
        )
        .await;
        t.preflight_comment(&issue)
    };
    assert!(go.contains("No run can start as asked"), "{go}");
    assert!(go.contains("`agent:gpt-engineer`"), "{go}");
    assert!(go.contains("allowed: `aider`, `claude-code`"), "{go}");
    // The start refuses it, says why on the issue, and makes nothing.
    t.app.wait_state(&issue, Lifecycle::Failed).await;
    t.app.wait_processed().await;
    let run = only_run(&t, &issue).await;
    assert_eq!(run.state, RunState::Refused);
    assert_eq!(fake.creations(&run.id), 0, "no container");
    let report = reports(&t, &issue).join("\n");
    assert!(
        report.contains("was refused before anything started")
            && report.contains("allowed: `aider`, `claude-code`"),
        "{report}"
    );
}

#[tokio::test]
async fn a_repository_chooses_among_the_agents_the_operator_allows_it() {
    let (t, _llm, fake) = spawn(|s| {
        agents(s);
        s.repo_settings.allow = vec!["runner.agent".into()];
        s.repo_settings.agents = vec!["aider".into()];
    })
    .await;
    t.forge.put_file(
        &t.repo,
        "main",
        ".director.toml",
        b"[runner]\nagent = \"aider\"\n",
    );
    let issue = crate::fake_runs::labelled(&t, "Add --verbose", "Print each step.").await;
    t.app.wait_state(&issue, Lifecycle::Succeeded).await;
    let run = only_run(&t, &issue).await;
    let spec = fake.spec_of(&run.id).expect("the run's container");
    assert_eq!(spec.image, "fake/aider:0.86");
    assert_eq!(
        run.agent.map(|a| a.describe()).as_deref(),
        Some("`aider` (the repository's `.director.toml`)")
    );
    let go = t.preflight_comment(&issue);
    assert!(
        go.contains("Agent: `aider` (the repository's `.director.toml`)."),
        "{go}"
    );

    // One it may not choose is refused, naming the ones it may.
    t.forge.put_file(
        &t.repo,
        "main",
        ".director.toml",
        b"[runner]\nagent = \"claude-code\"\n",
    );
    let second = crate::fake_runs::labelled(&t, "Add --quiet", "Print less.").await;
    t.app.wait_state(&second, Lifecycle::Failed).await;
    t.app.wait_processed().await;
    let report = reports(&t, &second).join("\n");
    assert!(
        report.contains("`runner.agent` `claude-code` is not among the agents the operator allows repositories (repo_settings.agents: `aider`)"),
        "{report}"
    );
}

#[tokio::test]
async fn a_writers_label_naming_an_agent_the_repository_may_not_use_is_refused() {
    // The operator lets this repository use `aider` alone; `claude-code` is the operator's
    // default and is configured, but a writer's label cannot pick it past the list.
    let (t, _llm, fake) = spawn(|s| {
        agents(s);
        s.repo_settings.allow = vec!["runner.agent".into()];
        s.repo_settings.agents = vec!["aider".into()];
        s.runner.agent = "aider".into();
    })
    .await;
    let issue = labelled_for(&t, WRITER, "agent:claude-code").await;
    t.app.wait_state(&issue, Lifecycle::Failed).await;
    t.app.wait_processed().await;
    let go = t.preflight_comment(&issue);
    assert!(go.contains("No run can start as asked"), "{go}");
    assert!(
        go.contains("`agent:claude-code`") && go.contains("repo_settings.agents: `aider`"),
        "{go}"
    );
    // Refused at the start too, said once, and the default is not run in its place.
    let run = only_run(&t, &issue).await;
    assert_eq!(run.state, RunState::Refused);
    assert_eq!(fake.creations(&run.id), 0, "no container");
    assert_eq!(run.agent, None, "no agent chosen in its place");
    let reports = reports(&t, &issue);
    let refusals = reports
        .iter()
        .filter(|r| r.contains("was refused before anything started"))
        .count();
    assert_eq!(refusals, 1, "{reports:?}");
    assert!(
        reports.join("\n").contains("repo_settings.agents: `aider`"),
        "{reports:?}"
    );
}

/// A profile variable a run may print: a secret of the operator's, like a pass-through.
const PROFILE_SECRET: &str = "dsk-live-7f3a9c0e5b21";

#[tokio::test]
async fn a_profiles_env_values_are_redacted_in_the_transcript_report_and_pull_request() {
    let (t, _llm, _fake) = spawn(|s| {
        agents(s);
        if let Some(aider) = s.agents.get_mut("aider") {
            aider
                .env
                .insert("AGENT_SECRET".into(), PROFILE_SECRET.into());
        }
    })
    .await;
    // A run that prints the value and fails: its report, log tail and transcript.
    let leaky = labelled_with(&t, WRITER, "agent:aider", "mode: leak-env").await;
    t.app.wait_state(&leaky, Lifecycle::Failed).await;
    t.app.wait_processed().await;
    let run = only_run(&t, &leaky).await;
    let report = reports(&t, &leaky).join("\n");
    assert!(report.contains("my key is [redacted]"), "{report}");
    assert!(
        run.log_tail
            .as_deref()
            .is_some_and(|l| l.contains("my key is [redacted]") && !l.contains(PROFILE_SECRET)),
        "{:?}",
        run.log_tail
    );
    if let Some(transcript) = t.app.store.transcript(&run.id).await.expect("store") {
        assert!(
            !transcript.text.contains(PROFILE_SECRET),
            "{}",
            transcript.text
        );
    }
    // A run that writes it into its summary: the pull request's body.
    let summed = labelled_with(
        &t,
        WRITER,
        "agent:aider",
        "Print each step.\n\nresult: done summary: secret-env",
    )
    .await;
    t.app.wait_state(&summed, Lifecycle::Succeeded).await;
    t.app.wait_processed().await;
    let pulls = t.forge.pulls_of(&t.repo);
    let body = &pulls.last().expect("a pull request").4;
    assert!(body.contains("Used [redacted]"), "{body}");
    for c in t
        .forge
        .comments_on(&leaky)
        .into_iter()
        .chain(t.forge.comments_on(&summed))
    {
        assert!(!c.body.contains(PROFILE_SECRET), "{}", c.body);
    }
}
