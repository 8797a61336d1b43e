//! A repository's checks (`[checks]` of `.director.toml`, or the operator's own `[checks]`),
//! run by the director on a run's pushed head and on its base commit in sealed containers,
//! and what they showed: each command's result on both, compared. A command that fails on the
//! base too is "already failing" and blocks nothing; one that passed on the base and fails on
//! the head is a regression. Pure: the act runs the commands, `decide` reads the verdict.

use serde::{Deserialize, Serialize};

/// The commit-status context the director posts the checks' result under.
pub const CONTEXT: &str = "director/checks";

/// The longest description a commit status is given (GitHub refuses longer ones).
pub const DESCRIPTION_MAX: usize = 140;

/// The checks a run gets, already checked (commands present, paths inside the workspace).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChecksDecl {
    /// Shell lines, each run by `sh -c` in the checkout, in order.
    pub commands: Vec<String>,
    /// The time all the commands of one side (head or base) may take together.
    pub timeout_secs: u64,
    /// Paths of JUnit XML reports the commands write, relative to the checkout.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub junit: Vec<String>,
}

/// How one command ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandResult {
    pub command: String,
    /// Its exit code (`None`: it was stopped at the time limit, or never ran).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit: Option<i64>,
    /// Stopped at the checks' time limit.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub timed_out: bool,
    pub millis: u64,
    /// The end of its output, redacted (for a follow-up's feedback).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub tail: String,
}

impl CommandResult {
    pub fn passed(&self) -> bool {
        self.exit == Some(0) && !self.timed_out
    }

    /// In a few words: `passed`, `failed (exit 2)`, `timed out`, `not run`.
    pub fn words(&self) -> String {
        match (self.exit, self.timed_out) {
            (_, true) => "timed out".to_owned(),
            (Some(0), _) => "passed".to_owned(),
            (Some(c), _) => format!("failed (exit {c})"),
            (None, false) => "not run".to_owned(),
        }
    }
}

/// One side's run of the checks: each command's result, or why they could not run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SideResult {
    pub commands: Vec<CommandResult>,
    /// Why the checks could not be run (a container that could not start, a fetch that
    /// failed): the status is then `error`, never `success`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What the `junit` reports said, when the checks name any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub junit: Option<Junit>,
    /// The head's change against the base: the files it touched that look like tests.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changed_tests: Vec<String>,
}

/// The test cases the `junit` reports of one side hold.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Junit {
    /// The test cases that ran (not skipped), `classname.name`, sorted.
    pub ran: Vec<String>,
    /// Why the reports could not be read (missing, not JUnit): the status is `error`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The checks of one pushed head, against the base, as the run's record keeps them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChecksRecord {
    /// The head commit checked.
    pub head: String,
    /// The base commit it is compared with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
    /// How many commits the run's branch was ahead when judged (a follow-up's answer says it).
    #[serde(default)]
    pub ahead: u64,
    /// `None` while the checks run: only then is their fetch-only credential taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<ChecksOutcome>,
}

/// What the checks showed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChecksOutcome {
    pub head: SideResult,
    /// The base's results (`None`: no base commit is known, so every failure blocks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<SideResult>,
    /// The baseline was found stored (run earlier for the same base and environment).
    #[serde(default)]
    pub baseline_reused: bool,
    /// From the push accepted to the results known, minus the commands' own time.
    #[serde(default)]
    pub overhead_ms: u64,
}

/// A command's result on the head against the base.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Passed,
    /// It fails on the base too: it blocks nothing.
    AlreadyFailing,
    /// It passed on the base (or the base is unknown) and fails on the head.
    Regression,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Passed => "passed",
            Self::AlreadyFailing => "already failing on the base",
            Self::Regression => "regression",
        }
    }
}

/// The commit status's state, as the forges spell it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StatusState {
    Pending,
    Success,
    Failure,
    Error,
}

