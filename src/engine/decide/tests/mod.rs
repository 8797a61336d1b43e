//! `decide` is where every state is chosen, so most of the director's tests live here: one per
//! transition, and properties over any interleaving of duplicate, replayed and out-of-order
//! events.

use proptest::prelude::*;

use super::*;
use crate::domain::run::test_id;
use crate::domain::{Feedback, LeftOut};
use crate::event::{CommentSnapshot, IssueSnapshot};

const NOW: i64 = 1_800_000_000_000;

fn policy() -> Policy {
    Policy {
        labels: LabelSettings::default(),
        forge: true,
        preflight_enabled: true,
        trusted_owners: vec!["acme".into()],
        on_error: OnError::Wait,
        preflight_max_attempts: 3,
        max_question_rounds: 3,
        retry_backoff_ms: 1_000,
        run_timeout_secs: 3_600,
        idle_timeout_secs: 1_800,
        keep_failed_secs: 0,
        max_followups: 3,
        max_ci_followups: 2,
        max_check_followups: 2,
        merge: crate::settings::MergeSettings::default(),
        start_attempts: 10,
        links: crate::settings::WebLinks {
            base: "http://forge.example".into(),
            kind: crate::settings::ForgeKind::Forgejo,
        },
        server: crate::settings::ServerSettings::default(),
        approval: crate::domain::approval::Approval::Never,
        run_usd: 0.0,
        filers: Default::default(),
        max_continue_usd: 0.0,
        egress_approvable: Vec::new(),
        sandbox: None,
        checks: None,
    }
}

fn issue() -> IssueRef {
    "acme/widgets#7".parse().expect("valid")
}

/// One issue as `decide` sees it, with every action it was asked for.
struct Sim {
    policy: Policy,
    issue: IssueRef,
    record: Option<IssueRecord>,
    run: Option<RunRecord>,
    now: i64,
    last: Vec<Planned>,
    all: Vec<Planned>,
}

impl Sim {
    fn new() -> Self {
        Self::with(policy())
    }

    fn with(policy: Policy) -> Self {
        Self {
            policy,
            issue: issue(),
            record: None,
            run: None,
            now: NOW,
            last: Vec::new(),
            all: Vec::new(),
        }
    }

    /// Applies `event`; returns whether it changed anything.
    fn apply(&mut self, event: &Event) -> bool {
        self.now += 1;
        let view = IssueView {
            issue: &self.issue,
            record: self.record.as_ref(),
            run: self.run.as_ref(),
        };
        match decide(&view, event, &self.policy, self.now) {
            Some(d) => {
                self.record = Some(d.record);
                if d.run.is_some() {
                    self.run = d.run;
                }
                self.all.extend(d.actions.iter().cloned());
                self.last = d.actions;
                true
            }
            None => {
                self.last.clear();
                false
            }
        }
    }

    fn state(&self) -> Lifecycle {
        self.record
            .as_ref()
            .map_or(Lifecycle::Untracked, |r| r.lifecycle)
    }

    fn rec(&self) -> &IssueRecord {
        self.record.as_ref().expect("a record")
    }

    fn run(&self) -> &RunRecord {
        self.run.as_ref().expect("a run")
    }

    fn rev(&self) -> i64 {
        self.rec().preflight.rev
    }

    fn kinds(&self) -> Vec<&'static str> {
        self.last.iter().map(|p| p.action.kind().as_str()).collect()
    }

    fn find(&self, kind: &str) -> Option<&Planned> {
        self.last.iter().find(|p| p.action.kind().as_str() == kind)
    }

    fn sticky(&self) -> String {
        match self.find("upsert_sticky").map(|p| &p.action) {
            Some(Action::UpsertSticky { body }) => body.clone(),
            other => panic!("no sticky comment planned: {other:?} in {:?}", self.kinds()),
        }
    }

    fn report(&self) -> String {
        match self.find("report_run").map(|p| &p.action) {
            Some(Action::ReportRun { body, .. }) => body.clone(),
            other => panic!("no report planned: {other:?} in {:?}", self.kinds()),
        }
    }

    /// Labelled by a writer, judged trusted: pending with a read asked for.
    fn picked_up() -> Self {
        let mut s = Self::new();
        s.apply(&label("alice", &["headless"], T1));
        s.apply(&judged(true));
        s
    }

    fn read(&mut self, outcome: PreflightOutcome) -> bool {
        let rev = self.rev();
        self.apply(&Event::PreflightRead { rev, outcome })
    }

    fn queued() -> Self {
        let mut s = Self::picked_up();
        s.read(go());
        assert_eq!(s.state(), Lifecycle::Queued);
        s
    }

    fn running() -> Self {
        Self::running_with(policy())
    }

    /// Picked up, read GO, admitted and started as run `r1`, under `policy`.
    fn running_with(policy: Policy) -> Self {
        let mut s = Self::with(policy);
        s.apply(&label("alice", &["headless"], T1));
        s.apply(&judged(true));
        s.read(go());
        assert_eq!(s.state(), Lifecycle::Queued);
        s.apply(&admitted("000000000001"));
        s.apply(&report("000000000001", started()));
        assert_eq!(s.state(), Lifecycle::Running);
        s
    }
}

