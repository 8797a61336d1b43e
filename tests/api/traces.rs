//! Traces over OTLP/HTTP (`[telemetry] otlp_endpoint`): a GO issue's whole story, from the
//! label to the merge, reaches a fake collector as one trace with a span for every decision,
//! action and run; with the collector down the flow completes and the lost spans are
//! counted.

use std::collections::BTreeSet;

use director::domain::{IssueRef, Lifecycle};
use director_testkit::otlp::{FakeOtlp, ReceivedSpan};

use crate::fake_runs::{env, labelled, run_ids, spawn};
use crate::forge_helpers::{ForgeApp, WRITER};
use crate::helpers::wait_until;

fn of_issue(spans: &[ReceivedSpan], issue: &IssueRef) -> Vec<ReceivedSpan> {
    let number = issue.number.to_string();
    spans
        .iter()
        .filter(|s| s.attr("director.issue") == Some(number.as_str()))
        .cloned()
        .collect()
}

/// `director_trace_spans_total{outcome}`, read from `/metrics`.
async fn spans_counted(t: &ForgeApp, outcome: &str) -> u64 {
    let text = t.app.get("/metrics").await.text().await.unwrap_or_default();
    let prefix = format!("director_trace_spans_total{{outcome=\"{outcome}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn a_go_issues_story_from_label_to_merge_is_one_trace_at_the_collector() {
    let otlp = FakeOtlp::start();
    let url = otlp.url.clone();
    let (t, _llm, fake) = spawn(move |s| {
        s.telemetry.otlp_endpoint = url;
        s.telemetry.export_interval_ms = 100;
    })
    .await;
    let issue = labelled(&t, "Add --verbose", "Print each step.").await;
    t.app.wait_state(&issue, Lifecycle::Succeeded).await;
    t.app.wait_processed().await;
    let run_id = run_ids(&t, &issue).await.pop().expect("a run");
    let token = env(&fake.spec_of(&run_id).expect("spec"), "DIRECTOR_TOKEN").to_owned();
    let pr = t
        .record(&issue)
        .await
        .and_then(|r| r.pr)
        .map(|p| p.number)
        .expect("a pull request");
    t.forge.merge_pull(WRITER, &t.repo, pr).await;
    t.app.wait_state(&issue, Lifecycle::Merged).await;
    t.app.wait_processed().await;

    wait_until("the merge's decision reaches the collector", || async {
        of_issue(&otlp.spans(), &issue)
            .iter()
            .any(|s| s.attr("director.state") == Some("merged"))
    })
    .await;
    let spans = of_issue(&otlp.spans(), &issue);
    assert_eq!(
        otlp.refused(),
        0,
        "every export was a readable OTLP request"
    );

    // One trace, one root, every other span its child.
    let traces: BTreeSet<&str> = spans.iter().map(|s| s.trace_id.as_str()).collect();
    assert_eq!(traces.len(), 1, "one trace for the issue: {traces:?}");
    let roots: Vec<&ReceivedSpan> = spans
        .iter()
        .filter(|s| s.parent_span_id.is_empty())
        .collect();
    assert_eq!(roots.len(), 1, "one root span: {roots:#?}");
    let root = roots[0];
    assert_eq!(root.name, format!("issue {issue}"));
    assert!(
        spans
            .iter()
            .filter(|s| s.span_id != root.span_id)
            .all(|s| s.parent_span_id == root.span_id),
        "every span hangs off the issue's root"
    );
    let ids: BTreeSet<&str> = spans.iter().map(|s| s.span_id.as_str()).collect();
    assert_eq!(ids.len(), spans.len(), "no span sent twice");
    for span in &spans {
        assert_eq!(
            span.attr("director.repo"),
            Some(t.repo.to_string().as_str())
        );
        assert_eq!(
            span.resource.get("service.name").map(String::as_str),
            Some("director")
        );
        assert!(span.end_unix_nano >= span.start_unix_nano, "{span:?}");
        let shown = format!("{} {:?}", span.name, span.attributes);
        assert!(!shown.contains(&token), "no credential in a span: {shown}");
        assert!(
            !shown.contains("pushed"),
            "no transcript in a span: {shown}"
        );
    }

    // The decisions: the label, the pre-flight's read, the admission, the run's end, the merge.
    let decided: Vec<&str> = spans
        .iter()
        .filter_map(|s| s.name.strip_prefix("decide "))
        .collect();
    for event in [
        "issue_label.label_updated",
        "preflight_read",
        "admitted",
        "run",
    ] {
        assert!(
            decided.iter().any(|d| d == &event),
            "a decision on {event}: {decided:?}"
        );
    }
    assert!(
        spans
            .iter()
            .any(|s| s.name.starts_with("decide pull_request")
                && s.attr("director.state") == Some("merged")),
        "the merge: {decided:?}"
    );
    // The actions, each with its kind and outcome.
    let acted: Vec<(&str, &str)> = spans
        .iter()
        .filter(|s| s.name.starts_with("act "))
        .map(|s| {
            (
                s.attr("director.action.kind").unwrap_or_default(),
                s.attr("director.outcome").unwrap_or_default(),
            )
        })
        .collect();
    for kind in [
        "read_preflight",
        "upsert_sticky",
        "start_run",
        "open_pr",
        "report_run",
    ] {
        assert!(
            acted.contains(&(kind, "done")),
            "the action {kind}, done: {acted:?}"
        );
    }
    let start = spans
        .iter()
        .find(|s| s.attr("director.action.kind") == Some("start_run"))
        .expect("the start");
    assert_eq!(start.attr("director.run_id"), Some(run_id.as_str()));
    // The run: one span, from its start to its end, with how it ended.
    let runs: Vec<&ReceivedSpan> = spans.iter().filter(|s| s.name == "run").collect();
    assert_eq!(runs.len(), 1, "{runs:#?}");
    assert_eq!(runs[0].attr("director.run_id"), Some(run_id.as_str()));
    assert_eq!(runs[0].attr("director.outcome"), Some("succeeded"));
    assert_eq!(runs[0].attr("director.pull"), Some(pr.to_string().as_str()));
    assert!(spans_counted(&t, "exported").await >= spans.len() as u64);
    assert_eq!(spans_counted(&t, "dropped").await, 0);
}

#[tokio::test]
async fn with_the_collector_down_the_flow_completes_and_the_lost_spans_are_counted() {
    // A port nothing listens on: every export is refused.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", closed.local_addr().expect("addr"));
    drop(closed);
    let (t, _llm, _fake) = spawn(move |s| {
        s.telemetry.otlp_endpoint = url;
        s.telemetry.export_interval_ms = 100;
    })
    .await;
    let issue = labelled(&t, "Add --quiet", "Print less.").await;
    t.app.wait_state(&issue, Lifecycle::Succeeded).await;
    t.app.wait_processed().await;
    assert!(
        t.record(&issue).await.and_then(|r| r.pr).is_some(),
        "the pull request was opened"
    );
    wait_until("the lost spans are counted", || async {
        spans_counted(&t, "dropped").await > 0
    })
    .await;
    assert_eq!(spans_counted(&t, "exported").await, 0);
}
