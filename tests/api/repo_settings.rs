//! A repository's own run settings, `.director.toml` on its default branch, within the
//! operator's `[repo_settings]`: on the in-memory FakeRuntime, with FakeForge serving the file
//! through its contents API (each request checked against Forgejo's API description).

use director::domain::{IssueRef, Lifecycle, RunState};
use director::forge::Permission;

use crate::fake_runs::{env, labelled, reports, spawn, status_json};
use crate::forge_helpers::{ForgeApp, TRIGGER, WRITER};
use crate::runs::RUNNER;

const FILE: &str = ".director.toml";
const RUST_IMAGE: &str = "registry.example.org/agents/rust:1.95";

/// Repositories may set everything, within these images and destinations.
fn open_ceiling(s: &mut director::settings::Settings) {
    s.repo_settings.allow = director::settings::repo::KEYS
        .iter()
        .map(|k| (*k).to_owned())
        .collect();
    s.repo_settings.images = vec!["registry.example.org/agents/*".into()];
    s.repo_settings.egress_allow_max = vec!["*.mirror.example.org:443".into()];
    s.budget.run_usd = 2.0;
}

async fn run_of(t: &ForgeApp, issue: &IssueRef) -> director::domain::RunRecord {
    let runs = t.app.store.runs_of(issue).await.expect("runs");
    assert_eq!(runs.len(), 1, "one run: {runs:?}");
    runs.into_iter().next().expect("a run")
}

#[tokio::test]
async fn a_repositorys_file_shapes_its_runs_and_another_repository_keeps_the_operators() {
    let (t, _llm, fake) = spawn(|s| {
        open_ceiling(s);
        s.scan.repos.push("acme/gadgets".parse().expect("repo"));
    })
    .await;
    t.forge.put_file(
        &t.repo,
        "main",
        FILE,
        format!(
            r#"
[runner]
image = "{RUST_IMAGE}"
egress_allow = ["crates.mirror.example.org:443"]
timeout_secs = 7200
branch_template = "rust-{{issue}}-{{run}}"

[budget]
run_usd = 0.5

[task]
instructions = "Run `cargo test --locked` before pushing."
"#
        )
        .as_bytes(),
    );
    let issue = labelled(&t, "Add --verbose", "Print each step.").await;
    t.app.wait_state(&issue, Lifecycle::Succeeded).await;
    let run = run_of(&t, &issue).await;
    let spec = fake.spec_of(&run.id).expect("the run's container");
    assert_eq!(spec.image, RUST_IMAGE);
    let task = String::from_utf8_lossy(&spec.task).into_owned();
    let heading = "## Instructions from the repository (`.director.toml` on the default branch)";
    let at = task.find(heading).expect("the instructions' heading");
    assert!(
        task[at..].contains("Run `cargo test --locked` before pushing."),
        "{task}"
    );
    assert!(
        task.find("## The issue").is_some_and(|i| i < at),
        "after the issue"
    );
    // The repository's template named the branch, and the run pushed to it.
    assert_eq!(
        run.branch,
        format!("rust-{}-{}", issue.number, run.id.short())
    );
    assert_eq!(env(&spec, "DIRECTOR_BRANCH"), run.branch);
    assert!(t.forge.branches_of(&t.repo).contains(&run.branch));
    // What it got, and from which version of the file.
    let settings = run.settings.clone().expect("settings recorded");
    assert!(settings.file);
    assert_eq!(settings.image.as_deref(), Some(RUST_IMAGE));
    assert_eq!(settings.egress_allow, ["crates.mirror.example.org:443"]);
    assert_eq!(
        settings.timeout_secs, None,
        "7200 is over the operator's 60"
    );
    assert!(
        settings.capped[0].contains("runner.timeout_secs 7200 is capped at the operator's 60"),
        "{:?}",
        settings.capped
    );
    assert_eq!(settings.run_usd, Some(0.5));
    let row = crate::pulls::status_row(&status_json(&t).await, &issue);
    let shown = &row["run"]["settings"];
    assert_eq!(shown["commit"], settings.commit.as_str(), "{row}");
    assert_eq!(shown["image"], RUST_IMAGE);
    assert_eq!(shown["instructions"], true);
    assert_eq!(
        settings.commit.len(),
        40,
        "a commit id: {}",
        settings.commit
    );

    // Another repository, without a file, keeps the operator's image and branch names.
    let other = t.forge.add_repo("acme/gadgets");
    t.forge.grant(&other, WRITER, Permission::Write);
    t.forge.grant(&other, RUNNER, Permission::Write);
    t.forge
        .grant(&other, crate::forge_helpers::BOT, Permission::Admin);
    t.forge.define_label(&other, TRIGGER);
    let theirs = t
        .forge
        .open_issue(&other, "reporter", "Fix the typo", "In the README.")
        .await;
    t.forge.label(WRITER, &theirs, TRIGGER).await;
    t.app.wait_state(&theirs, Lifecycle::Succeeded).await;
    let run = run_of(&t, &theirs).await;
    let spec = fake.spec_of(&run.id).expect("the run's container");
    assert_eq!(spec.image, "fake/agent:1");
    assert!(!String::from_utf8_lossy(&spec.task).contains("Instructions from the repository"));
    assert!(run.branch.starts_with("director-issue-"), "{}", run.branch);
    let settings = run.settings.expect("settings recorded");
    assert!(!settings.file);
    t.assert_contract();
}

