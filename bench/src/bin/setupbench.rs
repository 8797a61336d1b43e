//! Prepared environments: what a cold setup and a warm start cost for a workspace of a few
//! hundred MB of dependencies, on the real Docker engine, through the same library steps a
//! run's start takes (`engine/act/run/setup.rs`): a workspace volume, the setup's container,
//! the workspace read once through the engine's archive API and searched for a secret while
//! it is copied into a snapshot, the copy's git objects searched, a new volume unpacked from
//! the copy (cold); a new volume unpacked from the snapshot (warm). The setup writes `--mb`
//! of files (`--files` of them) in place of downloading them, so its own time is small
//! beside a real package install: the figures say how much the director adds. Memory is this
//! process's resident size, sampled every 20 ms, above what it held before each step.
//!
//! `cargo run --release -p director-bench --bin director-setupbench -- --mb 300 --runs 3`

use std::time::{Duration, Instant};

use clap::Parser;
use director::domain::RunId;
use director::prepared::scan::{Pattern, Scanned};
use director::prepared::store::SnapshotStore;
use director::prepared::stream::{file_stream, scan_stream};
use director::runtime::docker::DockerRuntime;
use director::runtime::{Exit, RunSpec, Runtime, WaitLimits};
use director::settings::RunnerSettings;
use director_bench as common;

#[derive(Parser)]
struct Args {
    /// Megabytes of "dependencies" the setup leaves.
    #[arg(long, default_value_t = 300)]
    mb: u64,
    /// How many files they are in.
    #[arg(long, default_value_t = 3000)]
    files: u64,
    #[arg(long, default_value_t = 3)]
    runs: usize,
}