impl StatusState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Success => "success",
            Self::Failure => "failure",
            Self::Error => "error",
        }
    }
}

impl ChecksOutcome {
    /// Each head command with its verdict against the base.
    pub fn verdicts(&self) -> Vec<(&CommandResult, Verdict)> {
        self.head
            .commands
            .iter()
            .map(|h| {
                let on_base = self
                    .base
                    .as_ref()
                    .filter(|b| b.error.is_none())
                    .and_then(|b| b.commands.iter().find(|c| c.command == h.command));
                let verdict = if h.passed() {
                    Verdict::Passed
                } else if on_base.is_some_and(|b| !b.passed()) {
                    Verdict::AlreadyFailing
                } else {
                    Verdict::Regression
                };
                (h, verdict)
            })
            .collect()
    }

    /// The first regression, for a follow-up's feedback.
    pub fn first_regression(&self) -> Option<&CommandResult> {
        self.verdicts()
            .into_iter()
            .find(|(_, v)| *v == Verdict::Regression)
            .map(|(c, _)| c)
    }

    /// The test cases that ran on the base and are absent or skipped on the head (both
    /// sides' reports read): a fix that deletes the failing test is not a pass.
    pub fn removed(&self) -> Vec<&str> {
        let (Some(head), Some(base)) = (
            self.head.junit.as_ref().filter(|j| j.error.is_none()),
            self.base
                .as_ref()
                .and_then(|b| b.junit.as_ref())
                .filter(|j| j.error.is_none()),
        ) else {
            return Vec::new();
        };
        base.ran
            .iter()
            .filter(|t| head.ran.binary_search(t).is_err())
            .map(String::as_str)
            .collect()
    }

    /// `error` when the checks (or their reports) could not be read, `failure` on a
    /// regression or a removed test, else `success`.
    pub fn state(&self) -> StatusState {
        let unread = self.head.junit.as_ref().is_some_and(|j| j.error.is_some());
        if self.head.error.is_some() || self.head.commands.is_empty() || unread {
            StatusState::Error
        } else if self.first_regression().is_some() || !self.removed().is_empty() {
            StatusState::Failure
        } else {
            StatusState::Success
        }
    }

    /// The status's short description (at most [`DESCRIPTION_MAX`] characters).
    pub fn description(&self) -> String {
        let text = if let Some(e) = &self.head.error {
            format!("could not run: {e}")
        } else {
            let verdicts = self.verdicts();
            let count = |v: Verdict| verdicts.iter().filter(|(_, x)| *x == v).count();
            let (passed, already, regressions) = (
                count(Verdict::Passed),
                count(Verdict::AlreadyFailing),
                count(Verdict::Regression),
            );
            let mut parts = vec![format!("{passed} of {} passed", verdicts.len())];
            if regressions > 0 {
                parts.push(format!("{regressions} failing"));
            }
            if already > 0 {
                parts.push(format!("{already} already failing on the base"));
            }
            let removed = self.removed().len();
            if removed > 0 {
                parts.push(format!("{removed} test(s) removed or skipped"));
            }
            if let Some(e) = self.head.junit.as_ref().and_then(|j| j.error.as_deref()) {
                parts.push(format!("reports unreadable: {e}"));
            }
            parts.join(", ")
        };
        cut(&text, DESCRIPTION_MAX)
    }

    /// The commands' own time on the head, in milliseconds.
    pub fn commands_ms(&self) -> u64 {
        self.head.commands.iter().map(|c| c.millis).sum()
    }

