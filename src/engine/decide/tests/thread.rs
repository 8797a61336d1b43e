//! Grants in the thread: hosts approved by a writer, runs continued after their budget.

use super::*;

fn approving() -> Policy {
    Policy {
        egress_approvable: vec!["pkgs.example:443".into(), "*.pythonhosted.org:443".into()],
        ..policy()
    }
}

/// Running under `policy`, then ended without a branch, refused `refused` by the proxy.
fn refused_run(policy: Policy, refused: &[&str]) -> Sim {
    let mut s = Sim::running_with(policy);
    s.apply(&report(
        "000000000001",
        RunReport::Exited {
            code: Some(1),
            timed_out: false,
            log: "pip install failed".into(),
            stopped: None,
            result: None,
            egress_refused: refused.iter().map(|r| ((*r).to_owned(), 2)).collect(),
        },
    ));
    s.apply(&report("000000000001", RunReport::Judged { ahead: 0 }));
    assert_eq!(s.state(), Lifecycle::Failed);
    s
}

fn answer(s: &Sim) -> String {
    match s.find("post_notice").map(|p| &p.action) {
        Some(Action::PostNotice { body, .. }) => body.clone(),
        other => panic!("no answer: {other:?} in {:?}", s.kinds()),
    }
}

#[test]
fn a_refused_hosts_report_carries_the_line_that_approves_it_or_why_not() {
    let s = refused_run(approving(), &["pkgs.example:443", "evil.example:443"]);
    let report = s.report();
    assert!(
        report.contains("```\n/director allow pkgs.example:443\n```"),
        "{report}"
    );
    assert!(
        report.contains("`evil.example:443` is not within `runner.egress_approvable`"),
        "{report}"
    );
    // Approvals off: the report says nothing of them.
    let off = refused_run(policy(), &["pkgs.example:443"]);
    assert!(
        !off.report().contains("/director allow"),
        "{}",
        off.report()
    );
}

#[test]
fn a_writers_allow_is_recorded_answered_and_retries_the_refused_run_once() {
    let mut s = refused_run(approving(), &["pkgs.example:443"]);
    assert!(s.apply(&said(
        Command::Allow,
        "alice",
        true,
        41,
        "pkgs.example:443 files.pythonhosted.org:443"
    )));
    assert_eq!(
        s.rec().thread.egress_allowed,
        vec!["files.pythonhosted.org:443", "pkgs.example:443"]
    );
    assert_eq!(s.state(), Lifecycle::Queued, "retried");
    assert_eq!(s.rec().thread.retried, Some(test_id("000000000001")));
    let body = answer(&s);
    assert!(
        body.contains("Approved by @alice") && body.contains("starts again, once"),
        "{body}"
    );
    assert_eq!(
        s.find("post_notice").expect("answer").key.to_string(),
        "acme/widgets#7:answer:41"
    );
    // Its retry is refused the same host again (say it was another one): no second retry.
    s.apply(&admitted("000000000002"));
    s.apply(&report("000000000002", started()));
    s.apply(&report(
        "000000000002",
        RunReport::Exited {
            code: Some(1),
            timed_out: false,
            log: "no".into(),
            stopped: None,
            result: None,
            egress_refused: vec![("pkgs.example:443".into(), 1)],
        },
    ));
    s.apply(&report("000000000002", RunReport::Judged { ahead: 0 }));
    assert!(s.apply(&said(Command::Allow, "alice", true, 42, "pkgs.example:443")));
    assert_eq!(
        s.state(),
        Lifecycle::Queued,
        "another run is retried once too"
    );
    assert!(s.apply(&said(Command::Allow, "alice", true, 43, "pkgs.example:443")));
    assert_eq!(s.state(), Lifecycle::Queued);
    s.apply(&admitted("000000000003"));
    s.apply(&report("000000000003", started()));
    s.apply(&report("000000000003", exited(1)));
    s.apply(&report("000000000003", RunReport::Judged { ahead: 0 }));
    assert!(s.apply(&said(Command::Allow, "alice", true, 44, "pkgs.example:443")));
    assert_eq!(
        s.state(),
        Lifecycle::Failed,
        "a run never refused it is not retried"
    );
}

