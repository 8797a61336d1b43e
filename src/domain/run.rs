//! One coder run: [`RunRecord`] and its typed [`RunState`].

use std::fmt;

use serde::{Deserialize, Serialize};

use super::{FollowUp, IssueRef, RepoName};

pub use super::git_env::{git_environment, log_shows_refused_push, sets_git_credentials};

/// A run's id: twelve lowercase hex digits, made when the run is admitted. It names the
/// run's container, its token and its branch, and keys the run's actions.
///
/// Made only by [`RunId::random`] or read by [`RunId::parse`] (also through serde and
/// `FromStr`): an id from a container's label, a token's name, a database row or a request
/// is checked before it is used, so it can never carry a path, a label selector or a glob.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct RunId(String);

/// Text that is not a run id.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("not a run id: {shown:?} (a run id is twelve lowercase hex digits)")]
pub struct BadRunId {
    /// The text, cut to 40 characters: it may come from anywhere.
    shown: String,
}

impl RunId {
    /// Its length in hex digits.
    pub const LEN: usize = 12;

    /// A fresh id: 48 random bits as twelve hex digits.
    pub fn random() -> Self {
        Self(format!("{:012x}", rand::random::<u64>() & 0xffff_ffff_ffff))
    }

    /// Reads an id: exactly twelve of `0-9a-f`.
    pub fn parse(text: &str) -> Result<Self, BadRunId> {
        let ok = text.len() == Self::LEN
            && text
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if ok {
            Ok(Self(text.to_owned()))
        } else {
            Err(BadRunId {
                shown: text.chars().take(40).collect(),
            })
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Its first eight digits, as a branch name carries them.
    pub fn short(&self) -> &str {
        &self.0[..8]
    }
}

impl std::str::FromStr for RunId {
    type Err = BadRunId;

    fn from_str(text: &str) -> Result<Self, BadRunId> {
        Self::parse(text)
    }
}

/// Read back from serde (an action's payload, a record's JSON): checked like any other.
impl TryFrom<String> for RunId {
    type Error = BadRunId;

    fn try_from(text: String) -> Result<Self, BadRunId> {
        Self::parse(&text)
    }
}

impl From<RunId> for String {
    fn from(id: RunId) -> Self {
        id.0
    }
}

/// Looked up by its text (a container's label, a token's name).
impl std::borrow::Borrow<str> for RunId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A well-formed id for a test: an id itself, or a name of up to six bytes as their hex,
/// zero-padded (`"r1"` is `000000007231`). Made through [`RunId::parse`] like any other.
#[cfg(any(test, feature = "testkit"))]
pub fn test_id(name: &str) -> RunId {
    RunId::parse(name)
        .or_else(|_| RunId::parse(&format!("{:0>12}", hex::encode(name))))
        .expect("an id, or a name of at most six bytes")
}

/// Where a run stands. A run id names one container and one token (`director-run-<id>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// Admitted: the token is being minted and the container created and started.
    Launching,
    /// The container was started (or adopted after a restart).
    Running,
    /// The container ended; the branch is being checked and the pull request opened.
    Exited,
    Succeeded,
    Failed,
    TimedOut,
    /// Stopped because its model calls spent a budget of `[budget]`.
    OverBudget,
    Cancelled,
    /// Stopped before anything started (PR-only check failed).
    Refused,
    /// The agent reported that it cannot or should not do the work.
    Declined,
}

impl RunState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Launching => "launching",
            Self::Running => "running",
            Self::Exited => "exited",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::TimedOut => "timed_out",
            Self::OverBudget => "over_budget",
            Self::Cancelled => "cancelled",
            Self::Refused => "refused",
            Self::Declined => "declined",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [
            Self::Launching,
            Self::Running,
            Self::Exited,
            Self::Succeeded,
            Self::Failed,
            Self::TimedOut,
            Self::OverBudget,
            Self::Cancelled,
            Self::Refused,
            Self::Declined,
        ]
        .into_iter()
        .find(|st| st.as_str() == s)
    }

    /// Not ended yet: at most one such run per issue (a unique index holds it too).
    pub fn is_active(self) -> bool {
        matches!(self, Self::Launching | Self::Running | Self::Exited)
    }
}