    /// The markdown section for the pull request and the run's report: each command on the
    /// base and on the head.
    pub fn section(&self, head: &str, base: Option<&str>, transcript: Option<&str>) -> String {
        let short = |s: &str| s.chars().take(10).collect::<String>();
        let mut out = format!(
            "\n\n### Checks (`{CONTEXT}`): {}\n\n",
            self.state().as_str()
        );
        if let Some(e) = &self.head.error {
            out.push_str(&format!("The checks could not run: {}\n", inert(e)));
        } else {
            let base_head = match base {
                Some(b) => format!("Base `{}`", short(b)),
                None => "Base".to_owned(),
            };
            out.push_str(&format!(
                "| Command | {base_head} | Head `{}` | |\n|---|---|---|---|\n",
                short(head)
            ));
            for (c, v) in self.verdicts() {
                let on_base = match &self.base {
                    Some(b) if b.error.is_none() => b
                        .commands
                        .iter()
                        .find(|x| x.command == c.command)
                        .map_or("not run".to_owned(), CommandResult::words),
                    Some(_) => "could not run".to_owned(),
                    None => "unknown".to_owned(),
                };
                out.push_str(&format!(
                    "| {} | {on_base} | {} | {} |\n",
                    code_cell(&c.command),
                    c.words(),
                    v.as_str()
                ));
            }
            let removed = self.removed();
            if !removed.is_empty() {
                let names: Vec<String> = removed.iter().take(20).map(|t| code_cell(t)).collect();
                out.push_str(&format!(
                    "\nTests that ran on the base and are gone or skipped on the head ({}): {}\n",
                    removed.len(),
                    names.join(", ")
                ));
            }
            if !self.head.changed_tests.is_empty() {
                let names: Vec<String> = self
                    .head
                    .changed_tests
                    .iter()
                    .take(20)
                    .map(|t| code_cell(t))
                    .collect();
                out.push_str(&format!(
                    "\nTest files this change touched ({}): {}\n",
                    self.head.changed_tests.len(),
                    names.join(", ")
                ));
            }
            if let Some(e) = self.head.junit.as_ref().and_then(|j| j.error.as_deref()) {
                out.push_str(&format!(
                    "\nThe test reports (`checks.junit`) could not be read: {}\n",
                    inert(e)
                ));
            }
            if let Some(e) = self.base.as_ref().and_then(|b| b.error.as_deref()) {
                out.push_str(&format!(
                    "\nThe base could not be checked ({}): every failure counts.\n",
                    inert(e)
                ));
            } else if self.baseline_reused {
                out.push_str("\nThe base's results were reused (checked once per base commit and environment).\n");
            }
        }
        if let Some(url) = transcript {
            out.push_str(&format!("\nTheir output: {url}\n"));
        }
        out
    }
}

/// A command as a table cell: in code, its backticks and bars made harmless.
fn code_cell(command: &str) -> String {
    let one = command.split_whitespace().collect::<Vec<_>>().join(" ");
    format!("`{}`", cut(&one, 120).replace('`', "'").replace('|', "\\|"))
}

/// Text for markdown, on one line, with no mention or HTML.
fn inert(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('@', "@\u{200b}")
        .replace('<', "&lt;")
}

