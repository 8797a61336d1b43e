//! The pull request: its fate, review feedback and follow-up runs.

use super::*;

const PR: u64 = 12;

/// A run that opened pull request #12.
fn with_pr() -> Sim {
    with_pr_under(policy())
}

fn with_pr_under(policy: Policy) -> Sim {
    let mut s = Sim::running_with(policy);
    s.apply(&report("000000000001", exited(0)));
    s.apply(&report("000000000001", RunReport::Judged { ahead: 1 }));
    s.apply(&report("000000000001", RunReport::PrOpened { number: PR }));
    assert_eq!(s.state(), Lifecycle::Succeeded);
    s
}

fn pull_fact(kind: EventKind, action: &str, sender: &str, state: &str, merged: bool) -> ForgeEvent {
    let mut f = fact(kind, action, sender, &[], state, T3);
    f.issue = "acme/widgets#12".parse().expect("valid");
    f.is_pull = true;
    f.snapshot.merged = merged;
    f
}

fn pull_event(action: &str, state: &str, merged: bool) -> Event {
    Event::Forge(pull_fact(
        EventKind::PullRequest,
        action,
        "maintainer",
        state,
        merged,
    ))
}

fn review(sender: &str, kind: crate::event::ReviewKind, body: &str) -> Event {
    let mut f = pull_fact(EventKind::PullReview, "reviewed", sender, "open", false);
    f.review = Some(crate::event::ReviewSnapshot {
        kind,
        body: body.into(),
    });
    Event::Forge(f)
}

fn pull_comment(sender: &str, id: u64, body: &str) -> Event {
    let mut f = pull_fact(EventKind::PullComment, "created", sender, "open", false);
    f.comment = Some(CommentSnapshot {
        id,
        author: sender.into(),
        body: body.into(),
        updated_at: Some(T3.into()),
    });
    Event::Forge(f)
}

fn fix(key: &str, text: &str) -> Event {
    Event::PullAsked {
        pr: PR,
        actor: "alice".into(),
        allowed: true,
        ask: PullAsk::Fix {
            feedback: Feedback {
                key: key.into(),
                by: "alice".into(),
                text: text.into(),
            },
        },
    }
}

impl Sim {
    /// The body of the comment planned on the pull request.
    fn on_pull(&self) -> String {
        match self.find("comment_on_pull").map(|p| &p.action) {
            Some(Action::CommentOnPull { pr, body, .. }) => {
                assert_eq!(*pr, PR);
                body.clone()
            }
            other => panic!(
                "no comment on the PR planned: {other:?} in {:?}",
                self.kinds()
            ),
        }
    }

    /// A follow-up admitted and started from head `h0`.
    fn followup_running(&mut self, run_id: &str) {
        assert!(self.apply(&admitted(run_id)));
        assert_eq!(self.state(), Lifecycle::Launching);
        self.apply(&report(
            run_id,
            RunReport::Started {
                container_id: "c2".into(),
                base_branch: "main".into(),
                start_head: Some("h0".into()),
            },
        ));
        assert_eq!(self.state(), Lifecycle::Running);
    }
}

#[test]
fn a_merged_pull_request_makes_the_issue_merged_and_swaps_the_label() {
    let mut s = with_pr();
    assert_eq!(s.rec().pr.as_ref().map(|p| p.number), Some(PR));
    assert!(s.apply(&pull_event("closed", "closed", true)));
    assert_eq!(s.state(), Lifecycle::Merged);
    assert!(s.kinds().contains(&"sync_labels"));
    assert_eq!(
        state_label(&s.policy.labels, s.rec()),
        Some("headless:merged")
    );
    assert!(s.find("post_notice").is_none(), "a merge needs no comment");
    // Forgejo then closes the issue (`Closes #7`): a merged issue stays merged.
    let mut closed = fact(
        EventKind::Issues,
        "closed",
        "maintainer",
        &["headless"],
        "closed",
        T3,
    );
    closed.snapshot.updated_at = Some("2026-11-30T10:00:10Z".into());
    s.apply(&Event::Forge(closed));
    assert_eq!(s.state(), Lifecycle::Merged);
}

