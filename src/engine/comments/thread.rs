//! What the director says about grants in the thread: the runtime runs are sandboxed by, the
//! line that approves a refused host, the answer to a writer's `allow` or `continue`, and how
//! to go on after a run stopped on its budget.

use crate::egress::approvable::{self, Glob};

/// A line naming the sandbox runtime the run had (`runner.oci_runtime`,
/// `runner.runtime_class_name`), or nothing for the engine's default.
pub fn runtime_line(runtime: Option<&str>) -> String {
    runtime
        .map(|r| format!("\n\nRuntime: `{r}` (a kernel between the run and the host)."))
        .unwrap_or_default()
}

/// For each host the egress proxy refused the run: the exact line a writer comments to
/// approve it for this issue's runs, or why it cannot be approved. Nothing when approvals
/// are off (`runner.egress_approvable` empty) or nothing was refused.
pub fn approvals(refused: &[(String, u64)], globs: &[Glob]) -> String {
    if globs.is_empty() {
        return String::new();
    }
    let mut lines = Vec::new();
    let mut not = Vec::new();
    for (what, _) in refused
        .iter()
        .filter(|(w, _)| !w.starts_with(crate::git_gateway::REFUSAL_PREFIX))
        .take(20)
    {
        // Only what parses as an entry is repeated: the run chose these names.
        let Ok(entry) = what.parse::<crate::egress::Entry>() else {
            continue;
        };
        match approvable::check(&entry.to_string(), globs) {
            Ok(e) => lines.push(format!("/director allow {e}")),
            Err(why) => not.push(format!("- {}", why.replace('\n', " "))),
        }
    }
    let mut out = String::new();
    if !lines.is_empty() {
        out.push_str(&format!(
            "\n\nA writer may approve these for this issue's runs (and retry this run once) by commenting:\n\n```\n{}\n```\n",
            lines.join("\n")
        ));
    }
    if !not.is_empty() {
        out.push_str(&format!(
            "\n\nNot approvable in the thread (an operator may add them to `runner.egress_allow`):\n{}\n",
            not.join("\n")
        ));
    }
    out
}

/// The answer to an `allow` or `continue` that changed nothing, and why.
pub fn refused(command: &str, why: &str) -> String {
    format!("`/director {command}`: nothing changed. {why}")
}

/// The answer to a writer's approval.
pub fn allowed(by: &str, hosts: &[String], all: &[String], retried: Option<&str>) -> String {
    let list = |h: &[String]| {
        h.iter()
            .map(|h| format!("`{h}`"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut out = format!(
        "Approved by @{by} for this issue's runs (its later runs, attempts and follow-ups; no other issue's): {}.\nApproved for this issue so far: {}.",
        list(hosts),
        list(all)
    );
    if let Some(run) = retried {
        out.push_str(&format!(
            "\n\nRun `{run}` was refused one of them: it starts again, once."
        ));
    }
    out
}

/// How to go on after a run stopped on its budget, and what it spent (`spent_usd`, as the
/// model gateway metered it, to the micro-dollar: the usage line rounds to cents, which can
/// read as less than the budget it crossed): `max_usd` is the most a continue may give (0: no
/// limit set), `default_usd` what a plain one gives (0: no run budget).
pub fn how_to_continue(
    branch: &str,
    spent_usd: Option<f64>,
    default_usd: f64,
    max_usd: f64,
) -> String {
    use crate::domain::units::dollars;
    let spent = spent_usd
        .map(|usd| format!("It spent {} on model calls. ", dollars(usd, 2)))
        .unwrap_or_default();
    let plain = if default_usd > 0.0 {
        format!("a budget of {}", dollars(default_usd, 2))
    } else {
        "no run budget (the repository's and the day's still apply)".to_owned()
    };
    let most = if max_usd > 0.0 {
        format!(
            ", at most {} (`budget.max_continue_usd`)",
            dollars(max_usd, 2)
        )
    } else {
        String::new()
    };
    format!(
        "\n\n{spent}What it pushed stays on branch `{branch}`. To go on from there, a writer comments `/director continue` (a follow-up run on the same branch with {plain}) or `/director continue $N` (a budget of $N{most})."
    )
}

/// The answer to a writer's continue.
pub fn continuing(by: &str, from: &str, branch: &str, usd: f64) -> String {
    use crate::domain::units::dollars;
    let budget = if usd > 0.0 {
        format!("a budget of its own, {}", dollars(usd, 2))
    } else {
        "no run budget of its own".to_owned()
    };
    format!(
        "Continuing for @{by}: a follow-up of run `{from}` on branch `{branch}`, with {budget}; the repository's and the day's budgets still apply."
    )
}

/// What the answer adds when the comment stated more than one command: only the first,
/// `taken`, is taken, and the others are named (the writer says each in a comment of its own).
pub fn not_taken(taken: crate::domain::Command, others: &[crate::domain::Command]) -> String {
    if others.is_empty() {
        return String::new();
    }
    let list = others
        .iter()
        .map(|c| format!("`/director {}`", c.as_str()))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "\n\nA comment gives one command: this one took `/director {}`, its first. Not taken: {list}; say each in a comment of its own.",
        taken.as_str()
    )
}