impl std::fmt::Display for RunState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One coder run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRecord {
    pub id: RunId,
    pub repo: RepoName,
    pub number: u64,
    pub state: RunState,
    pub branch: String,
    pub base_branch: String,
    pub container_id: Option<String>,
    pub pr_number: Option<u64>,
    pub detail: Option<String>,
    pub created_at_ms: i64,
    pub started_at_ms: Option<i64>,
    pub finished_at_ms: Option<i64>,
    /// The container's exit code, once it ended.
    #[serde(default)]
    pub exit_code: Option<i64>,
    /// The end of the run's output, redacted, kept for the report.
    #[serde(default)]
    pub log_tail: Option<String>,
    /// The issue was cancelled while the run was active: it ends as cancelled.
    #[serde(default)]
    pub stop_requested: bool,
    /// A follow-up run answering review feedback on the issue's pull request.
    #[serde(default)]
    pub followup: Option<FollowUp>,
    /// What the run said of itself (its result file), when it left a readable one.
    #[serde(default)]
    pub result: Option<RunResult>,
    /// Why the director stopped it before it ended by itself.
    #[serde(default)]
    pub stopped: Option<StopCause>,
    /// What the egress proxy refused it: (`host:port`, how many times), as it ended.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress_refused: Vec<(String, u64)>,
    /// What its repository's `.director.toml` gave it, written as the run starts (before
    /// its container exists, so every gateway sees it); `None`: the operator's settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settings: Option<RunSettings>,
    /// The base branch's head when a first run started, written as it starts (before its
    /// container exists): its pushes must descend from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_commit: Option<crate::domain::CommitSha>,
    /// The agent it was given, and why, written as it starts (before its container exists);
    /// `None`: `runner.image` and `runner.command`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<super::AgentChoice>,
    /// Where its branch lives when not in the repository itself: the runner's fork, written
    /// as it starts (before its container exists, so every gateway sees it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub home: Option<RepoName>,
    /// What became of its setup phase (`[setup]`), once it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setup: Option<super::setup::SetupOutcome>,
    /// Its pushed head's checks (`[checks]`), run by the director: under way while the
    /// outcome is `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checks: Option<super::checks::ChecksRecord>,
    /// It goes on where a run stopped on its budget stopped (a writer's `/director
    /// continue`), with a budget of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continued: Option<super::thread::Continuation>,
}

impl RunRecord {
    /// Whether its setup phase is under way: the run is launching, declares a setup, and
    /// none has ended. Only then are the setup's own credentials taken.
    pub fn setup_open(&self) -> bool {
        self.state == RunState::Launching
            && self.finished_at_ms.is_none()
            && self.setup.is_none()
            && self.settings.as_ref().is_some_and(|s| s.setup.is_some())
    }

    /// Whether its checks are under way: the agent has exited, the run has not ended, and
    /// its head's checks have no outcome yet. Only then is the checks' own (fetch-only)
    /// credential taken.
    pub fn checks_open(&self) -> bool {
        self.state == RunState::Exited
            && self.finished_at_ms.is_none()
            && self.checks.as_ref().is_some_and(|c| c.outcome.is_none())
    }

    /// The repository its branch lives in: its fork, or the repository itself.
    pub fn branch_repo(&self) -> &RepoName {
        self.home.as_ref().unwrap_or(&self.repo)
    }
}

/// The settings a run got from its repository's `.director.toml`, within the operator's
/// `[repo_settings]`: each `None` is the operator's own.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunSettings {
    /// The default branch's head the file was read at (the file version used).
    pub commit: String,
    /// Whether the repository has the file at that commit.
    pub file: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The agent of `[agents]` the repository chose (`runner.agent`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// The repository's `preflight.approval`, when stricter than the operator's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<super::approval::Approval>,
    /// `host:port` entries added to the run's egress allow-list.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress_allow: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_secs: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_usd: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch_template: Option<String>,
    /// Markdown appended to the task file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    /// What was lowered to the operator's ceiling, in words.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capped: Vec<String>,
    /// The setup phase the repository declared (`[setup]`), as allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setup: Option<super::setup::SetupDecl>,
    /// The checks the repository declared (`[checks]`), as allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checks: Option<super::checks::ChecksDecl>,
}

/// Compared by their text: a budget is never NaN (the parser refuses it).
impl Eq for RunSettings {}

/// Why a run was stopped (a stop signal first, then `runner.stop_grace_secs` to push).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopCause {
    /// It outlived `runner.timeout_secs`.
    Timeout,
    /// It printed nothing for `runner.idle_timeout_secs`.
    Idle,
    /// The model gateway refused its call: a budget of `[budget]` was spent.
    Budget,
}