#[test]
fn a_pull_request_closed_unmerged_is_said_on_the_issue_and_reopening_brings_it_back() {
    let mut s = with_pr();
    s.apply(&pull_event("closed", "closed", false));
    assert_eq!(s.state(), Lifecycle::PrClosed);
    assert!(s.kinds().contains(&"sync_labels"), "pr_open comes off");
    match s.find("post_notice").map(|p| &p.action) {
        Some(Action::PostNotice { body, .. }) => assert!(body.contains("#12 was closed"), "{body}"),
        other => panic!("{other:?}"),
    }
    s.apply(&pull_event("reopened", "open", false));
    assert_eq!(s.state(), Lifecycle::Succeeded);
    // A pull request that is not the issue's own changes nothing.
    let mut other = pull_fact(EventKind::PullRequest, "closed", "x", "closed", true);
    other.issue = "acme/widgets#99".parse().expect("valid");
    assert!(!s.apply(&Event::Forge(other)));
}

#[test]
fn the_scan_notices_a_merge_whose_webhook_was_lost() {
    let mut s = with_pr();
    let seen = pull_fact(EventKind::Scan, "observed", "", "closed", true);
    assert!(s.apply(&Event::Forge(seen.clone())));
    assert_eq!(s.state(), Lifecycle::Merged);
    assert!(!s.apply(&Event::Forge(seen)), "seen twice, decided once");
}

#[test]
fn only_a_request_for_changes_asks_for_the_reviewers_permission() {
    use crate::event::ReviewKind;
    let mut s = with_pr();
    assert!(!s.apply(&review("alice", ReviewKind::Approved, "LGTM")));
    assert!(!s.apply(&review("alice", ReviewKind::Comment, "nit")));
    assert!(s.apply(&review("rita", ReviewKind::ChangesRequested, "rename it")));
    match s.find("read_feedback").map(|p| &p.action) {
        Some(Action::ReadFeedback { pr, sender, source }) => {
            assert_eq!((*pr, sender.as_str()), (PR, "rita"));
            assert_eq!(
                *source,
                FeedbackSource::Review {
                    body: "rename it".into()
                }
            );
        }
        other => panic!("{other:?}"),
    }
    // Nothing changes until the reviewer is known to be a writer.
    assert_eq!(s.state(), Lifecycle::Succeeded);
    assert!(s.apply(&pull_comment("rita", 40, "/director fix please")));
    assert!(s.find("read_feedback").is_some());
    assert!(!s.apply(&pull_comment("rita", 41, "looks odd")));
}

#[test]
fn feedback_of_an_account_that_may_not_write_changes_nothing() {
    let mut s = with_pr();
    let before = s.rec().clone();
    let refused = Event::PullAsked {
        pr: PR,
        actor: "rita".into(),
        allowed: false,
        ask: PullAsk::Fix {
            feedback: Feedback {
                key: "review:1".into(),
                by: "rita".into(),
                text: "push to main".into(),
            },
        },
    };
    assert!(!s.apply(&refused));
    assert_eq!(*s.rec(), before);
}

#[test]
fn a_writers_feedback_starts_one_follow_up_on_the_same_branch() {
    let mut s = with_pr();
    let branch = s.run().branch.clone();
    assert!(s.apply(&fix("review:5", "Rename `x`.")));
    assert_eq!(s.state(), Lifecycle::Queued);
    assert!(
        !s.apply(&fix("review:5", "Rename `x`.")),
        "the same review is taken once"
    );
    s.followup_running("000000000002");
    let run = s.run().clone();
    assert_eq!(run.branch, branch, "the PR's own branch");
    let f = run.followup.expect("a follow-up");
    assert_eq!((f.pr, f.start_head.as_deref()), (PR, Some("h0")));
    assert!(f.feedback.text.contains("Rename"));
    assert!(s.on_pull().contains("follow-up run `000000000002` started"));
    assert_eq!(s.rec().pr.as_ref().map(|p| p.followups), Some(1));

    s.apply(&report("000000000002", exited(0)));
    assert!(s.find("judge_run").is_some());
    s.apply(&report("000000000002", RunReport::Judged { ahead: 2 }));
    assert!(s.find("open_pr").is_none(), "one pull request");
    assert!(s.find("report_run").is_none(), "answered on the PR");
    assert!(s.on_pull().contains("pushed 2 new commit(s)"));
    assert_eq!(s.run().state, RunState::Succeeded);
    assert_eq!(s.state(), Lifecycle::Succeeded);
}

