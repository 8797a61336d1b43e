//! Commit statuses, the combined status, merging through the API and updating a pull
//! request's branch, as Forgejo 15 does them (see `FACTS-CI.md`): statuses append and the
//! latest per context wins; the combined status combines one page; Forgejo sends no webhook for
//! a status; a merge checks the head it is told and answers 405 or 409 as Forgejo does; an
//! update merges the base into the head and sends `pull_request_sync`.

use serde_json::{Value, json};

use super::server::pull_json;
use super::{FakeForge, Refusal, State, rfc3339};
use director::domain::RepoName;
use director::forge::Permission;

/// One posted commit status.
#[derive(Clone, Debug)]
pub(crate) struct FStatus {
    /// Per commit, from 1, as Forgejo numbers them.
    pub index: u64,
    pub context: String,
    pub state: String,
    pub description: String,
    pub target_url: String,
    pub creator: String,
    pub created: i64,
}

/// A commit status as a test posts it (`POST /repos/{o}/{r}/statuses/{sha}`).
#[derive(Clone, Copy, Debug, Default)]
pub struct CommitStatus<'a> {
    /// `pending`, `success`, `error`, `failure` or `warning`.
    pub state: &'a str,
    pub context: &'a str,
    pub description: &'a str,
    pub target_url: &'a str,
}

/// What a test sees of a merge made through the API.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MergeCall {
    pub number: u64,
    pub style: String,
    pub by: String,
    pub deleted_branch: bool,
}

const STATES: [&str; 5] = ["pending", "success", "error", "failure", "warning"];

/// Forgejo's priority: the worst wins, then `error` reads `failure`.
fn combine<'a>(states: impl Iterator<Item = &'a str>) -> &'static str {
    let rank = |s: &str| match s {
        "error" => 0,
        "failure" => 1,
        "warning" => 2,
        "pending" => 3,
        _ => 4,
    };
    match states.map(rank).min() {
        None => "",
        Some(0 | 1) => "failure",
        Some(2) => "warning",
        Some(3) => "pending",
        Some(_) => "success",
    }
}

impl State {
    /// The commit a ref names: a branch's head, or a full commit id of one of its branches.
    fn commit_of(&self, repo: &RepoName, reference: &str) -> Result<u64, Refusal> {
        self.repo(repo)?
            .commit_named(reference)
            .ok_or(Refusal::NotFound)
    }

    pub(crate) fn post_status(
        &mut self,
        login: &str,
        repo: &RepoName,
        sha: &str,
        body: &Value,
    ) -> Result<Value, Refusal> {
        if self.permission_of(repo, login) < Permission::Write {
            return Err(Refusal::Forbidden);
        }
        let commit = self.commit_of(repo, sha)?;
        let state = body["state"].as_str().unwrap_or_default();
        if !STATES.contains(&state) {
            return Err(Refusal::BadRequest(format!("invalid state {state:?}")));
        }
        let now = self.tick();
        let r = self.repo_mut(repo)?;
        let list = r.statuses.entry(commit).or_default();
        let status = FStatus {
            index: list.len() as u64 + 1,
            context: body["context"]
                .as_str()
                .unwrap_or("default")
                .trim()
                .to_owned(),
            state: state.to_owned(),
            description: body["description"]
                .as_str()
                .unwrap_or_default()
                .trim()
                .to_owned(),
            target_url: body["target_url"]
                .as_str()
                .unwrap_or_default()
                .trim()
                .to_owned(),
            creator: login.to_owned(),
            created: now,
        };
        list.push(status.clone());
        Ok(status_json(self, &status))
    }

    /// The latest status of each context, newest first.
    fn latest_statuses(&self, repo: &RepoName, commit: u64) -> Result<Vec<FStatus>, Refusal> {
        let all = self
            .repo(repo)?
            .statuses
            .get(&commit)
            .cloned()
            .unwrap_or_default();
        let mut latest: Vec<FStatus> = Vec::new();
        for s in all.into_iter().rev() {
            if !latest.iter().any(|l| l.context == s.context) {
                latest.push(s);
            }
        }
        Ok(latest)
    }