#[test]
fn a_readers_allow_does_nothing_and_bad_ones_are_answered_changing_nothing() {
    let mut s = refused_run(approving(), &["pkgs.example:443"]);
    assert!(
        !s.apply(&said(
            Command::Allow,
            "mallory",
            false,
            41,
            "pkgs.example:443"
        )),
        "a reader's allow"
    );
    assert!(s.rec().thread.egress_allowed.is_empty());
    for (id, args, why) in [
        (50, "evil.example:443", "not within"),
        (51, "pkgs.example:22", "port 22 is outside"),
        (52, "*.org:443", "wildcard"),
        (53, "*.example:443", "wildcard"),
        (54, "pkgs.example", "not host:port"),
        (55, "", "Name each host"),
        // One bad host spoils the comment: nothing of it is taken.
        (56, "pkgs.example:443 evil.example:443", "not within"),
    ] {
        assert!(
            s.apply(&said(Command::Allow, "alice", true, id, args)),
            "{args}"
        );
        let body = answer(&s);
        assert!(
            body.contains("nothing changed") && body.contains(why),
            "{args}: {body}"
        );
        assert_eq!(
            s.find("post_notice").expect("answer").key.to_string(),
            format!("acme/widgets#7:answer:{id}")
        );
        assert!(s.rec().thread.egress_allowed.is_empty(), "{args}");
        assert_eq!(s.state(), Lifecycle::Failed, "{args}");
    }
    // Off: answered, nothing changed.
    let mut off = refused_run(policy(), &["pkgs.example:443"]);
    assert!(off.apply(&said(Command::Allow, "alice", true, 60, "pkgs.example:443")));
    assert!(answer(&off).contains("off here"));
    assert!(off.rec().thread.egress_allowed.is_empty());
}

fn budgeted() -> Policy {
    Policy {
        run_usd: 2.0,
        max_continue_usd: 5.0,
        ..policy()
    }
}

/// Running under `policy`, then stopped on its budget with a pushed branch.
fn over_budget(policy: Policy) -> Sim {
    let mut s = Sim::running_with(policy);
    s.apply(&report(
        "000000000001",
        RunReport::Exited {
            code: Some(0),
            timed_out: false,
            log: "stopped".into(),
            stopped: Some(StopCause::Budget),
            result: None,
            egress_refused: Vec::new(),
        },
    ));
    s.apply(&report("000000000001", RunReport::Judged { ahead: 1 }));
    assert_eq!(s.state(), Lifecycle::OverBudget);
    s
}

#[test]
fn a_run_stopped_on_its_budget_says_how_to_go_on_and_a_writers_continue_follows_it_up() {
    let mut s = over_budget(budgeted());
    let report = s.report();
    let branch = s.run().branch.clone();
    assert!(
        report.contains(&format!("stays on branch `{branch}`"))
            && report.contains("`/director continue`")
            && report.contains("at most $5.00"),
        "{report}"
    );
    assert!(
        !s.apply(&said(Command::Continue, "mallory", false, 70, "")),
        "a reader's continue"
    );
    assert_eq!(s.state(), Lifecycle::OverBudget);
    assert!(s.apply(&said(Command::Continue, "alice", true, 71, "$9")));
    assert!(answer(&s).contains("above `budget.max_continue_usd`"));
    assert_eq!(s.state(), Lifecycle::OverBudget, "nothing changed");
    assert!(s.apply(&said(Command::Continue, "alice", true, 72, "lots")));
    assert!(answer(&s).contains("not an amount"));
    assert!(s.apply(&said(Command::Continue, "alice", true, 73, "$4")));
    assert_eq!(s.state(), Lifecycle::Queued);
    assert!(answer(&s).contains("$4.00"), "{}", answer(&s));
    s.apply(&admitted("000000000002"));
    let run = s.run();
    assert_eq!(run.branch, branch, "the same branch");
    let c = run.continued.as_ref().expect("continued");
    assert_eq!((c.from.as_str(), c.usd), ("000000000001", 4.0));
    assert!(s.rec().thread.continuation.is_none(), "taken by the run");
    // A plain continue gives `run_usd`.
    let mut plain = over_budget(budgeted());
    plain.apply(&said(Command::Continue, "alice", true, 80, ""));
    plain.apply(&admitted("000000000002"));
    assert_eq!(plain.run().continued.as_ref().map(|c| c.usd), Some(2.0));
    // `budget.max_continue_usd` unset: `budget.run_usd` is the most, never no limit.
    let unset = || Policy {
        max_continue_usd: 0.0,
        ..budgeted()
    };
    let mut capped = over_budget(unset());
    assert!(
        capped.report().contains("at most $2.00"),
        "{}",
        capped.report()
    );
    assert!(capped.apply(&said(Command::Continue, "alice", true, 85, "$1000")));
    assert!(
        answer(&capped).contains(
            "$1000.00 is above `budget.max_continue_usd` ($2.00: it is not set, so `budget.run_usd`)"
        ),
        "{}",
        answer(&capped)
    );
    assert_eq!(capped.state(), Lifecycle::OverBudget, "nothing changed");
    assert!(capped.rec().thread.continuation.is_none());
    assert!(capped.apply(&said(Command::Continue, "alice", true, 86, "$1.50")));
    assert_eq!(capped.state(), Lifecycle::Queued);
    // Only after a budget stop.
    let mut failed = refused_run(budgeted(), &[]);
    assert!(failed.apply(&said(Command::Continue, "alice", true, 90, "")));
    assert!(answer(&failed).contains("Only a run stopped on its budget"));
    assert_eq!(failed.state(), Lifecycle::Failed);
}