impl RunRecord {
    /// What its model calls cost, as the director's model gateway metered them (what an agent
    /// reports of itself is not a cost).
    pub fn metered_cost_usd(&self) -> Option<f64> {
        self.result
            .as_ref()
            .and_then(|r| r.usage.as_ref())
            .filter(|u| u.metered)
            .and_then(|u| u.cost_usd)
    }

    /// Whether it ended since `before` (the run the issue had before this decision).
    pub fn ended_since(&self, before: Option<&RunRecord>) -> bool {
        self.finished_at_ms.is_some()
            && before.is_none_or(|b| b.id != self.id || b.finished_at_ms.is_none())
    }

    /// Why the agent said it is blocked, when its result file says so.
    pub fn declined_reason(&self) -> Option<&str> {
        match self.result.as_ref().map(|r| &r.outcome) {
            Some(RunOutcome::Blocked { reason }) => Some(reason),
            _ => None,
        }
    }

    pub fn issue_ref(&self) -> IssueRef {
        IssueRef::new(self.repo.clone(), self.number)
    }

    /// A new run for `issue`, admitted at `now_ms`.
    pub fn admitted(issue: &IssueRef, id: RunId, branch: &str, now_ms: i64) -> Self {
        Self {
            id,
            repo: issue.repo.clone(),
            number: issue.number,
            state: RunState::Launching,
            branch: branch.to_owned(),
            base_branch: String::new(),
            container_id: None,
            pr_number: None,
            detail: None,
            created_at_ms: now_ms,
            started_at_ms: None,
            finished_at_ms: None,
            exit_code: None,
            log_tail: None,
            stop_requested: false,
            followup: None,
            result: None,
            stopped: None,
            egress_refused: Vec::new(),
            settings: None,
            base_commit: None,
            agent: None,
            home: None,
            setup: None,
            checks: None,
            continued: None,
        }
    }
}

/// The largest result file read; a larger one is ignored.
pub const RESULT_MAX_BYTES: usize = 64 * 1024;
/// How much of the agent's summary is shown.
pub const SUMMARY_MAX_CHARS: usize = 4_000;

/// What the agent said of its run: the result file it left at `DIRECTOR_RESULT_FILE`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    pub outcome: RunOutcome,
    /// Markdown: what it changed and why (already made safe to show, and size-capped).
    #[serde(default)]
    pub summary: Option<String>,
    #[serde(default)]
    pub usage: Option<Usage>,
}

impl Eq for RunResult {}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "outcome")]
pub enum RunOutcome {
    Done,
    /// The agent found it cannot or should not do the work.
    Blocked {
        reason: String,
    },
}

/// The default `runner.branch_template`.
pub const DEFAULT_BRANCH_TEMPLATE: &str = "director-issue-{issue}-{run}";

/// The longest `{slug}` a branch name gets from an issue's title.
const SLUG_MAX: usize = 40;

/// A run's branch from the operator's template: `{issue}` the issue's number, `{run}` the
/// run's short id (which makes the name unique per run), `{slug}` the title made safe for a
/// ref (lower-case ASCII letters and digits joined by `-`, at most 40 characters).
pub fn branch_name(template: &str, issue: u64, run: &str, title: &str) -> String {
    template
        .replace("{issue}", &issue.to_string())
        .replace("{run}", run)
        .replace("{slug}", &slug(title))
}

