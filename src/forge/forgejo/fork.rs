//! The revert check's one list of a branch's commits, and what runs in fork mode ask of
//! Forgejo (`runner.branch_home = "fork"`): the runner's fork of a repository, kept in step
//! with it; its merged branches deleted as the runner; and the workflow runs Forgejo holds
//! for a maintainer's approval. (Opening and updating a pull request as the runner share the
//! bot's own calls, in `super`, with the runner's credentials.) The calls made as the runner
//! authenticate with its password (Basic), as minting its tokens already does: Forgejo takes
//! a pull request's poster as the one its approval gate judges, so the runner, not the bot,
//! must open it. What each call needs is in `docs/forks.md`.

use reqwest::Method;
use serde_json::json;

use super::wire::*;
use super::{ForgejoClient, PAGE_SIZE, basic, decode, repo_path, seg};
use crate::domain::{CommitSha, RepoName};
use crate::forge::{CommitSummary, ForgeError, ForkSync, RunnerAccount};

/// The most workflow runs of one commit read for their approval.
const RUNS_READ: usize = 50;

impl ForgejoClient {
    /// How many workflow runs of commit `sha` wait for a maintainer's approval. A repository
    /// without Actions (the list answers 404 or 403) has none.
    pub(super) async fn held_runs(
        &self,
        repo: &RepoName,
        sha: &CommitSha,
    ) -> Result<u32, ForgeError> {
        let path = format!("{}/actions/runs", repo_path(repo));
        let query = [
            ("head_sha", sha.to_string()),
            ("limit", RUNS_READ.to_string()),
        ];
        match self
            .json::<WireActionRuns>(
                Method::GET,
                "/repos/{owner}/{repo}/actions/runs",
                &path,
                &query,
                None,
            )
            .await
        {
            Ok(list) => Ok(list
                .workflow_runs
                .iter()
                .filter(|r| r.need_approval && !run_done(&r.status))
                .count()
                .try_into()
                .unwrap_or(u32::MAX)),
            Err(ForgeError::NotFound { .. } | ForgeError::Forbidden { .. }) => Ok(0),
            Err(e) => Err(e),
        }
    }

    pub(super) async fn recent_commits(
        &self,
        repo: &RepoName,
        branch: &str,
        not: Option<&str>,
    ) -> Result<Vec<CommitSummary>, ForgeError> {
        let path = format!("{}/commits", repo_path(repo));
        let mut query = vec![
            ("sha", branch.to_owned()),
            ("limit", PAGE_SIZE.to_string()),
            ("stat", "false".to_owned()),
            ("verification", "false".to_owned()),
            ("files", "false".to_owned()),
        ];
        if let Some(not) = not {
            query.push(("not", not.to_owned()));
        }
        let list: Vec<WireCommit> = self
            .json(
                Method::GET,
                "/repos/{owner}/{repo}/commits",
                &path,
                &query,
                None,
            )
            .await?;
        Ok(list
            .into_iter()
            .map(|c| CommitSummary {
                sha: c.sha,
                message: c.commit.map(|m| m.message).unwrap_or_default(),
                url: c.html_url,
                parents: c.parents.into_iter().map(|p| p.sha).collect(),
            })
            .collect())
    }

