//! The pre-flight: reads, verdicts, caps and retries, the WRONG-REPO route.

use super::*;

#[test]
fn go_queues_the_issue_with_one_comment_and_the_queued_label() {
    let mut s = Sim::picked_up();
    s.read(go());
    assert_eq!(s.state(), Lifecycle::Queued);
    assert_eq!(s.kinds(), vec!["upsert_sticky", "sync_labels"]);
    let body = s.sticky();
    assert!(
        body.contains("pre-flight: GO") && body.contains("@mallory"),
        "{body}"
    );
    let p = &s.rec().preflight;
    assert_eq!(p.verdict, Some(Judgement::Go));
    assert_eq!(p.hash.as_deref(), Some("h1"));
    assert_eq!(
        p.handled_command_id, 9,
        "commands seen by the read are handled"
    );
}

#[test]
fn no_go_says_why() {
    let mut s = Sim::picked_up();
    s.read(read_of(Verdict::NoGo {
        reason: "too big".into(),
    }));
    assert_eq!(s.state(), Lifecycle::NoGo);
    assert!(s.sticky().contains("too big"));
    assert_eq!(s.rec().preflight.reason.as_deref(), Some("too big"));
}

#[test]
fn wrong_repo_to_a_trusted_owner_files_there_then_says_where() {
    let mut s = Sim::picked_up();
    s.read(read_of(Verdict::WrongRepo {
        repo: "acme/api".parse().expect("repo"),
        what: "fix the API".into(),
    }));
    assert_eq!(s.state(), Lifecycle::Routed);
    let (rev, sticky) = match &s.last[0].action {
        Action::FileRouted {
            rev,
            target,
            marker,
            body,
            sticky,
            ..
        } => {
            assert_eq!(target.to_string(), "acme/api");
            assert_eq!(marker, "<!-- director:routed-from acme/widgets#7 -->");
            assert!(body.starts_with(marker.as_str()));
            (*rev, sticky.clone())
        }
        other => panic!("{other:?}"),
    };
    assert!(
        s.find("upsert_sticky").is_none(),
        "the comment waits for the filing"
    );
    let filed: IssueRef = "acme/api#12".parse().expect("ref");
    assert!(s.apply(&Event::RoutedFiled {
        rev,
        filed: filed.clone(),
        sticky: sticky.clone()
    }));
    assert_eq!(s.rec().preflight.routed_to.as_deref(), Some("acme/api#12"));
    assert!(s.sticky().contains("acme/api#12"));
    // The same outcome again (a replay) files and posts nothing more.
    assert!(!s.apply(&Event::RoutedFiled { rev, filed, sticky }));
}

#[test]
fn a_reread_of_a_routed_issue_does_not_file_it_again() {
    let mut s = Sim::picked_up();
    let wrong = read_of(Verdict::WrongRepo {
        repo: "acme/api".parse().expect("repo"),
        what: "fix the API".into(),
    });
    s.read(wrong.clone());
    let sticky = match &s.last[0].action {
        Action::FileRouted { sticky, .. } => sticky.clone(),
        other => panic!("{other:?}"),
    };
    let rev = s.rev();
    s.apply(&Event::RoutedFiled {
        rev,
        filed: "acme/api#12".parse().expect("ref"),
        sticky,
    });
    s.apply(&edited("alice", T2));
    assert_eq!(s.state(), Lifecycle::Pending);
    s.read(wrong);
    assert_eq!(s.state(), Lifecycle::Routed);
    assert!(s.find("file_routed").is_none(), "{:?}", s.kinds());
    assert!(s.sticky().contains("acme/api#12"));
}

#[test]
fn wrong_repo_to_an_untrusted_owner_is_a_no_go() {
    let mut s = Sim::picked_up();
    s.read(read_of(Verdict::WrongRepo {
        repo: "evil/api".parse().expect("repo"),
        what: "x".into(),
    }));
    assert_eq!(s.state(), Lifecycle::NoGo);
    assert!(s.find("file_routed").is_none());
    assert!(s.sticky().contains("preflight.trusted_owners"));
}