fn rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// Runs `f`, sampling the resident size meanwhile: (its result, the peak above the start).
async fn with_peak<T>(f: impl std::future::Future<Output = T>) -> (T, u64) {
    let start = rss_kb();
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(start));
    let sampling = {
        let peak = peak.clone();
        tokio::spawn(async move {
            loop {
                peak.fetch_max(rss_kb(), std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let out = f.await;
    sampling.abort();
    let peak = peak
        .load(std::sync::atomic::Ordering::Relaxed)
        .max(rss_kb());
    (out, peak.saturating_sub(start))
}

fn spec(run_id: &RunId, image: &str, volume: &str, command: &str) -> RunSpec {
    RunSpec {
        run_id: run_id.clone(),
        image: image.to_owned(),
        command: vec!["/bin/sh".into(), "-c".into(), command.to_owned()],
        env: vec![("HOME".into(), "/workspace".into())],
        labels: std::collections::HashMap::from([(
            director::runtime::SETUP_LABEL.to_owned(),
            run_id.to_string(),
        )]),
        task_path: "/task/task.md".into(),
        task: Vec::new(),
        mounts: Vec::new(),
        result_path: None,
        confined: false,
        workspace_volume: Some(volume.to_owned()),
        setup_phase: true,
    }
}

/// A new volume unpacked from `path`, as a run's start does.
async fn restore(
    docker: &DockerRuntime,
    run_id: &RunId,
    image: &str,
    path: &std::path::Path,
) -> anyhow::Result<()> {
    let volume = docker.make_workspace(run_id, image).await?;
    let id = docker.create(&spec(run_id, image, &volume, "true")).await?;
    let file = tokio::fs::File::open(path).await?;
    docker.import_workspace(&id, file_stream(file)).await?;
    docker.remove(&id).await?;
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let image = common::build_image("director-setupbench-agent:latest")?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let runner = RunnerSettings {
            image: image.clone(),
            network: "none".into(),
            egress: director::settings::Egress::Open,
            memory_mb: 1024,
            cpus: 1.0,
            workspace_mb: 8192,
            ..Default::default()
        };
        let docker = DockerRuntime::connect(runner).await?;
        let dir = tempfile::tempdir()?;
        let store = SnapshotStore::new(dir.path().to_owned(), 16 * 1024, 24);
        let repo: director::domain::RepoName = "bench/widgets".parse()?;
        let patterns = vec![Pattern {
            name: "TOKEN".into(),
            bytes: b"bench-secret-0123456789".to_vec(),
        }];
        let per_file_kb = (args.mb * 1024 / args.files.max(1)).max(1);
        let setup = format!(
            "mkdir -p $HOME/deps && i=0; while [ $i -lt {} ]; do head -c {}k /dev/urandom > $HOME/deps/f$i; i=$((i+1)); done",
            args.files, per_file_kb
        );
        let (mut cold, mut own, mut warm) = (Vec::new(), Vec::new(), Vec::new());
        let (mut cold_mem, mut warm_mem) = (0u64, 0u64);
        for n in 0..args.runs {
            let run_id = RunId::parse(&format!("{:012x}", rand::random::<u64>() >> 16))?;
            let key = format!("{:064x}", n + 1);
            // Cold.
            let t0 = Instant::now();
            let volume = docker.make_workspace(&run_id, &image).await?;
            let id = docker.create(&spec(&run_id, &image, &volume, &setup)).await?;
            let s0 = Instant::now();
            docker.start(&id).await?;
            let limits = WaitLimits {
                timeout: Duration::from_secs(600),
                idle: None,
                grace: Duration::from_secs(5),
            };
            let exit = docker.wait(&id, limits).await?;
            anyhow::ensure!(exit == Exit::Code(0), "the setup failed: {exit:?}");
            own.push(s0.elapsed().as_secs_f64() * 1000.0);
            let (read, mem) = with_peak(async {
                let pending = store.begin(&repo, &key)?;
                let tar = docker.export_workspace(&id).await?;
                scan_stream(tar, patterns.clone(), Some(pending), 8 << 30).await
            })
            .await;
            let (scanned, pending) = read?;
            cold_mem = cold_mem.max(mem);
            anyhow::ensure!(matches!(scanned, Scanned::Clean { kept: true, .. }), "{scanned:?}");
            docker.remove(&id).await?;
            let pending = pending.ok_or_else(|| anyhow::anyhow!("no copy"))?;
            let path = pending.finish()?;
            let (restored, mem) = with_peak(restore(&docker, &run_id, &image, &path)).await;
            restored?;
            cold_mem = cold_mem.max(mem);
            cold.push(t0.elapsed().as_secs_f64() * 1000.0);
            docker.remove_workspace(&run_id).await?;
            // Warm: the snapshot unpacked into a new volume.
            let t1 = Instant::now();
            let (restored, mem) = with_peak(restore(&docker, &run_id, &image, &path)).await;
            restored?;
            warm.push(t1.elapsed().as_secs_f64() * 1000.0);
            warm_mem = warm_mem.max(mem);
            docker.remove_workspace(&run_id).await?;
            let size = std::fs::metadata(&path)?.len();
            println!(
                "run {n}: snapshot {:.0} MB, cold {:.0} ms (setup's own {:.0} ms), warm {:.0} ms",
                size as f64 / 1e6,
                cold.last().unwrap_or(&0.0),
                own.last().unwrap_or(&0.0),
                warm.last().unwrap_or(&0.0)
            );
            let _ = std::fs::remove_file(&path);
        }
        common::stats("cold: volume, setup, read and search, copy, restore", &mut cold);
        common::stats("the setup's own work (writing the files)", &mut own);
        common::stats("warm: volume and restore", &mut warm);
        let median = |v: &[f64]| v.get(v.len() / 2).copied().unwrap_or(0.0);
        println!(
            "warm / cold: {:.1} %; director's memory above idle: cold {:.1} MB, warm {:.1} MB",
            100.0 * median(&warm) / median(&cold).max(1.0),
            cold_mem as f64 / 1024.0,
            warm_mem as f64 / 1024.0
        );
        Ok(())
    })
}