    /// The diff of commit `sha` against its first parent, at most `cap` bytes; `None` when
    /// it is larger. Only a commit id (hexadecimal) is asked for.
    pub(super) async fn commit_diff(
        &self,
        repo: &RepoName,
        sha: &str,
        cap: usize,
    ) -> Result<Option<String>, ForgeError> {
        let path = format!("{}/git/commits/{sha}.diff", repo_path(repo));
        if sha.is_empty() || !sha.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(ForgeError::NotFound {
                method: "GET".into(),
                path,
            });
        }
        let resp = self
            .send(
                Method::GET,
                "/repos/{owner}/{repo}/git/commits/{sha}.{diffType}",
                &path,
                &[],
                None,
            )
            .await?;
        match crate::limits::read_capped(resp, cap).await {
            Ok(bytes) => Ok(Some(String::from_utf8_lossy(&bytes).into_owned())),
            Err(crate::limits::ReadError::TooLarge(_)) => Ok(None),
            Err(e) => Err(ForgeError::Transport {
                method: "GET".into(),
                path,
                reason: e.to_string(),
            }),
        }
    }

    /// The fork `owner` holds, read by the name the director gives it (the base's), as
    /// the runner: a scan of the base's forks would stop at some page, and a repository
    /// with many forks would lose the runner's. Used only when its `parent` is `base`.
    pub(super) async fn fork_of(
        &self,
        runner: &RunnerAccount,
        base: &RepoName,
        owner: &str,
    ) -> Result<Option<RepoName>, ForgeError> {
        let Ok(name) = RepoName::new(owner, base.name()) else {
            return Ok(None);
        };
        Ok(self
            .fork_repo(runner, &name)
            .await?
            .filter(|r| r.fork && parent_is(r, base))
            .map(|_| name))
    }

    /// `GET /repos/{fork}` as the runner (`None`: there is none it can see).
    async fn fork_repo(
        &self,
        runner: &RunnerAccount,
        name: &RepoName,
    ) -> Result<Option<WireForkRepo>, ForgeError> {
        let path = repo_path(name);
        let resp = self
            .send_as(
                Some(&basic(runner)?),
                Method::GET,
                "/repos/{owner}/{repo}",
                &path,
                &[],
                None,
            )
            .await;
        match resp {
            Ok(resp) => Ok(Some(decode(&Method::GET, &path, resp).await?)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// What makes the runner's fork unfit for runs, read as the runner: Actions on in it
    /// (the run's pushes would run its workflows, with the fork owner's secrets), or
    /// anyone but the runner able to write to it (a collaborator, or a team of the
    /// organisation that owns it), or what of that cannot be read.
    pub(super) async fn fork_problems(
        &self,
        runner: &RunnerAccount,
        fork: &RepoName,
    ) -> Result<Vec<String>, ForgeError> {
        let mut out = Vec::new();
        match self.fork_repo(runner, fork).await? {
            None => out.push(format!("the fork {fork} cannot be seen by the runner")),
            Some(r) if r.has_actions => out.push(format!(
                "Forgejo Actions is on in the fork {fork}: the run's pushes would run workflows there, with the secrets of its owner; turn Actions off in its settings"
            )),
            Some(_) => {}
        }
        for who in self.fork_writers(runner, fork).await? {
            out.push(who);
        }
        Ok(out)
    }

    pub(super) async fn create_fork(
        &self,
        runner: &RunnerAccount,
        base: &RepoName,
        org: Option<&str>,
    ) -> Result<RepoName, ForgeError> {
        let path = format!("{}/forks", repo_path(base));
        let body = match org {
            Some(org) => json!({ "organization": org }),
            None => json!({}),
        };
        let resp = self
            .send_as(
                Some(&basic(runner)?),
                Method::POST,
                "/repos/{owner}/{repo}/forks",
                &path,
                &[],
                Some(&body),
            )
            .await?;
        let made: WireForkRepo = decode(&Method::POST, &path, resp).await?;
        let parent = made.parent.as_ref().map(|p| p.full_name.as_str());
        match made.full_name.parse::<RepoName>() {
            Ok(fork)
                if made.fork
                    && parent.is_none_or(|p| p.eq_ignore_ascii_case(&base.to_string())) =>
            {
                Ok(fork)
            }
            _ => Err(ForgeError::Decode {
                method: "POST".into(),
                path,
                reason: format!("the answer is not a fork of {base}"),
            }),
        }
    }

    pub(super) async fn sync_fork(
        &self,
        runner: &RunnerAccount,
        fork: &RepoName,
        branch: &str,
    ) -> Result<ForkSync, ForgeError> {
        let path = format!("{}/sync_fork/{}", repo_path(fork), seg(branch));
        let auth = basic(runner)?;
        let resp = self
            .send_as(
                Some(&auth),
                Method::GET,
                "/repos/{owner}/{repo}/sync_fork/{branch}",
                &path,
                &[],
                None,
            )
            .await?;
        let info: WireSyncFork = decode(&Method::GET, &path, resp).await?;
        if !info.base_commit.is_empty() && info.fork_commit == info.base_commit {
            return Ok(ForkSync::InStep);
        }
        if !info.allowed {
            return Ok(ForkSync::Diverged);
        }
        self.send_as(
            Some(&auth),
            Method::POST,
            "/repos/{owner}/{repo}/sync_fork/{branch}",
            &path,
            &[],
            None,
        )
        .await?;
        Ok(ForkSync::Synced)
    }

    /// How many commits `head` has that `base` has not, in `repo`, as `auth` (the bot when
    /// `None`).
    pub(super) async fn compare_with(
        &self,
        auth: Option<&reqwest::header::HeaderValue>,
        repo: &RepoName,
        base: &str,
        head: &str,
    ) -> Result<u64, ForgeError> {
        let path = format!("{}/compare/{}...{}", repo_path(repo), seg(base), seg(head));
        let resp = self
            .send_as(
                auth,
                Method::GET,
                "/repos/{owner}/{repo}/compare/{basehead}",
                &path,
                &[],
                None,
            )
            .await?;
        let wire: WireCompare = decode(&Method::GET, &path, resp).await?;
        Ok(wire.total_commits.max(wire.commits.len() as u64))
    }

    pub(super) async fn delete_branch_as(
        &self,
        runner: &RunnerAccount,
        repo: &RepoName,
        branch: &str,
    ) -> Result<(), ForgeError> {
        let path = format!("{}/branches/{}", repo_path(repo), seg(branch));
        self.delete_idempotent(
            Some(&basic(runner)?),
            "/repos/{owner}/{repo}/branches/{branch}",
            &path,
        )
        .await
    }
}

/// Whether `repo`'s parent is `base`.
fn parent_is(repo: &WireForkRepo, base: &RepoName) -> bool {
    repo.parent
        .as_ref()
        .is_some_and(|p| p.full_name.eq_ignore_ascii_case(&base.to_string()))
}

/// Whether a workflow run's status is final (Forgejo's `IsDone`).
fn run_done(status: &str) -> bool {
    matches!(status, "success" | "failure" | "cancelled" | "skipped")
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_final_statuses_are_done() {
        for done in ["success", "failure", "cancelled", "skipped"] {
            assert!(super::run_done(done), "{done}");
        }
        for open in ["waiting", "blocked", "running", "unknown", ""] {
            assert!(!super::run_done(open), "{open}");
        }
    }
}