    /// `CombinedStatus` of one page of contexts (default 30, at most 50).
    pub(crate) fn combined_status(
        &self,
        repo: &RepoName,
        reference: &str,
        query: &[(String, String)],
    ) -> Result<Value, Refusal> {
        let commit = self.commit_of(repo, reference)?;
        let latest = self.latest_statuses(repo, commit)?;
        let number = |k: &str, d: usize| {
            query
                .iter()
                .find(|(key, _)| key == k)
                .and_then(|(_, v)| v.parse::<usize>().ok())
                .unwrap_or(d)
        };
        let limit = number("limit", 30).clamp(1, 50);
        let page = number("page", 1).max(1);
        let shown: Vec<&FStatus> = latest.iter().skip((page - 1) * limit).take(limit).collect();
        Ok(json!({
            "state": combine(shown.iter().map(|s| s.state.as_str())),
            "sha": self.repo(repo)?.commit_name(commit),
            "total_count": latest.len(),
            "statuses": shown.iter().map(|s| status_json(self, s)).collect::<Vec<_>>(),
            "repository": super::server::repo_json(self, repo),
            "commit_url": format!("https://forgejo.example.org/api/v1/repos/{repo}/git/commits/{commit:040x}"),
            "url": format!("https://forgejo.example.org/api/v1/repos/{repo}/commits/{commit:040x}/status"),
        }))
    }

    /// `POST /repos/{o}/{r}/pulls/{n}/merge` as `login`.
    pub(crate) fn merge_by_api(
        &mut self,
        login: &str,
        repo: &RepoName,
        number: u64,
        body: &Value,
    ) -> Result<(), Refusal> {
        let style = body["Do"].as_str().unwrap_or_default().to_owned();
        if ![
            "merge",
            "rebase",
            "rebase-merge",
            "squash",
            "fast-forward-only",
        ]
        .contains(&style.as_str())
        {
            return Err(Refusal::Unprocessable(format!("Do: invalid {style:?}")));
        }
        let at = self.pull_index(repo, number)?;
        let r = self.repo(repo)?;
        let p = r.pulls[at].clone();
        if p.merged {
            return Err(Refusal::NotAllowed("The PR is already merged".into()));
        }
        if p.state != "open" {
            return Err(Refusal::NotFound);
        }
        if self.permission_of(repo, login) < Permission::Write {
            return Err(Refusal::NotAllowed("User not allowed to merge PR".into()));
        }
        if !p.mergeable {
            return Err(Refusal::NotAllowed(
                "Please try again later: the pull request is not mergeable".into(),
            ));
        }
        let head = r.pull_head_name(&p);
        if let Some(expected) = body["head_commit_id"].as_str().filter(|h| !h.is_empty())
            && expected != head
        {
            return Err(Refusal::Conflict("head out of date".into()));
        }
        self.merge_pull(login, repo, number)?;
        let delete = body["delete_branch_after_merge"].as_bool().unwrap_or(false);
        let r = self.repo_mut(repo)?;
        // A branch in a fork is not the merger's to delete (Forgejo checks their right to
        // write to the head's repository).
        if delete && p.head_repo.is_none() && p.head != r.default_branch {
            r.branches.remove(&p.head);
        }
        r.merges.push(MergeCall {
            number,
            style,
            by: login.to_owned(),
            deleted_branch: delete,
        });
        Ok(())
    }

    /// `POST /repos/{o}/{r}/pulls/{n}/update`: the base's commits merged into the head, with
    /// a merge commit; `pull_request_sync` follows.
    pub(crate) fn update_pull(
        &mut self,
        login: &str,
        repo: &RepoName,
        number: u64,
    ) -> Result<(), Refusal> {
        let at = self.pull_index(repo, number)?;
        let p = self.repo(repo)?.pulls[at].clone();
        // The update pushes to the head's branch: its repository's writers may (Forgejo's
        // `IsUserAllowedToUpdate`; no maintainer edits here).
        let home = p.head_repo.clone().unwrap_or_else(|| repo.clone());
        if self.permission_of(&home, login) < Permission::Write {
            return Err(Refusal::Forbidden);
        }
        if p.state != "open" {
            return Err(Refusal::Unprocessable(
                "pull request is closed or merged".into(),
            ));
        }
        let r = self.repo(repo)?;
        let base = r.branches.get(&p.base).cloned().unwrap_or_default();
        let head = r.pull_commits(&p);
        let missing: Vec<u64> = base.iter().filter(|c| !head.contains(c)).copied().collect();
        if missing.is_empty() {
            return Err(Refusal::Internal(format!(
                "HeadBranch of PR {number} is up to date"
            )));
        }
        let tree = head
            .last()
            .and_then(|c| r.trees.get(c).cloned())
            .unwrap_or_default();
        let merge_commit = self.id();
        let h = self.repo_mut(&home)?;
        let branch = h.branches.entry(p.head.clone()).or_default();
        branch.extend(missing);
        branch.push(merge_commit);
        h.trees.insert(merge_commit, tree);
        if p.head_repo.is_some() {
            self.fork_pushed(login, &home, &p.head);
        } else {
            self.pull_pushed(login, repo, &p.head);
        }
        Ok(())
    }

