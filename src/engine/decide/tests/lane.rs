//! The pull request's checks and the merge lane, as `decide` sees them.

use super::*;
use crate::domain::{Check, CheckState};
use crate::event::{MergeOutcome, ReviewKind};

const PR: u64 = 12;

fn with_pr_under(policy: Policy) -> Sim {
    let mut s = Sim::running_with(policy);
    s.apply(&report("000000000001", exited(0)));
    s.apply(&report("000000000001", RunReport::Judged { ahead: 1 }));
    s.apply(&report("000000000001", RunReport::PrOpened { number: PR }));
    s
}

fn lane_on() -> Policy {
    let mut p = policy();
    p.merge.enabled = true;
    p
}

fn read(head: &str, state: CheckState) -> Event {
    let failing = if state == CheckState::Failure {
        vec![Check {
            context: "ci / test".into(),
            state,
            description: "Failed".into(),
            target_url: "https://ci.example/1".into(),
        }]
    } else {
        Vec::new()
    };
    Event::ChecksRead {
        pr: PR,
        head: head.into(),
        state,
        failing,
        contexts: 1,
        held: 0,
    }
}

fn approved() -> Event {
    let mut f = fact(EventKind::PullReview, "reviewed", "alice", &[], "open", T3);
    f.issue = "acme/widgets#12".parse().expect("valid");
    f.is_pull = true;
    f.review = Some(crate::event::ReviewSnapshot {
        kind: ReviewKind::Approved,
        body: "LGTM".into(),
    });
    Event::Forge(f)
}

#[test]
fn opening_the_pull_request_reads_its_checks() {
    let s = with_pr_under(policy());
    assert!(s.kinds().contains(&"read_checks"), "{:?}", s.kinds());
}

#[test]
fn a_failure_is_answered_once_per_head_and_counted_apart_from_review_follow_ups() {
    let mut s = with_pr_under(policy());
    assert!(s.apply(&read("aaa", CheckState::Failure)));
    assert_eq!(s.state(), Lifecycle::Queued, "a follow-up waits for a slot");
    let pending = s
        .rec()
        .pr
        .as_ref()
        .and_then(|p| p.pending.clone())
        .expect("feedback");
    assert_eq!(pending.key, "checks:aaa");
    assert!(pending.text.contains("ci / test") && pending.text.contains("https://ci.example/1"));
    // The same failure read again changes nothing.
    s.apply(&read("aaa", CheckState::Failure));
    assert!(!s.kinds().contains(&"start_run"));
    s.apply(&Event::Admitted {
        run_id: test_id("000000000002"),
        branch: "b".into(),
    });
    let pr = s.rec().pr.clone().expect("pr");
    assert_eq!((pr.ci_followups, pr.followups), (1, 0));
}

#[test]
fn past_the_cap_the_issue_is_told_once_and_nothing_starts() {
    let mut p = policy();
    p.max_ci_followups = 0;
    let mut s = with_pr_under(p);
    s.apply(&read("aaa", CheckState::Failure));
    assert_eq!(s.state(), Lifecycle::Succeeded);
    assert_eq!(s.kinds(), vec!["post_notice"]);
    s.apply(&read("aaa", CheckState::Failure));
    assert!(s.kinds().is_empty(), "told once: {:?}", s.kinds());
}

#[test]
fn green_checks_try_the_merge_only_with_the_lane_on_and_one_attempt_at_a_time() {
    let mut off = with_pr_under(policy());
    off.apply(&read("aaa", CheckState::Success));
    assert!(!off.kinds().contains(&"try_merge"));

    let mut s = with_pr_under(lane_on());
    s.apply(&read("aaa", CheckState::Success));
    assert_eq!(s.kinds(), vec!["try_merge"]);
    s.apply(&approved());
    assert!(!s.kinds().contains(&"try_merge"), "one attempt at a time");
    s.apply(&Event::MergeTried {
        pr: PR,
        outcome: MergeOutcome::Waiting {
            reason: "0 of 1 approvals".into(),
            approvals: Vec::new(),
            poll: false,
        },
    });
    s.apply(&approved());
    assert_eq!(s.kinds(), vec!["try_merge"], "the approval tries again");
}

#[test]
fn a_refused_head_is_not_tried_again_until_the_branch_moves() {
    let mut s = with_pr_under(lane_on());
    s.apply(&read("aaa", CheckState::Success));
    s.apply(&Event::MergeTried {
        pr: PR,
        outcome: MergeOutcome::Refused {
            head: "aaa".into(),
            reason: "HTTP 405".into(),
        },
    });
    assert_eq!(s.kinds(), vec!["comment_on_pull"], "reported once");
    s.apply(&approved());
    assert!(s.kinds().is_empty(), "{:?}", s.kinds());
    s.apply(&read("bbb", CheckState::Success));
    assert_eq!(s.kinds(), vec!["try_merge"], "a new head is tried");
}

#[test]
fn a_merge_by_the_lane_ends_the_issue_merged_and_names_who_approved() {
    let mut s = with_pr_under(lane_on());
    s.apply(&read("aaa", CheckState::Success));
    s.apply(&Event::MergeTried {
        pr: PR,
        outcome: MergeOutcome::Merged {
            approvals: vec!["alice".into()],
        },
    });
    assert_eq!(s.state(), Lifecycle::Merged);
    let notice = s
        .last
        .iter()
        .find_map(|p| match &p.action {
            Action::PostNotice { body, .. } => Some(body.clone()),
            _ => None,
        })
        .expect("a notice");
    assert!(notice.contains("approved by @alice"), "{notice}");
}