#[test]
fn a_failed_read_is_retried_with_doubling_backoff_then_reported() {
    let mut s = Sim::picked_up();
    s.read(failed());
    assert_eq!(s.state(), Lifecycle::Pending);
    assert_eq!(s.rev(), 2, "a retry is a new revision");
    let first = s.find("read_preflight").expect("retry").not_before_ms;
    assert_eq!(first, s.now + 1_000);
    assert!(
        s.find("upsert_sticky").is_none(),
        "no comment while retrying"
    );
    s.read(failed());
    let second = s.find("read_preflight").expect("retry").not_before_ms;
    assert_eq!(second, s.now + 2_000);
    s.read(failed());
    assert_eq!(s.state(), Lifecycle::PreflightFailed);
    assert!(s.find("read_preflight").is_none());
    assert!(s.sticky().contains("did not answer"));
    assert_eq!(s.rec().preflight.verdict, Some(Judgement::Error));
}

#[test]
fn with_on_error_proceed_a_failed_pre_flight_queues_the_issue() {
    let mut s = Sim::with(Policy {
        on_error: OnError::Proceed,
        preflight_max_attempts: 1,
        ..policy()
    });
    s.apply(&label("alice", &["headless"], T1));
    s.apply(&judged(true));
    s.read(failed());
    assert_eq!(s.state(), Lifecycle::Queued);
}

#[test]
fn a_cap_defers_the_read_until_the_window_frees_as_a_labelled_state_without_a_comment() {
    let mut s = Sim::picked_up();
    let until = NOW + 3_600_000;
    s.read(PreflightOutcome::Capped {
        filer: None,
        limit: "20 pre-flights per hour".into(),
        until_ms: until,
        read: ctx(),
    });
    assert_eq!(s.state(), Lifecycle::Pending);
    assert_eq!(
        s.find("read_preflight").expect("later").not_before_ms,
        until
    );
    // A backlog of thousands must not notify every watcher of every issue.
    assert!(s.find("upsert_sticky").is_none(), "{:?}", s.kinds());
    assert!(s.find("post_notice").is_none(), "{:?}", s.kinds());
    assert!(s.kinds().contains(&"sync_labels"));
    assert_eq!(
        state_label(&s.policy.labels, s.rec()),
        Some("headless:waiting")
    );
    // Its read, when the window frees, takes the label off again.
    s.read(go());
    assert_eq!(
        state_label(&s.policy.labels, s.rec()),
        Some("headless:queued")
    );
    assert!(s.kinds().contains(&"sync_labels"));
}

#[test]
fn the_cap_arithmetic_names_the_limit_reached_first() {
    let repo: RepoName = "acme/widgets".parse().expect("repo");
    let w = CallWindow {
        total: 5,
        oldest_ms: Some(100),
        repo_total: 2,
        repo_oldest_ms: Some(200),
    };
    assert_eq!(cap_reached(&w, &repo, 10, 5, 1_000), None);
    let (limit, until) = cap_reached(&w, &repo, 10, 2, 1_000).expect("per repo");
    assert!(limit.contains("acme/widgets"));
    assert_eq!(until, 200 + HOUR_MS + 1_000);
    let (limit, until) = cap_reached(&w, &repo, 5, 9, 1_000).expect("overall");
    assert_eq!(limit, "5 pre-flights per hour");
    assert_eq!(until, 100 + HOUR_MS + 1_000);
}

#[test]
fn a_writer_skipping_the_gate_queues_the_issue() {
    let mut s = Sim::picked_up();
    s.read(PreflightOutcome::Skipped {
        by: "alice".into(),
        how: "`/director go`".into(),
        read: ctx(),
    });
    assert_eq!(s.state(), Lifecycle::Queued);
    assert_eq!(s.rec().preflight.verdict, Some(Judgement::Skipped));
    assert!(s.sticky().contains("@alice"));
}

#[test]
fn a_result_for_an_older_revision_is_stale_and_dropped() {
    let mut s = Sim::picked_up();
    s.apply(&edited("alice", T2));
    assert_eq!(s.rev(), 2, "the edit asks for a read of its own");
    let stale = Event::PreflightRead {
        rev: 1,
        outcome: go(),
    };
    assert!(!s.apply(&stale));
    assert_eq!(s.state(), Lifecycle::Pending);
}

