//! What runs on a schedule: the start-up sweeps, pruning, and the scans (claimed once per
//! period across replicas).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio_cron_scheduler::{Job, JobScheduler};
use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::engine::act::Acts;
use crate::engine::scanner::Scanner;
use crate::forge::Forge;
use crate::store::Store;

/// Tokens and containers a previous process left behind.
pub(super) async fn startup_sweeps(acts: &Acts) {
    let Some(runs) = &acts.runs else {
        return;
    };
    if let Err(error) = runs.sweep_tokens(acts).await {
        tracing::warn!(error = %format!("{error:#}"), "could not sweep stray run tokens");
    }
    if let Err(error) = runs.sweep_containers(acts).await {
        tracing::warn!(error = %format!("{error:#}"), "could not sweep finished run containers");
    }
}

/// Rows pruned per statement: small, so that intake never waits long for the writer.
pub(super) const PRUNE_BATCH: u32 = 500;

/// Deletes what `store.retention_days` no longer keeps, at start and then hourly.
pub(super) async fn prune_periodically(
    store: Store,
    retention_days: u32,
    clock: SharedClock,
    shutdown: CancellationToken,
) {
    let keep_ms = i64::from(retention_days.max(1)) * 86_400_000;
    loop {
        let before = clock.now_ms() - keep_ms;
        loop {
            match store.prune(before, PRUNE_BATCH).await {
                Ok(0) => break,
                Ok(n) => tracing::debug!(deleted = n, "pruned old rows"),
                Err(e) => {
                    tracing::warn!(error = %format!("{e:#}"), "pruning failed; retried later");
                    break;
                }
            }
            tokio::task::yield_now().await;
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(3600)) => {}
        }
    }
}

/// Asks the forge who the bot is until it answers; its own events are then ignored.
pub(super) async fn learn_bot_login(
    forge: Arc<dyn Forge>,
    bot: crate::forge::BotLogin,
    shutdown: CancellationToken,
) {
    let mut wait = Duration::from_secs(1);
    loop {
        match forge.current_user().await {
            Ok(login) => {
                tracing::info!(bot = %login, "forge account identified");
                bot.learn(login);
                return;
            }
            Err(error) => tracing::warn!(%error, "cannot identify the bot account yet"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        wait = (wait * 2).min(Duration::from_secs(300));
    }
}

/// Runs a scan now (to catch up on what was missed while down) and then on the schedule;
/// a scan still running when the next is due is not started twice.
pub(super) async fn schedule_scans(
    scanner: Arc<Scanner>,
    schedule: &str,
    full_schedule: &str,
    shared: Option<(Store, String)>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    // One pass at a time. A full pass waits for a running incremental one (it must not be
    // skipped for a whole period); an incremental pass due while another pass runs is skipped.
    // With several replicas, each period's pass runs on the first replica to claim it.
    let running = Arc::new(tokio::sync::Mutex::new(()));
    let shared = Arc::new(shared);
    let full = |scanner: Arc<Scanner>,
                running: Arc<tokio::sync::Mutex<()>>,
                shared: Arc<Option<(Store, String)>>,
                period: String| async move {
        let _guard = running.lock().await;
        if !claim_scan(&shared, "full", &period).await {
            return;
        }
        if let Err(error) = scanner.scan_once().await {
            tracing::error!(error = %format!("{error:#}"), "full scan failed");
        }
    };
    let incremental = |scanner: Arc<Scanner>,
                       running: Arc<tokio::sync::Mutex<()>>,
                       shared: Arc<Option<(Store, String)>>,
                       period: String| async move {
        let Ok(_guard) = running.try_lock() else {
            tracing::info!("a scan is still running; skipping this incremental pass");
            return;
        };
        if !claim_scan(&shared, "incremental", &period).await {
            return;
        }
        if let Err(error) = scanner.scan_incremental().await {
            tracing::error!(error = %format!("{error:#}"), "incremental scan failed");
        }
    };
    // At start-up: a replica starting soon after another's full pass leaves it out.
    let startup = (crate::clock::now_ms() + STARTUP_SCAN_WINDOW_MS / 2) / STARTUP_SCAN_WINDOW_MS;
    tokio::spawn(full(
        scanner.clone(),
        running.clone(),
        shared.clone(),
        format!("startup:{startup}"),
    ));
    let mut scheduler = JobScheduler::new()
        .await
        .context("starting the scan scheduler")?;
    let (s, r, sh) = (scanner.clone(), running.clone(), shared.clone());
    let expr = schedule.to_owned();
    let job = Job::new_async(schedule, move |_, _| {
        Box::pin(incremental(
            s.clone(),
            r.clone(),
            sh.clone(),
            period_of(&expr),
        ))
    })
    .with_context(|| format!("scan.schedule `{schedule}`"))?;
    scheduler.add(job).await.context("scheduling the scan")?;
    let (s, r, sh) = (scanner.clone(), running.clone(), shared.clone());
    let expr = full_schedule.to_owned();
    let job = Job::new_async(full_schedule, move |_, _| {
        Box::pin(full(s.clone(), r.clone(), sh.clone(), period_of(&expr)))
    })
    .with_context(|| format!("scan.full_schedule `{full_schedule}`"))?;
    scheduler
        .add(job)
        .await
        .context("scheduling the full scan")?;
    scheduler
        .start()
        .await
        .context("starting the scan scheduler")?;
    tokio::spawn(async move {
        shutdown.cancelled().await;
        let _ = scheduler.shutdown().await;
    });
    Ok(())
}

/// The start-up full pass is claimed once per window this wide (the nearest window edge).
pub(super) const STARTUP_SCAN_WINDOW_MS: i64 = 600_000;

/// A scheduled pass fires on every replica moments apart: it is named by the scheduled time
/// nearest now, the same on each.
pub(super) fn period_of(expr: &str) -> String {
    let now = crate::clock::now_ms();
    crate::settings::nearest_occurrence_ms(expr, now)
        .unwrap_or(now / 1000 * 1000)
        .to_string()
}

/// Whether this replica runs the `pass` of `period`: always alone; with several, only the
/// first to claim it.
pub(super) async fn claim_scan(shared: &Option<(Store, String)>, pass: &str, period: &str) -> bool {
    let Some((store, replica)) = shared else {
        return true;
    };
    let now = crate::clock::now_ms();
    let name = format!("scan:{pass}:{period}");
    match store.claim_once(&name, replica, now).await {
        Ok(true) => true,
        Ok(false) => {
            tracing::debug!(pass, "another replica runs this scan period");
            false
        }
        Err(error) => {
            tracing::warn!(error = %format!("{error:#}"), pass, "cannot claim the scan period; skipping it");
            false
        }
    }
}

/// This process's name among replicas: the host's (a pod's name) and its process id.
pub(super) fn replica_name() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "director".to_owned());
    format!(
        "{host}-{}-{:04x}",
        std::process::id(),
        rand::random::<u16>()
    )
}