/// The title as a piece of a ref name.
pub fn slug(title: &str) -> String {
    let mut out = String::new();
    for c in title.chars().flat_map(char::to_lowercase) {
        if c.is_ascii_alphanumeric() {
            out.push(c);
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
        if out.len() >= SLUG_MAX {
            break;
        }
    }
    let out = out.trim_end_matches('-');
    if out.is_empty() {
        "issue".to_owned()
    } else {
        out.to_owned()
    }
}

/// Why `template` cannot name runs' branches, if it cannot: it must hold `{run}` (a name
/// unique per run, never the default branch), only the known placeholders, and make a
/// valid branch name (git's `check-ref-format` rules) without `/`: the forges' API routes
/// that take a branch in their path (branches, compare, pulls) are not known to take one
/// with a slash, so names stay one segment.
pub fn check_branch_template(template: &str) -> Result<(), String> {
    if !template.contains("{run}") {
        return Err("must contain {run}, which makes each run's branch its own".into());
    }
    // Deploy workflows and branch rules filter on a branch's prefix (`release-*`): a
    // placeholder at the start would let an issue's title, or its number, pick it.
    let prefix = template.split('{').next().unwrap_or_default();
    if prefix.is_empty() || !prefix.ends_with(['-', '_', '.']) {
        return Err(format!(
            "must start with a fixed prefix ending in `-`, `_` or `.` (e.g. `director-{}`), so no title picks the prefix that workflows or branch rules filter on",
            template.trim_start_matches(|c: char| c.is_ascii_alphanumeric())
        ));
    }
    let sample = branch_name(template, 1, "0a1b2c3d", "Title");
    if sample.contains('{') || sample.contains('}') {
        return Err("knows only the placeholders {issue}, {run} and {slug}".into());
    }
    let bad_char = sample.chars().any(|c| {
        c.is_ascii_control()
            || matches!(c, ' ' | '~' | '^' | ':' | '?' | '*' | '[' | '\\' | '/')
            || !c.is_ascii()
    });
    let bad = bad_char
        || sample.starts_with(['-', '/', '.'])
        || sample.ends_with(['/', '.'])
        || sample.ends_with(".lock")
        || sample.contains("..")
        || sample.contains("//")
        || sample.contains("@{")
        || sample.contains("/.")
        || sample.split('/').any(|part| part.ends_with(".lock"));
    if bad {
        return Err(format!(
            "makes `{sample}`, which is not a valid branch name"
        ));
    }
    Ok(())
}

/// A run's model usage: metered by the model gateway (`metered`), or, without it, as the
/// agent reported it in its result file.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
    /// Model calls the gateway forwarded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests: Option<u64>,
    /// Counted by the director's model gateway from the providers' answers.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub metered: bool,
}

impl Usage {
    /// `12,345 input and 678 output tokens, $0.42`, or `None` when it says nothing.
    pub fn describe(&self) -> Option<String> {
        let mut parts = Vec::new();
        match (self.input_tokens, self.output_tokens) {
            (Some(i), Some(o)) => parts.push(format!("{i} input and {o} output tokens")),
            (Some(i), None) => parts.push(format!("{i} input tokens")),
            (None, Some(o)) => parts.push(format!("{o} output tokens")),
            (None, None) => {}
        }
        if let Some(c) = self.cost_usd.filter(|c| c.is_finite() && *c >= 0.0) {
            parts.push(format!("${c:.2}"));
        }
        if let Some(n) = self.requests {
            parts.push(format!("{n} model call(s)"));
        }
        if parts.is_empty() {
            return None;
        }
        let whose = if self.metered {
            "metered by the director"
        } else {
            "as the agent reported"
        };
        Some(format!("{} ({whose})", parts.join(", ")))
    }
}

/// The result file as an agent writes it (JSON):
/// `{"outcome": "done" | "blocked", "reason": "...", "summary": "...", "usage": {...}}`.
#[derive(Deserialize)]
struct RawResult {
    outcome: String,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    summary: Option<String>,
    #[serde(default)]
    usage: Option<RawUsage>,
}

#[derive(Deserialize)]
struct RawUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    cost_usd: Option<f64>,
}

/// Reads a result file. A missing, oversized or malformed one is `None`: it is simply absent
/// from the report, never a failure. The agent's text is made safe to show (see
/// [`agent_text`]).
/// `redact` is applied to every text the agent wrote before anything else is done with it (a
/// secret the run held must not reach a comment through its summary).
pub fn parse_result(bytes: &[u8], redact: impl Fn(&str) -> String) -> Option<RunResult> {
    if bytes.len() > RESULT_MAX_BYTES {
        return None;
    }
    let raw: RawResult = serde_json::from_slice(bytes).ok()?;
    let outcome = match raw.outcome.trim().to_ascii_lowercase().as_str() {
        "done" => RunOutcome::Done,
        "blocked" => RunOutcome::Blocked {
            reason: agent_text(&redact(raw.reason.as_deref().unwrap_or("")), 500)
                .unwrap_or_else(|| "no reason given".to_owned()),
        },
        _ => return None,
    };
    let summary = raw
        .summary
        .as_deref()
        .and_then(|s| agent_text(&redact(s), SUMMARY_MAX_CHARS));
    let usage = raw
        .usage
        .map(|u| Usage {
            input_tokens: u.input_tokens,
            output_tokens: u.output_tokens,
            cost_usd: u.cost_usd.filter(|c| c.is_finite() && *c >= 0.0),
            ..Usage::default()
        })
        .filter(|u| *u != Usage::default());
    Some(RunResult {
        outcome,
        summary,
        usage,
    })
}

