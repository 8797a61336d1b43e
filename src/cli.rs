//! The `director` command line: parse arguments, start telemetry, run the verb. In the
//! library rather than the binary so that its code is built once, with the rest, and the
//! binary is a call into it.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::settings::{LogFormat, Settings};
use crate::startup::Application;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "director",
    version,
    about = "Hands labelled Forgejo issues to coding agents, safely"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the service: webhook intake, consumer, scan.
    Serve {
        #[arg(long, env = "DIRECTOR_CONFIG")]
        config: Option<PathBuf>,
        /// Log format; overrides `server.log_format`.
        #[arg(long, value_parser = ["json", "pretty"])]
        log_format: Option<String>,
    },
    /// Validate the configuration and print it, secrets masked.
    CheckConfig {
        #[arg(long, env = "DIRECTOR_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Scan the watched repositories for labelled issues, process what was found, and exit.
    Scan {
        /// Scan once and exit (the only mode; `serve` scans on its schedule).
        #[arg(long, required = true)]
        once: bool,
        #[arg(long, env = "DIRECTOR_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Read a repository's `.director.toml` and print the settings its runs would get within
    /// `[repo_settings]`, or why the file cannot be used. Starts nothing.
    CheckRepo {
        /// The repository, as owner/name.
        repo: String,
        #[arg(long, env = "DIRECTOR_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Run the pre-flight on one issue and print the read and the verdict.
    Preflight {
        /// The issue, as owner/repo#N.
        issue: String,
        /// Write nothing to Forgejo or the database (required: the service runs real ones).
        #[arg(long, required = true)]
        dry_run: bool,
        #[arg(long, env = "DIRECTOR_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Create, repair or check the webhook of every watched repository.
    Hooks {
        #[command(subcommand)]
        action: HooksAction,
    },
    /// What the agents delivered over a window: issues, verdicts, runs, pull requests,
    /// merges and reverts, cost and time; in total, per repository and per agent.
    Report {
        /// The window: `30d` (days, at most 3650).
        #[arg(long, default_value = "30d")]
        since: String,
        /// Only this repository (owner/name).
        #[arg(long)]
        repo: Option<String>,
        #[arg(long, default_value = "table", value_parser = ["table", "json", "csv"])]
        format: String,
        #[arg(long, env = "DIRECTOR_CONFIG")]
        config: Option<PathBuf>,
    },
    /// The snapshots of prepared workspaces (`[setup]`) kept for warm starts.
    Snapshots {
        #[command(subcommand)]
        action: SnapshotsAction,
    },
    /// Print the tracked issues: state, who applied the trigger, last change.
    Status {
        /// One JSON array, an object per issue.
        #[arg(long)]
        json: bool,
        #[arg(long, env = "DIRECTOR_CONFIG")]
        config: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum SnapshotsAction {
    /// Every snapshot: repository, key, size, when made and last used.
    List {
        #[arg(long, env = "DIRECTOR_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Removes what is older than `runner.snapshot_ttl_hours`, then the least recently used
    /// until all fit in `runner.snapshot_max_mb` (as the director does after keeping one);
    /// `--all` removes every snapshot.
    Prune {
        #[arg(long)]
        all: bool,
        #[arg(long, env = "DIRECTOR_CONFIG")]
        config: Option<PathBuf>,
    },
}

/// `director snapshots list|prune`.
fn snapshots(action: SnapshotsAction) -> ExitCode {
    let (config, prune, all) = match action {
        SnapshotsAction::List { config } => (config, false, false),
        SnapshotsAction::Prune { config, all } => (config, true, all),
    };
    let settings = match load(config.as_ref()) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let r = &settings.runner;
    let store = crate::prepared::store::SnapshotStore::new(
        r.snapshot_root(),
        if all { 0 } else { r.snapshot_max_mb },
        if all { 0 } else { r.snapshot_ttl_hours },
    );
    let now = crate::clock::now_ms();
    let when = |ms: i64| {
        chrono::DateTime::from_timestamp_millis(ms)
            .map(|t| t.format("%Y-%m-%d %H:%M").to_string())
            .unwrap_or_default()
    };
    let shown = if prune {
        store.prune(now)
    } else {
        store.list()
    };
    let verb = if prune { "removed" } else { "kept" };
    println!(
        "{} snapshot(s) {verb} in {}",
        shown.len(),
        store.dir().display()
    );
    for m in &shown {
        println!(
            "  {}  {}  {:>8.1} MB  made {}  used {}  `{}`",
            m.repo,
            crate::domain::setup::short(&m.key),
            m.bytes as f64 / (1024.0 * 1024.0),
            when(m.created_ms),
            when(m.used_ms),
            m.command
        );
    }
    ExitCode::SUCCESS
}

#[derive(Subcommand)]
enum HooksAction {
    /// Create the hook where it is missing and repair one that is inactive or lacks an
    /// event; hooks with other URLs are never touched. A second run changes nothing.
    Install {
        #[arg(long, env = "DIRECTOR_CONFIG")]
        config: Option<PathBuf>,
        /// Delete and recreate the director's hooks with the first of `webhook.secrets`
        /// (Forgejo cannot change a hook's secret in place).
        #[arg(long)]
        rotate_secret: bool,
    },
    /// Report missing and drifted hooks; exit 1 when there are any.
    Check {
        #[arg(long)]
        json: bool,
        #[arg(long, env = "DIRECTOR_CONFIG")]
        config: Option<PathBuf>,
    },
}

/// `director hooks install|check`.
fn hooks(action: HooksAction) -> ExitCode {
    let (config, install, rotate, json) = match action {
        HooksAction::Install {
            config,
            rotate_secret,
        } => (config, true, rotate_secret, false),
        HooksAction::Check { json, config } => (config, false, false, json),
    };
    let settings = match load(config.as_ref()) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let secret = match hooks_secret(&settings) {
        Ok(secret) => secret,
        Err(code) => return code,
    };
    let _ = rustls::crypto::ring::default_provider().install_default();
    let forge = match crate::startup::forge_client(&settings, None) {
        Ok(Some(f)) => f,
        Ok(None) => return refuse_key("forge.url", "required by `director hooks`"),
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::from(2);
        }
    };
    // The hooks prove themselves before their bodies are read: with `webhook.authorization`,
    // or with a token derived from the secret they sign with.
    let authorization = if settings.webhook.authorization.is_empty() {
        crate::settings::Secret::new(crate::forge::signature::hook_token(secret.expose()))
    } else {
        settings.webhook.authorization.clone()
    };
    let install = install.then_some((&secret, &authorization, rotate));
    let mut attention = false;
    let code = run_async(async {
        let rows = hook_rows(forge.as_ref(), &settings, install).await;
        // `install` fails for what it could not do; `check` for anything that needs a
        // person (a runner that would defeat the approval gate among it).
        attention = rows.iter().any(|r| {
            if install.is_some() {
                matches!(r.outcome, crate::hooks::Outcome::Failed { .. })
            } else {
                r.outcome.needs_attention() || r.runner.is_some()
            }
        });
        if json {
            println!("{}", serde_json::to_string_pretty(&rows)?);
        } else {
            print!("{}", crate::hooks::render(&rows));
        }
        // Beside the hooks (on stderr under --json, whose stdout is the rows alone).
        if install.is_none()
            && let Some(said) = crate::hooks::host_services(&settings).await
        {
            if json {
                eprintln!("host services: {said}");
            } else {
                println!("host services: {said}");
            }
        }
        Ok(())
    });
    if code != ExitCode::SUCCESS {
        return code;
    }
    if attention {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// Exit status 2, naming the configuration key that is wrong and why.
fn refuse_key(key: &str, why: &str) -> ExitCode {
    eprintln!("error: configuration key `{key}`: {why}");
    ExitCode::from(2)
}

/// The secret the hooks are signed with, once the settings `director hooks` needs are there
/// (or exit status 2 naming the first that is not).
fn hooks_secret(settings: &Settings) -> Result<crate::settings::Secret, ExitCode> {
    if settings.forge.kind == crate::settings::ForgeKind::Github {
        return Err(refuse_key(
            "forge.kind",
            "`director hooks` manages Forgejo repository webhooks; a GitHub App has one webhook, set in the App's settings (Webhook URL: this director's /webhooks/github, with a secret from webhook.secrets)",
        ));
    }
    if settings.webhook.public_url.is_empty() {
        return Err(refuse_key(
            "webhook.public_url",
            "required by `director hooks`: the URL Forgejo posts to, e.g. https://director.example.org/webhooks/forgejo",
        ));
    }
    let Some(secret) = settings.webhook.secrets.first().cloned() else {
        return Err(refuse_key(
            "webhook.secrets",
            "required by `director hooks`: the hooks are signed with the first",
        ));
    };
    if settings.scan.repos.is_empty() && settings.scan.orgs.is_empty() {
        return Err(refuse_key(
            "scan.repos",
            "nothing is watched: set scan.repos or scan.orgs",
        ));
    }
    Ok(secret)
}

/// Each watched repository's hook, checked, or installed with `install` (the secret, the
/// authorization, and whether to rotate); and, when runs are configured, a runner account
/// that would defeat the approval gate there.
async fn hook_rows(
    forge: &dyn crate::forge::Forge,
    settings: &Settings,
    install: Option<(&crate::settings::Secret, &crate::settings::Secret, bool)>,
) -> Vec<crate::hooks::RepoHook> {
    let url = &settings.webhook.public_url;
    let (repos, mut rows) =
        crate::hooks::watched(forge, &settings.scan.repos, &settings.scan.orgs).await;
    for repo in repos {
        let outcome = match install {
            Some((secret, authorization, rotate)) => {
                crate::hooks::install_repo(forge, &repo, url, secret, Some(authorization), rotate)
                    .await
            }
            None => crate::hooks::check_repo(forge, &repo, url).await,
        };
        let account = crate::forge::RunnerAccount {
            login: settings.forge.runner_login.clone(),
            password: settings.forge.runner_password.clone(),
        };
        let runner = if settings.runs_configured() {
            let role = crate::hooks::runner_problem(forge, &repo, &settings.runner, &account);
            let fork = crate::hooks::fork_problem(forge, &repo, &settings.runner, &account);
            let said: Vec<String> = [role.await, fork.await].into_iter().flatten().collect();
            (!said.is_empty()).then(|| said.join("; "))
        } else {
            None
        };
        rows.push(crate::hooks::RepoHook {
            repo: repo.to_string(),
            outcome,
            runner,
        });
    }
    rows
}

/// `director report`: the outcomes of the last `since` (`30d`), for one repository or all.
fn report(since: &str, repo: Option<&str>, format: &str, config: Option<&PathBuf>) -> ExitCode {
    let days = match parse_days(since) {
        Ok(d) => d,
        Err(why) => {
            eprintln!("error: --since {since:?}: {why}");
            return ExitCode::from(2);
        }
    };
    let repo: Option<crate::domain::RepoName> = match repo.map(str::parse).transpose() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: --repo: {e}");
            return ExitCode::from(2);
        }
    };
    let settings = match load(config) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let format = format.to_owned();
    run_async(async move {
        let store = crate::store::Store::connect(&settings.store).await?;
        let now = crate::clock::now_ms();
        let mut facts = store
            .outcome_facts(now - i64::from(days) * 86_400_000, now)
            .await?;
        if let Some(repo) = &repo {
            facts.retain(|r| r == repo);
        }
        let outcomes = crate::domain::outcomes::compute(&facts, days, now);
        match format.as_str() {
            "json" => println!("{}", serde_json::to_string_pretty(&outcomes)?),
            "csv" => print!("{}", crate::status::outcomes::csv(&outcomes)),
            _ => print!("{}", crate::status::outcomes::table(&outcomes)),
        }
        Ok(())
    })
}

/// `30d` (or `30`): a number of days, 1 to 3650.
fn parse_days(text: &str) -> Result<u32, &'static str> {
    let digits = text.trim().strip_suffix('d').unwrap_or(text.trim());
    match digits.parse::<u32>() {
        Ok(d) if (1..=3650).contains(&d) => Ok(d),
        Ok(_) => Err("a window of 1 to 3650 days"),
        Err(_) => Err("a number of days, as `30d`"),
    }
}

fn load(config: Option<&PathBuf>) -> Result<Settings, ExitCode> {
    Settings::load(config.map(PathBuf::as_path)).map_err(|e| {
        eprintln!("error: {e}");
        ExitCode::from(2)
    })
}

/// Runs the command line: what `director` does with its arguments.
pub fn run() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::CheckConfig { config } => check_config(config.as_ref()),
        Command::Scan { once: _, config } => scan(config.as_ref()),
        Command::Preflight {
            issue,
            dry_run: _,
            config,
        } => preflight(&issue, config.as_ref()),
        Command::CheckRepo { repo, config } => check_repo(&repo, config.as_ref()),
        Command::Hooks { action } => hooks(action),
        Command::Report {
            since,
            repo,
            format,
            config,
        } => report(&since, repo.as_deref(), &format, config.as_ref()),
        Command::Status { json, config } => status(json, config.as_ref()),
        Command::Snapshots { action } => snapshots(action),
        Command::Serve { config, log_format } => serve(config.as_ref(), log_format.as_deref()),
    }
}

/// `director check-config`: the settings as read, secrets masked, and their warnings.
fn check_config(config: Option<&PathBuf>) -> ExitCode {
    match load(config) {
        Ok(settings) => {
            for w in settings.warnings() {
                eprintln!("warning: {w}");
            }
            print!("{}", settings.to_masked_toml());
            ExitCode::SUCCESS
        }
        Err(code) => code,
    }
}

/// `director scan --once`: one scan, its report as JSON.
fn scan(config: Option<&PathBuf>) -> ExitCode {
    let settings = match load(config) {
        Ok(s) => s,
        Err(code) => return code,
    };
    crate::telemetry::init(settings.server.log_format);
    let _ = rustls::crypto::ring::default_provider().install_default();
    run_async(async move {
        let report = crate::startup::scan_once(settings).await?;
        println!("{}", serde_json::to_string_pretty(&report)?);
        Ok(())
    })
}

/// `director preflight --dry-run`: the prompt, what was left out, the read and its verdict;
/// nothing is posted.
fn preflight(issue: &str, config: Option<&PathBuf>) -> ExitCode {
    let (issue, settings) =
        match argument::<crate::domain::IssueRef>(issue).and_then(|i| Ok((i, load(config)?))) {
            Ok(both) => both,
            Err(code) => return code,
        };
    let _ = rustls::crypto::ring::default_provider().install_default();
    run_async(async move {
        let run = crate::startup::preflight_dry_run(settings, issue).await?;
        println!("=== prompt ===\n{}\n", run.prompt);
        if !run.left_out.is_empty() {
            println!(
                "=== left out as untrusted ===\n{}\n",
                run.left_out.join("\n")
            );
        }
        println!("=== read ({}) ===\n{}\n", run.model, run.reading.trim());
        match run.verdict {
            Some(v) => {
                println!("=== verdict ===\n{}", serde_json::to_string(&v)?);
                if let crate::domain::verdict::Verdict::NeedsInfo { questions } = &v {
                    println!("\n=== questions ===");
                    for (n, q) in questions.iter().enumerate() {
                        println!("{}. {q}", n + 1);
                    }
                }
            }
            None => println!(
                "=== verdict ===\nunclear: no GO, NO-GO or WRONG-REPO line, nor NEEDS-INFO with numbered questions"
            ),
        }
        Ok(())
    })
}

/// `director check-repo`: the settings a run in the repository would get from its file, or
/// why it would get none (exit 1).
fn check_repo(repo: &str, config: Option<&PathBuf>) -> ExitCode {
    let (repo, settings) =
        match argument::<crate::domain::RepoName>(repo).and_then(|r| Ok((r, load(config)?))) {
            Ok(both) => both,
            Err(code) => return code,
        };
    if !settings.repo_settings.enabled() {
        println!(
            "repo_settings.allow is empty: repositories set nothing, and `{}` is not read; runs in {repo} get the operator's settings",
            crate::settings::repo::FILE
        );
        return ExitCode::SUCCESS;
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut usable = true;
    let code = run_async(async {
        match crate::startup::check_repo(&settings, &repo).await? {
            Ok(s) => {
                println!("{}", toml::to_string_pretty(&s)?);
                match crate::startup::setup_warmth(&settings, &repo, &s).await {
                    Ok(Some(warmth)) => println!("# setup: {warmth}"),
                    Ok(None) => {}
                    Err(e) => println!("# setup: cannot say whether a snapshot is warm: {e:#}"),
                }
            }
            Err(unusable) => {
                usable = false;
                eprintln!(
                    "error: `{}` at {} cannot be used; no run would start:",
                    crate::settings::repo::FILE,
                    unusable.commit
                );
                for p in &unusable.problems {
                    eprintln!("  - {p}");
                }
            }
        }
        Ok(())
    });
    if usable { code } else { ExitCode::from(1) }
}

/// `director status`: the issues and runs as the store holds them.
fn status(json: bool, config: Option<&PathBuf>) -> ExitCode {
    let settings = match load(config) {
        Ok(s) => s,
        Err(code) => return code,
    };
    run_async(async move {
        let store = crate::store::Store::connect(&settings.store).await?;
        let now = crate::clock::now_ms();
        let rows = crate::status::collect(
            &store,
            settings.forge.links().as_ref(),
            &crate::status::Queueing::from_settings(&settings),
            now,
        )
        .await?;
        if !json {
            let told = store.filers_told(&crate::models::day_of(now)).await?;
            for line in crate::status::filer_lines(&told) {
                println!("{line}");
            }
        }
        print!("{}", crate::status::render(&rows, json)?);
        Ok(())
    })
}

/// `director serve`: the service, until it is stopped.
fn serve(config: Option<&PathBuf>, log_format: Option<&str>) -> ExitCode {
    let mut settings = match load(config) {
        Ok(s) => s,
        Err(code) => return code,
    };
    match log_format {
        Some("pretty") => settings.server.log_format = LogFormat::Pretty,
        Some("json") => settings.server.log_format = LogFormat::Json,
        _ => {}
    }
    crate::telemetry::init(settings.server.log_format);
    let _ = rustls::crypto::ring::default_provider().install_default();
    let result = actix_web::rt::System::new().block_on(async move {
        Application::build(settings)
            .await?
            .run_until_stopped()
            .await
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "director stopped");
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// A command-line argument parsed, or exit status 2 with why it is not one.
fn argument<T>(text: &str) -> Result<T, ExitCode>
where
    T: std::str::FromStr,
    T::Err: std::fmt::Display,
{
    text.parse().map_err(|e| {
        eprintln!("error: {e}");
        ExitCode::from(2)
    })
}

fn run_async(work: impl std::future::Future<Output = anyhow::Result<()>>) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(work) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
