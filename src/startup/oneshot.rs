//! The one-shot commands: `scan --once`, `check-repo`, `preflight --dry-run`.

use std::sync::Arc;

use anyhow::Context;
use tokio::sync::Notify;

use crate::engine::consumer::Consumer;
use crate::engine::decide::Policy;
use crate::engine::scanner::ScanReport;
use crate::preflight::providers;
use crate::settings::Settings;
use crate::store::Store;

use super::parts::{forge_client, scanner};
use super::schedules::replica_name;

/// `director scan --once`: one scan, then everything it found is decided. The actions it
/// calls for (judging triggers, pre-flights) are left in the outbox for `serve` to perform.
pub async fn scan_once(settings: Settings) -> anyhow::Result<ScanReport> {
    let store = Store::connect(&settings.store).await?;
    let forge = forge_client(&settings, None)?.context("forge.url must be set to scan")?;
    let wake = Arc::new(Notify::new());
    let scanner = scanner(&settings, Some(&forge), &store, wake.clone())
        .context("nothing to scan: set scan.repos or scan.orgs")?;
    let report = scanner.scan_once().await?;
    let shared = store.is_shared();
    let mut consumer = Consumer::new(
        store,
        Policy::from_settings(&settings),
        crate::clock::system(),
        wake,
    );
    // Replicas serving the same database decide what was found; this one only if none
    // holds the consumer lease (never a second consumer beside them).
    if shared {
        consumer = consumer.as_replica(&replica_name());
    }
    let drained = consumer.drain().await;
    consumer.hand_over().await;
    drained?;
    Ok(report)
}

/// What `director preflight --dry-run` shows.
pub struct DryRun {
    pub prompt: String,
    pub reading: String,
    pub model: String,
    pub verdict: Option<crate::domain::verdict::Verdict>,
    pub left_out: Vec<String>,
}

/// `director check-repo owner/name`: the settings a run in `repo` would get now from its
/// `.director.toml` within `[repo_settings]`, or why it would get none. Starts nothing.
pub async fn check_repo(
    settings: &Settings,
    repo: &crate::domain::RepoName,
) -> anyhow::Result<Result<crate::domain::RunSettings, crate::engine::act::run::Unusable>> {
    let operator = crate::settings::repo::Operator::new(
        &settings.repo_settings,
        &settings.runner,
        &settings.budget,
        settings.preflight.approval,
    )
    .with_setup_secrets(settings.setup_secret_globs())
    .with_checks(Some(&settings.checks).filter(|c| c.is_set()));
    let forge = forge_client(settings, None)?.context("forge.url must be set")?;
    let default_branch = forge
        .repository(repo)
        .await
        .with_context(|| format!("reading {repo}"))?
        .default_branch;
    crate::engine::act::run::read_repo_settings(forge.as_ref(), &operator, repo, &default_branch)
        .await
}

/// For `director check-repo`: whether a run of `repo` with `run` (its resolved settings)
/// would start warm from a snapshot now, in words; `None` without a `[setup]`. The image is
/// the repository's or `runner.image` (an agent profile's image may differ).
pub async fn setup_warmth(
    settings: &Settings,
    repo: &crate::domain::RepoName,
    run: &crate::domain::RunSettings,
) -> anyhow::Result<Option<String>> {
    let Some(setup) = &run.setup else {
        return Ok(None);
    };
    let image = run
        .image
        .clone()
        .unwrap_or_else(|| settings.runner.image.clone());
    let image_id = match settings.runner.kind {
        crate::settings::RunnerKind::Docker => {
            use crate::runtime::Runtime as _;
            let docker = crate::runtime::docker::DockerRuntime::connect(settings.runner.clone())
                .await
                .context("connecting to the Docker engine")?;
            docker
                .image_id(&image)
                .await
                .unwrap_or_else(|_| image.clone())
        }
        crate::settings::RunnerKind::Kubernetes => image.clone(),
    };
    let forge = forge_client(settings, None)?.context("forge.url must be set")?;
    let extra =
        crate::engine::act::run::key_extra(setup, &settings.setup_secrets, &settings.runner.user);
    let key = crate::engine::act::run::snapshot_key(
        forge.as_ref(),
        repo,
        &run.commit,
        setup,
        &image_id,
        &extra,
    )
    .await?;
    let store = crate::prepared::store::SnapshotStore::new(
        settings.runner.snapshot_root(),
        settings.runner.snapshot_max_mb,
        settings.runner.snapshot_ttl_hours,
    );
    Ok(Some(
        match store.lookup(repo, &key, crate::clock::now_ms()) {
            Some((_, meta)) => format!(
                "warm: snapshot `{key}` ({:.1} MB) for image `{image}`: the next run skips the setup",
                meta.bytes as f64 / (1024.0 * 1024.0)
            ),
            None => format!(
                "cold: no snapshot `{key}` for image `{image}` yet: the next run runs the setup (`{}`)",
                setup.command
            ),
        },
    ))
}

/// `director preflight owner/repo#N --dry-run`: reads the issue, builds the prompt, asks the
/// provider; writes nothing to Forgejo and nothing to the database.
pub async fn preflight_dry_run(
    settings: Settings,
    issue: crate::domain::IssueRef,
) -> anyhow::Result<DryRun> {
    let forge = forge_client(&settings, None)?.context("forge.url must be set")?;
    let bot = match forge.current_user().await {
        Ok(login) => Some(login),
        Err(_) => settings.forge.bot_login.clone(),
    };
    let provider: Arc<dyn crate::preflight::Preflight> =
        Arc::from(providers::from_settings(&settings.preflight)?);
    let template = crate::engine::act::preflight::load_template(&settings.preflight)?;
    let with = crate::engine::act::preflight::Gatherer {
        forge: forge.as_ref(),
        acts: None,
        template: &template,
        automation_accounts: &settings.preflight.automation_accounts,
        bot: bot.as_deref(),
        // The operator asked to see this issue read; nothing is acted on.
        read_unvouched: true,
    };
    let gathered = crate::engine::act::preflight::gather_with(&with, &issue, 0, None).await?;
    let reading = provider.read(&gathered.prompt.text).await?;
    Ok(DryRun {
        prompt: gathered.prompt.text,
        verdict: crate::domain::verdict::parse(&reading.text),
        reading: reading.text,
        model: reading.model,
        left_out: gathered
            .left_out
            .iter()
            .map(|l| format!("@{} (comment {})", l.author, l.comment_id))
            .collect(),
    })
}
