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
        junit: None,
        changed_tests: Vec::new(),
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

fn read(head: &str) -> Event {
    Event::ChecksRead {
        pr: 5,
        head: head.into(),
        state: crate::domain::CheckState::Success,
        failing: Vec::new(),
        contexts: 1,
        held: 0,
    }
}

#[test]
fn the_merge_lane_waits_for_the_directors_checks_on_the_head_it_would_merge() {
    let mut policy = with_checks();
    policy.merge.enabled = true;
    let mut s = Sim::running_with(policy);
    s.apply(&report("000000000001", exited(0)));
    s.apply(&report("000000000001", RunReport::Judged { ahead: 1 }));
    s.apply(&checked(0, 0));
    s.apply(&report("000000000001", RunReport::PrOpened { number: 5 }));
    // Another head (a person's push) is green on the forge, unchecked by the director: the
    // lane waits.
    s.apply(&read("3333333333333333333333333333333333333333"));
    assert!(s.find("try_merge").is_none(), "{:?}", s.kinds());
    // The head the checks passed on: the lane goes.
    s.apply(&read(HEAD));
    assert!(s.find("try_merge").is_some(), "{:?}", s.kinds());
}

#[test]
fn a_draft_is_made_ready_when_a_follow_ups_checks_pass_and_only_then_merged() {
    let mut policy = with_checks();
    policy.merge.enabled = true;
    let mut s = Sim::running_with(policy);
    s.apply(&report("000000000001", exited(0)));
    s.apply(&report("000000000001", RunReport::Judged { ahead: 1 }));
    s.apply(&checked(1, 0));
    s.apply(&report("000000000001", RunReport::PrOpened { number: 5 }));
    assert_eq!(
        s.rec().pr.as_ref().and_then(|p| p.draft.clone()).as_deref(),
        Some("Add --verbose")
    );
    // The failing status is read and answered by a follow-up told the failing tail.
    s.apply(&Event::ChecksRead {
        pr: 5,
        head: HEAD.into(),
        state: crate::domain::CheckState::Failure,
        failing: vec![crate::domain::Check {
            context: crate::domain::checks::CONTEXT.into(),
            state: crate::domain::CheckState::Failure,
            description: "0 of 1 passed, 1 failing".into(),
            target_url: String::new(),
        }],
        contexts: 1,
        held: 0,
    });
    assert_eq!(s.state(), Lifecycle::Queued);
    let feedback = s
        .rec()
        .pr
        .as_ref()
        .and_then(|p| p.pending.clone())
        .expect("feedback");
    assert!(
        feedback.text.contains("FAIL: test_add"),
        "{}",
        feedback.text
    );
    s.apply(&admitted("000000000002"));
    let pr = s.rec().pr.as_ref().expect("pr");
    assert_eq!(
        (pr.ci_followups, pr.check_followups),
        (0, 1),
        "counted against runner.max_check_followups alone"
    );
    s.apply(&report("000000000002", started()));
    s.apply(&report("000000000002", exited(0)));
    s.apply(&report("000000000002", RunReport::Judged { ahead: 1 }));
    assert_eq!(
        s.kinds(),
        vec!["run_checks"],
        "the follow-up's head is checked"
    );
    let fixed = "4444444444444444444444444444444444444444";
    s.apply(&report(
        "000000000002",
        RunReport::Checked {
            head: fixed.into(),
            base: Some(BASE.into()),
            outcome: ChecksOutcome {
                head: side(0),
                base: Some(side(0)),
                baseline_reused: true,
                overhead_ms: 0,
            },
        },
    ));
    match &s.find("retitle_pull").expect("made ready").action {
        Action::RetitlePull { pr, title, .. } => {
            assert_eq!((*pr, title.as_str()), (5, "Add --verbose"));
        }
        other => panic!("{other:?}"),
    }
    assert!(
        s.find("post_status").is_some(),
        "posted on the fork-less head at once"
    );
    // Green on the forge, but still titled a draft: no merge before the title is changed.
    s.apply(&read(fixed));
    assert!(s.find("try_merge").is_none(), "{:?}", s.kinds());
    s.apply(&report("000000000002", RunReport::Readied { pr: 5 }));
    assert!(s.rec().pr.as_ref().is_some_and(|p| p.draft.is_none()));
    assert!(s.find("try_merge").is_some(), "{:?}", s.kinds());
}

#[test]
fn failing_director_checks_are_answered_within_their_own_budget() {
    let mut policy = with_checks();
    policy.max_check_followups = 0;
    let mut s = Sim::running_with(policy);
    s.apply(&report("000000000001", exited(0)));
    s.apply(&report("000000000001", RunReport::Judged { ahead: 1 }));
    s.apply(&checked(1, 0));
    s.apply(&report("000000000001", RunReport::PrOpened { number: 5 }));
    s.apply(&Event::ChecksRead {
        pr: 5,
        head: HEAD.into(),
        state: crate::domain::CheckState::Failure,
        failing: vec![crate::domain::Check {
            context: crate::domain::checks::CONTEXT.into(),
            state: crate::domain::CheckState::Failure,
            description: "0 of 1 passed, 1 failing".into(),
            target_url: String::new(),
        }],
        contexts: 1,
        held: 0,
    });
    assert_eq!(s.state(), Lifecycle::Succeeded, "nothing more starts");
    match &s.find("post_notice").expect("told once").action {
        Action::PostNotice { body, .. } => {
            assert!(body.contains("`runner.max_check_followups`"), "{body}");
        }
        other => panic!("{other:?}"),
    }
    let pr = s.rec().pr.as_ref().expect("pr");
    assert_eq!((pr.ci_followups, pr.check_followups), (0, 0));
}

#[test]
fn an_issue_cancelled_while_its_checks_run_opens_no_pull_request() {
    let mut s = pushed();
    s.apply(&label("alice", &[], T2));
    assert_eq!(s.state(), Lifecycle::Cancelled);
    s.apply(&checked(0, 0));
    assert!(s.find("open_pr").is_none(), "{:?}", s.kinds());
    assert!(s.find("post_status").is_none(), "{:?}", s.kinds());
    assert_eq!(s.run().state, RunState::Cancelled);
}
