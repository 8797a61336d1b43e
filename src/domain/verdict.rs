//! Reading the verdict out of a model's answer. Models decorate: `**NO-GO:** reason`,
//! `> GO`, `- WRONG-REPO: acme/api — file it there`, mixed case, en and em dashes. The last
//! line that holds a verdict wins; an answer with none is unclear.

use serde::{Deserialize, Serialize};

use crate::domain::RepoName;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "SCREAMING-KEBAB-CASE")]
pub enum Verdict {
    Go,
    NoGo {
        reason: String,
    },
    WrongRepo {
        repo: RepoName,
        what: String,
    },
    /// Could be GO once these questions (one to [`MAX_QUESTIONS`]) are answered.
    NeedsInfo {
        questions: Vec<String>,
    },
}

/// The most questions one read may ask; more are cut.
pub const MAX_QUESTIONS: usize = 5;
/// The longest question kept, in characters.
const QUESTION_MAX_CHARS: usize = 300;

impl Verdict {
    /// `GO`, `NO-GO`, `WRONG-REPO` or `NEEDS-INFO`: the word people see.
    pub fn word(&self) -> &'static str {
        match self {
            Self::Go => "GO",
            Self::NoGo { .. } => "NO-GO",
            Self::WrongRepo { .. } => "WRONG-REPO",
            Self::NeedsInfo { .. } => "NEEDS-INFO",
        }
    }
}

/// Strips the decoration models put around a verdict line.
fn clean(line: &str) -> String {
    let mut s = line.trim();
    loop {
        let before = s;
        s = s.trim_start_matches(['>', '#', '*', '_', '`', '-', '+', '•', '–', '—', ' ', '\t']);
        s = s.trim_end_matches(['*', '_', '`', ' ', '\t', '.']);
        if s == before {
            break;
        }
    }
    s.replace("**", "").replace("__", "").replace('`', "")
}

/// The text after a verdict keyword: separators (`:`, dashes) and decoration dropped.
fn rest(after: &str) -> Option<String> {
    let t = after.trim_start_matches(['*', '_', ' ', '\t']);
    // The keyword must end here: `GOOD` is not `GO`.
    if let Some(c) = t.chars().next()
        && (c.is_alphanumeric())
        && !after.starts_with([' ', '\t'])
    {
        return None;
    }
    let t = t.trim_start_matches([':', '-', '–', '—', '*', '_', ' ', '\t']);
    Some(t.trim().to_owned())
}

fn strip_prefix_ci<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &s[prefix.len()..])
}

/// The verdict on one line, if the line states one.
fn verdict_of(line: &str) -> Option<Verdict> {
    let line = clean(line);
    let normalized = line.replace(['–', '—'], "-");
    let l = normalized.as_str();
    if let Some(after) =
        strip_prefix_ci(l, "WRONG-REPO").or_else(|| strip_prefix_ci(l, "WRONG REPO"))
    {
        let text = rest(after)?;
        let (repo_part, what) = match text.split_once(" - ") {
            Some((r, w)) => (r.trim(), w.trim()),
            None => match text.split_once(char::is_whitespace) {
                Some((r, w)) => (r.trim(), w.trim_start_matches(['-', ':', ' ']).trim()),
                None => (text.trim(), ""),
            },
        };
        let repo: RepoName = repo_part
            .trim_matches(['`', '*', '_', ',', ';'])
            .parse()
            .ok()?;
        return Some(Verdict::WrongRepo {
            repo,
            what: what.to_owned(),
        });
    }
    if let Some(after) = strip_prefix_ci(l, "NO-GO")
        .or_else(|| strip_prefix_ci(l, "NO GO"))
        .or_else(|| strip_prefix_ci(l, "NOGO"))
    {
        let reason = rest(after)?;
        return Some(Verdict::NoGo { reason });
    }
    if let Some(after) = strip_prefix_ci(l, "GO") {
        let tail = rest(after)?;
        // A bare GO, possibly with a short flourish; "GO ahead and ..." prose is not a verdict.
        if tail.is_empty() || tail.len() <= 3 {
            return Some(Verdict::Go);
        }
        return None;
    }
    None
}

/// Whether the line says NEEDS-INFO (its questions are on the lines that follow).
fn needs_info(line: &str) -> bool {
    let line = clean(line);
    let normalized = line.replace(['–', '—'], "-");
    let l = normalized.as_str();
    strip_prefix_ci(l, "NEEDS-INFO")
        .or_else(|| strip_prefix_ci(l, "NEEDS INFO"))
        .and_then(rest)
        .is_some()
}

/// A numbered list item (`1. …`, `2) …`, decorated or not): its text.
fn numbered(line: &str) -> Option<String> {
    let t = line
        .trim()
        .trim_start_matches(['>', '*', '_', ' ', '\t'])
        .trim_start();
    let digits = t.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 || digits > 2 {
        return None;
    }
    let after = t[digits..].strip_prefix(['.', ')'])?;
    if !after.starts_with([' ', '\t']) {
        return None;
    }
    let text = after.trim().trim_matches(['*', '_']).trim();
    (!text.is_empty()).then(|| text.chars().take(QUESTION_MAX_CHARS).collect())
}