    /// New commits on `branch`: each open pull request from it is synchronised.
    pub(crate) fn pull_pushed(&mut self, login: &str, repo: &RepoName, branch: &str) {
        let Ok(r) = self.repo(repo) else { return };
        let numbers: Vec<u64> = r
            .pulls
            .iter()
            .filter(|p| p.head == branch && p.head_repo.is_none() && p.state == "open")
            .map(|p| p.number)
            .collect();
        for number in numbers {
            self.emit_pull(
                "pull_request_sync",
                "synchronized",
                login,
                repo,
                number,
                None,
            );
        }
    }
}

fn status_json(s: &State, status: &FStatus) -> Value {
    json!({
        "id": status.index,
        "status": status.state,
        "context": status.context,
        "description": status.description,
        "target_url": status.target_url,
        "url": "",
        "creator": super::server::user_json(s, &status.creator),
        "created_at": rfc3339(status.created),
        "updated_at": rfc3339(status.created),
    })
}

impl State {
    /// `GET .../commits?sha=<branch>&not=<commit>`: the branch's commits, newest first,
    /// leaving out those `not` has, at most `limit` (50).
    pub(crate) fn recent_commits(
        &self,
        repo: &RepoName,
        branch: &str,
        not: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Value>, Refusal> {
        let r = self.repo(repo)?;
        let commits = r.branches.get(branch).ok_or(Refusal::NotFound)?;
        let known: Vec<u64> = match not.and_then(|n| r.commit_named(n)) {
            Some(stop) => {
                let at = commits.iter().position(|c| *c == stop).unwrap_or(0);
                commits[..=at].to_vec()
            }
            None => Vec::new(),
        };
        Ok(commits
            .iter()
            .rev()
            .filter(|c| !known.contains(c))
            .take(limit.min(50))
            .map(|c| {
                let sha = r.commit_name(*c);
                let parents: Vec<Value> = r
                    .parents_of(*c)
                    .into_iter()
                    .map(|p| json!({ "sha": r.commit_name(p), "url": "" }))
                    .collect();
                json!({
                    "sha": sha,
                    "parents": parents,
                    "html_url": format!("https://forgejo.example.org/{repo}/commit/{sha}"),
                    "commit": { "message": r.messages.get(c).cloned().unwrap_or_else(|| "commit".to_owned()) },
                })
            })
            .collect())
    }
}

/// The in-process answers, for the fake's `Forge` implementation.
pub(super) fn checks(
    s: &State,
    repo: &RepoName,
    sha: &str,
) -> Result<director::forge::Checks, Refusal> {
    let commit = s.commit_of(repo, sha)?;
    let checks = s
        .latest_statuses(repo, commit)?
        .into_iter()
        .take(director::forge::MAX_CHECKS)
        .map(|st| director::forge::Check {
            context: st.context,
            state: director::forge::CheckState::from_forge(&st.state),
            description: st.description,
            target_url: st.target_url,
        })
        .collect();
    let held = s.repo(repo).map_or(0, |r| {
        r.action_runs
            .iter()
            .filter(|a| a.need_approval && a.head_sha == sha)
            .count()
    });
    Ok(director::forge::Checks {
        checks,
        truncated: false,
        held: u32::try_from(held).unwrap_or(u32::MAX),
    })
}

impl FakeForge {
    /// `by` posts a commit status on `sha` (Forgejo sends no webhook for it).
    pub fn post_status(&self, by: &str, repo: &RepoName, sha: &str, status: &CommitStatus<'_>) {
        let mut s = self.state();
        s.ensure_user(by);
        let body = json!({
            "state": status.state,
            "context": status.context,
            "description": status.description,
            "target_url": status.target_url,
        });
        s.post_status(by, repo, sha, &body)
            .unwrap_or_else(|e| panic!("status on {sha}: {e:?}"));
    }