const T1: &str = "2026-11-30T10:00:00Z";
const T2: &str = "2026-11-30T10:00:05Z";
const T3: &str = "2026-11-30T10:00:09Z";

fn fact(
    kind: EventKind,
    action: &str,
    sender: &str,
    labels: &[&str],
    state: &str,
    at: &str,
) -> ForgeEvent {
    ForgeEvent {
        kind,
        action: action.into(),
        issue: issue(),
        sender: sender.into(),
        is_pull: false,
        snapshot: IssueSnapshot {
            title: "Add --verbose".into(),
            body: "Print each step.".into(),
            state: state.into(),
            labels: labels.iter().map(|s| s.to_string()).collect(),
            author: "reporter".into(),
            updated_at: Some(at.into()),
            merged: false,
        },
        comment: None,
        review: None,
    }
}

fn label(sender: &str, labels: &[&str], at: &str) -> Event {
    Event::Forge(fact(
        EventKind::IssueLabel,
        "label_updated",
        sender,
        labels,
        "open",
        at,
    ))
}

fn observed(labels: &[&str], state: &str, at: &str) -> Event {
    Event::Forge(fact(EventKind::Scan, "observed", "", labels, state, at))
}

fn closed(state: &str, at: &str) -> Event {
    let action = if state == "open" {
        "reopened"
    } else {
        "closed"
    };
    Event::Forge(fact(
        EventKind::Issues,
        action,
        "reporter",
        &["headless"],
        state,
        at,
    ))
}

fn edited(sender: &str, at: &str) -> Event {
    Event::Forge(fact(
        EventKind::Issues,
        "edited",
        sender,
        &["headless"],
        "open",
        at,
    ))
}

fn comment(sender: &str, id: u64, body: &str, at: &str) -> Event {
    let mut f = fact(
        EventKind::IssueComment,
        "created",
        sender,
        &["headless"],
        "open",
        at,
    );
    f.comment = Some(CommentSnapshot {
        id,
        author: sender.into(),
        body: body.into(),
        updated_at: Some(at.into()),
    });
    Event::Forge(f)
}

fn judged(trusted: bool) -> Event {
    Event::TriggerJudged {
        actor: Some(if trusted { "alice" } else { "mallory" }.into()),
        trusted,
        permission: if trusted { "write" } else { "read" }.into(),
        labelled_at: Some(T1.into()),
    }
}

/// An edit of the issue's body by `sender`.
fn rewritten(sender: &str, body: &str, at: &str) -> Event {
    let mut f = fact(
        EventKind::Issues,
        "edited",
        sender,
        &["headless"],
        "open",
        at,
    );
    f.snapshot.body = body.into();
    Event::Forge(f)
}

fn ctx() -> ReadContext {
    ReadContext {
        hash: "h1".into(),
        left_out: vec![LeftOut {
            author: "mallory".into(),
            comment_id: 3,
            issue_text: false,
            never_vouched: false,
            edited_after_vouched: false,
        }],
        newest_comment_id: 9,
        title: "Add --verbose".into(),
        body: "Print each step.".into(),
        vouched: None,
        hidden: Vec::new(),
        agent: None,
        forecast: None,
        repo_approval: None,
        approved_by: None,
        text_sha: String::new(),
    }
}

fn read_of(verdict: Verdict) -> PreflightOutcome {
    PreflightOutcome::Read {
        verdict,
        reading: "Fine.\n\nVERDICT".into(),
        model: "m1".into(),
        read: ctx(),
    }
}

fn go() -> PreflightOutcome {
    read_of(Verdict::Go)
}

fn failed() -> PreflightOutcome {
    PreflightOutcome::Failed {
        error: "the provider did not answer within 5 s".into(),
        reading: None,
        model: "m1".into(),
        read: Some(ctx()),
    }
}

/// `name` is the run's, as [`test_id`] makes its id.
fn admitted(name: &str) -> Event {
    let run_id = test_id(name);
    Event::Admitted {
        branch: format!("director-issue-7-{run_id}"),
        run_id,
    }
}

fn report(name: &str, report: RunReport) -> Event {
    Event::Run {
        run_id: test_id(name),
        report,
    }
}

fn started() -> RunReport {
    RunReport::Started {
        container_id: "c1".into(),
        base_branch: "main".into(),
        start_head: None,
    }
}

fn exited(code: i64) -> RunReport {
    RunReport::Exited {
        code: Some(code),
        timed_out: false,
        log: "did things".into(),
        stopped: None,
        result: None,
        egress_refused: Vec::new(),
    }
}

fn command(command: Command, allowed: bool) -> Event {
    Event::CommandJudged {
        command,
        actor: "alice".into(),
        allowed,
        said: None,
    }
}

/// A judged `allow` or `continue` of comment `comment` saying `args`.
fn said(command: Command, actor: &str, allowed: bool, comment: u64, args: &str) -> Event {
    Event::CommandJudged {
        command,
        actor: actor.into(),
        allowed,
        said: Some(crate::domain::command::Said {
            comment,
            args: args.into(),
            not_taken: Vec::new(),
        }),
    }
}

mod checks;
mod filers;
mod gave_up;
mod issue;
mod lane;
mod preflight;
mod properties;
mod pull;
mod runs;
mod start;
mod thread;