/// The last verdict in `answer`, or `None` when it states none. A NEEDS-INFO counts only
/// with its questions, a numbered list on the lines after it: without one the answer is
/// garbled, and no earlier verdict line stands in for it.
pub fn parse(answer: &str) -> Option<Verdict> {
    let lines: Vec<&str> = answer.lines().collect();
    for (i, line) in lines.iter().enumerate().rev() {
        if needs_info(line) {
            let questions: Vec<String> = lines[i + 1..]
                .iter()
                .filter(|l| !l.trim().is_empty())
                .map_while(|l| numbered(l))
                .take(MAX_QUESTIONS)
                .collect();
            return (!questions.is_empty()).then_some(Verdict::NeedsInfo { questions });
        }
        if let Some(v) = verdict_of(line) {
            return Some(v);
        }
    }
    None
}

/// The most steps of a plan kept; more are cut.
pub const MAX_PLAN_STEPS: usize = 10;
/// The longest step kept, in characters.
const STEP_MAX_CHARS: usize = 300;

/// A list item (`1. …`, `2) …`, `- …`, `* …`, decorated or not): its text.
fn list_item(line: &str) -> Option<String> {
    if let Some(text) = numbered(line) {
        return Some(text);
    }
    let t = line.trim().trim_start_matches(['>', ' ', '\t']);
    let after = t
        .strip_prefix("- ")
        .or_else(|| t.strip_prefix("* "))
        .or_else(|| t.strip_prefix("+ "))
        .or_else(|| t.strip_prefix("• "))?;
    let text = after.trim().trim_matches(['*', '_']).trim();
    (!text.is_empty()).then(|| text.chars().take(STEP_MAX_CHARS).collect())
}

/// The plan in `answer`: the list after its last `Plan:` line (decorated or not, a step on
/// that line itself too), up to the first line that is neither a list item nor blank. `None`
/// when the answer gives none: a verdict without a plan is still a verdict.
pub fn plan(answer: &str) -> Option<Vec<String>> {
    let lines: Vec<&str> = answer.lines().collect();
    let (at, first) = lines.iter().enumerate().rev().find_map(|(i, line)| {
        let cleaned = clean(line);
        let after = strip_prefix_ci(&cleaned, "plan")?;
        let after = after.trim_start_matches(['*', '_', ' ', '\t']);
        let rest = after.strip_prefix(':')?;
        Some((i, rest.trim().trim_matches(['*', '_']).trim().to_owned()))
    })?;
    let mut steps: Vec<String> = Vec::new();
    if !first.is_empty() {
        steps.push(first.chars().take(STEP_MAX_CHARS).collect());
    }
    for line in &lines[at + 1..] {
        if line.trim().is_empty() {
            continue;
        }
        // The verdict line ends the plan, however it is decorated.
        if verdict_of(line).is_some() || needs_info(line) {
            break;
        }
        match list_item(line) {
            Some(step) => steps.push(step),
            None => break,
        }
    }
    steps.truncate(MAX_PLAN_STEPS);
    (!steps.is_empty()).then_some(steps)
}

#[cfg(test)]
mod plan_tests {
    use super::*;

    #[test]
    fn the_plan_is_the_list_after_its_heading_and_stops_at_the_verdict() {
        let answer = "Context to front-load: src/cli.rs.\n\nSmall.\n\n**Plan:**\n1. Add the flag in `src/cli.rs`.\n2) Print each step in `src/run.rs`.\n- Test it in `tests/cli.rs`.\n\nGO";
        assert_eq!(
            plan(answer),
            Some(vec![
                "Add the flag in `src/cli.rs`.".to_owned(),
                "Print each step in `src/run.rs`.".to_owned(),
                "Test it in `tests/cli.rs`.".to_owned(),
            ])
        );
        assert_eq!(parse(answer), Some(Verdict::Go));
    }

    #[test]
    fn no_plan_is_none_and_a_long_plan_is_cut() {
        assert_eq!(plan("Fine.\n\nGO"), None);
        assert_eq!(plan("Plan:\n\nGO"), None);
        let long: String = (1..=30).map(|n| format!("{n}. step {n}\n")).collect();
        let steps = plan(&format!("Plan:\n{long}GO")).expect("a plan");
        assert_eq!(steps.len(), MAX_PLAN_STEPS);
        let wide = format!("Plan: {}\nGO", "x".repeat(5_000));
        assert_eq!(
            plan(&wide).expect("a plan")[0].chars().count(),
            STEP_MAX_CHARS
        );
    }

