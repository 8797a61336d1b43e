//! One coder run: [`RunRecord`] and its typed [`RunState`].

use serde::{Deserialize, Serialize};

use super::{IssueRef, RepoName};

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
    Cancelled,
    /// Stopped before anything started (PR-only check failed).
    Refused,
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
            Self::Cancelled => "cancelled",
            Self::Refused => "refused",
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
            Self::Cancelled,
            Self::Refused,
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
    pub id: String,
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
}

impl RunRecord {
    pub fn issue_ref(&self) -> IssueRef {
        IssueRef::new(self.repo.clone(), self.number)
    }

    /// A new run for `issue`, admitted at `now_ms`.
    pub fn admitted(issue: &IssueRef, id: &str, branch: &str, now_ms: i64) -> Self {
        Self {
            id: id.to_owned(),
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
        }
    }
}

/// What git in a run needs to clone and push with the run token and nothing else: the token
/// reaches git through a credential helper that reads `DIRECTOR_TOKEN` from the environment
/// when git asks, for the forge's address only. The token is never in the clone URL, a
/// command line, `.git/config` or the log. Helpers the image configures are switched off, so
/// none can store the token. Commits get `name <email>`.
pub fn git_environment(
    forge_origin: &str,
    login: &str,
    name: &str,
    email: &str,
) -> Vec<(String, String)> {
    // `!` runs the rest through the shell; `$DIRECTOR_TOKEN` stays unexpanded in the helper's
    // text (so also in any argument list) and is read from the environment when it runs.
    let helper = format!(
        "!f() {{ test \"$1\" = get || exit 0; echo username={login}; echo \"password=$DIRECTOR_TOKEN\"; }}; f"
    );
    let config = [
        ("credential.helper".to_owned(), String::new()),
        (format!("credential.{forge_origin}.helper"), helper),
        ("credential.interactive".to_owned(), "false".to_owned()),
    ];
    let mut env = vec![
        ("GIT_TERMINAL_PROMPT".to_owned(), "0".to_owned()),
        ("GIT_AUTHOR_NAME".to_owned(), name.to_owned()),
        ("GIT_AUTHOR_EMAIL".to_owned(), email.to_owned()),
        ("GIT_COMMITTER_NAME".to_owned(), name.to_owned()),
        ("GIT_COMMITTER_EMAIL".to_owned(), email.to_owned()),
        ("GIT_CONFIG_COUNT".to_owned(), config.len().to_string()),
    ];
    for (i, (key, value)) in config.into_iter().enumerate() {
        env.push((format!("GIT_CONFIG_KEY_{i}"), key));
        env.push((format!("GIT_CONFIG_VALUE_{i}"), value));
    }
    env
}

/// Whether an environment variable passed into a run would change how git gets its
/// credentials or identity (the director sets those).
pub fn sets_git_credentials(name: &str) -> bool {
    let n = name.to_ascii_uppercase();
    n.starts_with("GIT_CONFIG")
        || n.starts_with("GIT_AUTHOR_")
        || n.starts_with("GIT_COMMITTER_")
        || matches!(
            n.as_str(),
            "GIT_ASKPASS" | "SSH_ASKPASS" | "GIT_TERMINAL_PROMPT" | "HOME" | "XDG_CONFIG_HOME"
        )
}

/// Whether a run's log shows the forge refusing a push to `branch` (git's
/// `! [remote rejected] x -> branch` line, or Forgejo's "protected branch" message).
pub fn log_shows_refused_push(log: &str, branch: &str) -> bool {
    let target = format!("-> {branch} ");
    let protected = format!("protected branch {branch}");
    log.lines().any(|line| {
        let line = line.trim_end();
        let rejected = line.contains("[remote rejected]") || line.contains("[rejected]");
        (rejected && format!("{line} ").contains(&target)) || line.contains(&protected)
    })
}

#[cfg(test)]
mod git_tests {
    use super::*;

    #[test]
    fn the_git_environment_never_holds_the_token_and_scopes_the_helper_to_the_forge() {
        let env = git_environment(
            "http://forge.example:3000",
            "runner",
            "runner",
            "runner@noreply.forge.example",
        );
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("GIT_CONFIG_COUNT"), Some("3"));
        assert_eq!(get("GIT_CONFIG_KEY_0"), Some("credential.helper"));
        assert_eq!(get("GIT_CONFIG_VALUE_0"), Some(""));
        assert_eq!(
            get("GIT_CONFIG_KEY_1"),
            Some("credential.http://forge.example:3000.helper")
        );
        assert!(get("GIT_CONFIG_VALUE_1").is_some_and(|h| h.contains("$DIRECTOR_TOKEN")));
        assert_eq!(get("GIT_TERMINAL_PROMPT"), Some("0"));
        assert_eq!(
            get("GIT_AUTHOR_EMAIL"),
            Some("runner@noreply.forge.example")
        );
        for (k, _) in &env {
            assert!(sets_git_credentials(k), "{k} must not be passed through");
        }
    }

    #[test]
    fn a_refused_push_to_the_default_branch_is_seen_in_the_log() {
        let log = "remote: Forgejo: Not allowed to push to protected branch main\nTo http://f/a/b.git\n ! [remote rejected] HEAD -> main (pre-receive hook declined)\nerror: failed to push some refs";
        assert!(log_shows_refused_push(log, "main"));
        assert!(log_shows_refused_push(
            " ! [remote rejected] x -> main (pre-receive hook declined)",
            "main"
        ));
        assert!(!log_shows_refused_push(
            " ! [remote rejected] x -> maintenance (declined)",
            "main"
        ));
        assert!(!log_shows_refused_push(
            "pushed director-issue-7-abc",
            "main"
        ));
        assert!(!log_shows_refused_push(
            " * [new branch] HEAD -> main",
            "main"
        ));
    }
}