/// `text` cut to `max` characters, with an ellipsis when cut.
pub fn cut(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut out: String = text.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// The feedback a follow-up gets for a regression: the command and its output's end.
pub fn feedback(command: &CommandResult, head: &str) -> String {
    format!(
        "The director ran the repository's checks on your push (`{}`). This command passed on the base and fails now, {}:\n\n    {}\n\nThe end of its output:\n\n```\n{}\n```\n\nFix the code (not the test) so that it passes, and push again.",
        head.chars().take(10).collect::<String>(),
        command.words(),
        command.command,
        command.tail.trim_end().replace("```", "'''")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(command: &str, exit: Option<i64>) -> CommandResult {
        CommandResult {
            command: command.into(),
            exit,
            timed_out: false,
            millis: 10,
            tail: String::new(),
        }
    }

    fn outcome(head: Vec<CommandResult>, base: Option<Vec<CommandResult>>) -> ChecksOutcome {
        ChecksOutcome {
            head: SideResult {
                commands: head,
                error: None,
                junit: None,
                changed_tests: Vec::new(),
            },
            base: base.map(|commands| SideResult {
                commands,
                error: None,
                junit: None,
                changed_tests: Vec::new(),
            }),
            baseline_reused: false,
            overhead_ms: 0,
        }
    }

    #[test]
    fn a_command_failing_on_the_base_too_blocks_nothing() {
        let o = outcome(
            vec![result("unit", Some(0)), result("lint", Some(1))],
            Some(vec![result("unit", Some(0)), result("lint", Some(1))]),
        );
        assert_eq!(o.state(), StatusState::Success);
        assert_eq!(o.verdicts()[1].1, Verdict::AlreadyFailing);
        assert_eq!(
            o.description(),
            "1 of 2 passed, 1 already failing on the base"
        );
    }

    #[test]
    fn a_command_that_passed_on_the_base_and_fails_on_the_head_is_a_regression() {
        let o = outcome(
            vec![result("unit", Some(2))],
            Some(vec![result("unit", Some(0))]),
        );
        assert_eq!(o.state(), StatusState::Failure);
        assert_eq!(
            o.first_regression().map(|c| c.command.as_str()),
            Some("unit")
        );
        assert_eq!(o.description(), "0 of 1 passed, 1 failing");
    }

    #[test]
    fn without_a_base_every_failure_blocks_and_a_time_out_is_a_failure() {
        let mut slow = result("unit", None);
        slow.timed_out = true;
        let o = outcome(vec![slow.clone()], None);
        assert_eq!(o.state(), StatusState::Failure);
        // A base that timed out too: already failing.
        let o = outcome(vec![slow.clone()], Some(vec![slow]));
        assert_eq!(o.state(), StatusState::Success);
    }

    #[test]
    fn checks_that_could_not_run_are_an_error_never_a_success() {
        let mut o = outcome(vec![], None);
        assert_eq!(o.state(), StatusState::Error);
        o.head.commands.push(result("unit", Some(0)));
        o.head.error = Some("the container could not start".into());
        assert_eq!(o.state(), StatusState::Error);
        assert!(o.description().starts_with("could not run: "));
    }

    #[test]
    fn a_test_on_the_base_that_is_gone_or_skipped_on_the_head_is_not_a_pass() {
        let junit = |ran: &[&str]| {
            Some(Junit {
                ran: ran.iter().map(|t| (*t).to_owned()).collect(),
                error: None,
            })
        };
        let mut o = outcome(
            vec![result("unit", Some(0))],
            Some(vec![result("unit", Some(0))]),
        );
        o.base.as_mut().expect("base").junit = junit(&["calc.adds", "calc.subtracts"]);
        o.head.junit = junit(&["calc.adds"]);
        assert_eq!(o.removed(), vec!["calc.subtracts"]);
        assert_eq!(o.state(), StatusState::Failure);
        assert!(o.description().contains("1 test(s) removed or skipped"));
        assert!(o.section("h", Some("b"), None).contains("`calc.subtracts`"));
        // Reports the head did not leave readable: an error, never a success.
        o.head.junit = Some(Junit {
            ran: Vec::new(),
            error: Some("`out.xml` was not written".into()),
        });
        assert_eq!(o.state(), StatusState::Error);
    }

    #[test]
    fn the_description_fits_a_status_and_the_section_is_inert() {
        let long = "x".repeat(500);
        let mut o = outcome(vec![], None);
        o.head.error = Some(long);
        assert_eq!(o.description().chars().count(), DESCRIPTION_MAX);
        let o = outcome(
            vec![result("echo `@admin` | tee <b>", Some(1))],
            Some(vec![result("echo `@admin` | tee <b>", Some(0))]),
        );
        let section = o.section("0123456789abcdef", Some("fedcba9876543210"), None);
        assert!(section.contains("`echo '@admin' \\| tee <b>`"), "{section}");
        assert!(section.contains("Base `fedcba9876`"), "{section}");
        assert!(section.contains("| passed | failed (exit 1) | regression |"));
    }
}
