//! Actions that failed on every attempt.

use super::*;

#[test]
fn a_run_that_cannot_be_started_fails_visibly() {
    let mut s = Sim::queued();
    s.apply(&admitted("000000000001"));
    s.apply(&Event::ActionGaveUp {
        key: "acme/widgets#7:start:000000000001".into(),
        kind: ActionKind::StartRun,
        error: "minting the run token: HTTP 500".into(),
        run: Some(test_id("000000000001")),
    });
    assert_eq!(s.state(), Lifecycle::Failed);
    assert_eq!(s.run().state, RunState::Failed);
    assert!(s.report().contains("HTTP 500"));
    assert!(s.rec().blocked.is_some());
}

#[test]
fn a_give_up_stored_before_runs_were_recorded_in_it_is_read_by_its_key() {
    let stored = r#"{"type":"action_gave_up","key":"acme/widgets#7:start:000000000001","kind":"start_run","error":"HTTP 500"}"#;
    let legacy: Event = serde_json::from_str(stored).expect("an earlier version's event parses");
    let mut s = Sim::queued();
    s.apply(&admitted("000000000001"));
    s.apply(&legacy);
    assert_eq!(s.run().state, RunState::Failed);
    let mut other = Sim::queued();
    other.apply(&admitted("000000000002"));
    assert!(
        !other.apply(&legacy),
        "000000000002 failed for 000000000001's start"
    );
}

#[test]
fn a_start_that_gave_up_for_an_earlier_run_leaves_the_run_now_alone() {
    let mut s = Sim::queued();
    s.apply(&admitted("000000000001"));
    // Cancelled and stopped while an attempt at its start was still out, then run again.
    s.apply(&command(Command::Cancel, true));
    s.apply(&report("000000000001", exited(137)));
    assert!(!s.run().state.is_active());
    s.apply(&command(Command::Retry, true));
    s.apply(&admitted("000000000002"));
    assert_eq!(s.run().id.as_str(), "000000000002");
    let late = |kind: ActionKind, what: &str| Event::ActionGaveUp {
        key: format!("acme/widgets#7:{what}:000000000001"),
        kind,
        error: "HTTP 500".into(),
        run: Some(test_id("000000000001")),
    };
    assert!(
        !s.apply(&late(ActionKind::StartRun, "start")),
        "000000000002 failed for 000000000001's start"
    );
    assert_eq!(s.run().state, RunState::Launching);
    assert_eq!(s.state(), Lifecycle::Launching);
    assert!(s.rec().blocked.is_none());
    // Its own start giving up still fails it.
    s.apply(&Event::ActionGaveUp {
        key: "acme/widgets#7:start:000000000002".into(),
        kind: ActionKind::StartRun,
        error: "HTTP 500".into(),
        run: Some(test_id("000000000002")),
    });
    assert_eq!(s.run().state, RunState::Failed);
}

#[test]
fn a_routed_issue_that_cannot_be_filed_says_so_on_the_issue() {
    let mut s = Sim::picked_up();
    s.read(read_of(Verdict::WrongRepo {
        repo: "acme/api".parse().expect("repo"),
        what: "x".into(),
    }));
    s.apply(&Event::ActionGaveUp {
        key: "k".into(),
        kind: ActionKind::FileRouted,
        error: "HTTP 403".into(),
        run: None,
    });
    assert_eq!(s.state(), Lifecycle::PreflightFailed);
    assert!(s.sticky().contains("HTTP 403"));
    assert!(
        s.rec()
            .blocked
            .as_deref()
            .is_some_and(|b| b.contains("file_routed"))
    );
}

#[test]
fn a_failed_comment_leaves_the_state_and_names_the_reason() {
    let mut s = Sim::queued();
    s.apply(&Event::ActionGaveUp {
        key: "k".into(),
        kind: ActionKind::UpsertSticky,
        error: "HTTP 502".into(),
        run: None,
    });
    assert_eq!(s.state(), Lifecycle::Queued);
    assert!(
        s.rec()
            .blocked
            .as_deref()
            .is_some_and(|b| b.contains("HTTP 502"))
    );
}

#[test]
fn every_decision_bumps_the_version_its_action_keys_name() {
    let mut s = Sim::new();
    s.apply(&label("alice", &["headless"], T1));
    assert_eq!(s.rec().version, 1);
    assert_eq!(s.last[0].key.to_string(), "acme/widgets#7:resolve:v1");
    s.apply(&judged(true));
    assert_eq!(s.rec().version, 2);
}
