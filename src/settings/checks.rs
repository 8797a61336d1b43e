//! `[checks]`: the commands the director runs on a run's pushed head and on its base, in
//! sealed containers, before the pull request opens. Set by the operator for every repository
//! (its own `[checks]`) or by a repository in `.director.toml` when `repo_settings.allow`
//! names `checks`. Both are read by [`decl`], which names the key of each problem.

use serde::{Deserialize, Serialize};

use crate::domain::checks::ChecksDecl;

/// The longest the checks of one side may take when `[checks]` names no `timeout_secs`.
pub const TIMEOUT_SECS: u64 = 600;

/// The most commands one `[checks]` may hold.
pub const MAX_COMMANDS: usize = 16;

/// `[checks]` as written, in the operator's configuration or a repository's file.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChecksSettings {
    /// Shell lines, each run by `sh -c` in the checkout.
    #[serde(default)]
    pub commands: Vec<String>,
    #[serde(default)]
    pub timeout_secs: Option<u64>,
    /// JUnit XML reports the commands write, relative to the checkout.
    #[serde(default)]
    pub junit: Vec<String>,
}

impl ChecksSettings {
    /// Whether any key is set (the operator's `[checks]`: none set, no checks).
    pub fn is_set(&self) -> bool {
        !self.commands.is_empty() || !self.junit.is_empty() || self.timeout_secs.is_some()
    }
}

/// `s` checked: at least one command, each non-empty and short, report paths inside the
/// workspace, a time limit of at least a second and at most `max_timeout_secs` (capped, said
/// in `capped`). `Err`: each problem, naming its key.
pub fn decl(
    s: &ChecksSettings,
    max_timeout_secs: u64,
    capped: &mut Vec<String>,
) -> Result<ChecksDecl, Vec<String>> {
    let mut problems = Vec::new();
    let commands: Vec<String> = s.commands.iter().map(|c| c.trim().to_owned()).collect();
    if commands.is_empty() {
        problems
            .push("`checks.commands` is missing or empty: name at least one command".to_owned());
    }
    if commands.len() > MAX_COMMANDS {
        problems.push(format!(
            "`checks.commands` holds {} commands; at most {MAX_COMMANDS}",
            commands.len()
        ));
    }
    for c in &commands {
        if c.is_empty() {
            problems.push("`checks.commands` holds an empty command".to_owned());
        } else if c.len() > 4096 || c.contains('\0') {
            problems.push(
                "`checks.commands` holds a command longer than 4096 bytes or with a NUL".to_owned(),
            );
        }
    }
    for path in &s.junit {
        let bad = path.is_empty()
            || path.starts_with('/')
            || path.starts_with('~')
            || path.split('/').any(|p| p == ".." || p == ".")
            || path.contains('\0')
            || path.contains('\\');
        if bad {
            problems.push(format!(
                "`checks.junit` `{path}` is not a relative path inside the workspace"
            ));
        }
    }
    if s.junit.len() > 16 {
        problems.push("`checks.junit` names more than 16 files".to_owned());
    }
    let mut timeout_secs = s.timeout_secs.unwrap_or(TIMEOUT_SECS.min(max_timeout_secs));
    if timeout_secs == 0 {
        problems.push("`checks.timeout_secs` must be at least 1".to_owned());
    } else if timeout_secs > max_timeout_secs {
        capped.push(format!(
            "checks.timeout_secs {timeout_secs} is capped at the operator's runner.timeout_secs {max_timeout_secs}"
        ));
        timeout_secs = max_timeout_secs;
    }
    if problems.is_empty() {
        Ok(ChecksDecl {
            commands,
            timeout_secs,
            junit: s.junit.clone(),
        })
    } else {
        Err(problems)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(commands: &[&str], junit: &[&str]) -> ChecksSettings {
        ChecksSettings {
            commands: commands.iter().map(|c| (*c).to_owned()).collect(),
            timeout_secs: None,
            junit: junit.iter().map(|c| (*c).to_owned()).collect(),
        }
    }

    #[test]
    fn checks_are_kept_with_a_default_time_limit_within_the_operators() {
        let mut capped = Vec::new();
        let d = decl(
            &settings(&[" sh test.sh "], &["out/junit.xml"]),
            3600,
            &mut capped,
        )
        .expect("fine");
        assert_eq!(d.commands, vec!["sh test.sh"]);
        assert_eq!(d.timeout_secs, TIMEOUT_SECS);
        assert_eq!(d.junit, vec!["out/junit.xml"]);
        let d = decl(&settings(&["make"], &[]), 60, &mut capped).expect("fine");
        assert_eq!(d.timeout_secs, 60);
        assert!(capped.is_empty());
        let mut long = settings(&["make"], &[]);
        long.timeout_secs = Some(7200);
        let d = decl(&long, 3600, &mut capped).expect("capped, not refused");
        assert_eq!(d.timeout_secs, 3600);
        assert_eq!(capped.len(), 1);
    }

    #[test]
    fn an_empty_command_list_and_a_report_outside_the_workspace_are_refused_naming_the_key() {
        let mut capped = Vec::new();
        let why = decl(&settings(&[], &[]), 3600, &mut capped).expect_err("refused");
        assert!(why[0].contains("`checks.commands`"), "{why:?}");
        for path in ["/etc/passwd", "../x.xml", "a/../../b", "~/x", ""] {
            let why = decl(&settings(&["make"], &[path]), 3600, &mut capped).expect_err(path);
            assert!(why[0].contains("`checks.junit`"), "{why:?}");
        }
        let mut zero = settings(&["make"], &[]);
        zero.timeout_secs = Some(0);
        let why = decl(&zero, 3600, &mut capped).expect_err("refused");
        assert!(why[0].contains("`checks.timeout_secs`"), "{why:?}");
        let why = decl(&settings(&["make", "  "], &[]), 3600, &mut capped).expect_err("empty");
        assert!(why[0].contains("empty command"), "{why:?}");
    }
}