    #[test]
    fn a_word_that_only_starts_with_plan_is_no_heading() {
        assert_eq!(plan("Planning: 1. x\nGO"), None);
        assert_eq!(plan("PLAN - none\nGO"), None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn nogo(r: &str) -> Option<Verdict> {
        Some(Verdict::NoGo { reason: r.into() })
    }

    #[test]
    fn plain_verdicts() {
        assert_eq!(
            parse("Context to front-load: x\n\nRisky.\nGO"),
            Some(Verdict::Go)
        );
        assert_eq!(
            parse("NO-GO: needs a design decision"),
            nogo("needs a design decision")
        );
        assert_eq!(
            parse("WRONG-REPO: acme/api - add the endpoint there"),
            Some(Verdict::WrongRepo {
                repo: "acme/api".parse().expect("repo"),
                what: "add the endpoint there".into()
            })
        );
    }

    #[test]
    fn decorated_verdicts() {
        assert_eq!(parse("**GO**"), Some(Verdict::Go));
        assert_eq!(parse("> **NO-GO:** too vague"), nogo("too vague"));
        assert_eq!(parse("- no-go — touches billing"), nogo("touches billing"));
        assert_eq!(parse("* **No-Go** – flaky tests"), nogo("flaky tests"));
        assert_eq!(parse("`GO`."), Some(Verdict::Go));
        assert_eq!(
            parse("## Verdict\n\n**WRONG-REPO:** `acme/docs` — document it"),
            Some(Verdict::WrongRepo {
                repo: "acme/docs".parse().expect("repo"),
                what: "document it".into()
            })
        );
        assert_eq!(parse("> go"), Some(Verdict::Go));
    }

    #[test]
    fn the_last_verdict_wins() {
        assert_eq!(
            parse("GO\nOn reflection:\nNO-GO: no tests exist"),
            nogo("no tests exist")
        );
        assert_eq!(parse("NO-GO: first thought\nGO"), Some(Verdict::Go));
    }

    #[test]
    fn prose_is_not_a_verdict() {
        assert_eq!(parse(""), None);
        assert_eq!(parse("Good question. Going further, this is hard."), None);
        assert_eq!(parse("GO ahead and rewrite the parser"), None);
        assert_eq!(parse("GOAL: refactor"), None);
        assert_eq!(
            parse("WRONG-REPO: nowhere"),
            None,
            "a WRONG-REPO needs a repository"
        );
    }

    fn needs(qs: &[&str]) -> Option<Verdict> {
        Some(Verdict::NeedsInfo {
            questions: qs.iter().map(|q| (*q).to_owned()).collect(),
        })
    }

    #[test]
    fn needs_info_carries_its_numbered_questions() {
        assert_eq!(
            parse("Unclear which flag.\n\nNEEDS-INFO\n1. Which flag name?\n2) Default on or off?"),
            needs(&["Which flag name?", "Default on or off?"])
        );
        assert_eq!(
            parse("**NEEDS-INFO:**\n\n> 1. **Which flag?**\n\n> 2. Where?\n"),
            needs(&["Which flag?", "Where?"])
        );
        assert_eq!(parse("needs info\n1. One?"), needs(&["One?"]));
        let six = "NEEDS-INFO\n1. a\n2. b\n3. c\n4. d\n5. e\n6. f";
        assert_eq!(
            parse(six),
            needs(&["a", "b", "c", "d", "e"]),
            "at most five"
        );
        let long = format!("NEEDS-INFO\n1. {}", "x".repeat(1000));
        let Some(Verdict::NeedsInfo { questions }) = parse(&long) else {
            panic!("a verdict");
        };
        assert_eq!(questions[0].chars().count(), 300);
    }

    #[test]
    fn needs_info_without_a_question_is_garbled_and_no_earlier_verdict_stands_in() {
        assert_eq!(parse("NEEDS-INFO"), None);
        assert_eq!(parse("NEEDS-INFO: what flag?"), None);
        assert_eq!(parse("GO\nOn reflection:\nNEEDS-INFO\nJust ask me."), None);
        assert_eq!(
            parse("1. Which?\nNEEDS-INFO"),
            None,
            "questions follow the verdict"
        );
        // A later verdict still wins over an earlier NEEDS-INFO.
        assert_eq!(parse("NEEDS-INFO\n1. Which?\nGO"), Some(Verdict::Go));
    }

    proptest! {
        #[test]
        fn never_panics(text in "\\PC{0,400}") {
            let _ = parse(&text);
        }

        #[test]
        fn a_final_verdict_line_is_found_behind_any_decoration(
            prose in "[a-z ,.]{0,200}",
            deco in prop_oneof![Just(""), Just("> "), Just("- "), Just("**"), Just("* "), Just("### ")],
            case in prop_oneof![Just("NO-GO"), Just("no-go"), Just("No-Go"), Just("NO GO")],
            sep in prop_oneof![Just(": "), Just(" - "), Just(" – "), Just(" — "), Just(":** ")],
            reason in "[a-z][a-z ]{0,40}[a-z]",
        ) {
            let text = format!("{prose}\n{deco}{case}{sep}{reason}");
            prop_assert_eq!(parse(&text), Some(Verdict::NoGo { reason: reason.clone() }));
        }

        #[test]
        fn go_is_found_in_any_case(prose in "[a-z ,.]{0,200}", deco in prop_oneof![Just(""), Just("> "), Just("**")]) {
            for word in ["GO", "go", "Go"] {
                let close = if deco == "**" { "**" } else { "" };
                let text = format!("{prose}\n{deco}{word}{close}\n");
                prop_assert_eq!(parse(&text), Some(Verdict::Go));
            }
        }
    }
}
