//! The director's checks of a run's head: before the pull request, their status, a draft
//! when they fail.

use super::*;
use crate::domain::checks::{ChecksDecl, ChecksOutcome, CommandResult, SideResult, StatusState};

const HEAD: &str = "1111111111111111111111111111111111111111";
const BASE: &str = "2222222222222222222222222222222222222222";

fn with_checks() -> Policy {
    Policy {
        checks: Some(ChecksDecl {
            commands: vec!["sh test.sh".into()],
            timeout_secs: 60,
            junit: Vec::new(),
        }),
        server: crate::settings::ServerSettings {
            public_url: "https://director.example".into(),
            ..Default::default()
        },
        ..policy()
    }
}

fn side(exit: i64) -> SideResult {
    SideResult {
        commands: vec![CommandResult {
            command: "sh test.sh".into(),
            exit: Some(exit),
            timed_out: false,
            millis: 5,
            tail: "FAIL: test_add".into(),
        }],
        error: None,
    }
}

fn checked(head: i64, base: i64) -> Event {
    report(
        "000000000001",
        RunReport::Checked {
            head: HEAD.into(),
            base: Some(BASE.into()),
            outcome: ChecksOutcome {
                head: side(head),
                base: Some(side(base)),
                baseline_reused: false,
                overhead_ms: 0,
            },
        },
    )
}

fn pushed() -> Sim {
    let mut s = Sim::running_with(with_checks());
    s.apply(&report("000000000001", exited(0)));
    s.apply(&report("000000000001", RunReport::Judged { ahead: 1 }));
    s
}

#[test]
fn a_pushed_head_is_checked_before_any_pull_request_and_only_once() {
    let mut s = pushed();
    assert_eq!(s.kinds(), vec!["run_checks"]);
    assert!(s.run().checks_open(), "the checks' credential is taken now");
    // The judgement again (a replay): the checks under way are not asked twice.
    s.apply(&report("000000000001", RunReport::Judged { ahead: 1 }));
    assert!(!s.kinds().contains(&"run_checks"));
    assert!(!s.kinds().contains(&"open_pr"));
}

#[test]
fn green_checks_post_success_and_open_the_pull_request_with_the_baseline() {
    let mut s = pushed();
    assert!(s.apply(&checked(0, 0)));
    assert!(!s.run().checks_open(), "closed once the outcome is known");
    match &s.find("post_status").expect("status").action {
        Action::PostStatus {
            sha,
            state,
            target_url,
            ..
        } => {
            assert_eq!(sha, HEAD);
            assert_eq!(*state, StatusState::Success);
            assert_eq!(
                target_url,
                "https://director.example/runs/000000000001/checks"
            );
        }
        other => panic!("{other:?}"),
    }
    match &s.find("open_pr").expect("a pull request").action {
        Action::OpenPr { title, body, .. } => {
            assert!(!title.starts_with("WIP:"), "{title}");
            assert!(
                body.contains("### Checks (`director/checks`): success"),
                "{body}"
            );
            assert!(
                body.contains("| `sh test.sh` | passed | passed | passed |"),
                "{body}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(!s.apply(&checked(0, 0)), "an outcome counts once");
}

#[test]
fn a_regression_posts_failure_and_the_pull_request_opens_as_a_draft_saying_what_fails() {
    let mut s = pushed();
    s.apply(&checked(1, 0));
    match &s.find("post_status").expect("status").action {
        Action::PostStatus { state, .. } => assert_eq!(*state, StatusState::Failure),
        other => panic!("{other:?}"),
    }
    match &s.find("open_pr").expect("a pull request").action {
        Action::OpenPr { title, body, .. } => {
            assert!(title.starts_with("WIP: "), "{title}");
            assert!(body.contains("| failed (exit 1) | regression |"), "{body}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_command_already_failing_on_the_base_blocks_nothing() {
    let mut s = pushed();
    s.apply(&checked(1, 1));
    match &s.find("post_status").expect("status").action {
        Action::PostStatus { state, .. } => assert_eq!(*state, StatusState::Success),
        other => panic!("{other:?}"),
    }
}

#[test]
fn checks_that_could_not_run_never_pass() {
    let mut s = pushed();
    s.apply(&Event::ActionGaveUp {
        key: "acme/widgets#7:run-checks:000000000001".into(),
        kind: ActionKind::RunChecks,
        error: "engine down".into(),
        run: Some(test_id("000000000001")),
    });
    assert_eq!(s.kinds(), vec!["open_pr"], "no status: no head was checked");
    match &s.last[0].action {
        Action::OpenPr { title, body, .. } => {
            assert!(title.starts_with("WIP: "), "{title}");
            assert!(body.contains("could not be run: engine down"), "{body}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_run_in_a_fork_gets_its_status_once_its_pull_request_exists() {
    let mut s = Sim::running_with(with_checks());
    if let Some(run) = s.run.as_mut() {
        run.home = Some("runner/widgets".parse().expect("repo"));
    }
    s.apply(&report("000000000001", exited(0)));
    s.apply(&report("000000000001", RunReport::Judged { ahead: 1 }));
    s.apply(&checked(0, 0));
    assert!(
        s.find("post_status").is_none(),
        "the base holds no such commit yet"
    );
    assert!(s.find("open_pr").is_some());
    s.apply(&report("000000000001", RunReport::PrOpened { number: 5 }));
    assert!(s.find("post_status").is_some());
    assert!(s.report().contains("### Checks"), "the report carries them");
}