/// Text an agent wrote, made safe to put in a comment or PR body: hidden characters and HTML
/// comments (the director's own markers among them) removed, `<` escaped so no HTML is
/// made, lines that would read as `/director` commands or `@` mentions defused, and the
/// length capped at `max_chars`. `None` when nothing is left.
pub fn agent_text(text: &str, max_chars: usize) -> Option<String> {
    let mut out = String::new();
    let mut rest = text;
    // HTML comments go first: a marker the agent forges must not pass for the director's.
    while let Some(start) = rest.find("<!--") {
        out.push_str(&rest[..start]);
        rest = match rest[start..].find("-->") {
            Some(end) => &rest[start + end + 3..],
            None => "",
        };
    }
    out.push_str(rest);
    let cleaned: String = out
        .chars()
        .filter(|c| {
            !matches!(c, '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2060}'..='\u{2064}' | '\u{FEFF}')
                && (!c.is_control() || *c == '\n' || *c == '\t')
        })
        .collect();
    let lines: Vec<String> = cleaned
        .lines()
        .map(|line| {
            let line = line.replace('<', "&lt;").replace('@', "@\u{200B}");
            if line.trim_start().starts_with("/director") {
                format!("\\{}", line.trim_start())
            } else {
                line
            }
        })
        .collect();
    let joined = lines.join("\n");
    let trimmed = joined.trim();
    if trimmed.is_empty() {
        return None;
    }
    let mut capped: String = trimmed.chars().take(max_chars).collect();
    if trimmed.chars().count() > max_chars {
        capped.push_str("\n\n(cut at the size limit)");
    }
    Some(capped)
}

#[cfg(test)]
mod result_tests {
    use super::*;

    fn parse_result_as_is(bytes: &[u8]) -> Option<RunResult> {
        parse_result(bytes, str::to_owned)
    }

    #[test]
    fn a_token_the_agent_writes_into_its_result_is_redacted_before_it_is_shaped() {
        let token = "f0rge-t0ken-<9a8b>";
        let file = format!(
            r#"{{"outcome":"blocked","reason":"push failed with {token}","summary":"I used {token} to push"}}"#
        );
        let r = parse_result(file.as_bytes(), |t| t.replace(token, "[redacted]")).expect("parses");
        let summary = r.summary.expect("summary");
        assert_eq!(summary, "I used [redacted] to push");
        let RunOutcome::Blocked { reason } = r.outcome else {
            panic!("blocked")
        };
        assert!(!reason.contains("9a8b"), "{reason}");
    }

    #[test]
    fn a_result_file_is_read_and_its_text_made_safe() {
        let r = parse_result_as_is(
            br#"{"outcome":"done","summary":"Added `--verbose`.<!-- director:sticky -->\n/director fix\n<script>x</script> cc @alice","usage":{"input_tokens":1200,"output_tokens":300,"cost_usd":0.42}}"#,
        )
        .expect("parses");
        assert_eq!(r.outcome, RunOutcome::Done);
        let summary = r.summary.expect("summary");
        assert!(!summary.contains("director:sticky"), "{summary}");
        assert!(!summary.contains("<script>"), "{summary}");
        assert!(summary.contains("\\/director fix"), "{summary}");
        assert!(!summary.contains("@alice"), "{summary}");
        assert_eq!(
            r.usage.and_then(|u| u.describe()).as_deref(),
            Some("1200 input and 300 output tokens, $0.42 (as the agent reported)")
        );
    }