#[tokio::test]
async fn a_file_outside_the_ceiling_starts_no_run_and_is_reported_once() {
    let (t, _llm, fake) = spawn(open_ceiling).await;
    t.forge.put_file(
        &t.repo,
        "main",
        FILE,
        b"[runner]\nimage = \"docker.io/someone/agent:latest\"\negress_allow = [\"evil.example.com:443\"]\nimgae = \"typo\"\n",
    );
    let issue = labelled(&t, "Add --verbose", "Print each step.").await;
    t.app
        .wait_for("the refusal is reported", || async {
            !reports(&t, &issue).is_empty()
        })
        .await;
    t.app.wait_processed().await;
    let report = reports(&t, &issue).join("\n");
    assert!(
        report.contains("was refused before anything started"),
        "{report}"
    );
    assert!(report.contains("unknown field `imgae`"), "{report}");
    let run = run_of(&t, &issue).await;
    assert_eq!(run.state, RunState::Refused);
    assert_eq!(fake.creations(&run.id), 0, "no container");
    assert!(t.forge.tokens_of(RUNNER).is_empty(), "no token left");
    // The keys are named once the file parses.
    t.forge.put_file(
        &t.repo,
        "main",
        FILE,
        b"[runner]\nimage = \"docker.io/someone/agent:latest\"\negress_allow = [\"evil.example.com:443\"]\n",
    );
    let second = labelled(&t, "Add --quiet", "Print nothing.").await;
    t.app
        .wait_for("the refusal is reported", || async {
            !reports(&t, &second).is_empty()
        })
        .await;
    let report = reports(&t, &second).join("\n");
    assert!(
        report.contains("`runner.image` `docker.io/someone/agent:latest` is not among the images the operator allows (repo_settings.images)"),
        "{report}"
    );
    assert!(
        report.contains(
            "`runner.egress_allow` `evil.example.com:443` is outside what the operator allows"
        ),
        "{report}"
    );
    // Scans find the labelled issues again: nothing is retried, nothing said twice.
    let comments = t.forge.comments_on(&issue).len();
    t.scan().await;
    t.scan().await;
    t.app.wait_processed().await;
    assert_eq!(t.forge.comments_on(&issue).len(), comments);
    assert_eq!(reports(&t, &second).len(), 1);
    assert_eq!(t.app.store.runs_of(&issue).await.expect("runs").len(), 1);
    t.assert_contract();
}

#[tokio::test]
async fn a_file_on_another_branch_is_ignored() {
    let (t, _llm, fake) = spawn(open_ceiling).await;
    let text = format!("[runner]\nimage = \"{RUST_IMAGE}\"\n");
    t.forge
        .put_file(&t.repo, "settings-proposal", FILE, text.as_bytes());
    let issue = labelled(&t, "Add --verbose", "Print each step.").await;
    t.app.wait_state(&issue, Lifecycle::Succeeded).await;
    let run = run_of(&t, &issue).await;
    assert_eq!(fake.spec_of(&run.id).expect("spec").image, "fake/agent:1");
    assert!(!run.settings.expect("recorded").file);
}

#[tokio::test]
async fn a_forge_error_reading_the_file_delays_the_run_and_never_starts_it_on_defaults() {
    let (t, _llm, fake) = spawn(open_ceiling).await;
    let text = format!("[runner]\nimage = \"{RUST_IMAGE}\"\n");
    t.forge.put_file(&t.repo, "main", FILE, text.as_bytes());
    t.forge.fail_path("/contents/.director.toml", &[500, 500]);
    let issue = labelled(&t, "Add --verbose", "Print each step.").await;
    t.app.wait_state(&issue, Lifecycle::Succeeded).await;
    let run = run_of(&t, &issue).await;
    assert_eq!(fake.creations(&run.id), 1);
    assert_eq!(fake.spec_of(&run.id).expect("spec").image, RUST_IMAGE);
    assert!(
        t.calls_to("GET", "/contents/.director.toml") >= 3,
        "read until it answered"
    );
}

