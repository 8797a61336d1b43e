//! `director-demo`: the whole flow a newcomer watches, printed step by step.

use std::time::Duration;

async fn demo(args: &[&str]) -> String {
    let out = tokio::time::timeout(
        Duration::from_secs(200),
        tokio::process::Command::new(env!("CARGO_BIN_EXE_director-demo"))
            .args(["--once", "--listen", "127.0.0.1:0"])
            .args(args)
            .output(),
    )
    .await
    .expect("the demo finishes")
    .expect("runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    text
}

/// Each of `steps` appears, in this order.
fn in_order(text: &str, steps: &[&str]) {
    let mut from = 0;
    for step in steps {
        match text[from..].find(step) {
            Some(at) => from += at + step.len(),
            None => panic!("`{step}` missing (or out of order) in:\n{text}"),
        }
    }
}

#[tokio::test]
async fn the_demo_shows_a_label_become_a_go_comment_a_run_and_a_pull_request() {
    let text = demo(&[]).await;
    in_order(
        &text,
        &[
            "runs use the local Docker engine",
            "alice applies the label `headless` to #1",
            "admitted: minting its token",
            "container started",
            "branch pushed: director-issue-1-",
            "pull request #3 opened",
            "finished and its branch is pull request #3",
            "The status page: http://127.0.0.1:",
        ],
    );
    in_order(
        &text,
        &[
            "applies the label `headless` to #2",
            "pre-flight: NO-GO",
            "> far too broad",
        ],
    );
    // The GO comment shows what a maintainer signs: the model's plan and a forecast, from a
    // past the demo seeded and says it made up (six runs: the median $0.31 and 5 minutes,
    // the 90th percentile $0.60 and 12 minutes).
    in_order(
        &text,
        &[
            "seeded a made-up past in the demo's own store",
            "none of them happened",
            "applies the label `headless` to #1",
            "pre-flight: GO",
            "**The plan** (the model's, given to the agent as it is shown here):",
            "1. Add the `--verbose` flag where the flags are parsed.",
            "2. Print each step as the tool runs it when the flag is given.",
            "3. Say what the flag does in `VERBOSE.md`.",
            "**Forecast:** $0.31 (median) to $0.60 (90th percentile), 5m 00s to 12m 00s; from 6 finished first runs in this repository.",
        ],
    );
    assert!(!text.contains("no plan given"), "{text}");
    assert!(!text.contains("no history yet"), "{text}");
    assert!(text.contains("headless:pr-open"), "{text}");
    // The run's branch lives in the runner's fork, and Forgejo holds the pull request's
    // checks until a maintainer reads it.
    assert!(text.contains("(in director-runner/widgets)"), "{text}");
    assert!(text.contains("of director-runner/widgets"), "{text}");
    assert!(text.contains("wait for a maintainer's approval"), "{text}");
}

#[tokio::test]
async fn without_docker_the_demo_says_runs_are_skipped_and_the_go_issue_waits() {
    let text = demo(&["--no-docker"]).await;
    // The demo prints what changed on the forge per look: a label and a comment that changed
    // between two looks come out labels first, so the two are checked apart.
    in_order(&text, &["runs skipped: --no-docker", "pre-flight: GO"]);
    in_order(
        &text,
        &[
            "runs skipped: --no-docker",
            "headless:queued",
            "The status page:",
        ],
    );
    assert!(text.contains("pre-flight: NO-GO"), "{text}");
    assert!(!text.contains("container started"), "{text}");
    // The plan shows; no run can start, so the director forecasts none, and the demo seeds
    // no past for it.
    in_order(
        &text,
        &[
            "pre-flight: GO",
            "1. Add the `--verbose` flag where the flags are parsed.",
        ],
    );
    assert!(!text.contains("**Forecast:**"), "{text}");
    assert!(!text.contains("seeded a made-up past"), "{text}");
}

#[tokio::test]
async fn sigterm_stops_the_demo_as_ctrl_c_does() {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_director-demo"))
        .args(["--no-docker", "--listen", "127.0.0.1:0"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("the demo starts");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let waiting = tokio::time::timeout(Duration::from_secs(200), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if line.contains("press Ctrl-C to stop") {
                return true;
            }
        }
        false
    })
    .await
    .expect("the demo reaches its end");
    assert!(waiting, "the demo says how to stop it");
    // Read on, as a terminal does: a demo blocked writing to a full pipe cannot stop.
    let drained = tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let pid = child.id().expect("running").to_string();
    let sent = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill runs");
    assert!(sent.success());
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("the demo stops on SIGTERM")
        .expect("reaped");
    assert!(status.success(), "{status:?}");
    drained.abort();
}