    #[test]
    fn a_blocked_outcome_keeps_its_reason() {
        let r =
            parse_result_as_is(br#"{"outcome":"BLOCKED","reason":"needs a database migration"}"#)
                .expect("parses");
        assert_eq!(
            r.outcome,
            RunOutcome::Blocked {
                reason: "needs a database migration".into()
            }
        );
    }

    #[test]
    fn a_missing_malformed_or_huge_result_file_is_absent() {
        for bad in [
            &b""[..],
            b"not json",
            br#"{"outcome":"maybe"}"#,
            br#"{"summary":"no outcome"}"#,
            br#"{"outcome":"done","usage":{"input_tokens":-1}}"#,
        ] {
            assert_eq!(
                parse_result_as_is(bad),
                None,
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        let huge = format!(
            r#"{{"outcome":"done","summary":"{}"}}"#,
            "x".repeat(RESULT_MAX_BYTES)
        );
        assert_eq!(parse_result_as_is(huge.as_bytes()), None);
        let long = format!(
            r#"{{"outcome":"done","summary":"{}"}}"#,
            "y".repeat(SUMMARY_MAX_CHARS * 2)
        );
        let summary = parse_result_as_is(long.as_bytes())
            .and_then(|r| r.summary)
            .expect("summary");
        assert!(summary.len() < SUMMARY_MAX_CHARS + 100);
        assert!(summary.ends_with("(cut at the size limit)"));
    }
}

#[cfg(test)]
mod id_tests {
    use super::*;

    #[test]
    fn a_fresh_run_id_is_twelve_hex_digits_and_two_are_not_alike() {
        let (a, b) = (RunId::random(), RunId::random());
        for id in [&a, &b] {
            assert_eq!(id.as_str().len(), 12, "{id}");
            assert!(id.as_str().chars().all(|c| c.is_ascii_hexdigit()), "{id}");
            assert_eq!(RunId::parse(id.as_str()).as_ref(), Ok(id), "it reads back");
        }
        assert_ne!(a, b);
    }

    #[test]
    fn a_run_id_is_stored_as_the_plain_string_it_always_was() {
        let id = RunId::parse("0123456789ab").expect("an id");
        assert_eq!(
            serde_json::to_string(&id).expect("json"),
            "\"0123456789ab\""
        );
        let back: RunId = serde_json::from_str("\"0123456789ab\"").expect("reads back");
        assert_eq!(back, id);
        assert_eq!(id.as_str(), "0123456789ab");
        let set = std::collections::HashSet::from([id.clone()]);
        assert!(set.contains("0123456789ab"), "looked up by its text");
    }

    #[test]
    fn text_that_is_not_exactly_twelve_lowercase_hex_digits_is_no_run_id() {
        for bad in [
            "",
            "0123456789a",
            "0123456789abc",
            "0123456789AB",
            "../../etc/pa",
            "0123456789a\n",
            "01234567 9ab",
            "director-run",
            "0123456789ag",
            "٠١٢٣٤٥٦٧٨٩ab",
            "x=y,director",
        ] {
            let err = RunId::parse(bad).expect_err(bad);
            assert!(
                err.to_string().contains("twelve lowercase hex digits"),
                "{err}"
            );
            assert!(serde_json::from_value::<RunId>(serde_json::json!(bad)).is_err());
            assert!(bad.parse::<RunId>().is_err());
        }
        let long = "a".repeat(10_000);
        let shown = RunId::parse(&long).expect_err("long").to_string();
        assert!(
            shown.len() < 120,
            "a hostile id is cut in the error: {shown}"
        );
    }
}

#[cfg(test)]
mod branch_tests {
    use super::*;

    #[test]
    fn the_default_template_keeps_todays_names() {
        assert_eq!(
            branch_name(DEFAULT_BRANCH_TEMPLATE, 7, "0a1b2c3d", "Anything"),
            "director-issue-7-0a1b2c3d"
        );
    }

    #[test]
    fn a_title_becomes_a_safe_slug_whatever_it_holds() {
        assert_eq!(slug("Add --verbose to `run`!"), "add-verbose-to-run");
        assert_eq!(slug("Ünïcode ../../main ~^:?*[\\ @{x}"), "n-code-main-x");
        assert_eq!(slug("   "), "issue");
        assert_eq!(slug("refs/heads/main.lock"), "refs-heads-main-lock");
        let long = slug(&"word ".repeat(40));
        assert!(long.len() <= 40 && !long.ends_with('-'), "{long}");
        assert_eq!(
            branch_name(
                "agent-{issue}-{slug}-{run}",
                12,
                "0a1b2c3d",
                "Fix the `README`"
            ),
            "agent-12-fix-the-readme-0a1b2c3d"
        );
    }

    #[test]
    fn a_template_must_name_each_run_apart_and_make_a_valid_branch() {
        assert!(check_branch_template(DEFAULT_BRANCH_TEMPLATE).is_ok());
        assert!(check_branch_template("agent-{issue}-{slug}-{run}").is_ok());
        for bad in [
            "director-issue-{issue}",
            "main",
            "{run}-{title}",
            "-{run}",
            "/x-{run}",
            "x-{run}/",
            "x..{run}",
            "x {run}",
            "x-{run}.lock",
            "x-{run}.",
            "a//b-{run}",
            "agents/{issue}-{run}",
            "x-{run}~1",
        ] {
            assert!(check_branch_template(bad).is_err(), "{bad} was accepted");
        }
    }
}
