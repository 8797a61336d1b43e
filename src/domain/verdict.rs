//! Reading the verdict out of a model's answer. Models decorate: `**NO-GO:** reason`,
//! `> GO`, `- WRONG-REPO: acme/api — file it there`, mixed case, en and em dashes. The last
//! line that holds a verdict wins; an answer with none is unclear.

use serde::{Deserialize, Serialize};

use crate::domain::RepoName;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "SCREAMING-KEBAB-CASE")]
pub enum Verdict {
    Go,
    NoGo { reason: String },
    WrongRepo { repo: RepoName, what: String },
}

impl Verdict {
    /// `GO`, `NO-GO` or `WRONG-REPO`: the word people see.
    pub fn word(&self) -> &'static str {
        match self {
            Self::Go => "GO",
            Self::NoGo { .. } => "NO-GO",
            Self::WrongRepo { .. } => "WRONG-REPO",
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

/// The last verdict in `answer`, or `None` when it states none.
pub fn parse(answer: &str) -> Option<Verdict> {
    answer.lines().rev().find_map(verdict_of)
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