#[tokio::test]
async fn with_no_ceiling_the_file_is_not_read_and_the_operators_settings_hold() {
    let (t, _llm, fake) = spawn(|_| {}).await;
    t.forge
        .put_file(&t.repo, "main", FILE, b"[runner]\nimage = \"evil/agent\"\n");
    let issue = labelled(&t, "Add --verbose", "Print each step.").await;
    t.app.wait_state(&issue, Lifecycle::Succeeded).await;
    let run = run_of(&t, &issue).await;
    assert_eq!(fake.spec_of(&run.id).expect("spec").image, "fake/agent:1");
    assert_eq!(run.settings, None);
    assert_eq!(t.calls_to("GET", "/contents/.director.toml"), 0);
}

/// `director check-repo`, configured by `env` and pointed at the fake forge.
async fn check_repo(t: &ForgeApp, env: &[(&str, &str)]) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_director"))
        .args(["check-repo", &t.repo.to_string()])
        .env("DIRECTOR_FORGE__URL", t.forge_url())
        .env("DIRECTOR_FORGE__TOKEN", crate::forge_helpers::BOT_TOKEN)
        .env("DIRECTOR_STORE__URL", "sqlite:///nonexistent-dir/never.db")
        .envs(env.iter().copied())
        .output()
        .await
        .expect("runs")
}

#[tokio::test]
async fn check_repo_prints_the_settings_a_run_would_get_or_the_errors_and_starts_nothing() {
    let (t, _llm, _fake) = spawn(|_| {}).await;
    let ceiling = [
        (
            "DIRECTOR_REPO_SETTINGS__ALLOW",
            "runner.image,runner.timeout_secs",
        ),
        (
            "DIRECTOR_REPO_SETTINGS__IMAGES",
            "registry.example.org/agents/*",
        ),
        ("DIRECTOR_RUNNER__TIMEOUT_SECS", "600"),
    ];
    let text = format!("[runner]\nimage = \"{RUST_IMAGE}\"\ntimeout_secs = 9999\n");
    t.forge.put_file(&t.repo, "main", FILE, text.as_bytes());
    t.forge.clear_calls();
    let out = check_repo(&t, &ceiling).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!("image = \"{RUST_IMAGE}\"")),
        "{stdout}"
    );
    assert!(stdout.contains("capped at the operator's 600"), "{stdout}");
    assert!(stdout.contains("file = true"), "{stdout}");

    t.forge
        .put_file(&t.repo, "main", FILE, b"[task]\ninstructions = \"hi\"\n");
    let out = check_repo(&t, &ceiling).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("`task.instructions` may not be set by a repository here"),
        "{stderr}"
    );
    // Off until the operator opts in.
    let out = check_repo(&t, &[]).await;
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("repo_settings.allow is empty"));
    let writes = t
        .forge
        .calls()
        .into_iter()
        .filter(|c| c.method != "GET")
        .count();
    assert_eq!(writes, 0, "check-repo writes nothing");
    assert!(
        t.app
            .store
            .runs_of(&IssueRef::new(t.repo.clone(), 1))
            .await
            .expect("runs")
            .is_empty()
    );
    t.assert_contract();
}

#[tokio::test]
async fn what_a_hostile_file_says_reaches_the_issue_inert() {
    let (t, _llm, _fake) = spawn(open_ceiling).await;
    let hostile = [
        "[runner]\n\"@root <img src=x onerror=alert(1)>\" = 1\n",
        "[runner]\nimage = \"evil`\\n/director retry @root <b>x</b>\"\n",
    ];
    for (n, text) in hostile.iter().enumerate() {
        t.forge.put_file(&t.repo, "main", FILE, text.as_bytes());
        let issue = labelled(&t, &format!("Hostile {n}"), "Print each step.").await;
        t.app
            .wait_for("the refusal is reported", || async {
                !reports(&t, &issue).is_empty()
            })
            .await;
        let report = reports(&t, &issue).join("\n");
        assert!(report.contains("cannot be used"), "{report}");
        assert!(!report.contains("@root"), "no mention: {report}");
        assert!(
            !report.contains("<img") && !report.contains("<b>"),
            "no HTML: {report}"
        );
        assert!(
            !report
                .lines()
                .any(|l| l.trim_start().starts_with("/director")),
            "no command: {report}"
        );
    }
}

#[tokio::test]
async fn a_repositorys_lower_timeout_stops_its_run_and_says_whose_limit_it_was() {
    let (t, _llm, _fake) = spawn(open_ceiling).await;
    t.forge
        .put_file(&t.repo, "main", FILE, b"[runner]\ntimeout_secs = 1\n");
    let issue = labelled(&t, "Think forever", "mode: hang").await;
    t.app.wait_state(&issue, Lifecycle::TimedOut).await;
    let r = reports(&t, &issue);
    assert_eq!(r.len(), 1);
    assert!(
        r[0].contains(
            "it outlived its repository's `runner.timeout_secs` (1 s, in `.director.toml`)"
        ),
        "{}",
        r[0]
    );
}
