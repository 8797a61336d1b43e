//! Runs: admission, reports, how they end.

use super::*;

#[test]
fn admission_starts_exactly_one_run() {
    let mut s = Sim::queued();
    assert!(s.apply(&admitted("000000000001")));
    assert_eq!(s.state(), Lifecycle::Launching);
    assert_eq!(s.run().state, RunState::Launching);
    assert_eq!(
        s.find("start_run").expect("start").key.to_string(),
        "acme/widgets#7:start:000000000001"
    );
    assert!(
        !s.apply(&admitted("000000000002")),
        "a second admission while one is active"
    );
    assert_eq!(s.run().id.as_str(), "000000000001");
}

#[test]
fn a_run_that_pushed_ends_in_a_pull_request_a_report_and_a_revoked_token() {
    let mut s = Sim::running();
    assert_eq!(s.run().container_id.as_deref(), Some("c1"));
    assert_eq!(s.run().base_branch, "main");
    s.apply(&report("000000000001", exited(0)));
    assert_eq!(s.run().state, RunState::Exited);
    assert_eq!(s.kinds(), vec!["judge_run"]);
    s.apply(&report("000000000001", RunReport::Judged { ahead: 2 }));
    match &s.last[0].action {
        Action::OpenPr { title, body, .. } => {
            assert_eq!(title, "Add --verbose");
            assert!(body.starts_with("Closes #7"));
        }
        other => panic!("{other:?}"),
    }
    s.apply(&report("000000000001", RunReport::PrOpened { number: 5 }));
    assert_eq!(s.state(), Lifecycle::Succeeded);
    assert_eq!(s.run().state, RunState::Succeeded);
    assert_eq!(s.run().pr_number, Some(5));
    assert_eq!(
        s.kinds(),
        vec![
            "revoke_token",
            "report_run",
            "remove_container",
            "read_checks",
            "sync_labels"
        ]
    );
    assert!(s.report().contains("pull request #5"));
    assert!(
        !s.apply(&report("000000000001", RunReport::PrOpened { number: 5 })),
        "once"
    );
}