#[test]
fn a_follow_up_that_pushes_nothing_fails_on_the_pr_and_the_pr_stays_open() {
    let mut s = with_pr();
    s.apply(&fix("comment:8", "Add a test."));
    s.followup_running("000000000002");
    s.apply(&report("000000000002", exited(1)));
    s.apply(&report("000000000002", RunReport::Judged { ahead: 0 }));
    let body = s.on_pull();
    assert!(
        body.contains("failed") && body.contains("did things"),
        "{body}"
    );
    assert_eq!(s.run().state, RunState::Failed);
    assert_eq!(s.state(), Lifecycle::Succeeded);
}

#[test]
fn feedback_during_a_follow_up_waits_for_its_end() {
    let mut s = with_pr();
    s.apply(&fix("review:5", "Rename `x`."));
    s.followup_running("000000000002");
    s.apply(&fix("review:6", "Also add docs."));
    assert_eq!(s.state(), Lifecycle::Running);
    s.apply(&report("000000000002", exited(0)));
    s.apply(&report("000000000002", RunReport::Judged { ahead: 1 }));
    assert_eq!(s.state(), Lifecycle::Queued, "the waiting feedback is next");
    s.followup_running("000000000003");
    assert!(
        s.run()
            .followup
            .as_ref()
            .is_some_and(|f| f.feedback.text.contains("docs"))
    );
}

#[test]
fn the_follow_up_cap_waits_for_a_writers_retry() {
    let mut s = with_pr_under(Policy {
        max_followups: 1,
        ..policy()
    });
    s.apply(&fix("review:5", "one"));
    s.followup_running("000000000002");
    s.apply(&report("000000000002", exited(0)));
    s.apply(&report("000000000002", RunReport::Judged { ahead: 1 }));
    assert!(s.apply(&fix("review:6", "two")));
    assert_eq!(s.state(), Lifecycle::Succeeded, "capped");
    assert!(s.on_pull().contains("`/director retry`"));
    let cap_key = s.find("comment_on_pull").map(|p| p.key.clone());
    s.apply(&fix("review:7", "three"));
    assert_eq!(
        s.find("comment_on_pull").map(|p| p.key.clone()),
        cap_key,
        "the cap notice is one comment"
    );
    let retry = Event::PullAsked {
        pr: PR,
        actor: "alice".into(),
        allowed: true,
        ask: PullAsk::Retry { comment_id: 50 },
    };
    assert!(s.apply(&retry));
    assert_eq!(s.state(), Lifecycle::Queued);
    s.followup_running("000000000003");
    let text = &s.run().followup.as_ref().expect("follow-up").feedback.text;
    assert!(text.contains("two") && text.contains("three"), "{text}");
}

#[test]
fn cancel_on_the_pr_stops_the_follow_up_and_keeps_the_pr() {
    let mut s = with_pr();
    s.apply(&fix("review:5", "one"));
    s.followup_running("000000000002");
    let cancel = Event::PullAsked {
        pr: PR,
        actor: "alice".into(),
        allowed: true,
        ask: PullAsk::Cancel { comment_id: 51 },
    };
    assert!(s.apply(&cancel));
    assert!(s.find("stop_run").is_some());
    s.apply(&report("000000000002", exited(137)));
    assert_eq!(s.run().state, RunState::Cancelled);
    assert!(s.find("comment_on_pull").is_some(), "the PR is told");
    assert_eq!(s.state(), Lifecycle::Succeeded);
    // Removing the trigger during a follow-up stops it too, and the PR stays.
    s.apply(&fix("review:6", "two"));
    s.followup_running("000000000003");
    s.apply(&label("alice", &[], T2));
    assert!(s.find("stop_run").is_some());
    assert_ne!(s.state(), Lifecycle::Cancelled);
}

#[test]
fn a_merge_during_a_follow_up_stops_it() {
    let mut s = with_pr();
    s.apply(&fix("review:5", "one"));
    s.followup_running("000000000002");
    s.apply(&pull_event("closed", "closed", true));
    assert_eq!(s.state(), Lifecycle::Merged);
    assert!(s.find("stop_run").is_some());
    s.apply(&report("000000000002", exited(137)));
    assert_eq!(s.state(), Lifecycle::Merged);
}

#[test]
fn comments_on_the_issue_while_its_pr_is_open_read_nothing_again() {
    let mut s = with_pr();
    s.apply(&comment("alice", 60, "thanks!", T3));
    assert!(s.find("read_preflight").is_none());
    s.apply(&fix("review:5", "one"));
    assert_eq!(s.state(), Lifecycle::Queued);
    s.apply(&comment(
        "alice",
        61,
        "more context",
        "2026-11-30T10:00:11Z",
    ));
    assert!(s.find("read_preflight").is_none());
    assert_eq!(s.state(), Lifecycle::Queued);
}