/// The comment `body` by `actor`, then its command judged (`allowed`: a writer's), as the
/// engine does: returns whether the judged command changed anything.
fn commented(s: &mut Sim, actor: &str, allowed: bool, id: u64, body: &str) -> bool {
    s.apply(&comment(actor, id, body, T3));
    let Some(Action::AuthorizeCommand {
        command,
        actor,
        said,
    }) = s.find("authorize_command").map(|p| p.action.clone())
    else {
        panic!("no command in {body:?}: {:?}", s.kinds());
    };
    s.apply(&Event::CommandJudged {
        command,
        actor,
        allowed,
        said,
    })
}

#[test]
fn a_comment_gives_one_command_and_its_answer_names_the_others_not_taken() {
    // Allow first: the host is approved, the continue is named as not taken.
    let mut s = over_budget(Policy {
        egress_approvable: vec!["pkgs.example:443".into()],
        ..budgeted()
    });
    let body = "/director allow pkgs.example:443\n/director continue $1";
    assert!(commented(&mut s, "alice", true, 100, body));
    assert_eq!(s.rec().thread.egress_allowed, vec!["pkgs.example:443"]);
    assert!(
        s.rec().thread.continuation.is_none(),
        "the continue is not taken"
    );
    let said = answer(&s);
    assert!(
        said.contains("Approved by @alice")
            && said.contains(
                "this one took `/director allow`, its first. Not taken: `/director continue`"
            ),
        "{said}"
    );
    assert_eq!(s.kinds(), vec!["post_notice"], "one answer");
    // Continue first: the continue is taken, the allow named.
    let mut s = over_budget(budgeted());
    let body = "/director continue $1\n/director allow pkgs.example:443";
    assert!(commented(&mut s, "alice", true, 101, body));
    assert_eq!(s.state(), Lifecycle::Queued);
    assert!(s.rec().thread.egress_allowed.is_empty());
    let said = answer(&s);
    assert!(
        said.contains("Continuing for @alice") && said.contains("Not taken: `/director allow`"),
        "{said}"
    );
    // A command that says nothing of its own answers to name the rest, even when it changed
    // nothing.
    let mut s = over_budget(budgeted());
    assert!(commented(
        &mut s,
        "alice",
        true,
        102,
        "/director retry\n/director continue"
    ));
    assert_eq!(s.state(), Lifecycle::Queued, "retried");
    assert!(s.rec().thread.continuation.is_none());
    assert!(answer(&s).starts_with(
        "<!-- director:answer 102 -->\nA comment gives one command: this one took `/director retry`"
    ));
    let mut s = over_budget(budgeted());
    assert!(commented(
        &mut s,
        "alice",
        true,
        103,
        "/director cancel\n/director continue"
    ));
    assert_eq!(
        s.state(),
        Lifecycle::OverBudget,
        "nothing to cancel, nothing continued"
    );
    assert!(answer(&s).contains("Not taken: `/director continue`"));
    // A reader's: nothing, no answer.
    let mut s = over_budget(budgeted());
    assert!(!commented(
        &mut s,
        "mallory",
        false,
        104,
        "/director retry\n/director continue"
    ));
    assert_eq!(s.state(), Lifecycle::OverBudget);
    assert!(s.find("post_notice").is_none());
    // One command alone: no note.
    let mut s = over_budget(budgeted());
    assert!(commented(
        &mut s,
        "alice",
        true,
        105,
        "/director continue\n/director continue $3"
    ));
    assert!(!answer(&s).contains("Not taken"), "{}", answer(&s));
}

#[test]
fn the_report_names_the_sandbox_runtime() {
    let s = refused_run(
        Policy {
            sandbox: Some("runsc".into()),
            ..policy()
        },
        &[],
    );
    assert!(s.report().contains("Runtime: `runsc`"), "{}", s.report());
}
