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

/// Runs git in `dir` (a fixed identity, no prompt), `input` on its stdin; its trimmed output.
pub fn git(dir: &std::path::Path, args: &[&str], input: Option<&[u8]>) -> anyhow::Result<String> {
    use std::io::Write as _;
    let mut child = std::process::Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_AUTHOR_NAME", "bench")
        .env("GIT_AUTHOR_EMAIL", "bench@example.org")
        .env("GIT_COMMITTER_NAME", "bench")
        .env("GIT_COMMITTER_EMAIL", "bench@example.org")
        .env("GIT_TERMINAL_PROMPT", "0")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    if let Some(input) = input {
        child.stdin.take().map(|mut s| s.write_all(input));
    }
    drop(child.stdin.take());
    let out = child.wait_with_output()?;
    anyhow::ensure!(
        out.status.success(),
        "git {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// `mb` of incompressible data.
pub fn random_bytes(mb: usize) -> Vec<u8> {
    (0..mb * 1024 * 1024)
        .map(|_| rand::random::<u8>())
        .collect()
}

/// Adds a commit holding `big.bin` (`mb` of incompressible data) to `main` of the bare
/// repository `bare`, written directly (no push, no hook).
pub fn commit_big_file(bare: &std::path::Path, mb: usize) -> anyhow::Result<()> {
    let blob = git(
        bare,
        &["hash-object", "-w", "--stdin"],
        Some(&random_bytes(mb)),
    )?;
    let entry = format!("100644 blob {blob}\tbig.bin\n");
    let tree = git(bare, &["mktree"], Some(entry.as_bytes()))?;
    let parent = git(bare, &["rev-parse", "refs/heads/main"], None)?;
    let commit = git(
        bare,
        &["commit-tree", &tree, "-p", &parent, "-m", "big"],
        None,
    )?;
    git(bare, &["update-ref", "refs/heads/main", &commit], None)?;
    Ok(())
}