#[test]
fn a_trusted_edit_after_no_go_reads_again() {
    let mut s = Sim::picked_up();
    s.read(read_of(Verdict::NoGo {
        reason: "vague".into(),
    }));
    s.apply(&edited("alice", T2));
    assert_eq!(s.state(), Lifecycle::Pending);
    assert_eq!(s.rev(), 2);
    assert!(s.find("read_preflight").is_some());
}

#[test]
fn a_comment_while_running_starts_nothing() {
    let mut s = Sim::running();
    assert!(s.apply(&comment("alice", 20, "looks good", T2)));
    assert_eq!(s.state(), Lifecycle::Running);
    assert!(s.last.is_empty(), "{:?}", s.kinds());
}

fn asks(hash: &str, newest: u64) -> PreflightOutcome {
    let mut read = ctx();
    read.hash = hash.into();
    read.newest_comment_id = newest;
    PreflightOutcome::Read {
        verdict: Verdict::NeedsInfo {
            questions: vec!["Which flag?".into(), "Default on?".into()],
        },
        reading: "NEEDS-INFO\n1. Which flag?\n2. Default on?".into(),
        model: "m1".into(),
        read,
    }
}

#[test]
fn needs_info_asks_in_the_comment_and_counts_a_round_only_for_new_text() {
    let mut s = Sim::picked_up();
    s.read(asks("h1", 9));
    assert_eq!(s.state(), Lifecycle::NeedsInfo);
    let p = &s.rec().preflight;
    assert_eq!(
        (p.verdict, p.question_rounds, p.asked_after),
        (Some(Judgement::NeedsInfo), 1, 9)
    );
    assert!(s.sticky().contains("1. Which flag?\n2. Default on?"));
    assert!(
        s.kinds().contains(&"sync_labels"),
        "the needs-info label: {:?}",
        s.kinds()
    );
    // A comment by someone without write access: the same text is read again.
    s.apply(&comment("mallory", 12, "ANSWER: -v", T2));
    assert_eq!(s.state(), Lifecycle::Pending);
    let mut again = asks("h1", 12);
    if let PreflightOutcome::Read { read, .. } = &mut again {
        read.left_out.push(LeftOut {
            author: "mallory".into(),
            comment_id: 12,
            issue_text: false,
            never_vouched: false,
            edited_after_vouched: false,
        });
    }
    s.read(again);
    assert_eq!(s.state(), Lifecycle::NeedsInfo);
    let p = &s.rec().preflight;
    assert_eq!((p.question_rounds, p.asked_after), (1, 9), "the same round");
    let body = s.sticky();
    assert!(body.contains("Answers waiting for a writer (1)"), "{body}");
    assert!(
        body.contains("[comment by @mallory](#issuecomment-12)"),
        "only answers after the questions wait: {body}"
    );
    // A writer's answer: new text, a new round.
    s.apply(&comment("alice", 14, "Use -v.", T2));
    s.read(asks("h2", 14));
    assert_eq!(s.rec().preflight.question_rounds, 2);
    s.apply(&comment("alice", 15, "Really, -v.", T2));
    s.read(asks("h3", 15));
    assert_eq!(s.state(), Lifecycle::NoGo, "the third round ends it");
    let reason = s.rec().preflight.reason.clone().unwrap_or_default();
    assert!(reason.contains("1) Which flag? 2) Default on?"), "{reason}");
}

#[test]
fn a_go_after_questions_resets_the_rounds_and_keeps_the_questions_for_the_run() {
    let mut s = Sim::picked_up();
    s.read(asks("h1", 9));
    s.apply(&comment("alice", 14, "Use -v.", T2));
    s.read(go());
    assert_eq!(s.state(), Lifecycle::Queued);
    let p = &s.rec().preflight;
    assert_eq!(p.question_rounds, 0);
    assert_eq!(p.questions, ["Which flag?", "Default on?"]);
    assert!(!p.asking());
}