    /// Every commit status posted on `sha` (a full commit id or a branch), in the order
    /// posted: (state, context, description, target_url, poster).
    pub fn statuses(
        &self,
        repo: &RepoName,
        sha: &str,
    ) -> Vec<(String, String, String, String, String)> {
        let s = self.state();
        let Ok(commit) = s.commit_of(repo, sha) else {
            return Vec::new();
        };
        s.repo(repo)
            .ok()
            .and_then(|r| r.statuses.get(&commit))
            .map(|list| {
                list.iter()
                    .map(|f| {
                        (
                            f.state.clone(),
                            f.context.clone(),
                            f.description.clone(),
                            f.target_url.clone(),
                            f.creator.clone(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The head commit of pull request `number`, as the API names it.
    pub fn pull_head(&self, repo: &RepoName, number: u64) -> String {
        let s = self.state();
        pull_json(&s, repo, number)
            .ok()
            .and_then(|v| v["head"]["sha"].as_str().map(str::to_owned))
            .unwrap_or_default()
    }

    /// Whether the forge calls pull request `number` mergeable (true unless a test says not).
    pub fn set_mergeable(&self, repo: &RepoName, number: u64, mergeable: bool) {
        let mut s = self.state();
        if let Ok(r) = s.repo_mut(repo)
            && let Some(p) = r.pulls.iter_mut().find(|p| p.number == number)
        {
            p.mergeable = mergeable;
        }
    }

    /// The merges made through the API, in order.
    pub fn merges(&self, repo: &RepoName) -> Vec<MergeCall> {
        let s = self.state();
        s.repo(repo).map(|r| r.merges.clone()).unwrap_or_default()
    }

    /// Forgejo Actions finished a run of pull request `number` (`action_run_success`, or
    /// `action_run_failure` when `success` is false): the webhook Forgejo sends, with no
    /// top-level repository or sender.
    pub async fn send_action_run(&self, repo: &RepoName, number: u64, success: bool) {
        {
            let mut s = self.state();
            if s.webhook.is_none() {
                return;
            }
            let id = s.id();
            let head = pull_json(&s, repo, number)
                .ok()
                .and_then(|v| v["head"]["sha"].as_str().map(str::to_owned))
                .unwrap_or_default();
            let (action, status) = if success {
                ("success", "success")
            } else {
                ("failure", "failure")
            };
            let body = json!({
                "action": action,
                "prior_status": "running",
                "run": {
                    "id": id,
                    "index_in_repo": id,
                    "title": "CI",
                    "workflow_id": "ci.yml",
                    "commit_sha": head,
                    "prettyref": format!("#{number}"),
                    "event": "pull_request",
                    "trigger_event": "pull_request",
                    "status": status,
                    "repository": super::server::repo_json(&s, repo),
                    "trigger_user": super::server::user_json(&s, "forgejo-actions"),
                    "html_url": format!("https://forgejo.example.org/{repo}/actions/runs/{id}"),
                },
            });
            s.outbox.push(super::Outgoing {
                event_type: format!("action_run_{action}"),
                body: serde_json::to_string_pretty(&body).unwrap_or_default(),
            });
        }
        self.deliver_webhooks().await;
    }

    /// Whether `branch` exists.
    pub fn has_branch(&self, repo: &RepoName, branch: &str) -> bool {
        let s = self.state();
        s.repo(repo).is_ok_and(|r| r.branches.contains_key(branch))
    }

    /// `by` pushes a new commit to `branch` with `message` (a revert, say).
    pub async fn push_commit_with_message(
        &self,
        by: &str,
        repo: &RepoName,
        branch: &str,
        message: &str,
    ) -> String {
        let sha = self.push_commit(by, repo, branch).await;
        let mut s = self.state();
        if let Ok(r) = s.repo_mut(repo)
            && let Some(id) = r.commit_named(&sha)
        {
            r.messages.insert(id, message.to_owned());
        }
        sha
    }

    /// `by` pushes a new commit to `branch` (a base that moves on); an open pull request from
    /// it is synchronised (its webhook delivered).
    pub async fn push_commit(&self, by: &str, repo: &RepoName, branch: &str) -> String {
        let sha = {
            let mut s = self.state();
            s.ensure_user(by);
            let commit = s.id();
            let Ok(r) = s.repo_mut(repo) else {
                panic!("no repository {repo}");
            };
            let parent = r.branches.get(branch).and_then(|c| c.last()).copied();
            let tree = parent
                .and_then(|p| r.trees.get(&p).cloned())
                .unwrap_or_default();
            r.branches
                .entry(branch.to_owned())
                .or_default()
                .push(commit);
            r.trees.insert(commit, tree);
            r.parents.insert(commit, parent.into_iter().collect());
            s.pull_pushed(by, repo, branch);
            format!("{commit:040x}")
        };
        self.deliver_webhooks().await;
        sha
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worst_state_wins_and_error_reads_failure_as_forgejo_combines() {
        assert_eq!(combine(["success", "pending"].into_iter()), "pending");
        assert_eq!(combine(["pending", "warning"].into_iter()), "warning");
        assert_eq!(combine(["success", "error"].into_iter()), "failure");
        assert_eq!(combine(std::iter::empty()), "");
    }
}
