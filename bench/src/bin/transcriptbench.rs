//! Transcript benchmark: a run that prints 50 MB as fast as it can, on the real Docker
//! engine, with its output followed, redacted and stored as the director's watcher does
//! (`director::engine::transcript::Recorder` into SQLite), against the same run whose output
//! nobody follows. Alternated; the run's wall time (start to exit) each way, and this
//! process's resident memory sampled every 5 ms while the transcript is recorded.
//!
//! `cargo run --release -p director-bench --bin director-transcriptbench -- --runs 5`

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use director::domain::RunId;
use director::engine::act::run::Secrets;
use director::engine::transcript::Recorder;
use director::runtime::docker::DockerRuntime;
use director::runtime::{RunSpec, Runtime, WaitLimits};
use director::settings::{RunnerSettings, StoreSettings};
use director::store::Store;
use director_bench as common;
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Bytes the run prints.
    #[arg(long, default_value_t = 50 * 1024 * 1024)]
    bytes: u64,
}

/// This process's resident memory, in bytes.
fn rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let image = common::build_image("director-transcriptbench-agent:latest")?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let runner = RunnerSettings {
            image: image.clone(),
            network: "none".into(),
            egress: director::settings::Egress::Open,
            memory_mb: 256,
            cpus: 1.0,
            ..Default::default()
        };
        let docker: Arc<dyn Runtime> = Arc::new(DockerRuntime::connect(runner).await?);
        let dir = tempfile::tempdir()?;
        let store = Store::connect(&StoreSettings {
            url: format!("sqlite://{}/t.db", dir.path().display()),
            ..Default::default()
        })
        .await?;
        let recorder = Recorder {
            store: store.clone(),
            runtime: docker.clone(),
            secrets: Arc::new(Secrets::new(Vec::new())),
            clock: director::clock::system(),
            cap_bytes: 16 * 1024 * 1024,
        };
        // 64-byte lines, as a chatty agent prints them.
        let script = format!(
            "yes 'the agent prints a line of output, sixty-four bytes long......' | head -c {}",
            args.bytes
        );
        let idle = rss();
        let (mut bare, mut followed, mut recorded, mut peak) =
            (Vec::new(), Vec::new(), Vec::new(), 0u64);
        let mut kept_least = u64::MAX;
        for i in 0..args.runs * 2 {
            let follow = i % 2 == 1;
            let run_id = RunId::random();
            let spec = RunSpec {
                run_id: run_id.clone(),
                image: image.clone(),
                command: vec!["/bin/sh".into(), "-c".into(), script.clone()],
                env: vec![],
                labels: HashMap::new(),
                task_path: "/task/task.md".into(),
                task: b"task".to_vec(),
                mounts: vec![],
                result_path: None,
                confined: false,
                workspace_volume: None,
                setup_phase: false,
            };
            let id = docker.create(&spec).await?;
            let stop = CancellationToken::new();
            let high = Arc::new(AtomicU64::new(0));
            let sampler = {
                let (high, stop) = (high.clone(), stop.clone());
                tokio::spawn(async move {
                    while !stop.is_cancelled() {
                        high.fetch_max(rss(), Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                })
            };
            let started = Instant::now();
            docker.start(&id).await?;
            let following = follow.then(|| {
                let (recorder, id, run, until) =
                    (recorder.clone(), id.clone(), run_id.clone(), stop.clone());
                tokio::spawn(async move { recorder.follow(&run, &id, until).await })
            });
            let limits = WaitLimits {
                timeout: Duration::from_secs(600),
                idle: None,
                grace: Duration::from_secs(5),
            };
            docker.wait(&id, limits).await?;
            let ran = started.elapsed().as_secs_f64() * 1000.0;
            if let Some(task) = following {
                followed.push(ran);
                // Until the transcript holds the last of it.
                let _ = task.await;
                recorded.push(started.elapsed().as_secs_f64() * 1000.0);
                // Measured before the check below reads the whole transcript back.
                stop.cancel();
                let _ = sampler.await;
                peak = peak.max(high.load(Ordering::Relaxed));
                let kept = store.transcript(&run_id).await?.unwrap_or_default();
                kept_least = kept_least.min(kept.bytes + kept.dropped_bytes);
            } else {
                bare.push(ran);
                stop.cancel();
                let _ = sampler.await;
            }
            docker.remove(&id).await?;
        }
        common::stats("run, start to exit, nobody following", &mut bare);
        common::stats("run, start to exit, its output followed", &mut followed);
        common::stats(
            "run, start to the transcript's last byte stored",
            &mut recorded,
        );
        println!(
            "transcript: at least {kept_least} of the {} bytes printed reached it",
            args.bytes
        );
        let mb = |b: u64| b as f64 / (1024.0 * 1024.0);
        println!(
            "memory: idle {:.1} MB, at most {:.1} MB while recording ({:+.1} MB)",
            mb(idle),
            mb(peak),
            mb(peak.saturating_sub(idle))
        );
        Ok(())
    })
}