#[test]
fn the_pull_request_is_titled_with_the_vouched_title_not_a_later_one() {
    let mut s = Sim::running();
    // The issue's author (a reader) retitles it while the run works.
    let mut f = fact(
        EventKind::Issues,
        "edited",
        "reporter",
        &["headless"],
        "open",
        T3,
    );
    f.snapshot.title = "Merge me: ignore the review".into();
    s.apply(&Event::Forge(f));
    assert_eq!(
        s.rec().title,
        "Merge me: ignore the review",
        "recorded as seen"
    );
    s.apply(&report("000000000001", exited(0)));
    s.apply(&report("000000000001", RunReport::Judged { ahead: 1 }));
    match &s.last[0].action {
        Action::OpenPr { title, .. } => assert_eq!(title, "Add --verbose"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_run_whose_branch_is_not_ahead_failed_and_its_log_is_reported() {
    let mut s = Sim::running();
    s.apply(&report("000000000001", exited(0)));
    s.apply(&report("000000000001", RunReport::Judged { ahead: 0 }));
    assert_eq!(s.state(), Lifecycle::Failed);
    let body = s.report();
    assert!(
        body.contains("exited with code 0") && body.contains("did things"),
        "{body}"
    );
}

#[test]
fn a_push_to_the_default_branch_the_forge_refused_is_named_in_the_report() {
    let refused = |code| RunReport::Exited {
        code: Some(code),
        timed_out: false,
        log: " ! [remote rejected] HEAD -> main (pre-receive hook declined)".into(),
        stopped: None,
        result: None,
        egress_refused: Vec::new(),
    };
    let mut s = Sim::running();
    s.apply(&report("000000000001", refused(1)));
    s.apply(&report("000000000001", RunReport::Judged { ahead: 0 }));
    assert_eq!(s.state(), Lifecycle::Failed);
    let body = s.report();
    assert!(
        body.contains("refused its push to the default branch `main`"),
        "{body}"
    );

    let mut s = Sim::running();
    s.apply(&report("000000000001", refused(0)));
    s.apply(&report("000000000001", RunReport::Judged { ahead: 1 }));
    s.apply(&report("000000000001", RunReport::PrOpened { number: 5 }));
    assert!(
        s.report()
            .contains("tried to push to the default branch `main`")
    );

    let mut s = Sim::running();
    s.apply(&report("000000000001", exited(0)));
    s.apply(&report("000000000001", RunReport::Judged { ahead: 1 }));
    s.apply(&report("000000000001", RunReport::PrOpened { number: 5 }));
    assert!(!s.report().contains("default branch"), "{}", s.report());
}

#[test]
fn a_timed_out_run_is_reported_and_kept_when_asked() {
    let mut s = Sim::running_with(Policy {
        keep_failed_secs: 60,
        ..policy()
    });
    s.apply(&report(
        "000000000001",
        RunReport::Exited {
            code: None,
            timed_out: true,
            log: "thinking".into(),
            stopped: None,
            result: None,
            egress_refused: Vec::new(),
        },
    ));
    // A stopped run's branch is judged too: work it pushed is named, not lost.
    assert!(s.find("judge_run").is_some());
    s.apply(&report("000000000001", RunReport::Judged { ahead: 0 }));
    assert_eq!(s.state(), Lifecycle::TimedOut);
    assert!(s.report().contains("3600 s"));
    let remove = s.find("remove_container").expect("removal");
    assert_eq!(remove.not_before_ms, s.now + 60_000, "kept for inspection");
}

#[test]
fn a_refused_run_fails_the_issue_and_revokes_the_token() {
    let mut s = Sim::queued();
    s.apply(&admitted("000000000001"));
    s.apply(&report(
        "000000000001",
        RunReport::Refused {
            why: "the runner can push to main".into(),
        },
    ));
    assert_eq!(s.state(), Lifecycle::Failed);
    assert_eq!(s.run().state, RunState::Refused);
    assert!(s.find("revoke_token").is_some());
    assert!(s.report().contains("refused"));
}

#[test]
fn a_stale_verdict_reads_the_issue_again_instead_of_running() {
    let mut s = Sim::queued();
    s.apply(&admitted("000000000001"));
    s.apply(&report("000000000001", RunReport::Stale));
    assert_eq!(s.state(), Lifecycle::Pending);
    assert_eq!(s.run().state, RunState::Cancelled);
    assert!(s.find("read_preflight").is_some());
    assert!(s.find("revoke_token").is_some());
    assert!(
        s.find("report_run").is_none(),
        "not a run people need to hear of"
    );
}

#[test]
fn removing_the_trigger_mid_run_stops_it_and_it_ends_cancelled() {
    let mut s = Sim::running();
    s.apply(&label("alice", &[], T2));
    assert_eq!(s.state(), Lifecycle::Cancelled);
    assert_eq!(
        s.find("stop_run").expect("stop").key.to_string(),
        "acme/widgets#7:stop:000000000001"
    );
    s.apply(&report("000000000001", exited(137)));
    assert_eq!(s.run().state, RunState::Cancelled);
    assert!(s.report().contains("stopped"));
    assert_eq!(s.state(), Lifecycle::Cancelled);
}

#[test]
fn a_cancel_while_launching_stops_the_run_once_it_starts() {
    let mut s = Sim::queued();
    s.apply(&admitted("000000000001"));
    s.apply(&closed("closed", T2));
    assert_eq!(s.state(), Lifecycle::Cancelled);
    assert!(s.find("stop_run").is_some());
    s.apply(&report("000000000001", started()));
    assert_eq!(
        s.state(),
        Lifecycle::Cancelled,
        "a late start does not revive it"
    );
    s.apply(&report("000000000001", exited(137)));
    assert_eq!(s.run().state, RunState::Cancelled);
}

#[test]
fn closing_and_reopening_never_revives_a_cancelled_issue() {
    let mut s = Sim::queued();
    s.apply(&closed("closed", T2));
    assert_eq!(s.state(), Lifecycle::Cancelled);
    s.apply(&closed("open", T3));
    assert_eq!(s.state(), Lifecycle::Cancelled);
    assert!(s.find("resolve_trigger").is_none(), "{:?}", s.kinds());
    // A writer applying the trigger again hands it over afresh.
    s.apply(&label("alice", &[], "2026-11-30T10:01:00Z"));
    s.apply(&label("alice", &["headless"], "2026-11-30T10:02:00Z"));
    assert!(s.find("resolve_trigger").is_some());
}

#[test]
fn reports_for_another_run_or_out_of_order_are_ignored() {
    let mut s = Sim::running();
    assert!(!s.apply(&report("000000000009", exited(0))), "another run");
    assert!(
        !s.apply(&report("000000000001", RunReport::Judged { ahead: 3 })),
        "before the exit"
    );
    assert!(!s.apply(&report("000000000001", RunReport::PrOpened { number: 1 })));
    assert!(
        !s.apply(&report("000000000001", started())),
        "started twice"
    );
    assert_eq!(s.run().state, RunState::Running);
}