fn exited_with(result: crate::domain::run::RunResult, stopped: Option<StopCause>) -> RunReport {
    RunReport::Exited {
        code: stopped.is_none().then_some(0),
        timed_out: stopped == Some(StopCause::Timeout),
        log: "worked".into(),
        stopped,
        result: Some(result),
        egress_refused: Vec::new(),
    }
}

#[test]
fn an_agent_that_says_it_is_blocked_is_reported_as_such_not_as_a_failure() {
    use crate::domain::run::{RunOutcome, RunResult};
    let mut s = Sim::running();
    let blocked = RunResult {
        outcome: RunOutcome::Blocked {
            reason: "the issue asks for a secret key".into(),
        },
        summary: None,
        usage: None,
    };
    s.apply(&report("000000000001", exited_with(blocked, None)));
    s.apply(&report("000000000001", RunReport::Judged { ahead: 1 }));
    assert_eq!(s.state(), Lifecycle::Declined);
    assert_eq!(s.run().state, RunState::Declined);
    assert!(s.find("open_pr").is_none());
    let body = s.report();
    assert!(
        body.contains("blocked: the issue asks for a secret key"),
        "{body}"
    );
    assert!(
        body.contains("/compare/main...director-issue-7-000000000001"),
        "{body}"
    );
    // A writer may try again.
    s.apply(&command(Command::Retry, true));
    assert_eq!(s.state(), Lifecycle::Queued);
}

#[test]
fn the_agents_summary_goes_in_the_pr_body_and_its_usage_in_the_report() {
    use crate::domain::run::{RunOutcome, RunResult, Usage};
    let mut s = Sim::running();
    let done = RunResult {
        outcome: RunOutcome::Done,
        summary: Some("Added a `--verbose` flag.".into()),
        usage: Some(Usage {
            input_tokens: Some(1000),
            output_tokens: Some(200),
            cost_usd: Some(0.5),
            ..Usage::default()
        }),
    };
    s.apply(&report("000000000001", exited_with(done, None)));
    s.apply(&report("000000000001", RunReport::Judged { ahead: 1 }));
    match s.find("open_pr").map(|p| &p.action) {
        Some(Action::OpenPr { body, .. }) => {
            assert!(body.contains("Added a `--verbose` flag."), "{body}")
        }
        other => panic!("{other:?}"),
    }
    s.apply(&report("000000000001", RunReport::PrOpened { number: PR }));
    assert!(
        s.report()
            .contains("1000 input and 200 output tokens, $0.50"),
        "{}",
        s.report()
    );
}

#[test]
fn a_wedged_run_is_stopped_and_its_pushed_branch_named_not_opened() {
    use crate::domain::run::{RunOutcome, RunResult};
    let mut s = Sim::running();
    let done = RunResult {
        outcome: RunOutcome::Done,
        summary: None,
        usage: None,
    };
    s.apply(&report(
        "000000000001",
        exited_with(done, Some(StopCause::Idle)),
    ));
    s.apply(&report("000000000001", RunReport::Judged { ahead: 2 }));
    assert_eq!(s.state(), Lifecycle::TimedOut);
    assert!(s.find("open_pr").is_none());
    let body = s.report();
    assert!(
        body.contains("printed nothing for `runner.idle_timeout_secs`"),
        "{body}"
    );
    assert!(body.contains("2 commit(s) ahead of `main`"), "{body}");
    assert!(
        body.contains("http://forge.example/acme/widgets/src/branch/director-issue-7-000000000001"),
        "{body}"
    );
}

#[test]
fn a_run_cancelled_before_its_container_started_ends_cancelled() {
    let mut s = Sim::queued();
    s.apply(&admitted("000000000001"));
    s.apply(&label("alice", &[], T2));
    assert!(s.run().stop_requested);
    s.apply(&report(
        "000000000001",
        RunReport::Refused {
            why: "it was cancelled before it started".into(),
        },
    ));
    assert_eq!(s.run().state, RunState::Cancelled);
    assert_eq!(s.state(), Lifecycle::Cancelled);
    assert!(s.kinds().contains(&"revoke_token"));
}
