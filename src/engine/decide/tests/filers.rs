//! Agent-filed work (`[filers]`): who filed it, the filer's approval rule, a maintainer's go,
//! and the one notice of a filer's spent day.

use super::*;
use crate::domain::approval::Approval;
use crate::domain::filer::{FilerRule, Filers};

fn with_ward(approval: Approval) -> Policy {
    let mut map = std::collections::BTreeMap::new();
    map.insert(
        "ward".to_owned(),
        FilerRule {
            logins: vec!["ward-broker".into()],
            approval,
            max_per_day: 2,
            daily_usd: 0.0,
        },
    );
    Policy {
        filers: Filers(map),
        ..policy()
    }
}

fn judged_by(actor: &str) -> Event {
    Event::TriggerJudged {
        actor: Some(actor.into()),
        trusted: true,
        permission: "write".into(),
        labelled_at: Some(T1.into()),
    }
}

#[test]
fn a_trigger_applied_by_a_filers_account_makes_the_issue_agent_filed() {
    let mut s = Sim::with(with_ward(Approval::Never));
    s.apply(&label("ward-broker", &["headless"], T1));
    s.apply(&judged_by("ward-broker"));
    let filer = s.rec().preflight.filer.clone().expect("agent-filed");
    assert_eq!(
        (filer.name.as_str(), filer.login.as_str()),
        ("ward", "ward-broker")
    );
    assert!(filer.is_agents());
    // A writer's trigger on another issue: a maintainer's.
    let mut m = Sim::with(with_ward(Approval::Never));
    m.apply(&label("alice", &["headless"], T1));
    m.apply(&judged_by("alice"));
    assert_eq!(m.rec().preflight.filer, None);
}

#[test]
fn an_issue_the_filers_account_authored_is_agent_filed_whoever_labelled_it() {
    let mut s = Sim::with(with_ward(Approval::Never));
    let mut f = fact(
        EventKind::IssueLabel,
        "label_updated",
        "alice",
        &["headless"],
        "open",
        T1,
    );
    f.snapshot.author = "ward-broker".into();
    s.apply(&Event::Forge(f));
    s.apply(&judged_by("alice"));
    assert_eq!(
        s.rec().preflight.filer.as_ref().map(|f| f.login.as_str()),
        Some("ward-broker")
    );
}

#[test]
fn the_filers_approval_rule_holds_its_go_and_names_the_key_and_the_filer() {
    let mut s = Sim::with(with_ward(Approval::Always));
    s.apply(&label("ward-broker", &["headless"], T1));
    s.apply(&judged_by("ward-broker"));
    s.read(go());
    assert_eq!(s.state(), Lifecycle::AwaitingApproval);
    let sticky = s.sticky();
    assert!(
        sticky.contains("filers.ward.approval = \"always\""),
        "{sticky}"
    );
    assert!(
        sticky.contains("Filed by `ward-broker` for an agent"),
        "{sticky}"
    );
    // A maintainer's issue under the same configuration does not wait.
    let mut m = Sim::with(with_ward(Approval::Always));
    m.apply(&label("alice", &["headless"], T1));
    m.apply(&judged_by("alice"));
    m.read(go());
    assert_eq!(m.state(), Lifecycle::Queued);
}

#[test]
fn a_writers_go_makes_agent_filed_work_a_maintainers() {
    let mut s = Sim::with(with_ward(Approval::Always));
    s.apply(&label("ward-broker", &["headless"], T1));
    s.apply(&judged_by("ward-broker"));
    s.read(go());
    assert_eq!(s.state(), Lifecycle::AwaitingApproval);
    s.apply(&comment("alice", 10, "/director go", T2));
    assert_eq!(s.state(), Lifecycle::Pending, "the go asks for a read");
    let mut approved = ctx();
    approved.approved_by = Some("alice".into());
    s.read(PreflightOutcome::Read {
        verdict: Verdict::Go,
        reading: "Fine.\n\nGO".into(),
        model: "m1".into(),
        read: approved,
    });
    assert_eq!(s.state(), Lifecycle::Queued);
    let filer = s.rec().preflight.filer.clone().expect("still named");
    assert_eq!(filer.taken_by.as_deref(), Some("alice"));
    assert!(!filer.is_agents());
}

#[test]
fn a_filers_spent_day_is_said_on_the_issue_once_and_it_is_read_when_the_day_starts_over() {
    let mut s = Sim::with(with_ward(Approval::Never));
    s.apply(&label("ward-broker", &["headless"], T1));
    s.apply(&judged_by("ward-broker"));
    let until = crate::models::next_day_ms(NOW);
    let capped = || PreflightOutcome::Capped {
        limit: "the filer `ward` filed its 2 issues for today (filers.ward.max_per_day)".into(),
        until_ms: until,
        read: ctx(),
        filer: Some("ward".into()),
    };
    s.read(capped());
    assert_eq!(s.state(), Lifecycle::Pending);
    assert_eq!(s.rec().preflight.not_before_ms, Some(until));
    let notice = s.find("post_notice").expect("the issue says why");
    let Action::PostNotice { marker, body } = &notice.action else {
        panic!("a notice")
    };
    assert_eq!(marker, FILER_MARKER);
    assert!(body.contains("filers.ward.max_per_day"), "{body}");
    let read = s.find("read_preflight").expect("read later");
    assert_eq!(read.not_before_ms, until);
    // Held again: nothing more is said.
    s.read(capped());
    assert!(s.find("post_notice").is_none(), "{:?}", s.kinds());
}

#[test]
fn a_filers_limits_hold_what_they_name() {
    let rule = FilerRule {
        logins: vec!["b".into()],
        approval: Approval::Never,
        max_per_day: 2,
        daily_usd: 1.0,
    };
    let day = |taken_before, taken_today, spent_usd| crate::domain::filer::FilerDay {
        taken_before,
        taken_today,
        spent_usd,
    };
    assert_eq!(filer_limit("ward", &rule, day(false, 1, 0.5), NOW), None);
    let (why, until) = filer_limit("ward", &rule, day(false, 2, 0.5), NOW).expect("held");
    assert!(why.contains("filers.ward.max_per_day"), "{why}");
    assert_eq!(until, crate::models::next_day_ms(NOW));
    // An issue taken before is read again, however many were taken since.
    assert_eq!(filer_limit("ward", &rule, day(true, 5, 0.5), NOW), None);
    // A spent budget holds even an issue taken before.
    let (why, _) = filer_limit("ward", &rule, day(true, 0, 1.0), NOW).expect("held");
    assert!(
        why.contains("filers.ward.daily_usd") && why.contains("$1.00"),
        "{why}"
    );
}
