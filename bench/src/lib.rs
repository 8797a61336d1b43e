//! Pieces the benchmark binaries share: the test agent image and the figures they print.
//! The binaries themselves are in `bench/src/bin/`; docs/benchmarks.md says what each measures.

/// Builds the test agent image (`tests/agent/`, a static busybox) and returns its tag.
pub fn build_image(tag: &str) -> anyhow::Result<String> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/agent");
    let ctx = std::env::temp_dir().join(format!("director-bench-image-{}", std::process::id()));
    std::fs::create_dir_all(&ctx)?;
    for f in ["agent.sh", "Dockerfile"] {
        std::fs::copy(format!("{dir}/{f}"), ctx.join(f))?;
    }
    std::fs::copy("/bin/busybox", ctx.join("busybox"))?;
    let out = std::process::Command::new("docker")
        .args(["build", "-q", "-t", tag])
        .arg(&ctx)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "docker build: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&ctx);
    Ok(tag.to_owned())
}

/// Prints median and mean of `ms` (sorted in place).
pub fn stats(label: &str, ms: &mut [f64]) {
    if ms.is_empty() {
        println!("{label:<58} (no samples)");
        return;
    }
    ms.sort_by(|a, b| a.total_cmp(b));
    let median = ms[ms.len() / 2];
    let mean = ms.iter().sum::<f64>() / ms.len() as f64;
    println!(
        "{label:<58} median {median:7.1} ms  mean {mean:7.1} ms  (n={})",
        ms.len()
    );
}

/// Prints p50, p95 and max of `ms` (sorted in place).
pub fn percentiles(label: &str, ms: &mut [f64]) {
    if ms.is_empty() {
        println!("{label:<58} (no samples)");
        return;
    }
    ms.sort_by(|a, b| a.total_cmp(b));
    let at = |p: f64| ms[((ms.len() as f64 * p).ceil() as usize).clamp(1, ms.len()) - 1];
    println!(
        "{label:<58} p50 {:7.1} ms  p95 {:7.1} ms  max {:7.1} ms  (n={})",
        at(0.5),
        at(0.95),
        ms[ms.len() - 1],
        ms.len()
    );
}
