//! Forks and Forgejo Actions in the fake, as Forgejo 15 has them (read in its source, see
//! `docs/forks.md`):
//!
//! - `POST /repos/{o}/{r}/forks` makes one fork per owner (409 when the owner has one, or a
//!   repository of the name), copying branches and git; `GET .../forks` lists them.
//! - `GET|POST .../sync_fork/{branch}` brings a fork's branch up to its base's by a
//!   fast-forward push, `allowed` only when the fork's commit is in the base's branch.
//! - A pull request from a fork keeps its head's commits in the base (`refs/pull/<n>/head`);
//!   a push to the fork's branch synchronises it.
//! - With Actions on, each pull request event starts a workflow run of its head. A run of a
//!   pull request from a fork waits with `need_approval` unless its poster or the pusher may
//!   write to the repository (or was trusted with "Approve always"); it never gets the
//!   repository's secrets. Its job's commit status is `pending`, "Blocked by required
//!   conditions", until a maintainer approves it on the pull request's page.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::{FRepo, FakeForge, Refusal, State, git, rfc3339};
use director::domain::RepoName;
use director::forge::Permission;

/// The context of the fake's one workflow job, as Forgejo names a job's status.
pub const WORKFLOW_CONTEXT: &str = "CI / test (pull_request)";

/// One workflow run (`ActionRun`).
#[derive(Clone, Debug)]
pub(crate) struct FActionRun {
    pub id: u64,
    pub index: u64,
    pub pull: u64,
    pub head_sha: String,
    /// `pull_request`, `pull_request_sync`.
    pub event: String,
    pub trigger_user: String,
    pub need_approval: bool,
    pub approved_by: Option<String>,
    /// `blocked`, `waiting`, `running`, `success`, `failure`.
    pub status: String,
    pub is_fork: bool,
    /// Whether its jobs get the repository's secrets.
    pub secrets: bool,
    pub created: i64,
}

impl State {
    /// The fork of `base` that `owner` holds, if any.
    pub(crate) fn fork_owned_by(&self, base: &RepoName, owner: &str) -> Option<RepoName> {
        self.repos
            .values()
            .find(|r| {
                r.fork_of.as_ref() == Some(base) && r.name.owner().eq_ignore_ascii_case(owner)
            })
            .map(|r| r.name.clone())
    }

    /// `POST /repos/{base}/forks` as `login`, into `org` or `login`'s own account.
    pub(crate) fn create_fork(
        &mut self,
        login: &str,
        base: &RepoName,
        org: Option<&str>,
    ) -> Result<RepoName, Refusal> {
        if self.permission_of(base, login) < Permission::Read {
            return Err(Refusal::NotFound);
        }
        let owner = match org {
            Some(org) if !self.orgs.contains_key(org) => {
                return Err(Refusal::Unprocessable(format!(
                    "organization does not exist [name: {org}]"
                )));
            }
            Some(org) => org.to_owned(),
            None => login.to_owned(),
        };
        if let Some(fork) = self.fork_owned_by(base, &owner) {
            return Err(Refusal::Conflict(format!(
                "repository is already forked by user [uname: {owner}, repo path: {base}, fork path: {fork}]"
            )));
        }
        let name = RepoName::new(&owner, base.name()).map_err(|_| Refusal::NotFound)?;
        if self.repos.contains_key(&name) {
            return Err(Refusal::Conflict(format!(
                "repository already exists [uname: {owner}, name: {}]",
                base.name()
            )));
        }
        let b = self.repo(base)?.clone();
        let id = self.id();
        let git = match &b.git {
            Some(g) => Some(fork_git(g, &name).map_err(|e| Refusal::Internal(e.to_string()))?),
            None => None,
        };
        let mut permissions = std::collections::HashMap::new();
        if org.is_some() {
            permissions.insert(login.to_owned(), Permission::Admin);
        }
        self.repos.insert(
            name.clone(),
            FRepo {
                id,
                name: name.clone(),
                default_branch: b.default_branch.clone(),
                branches: b.branches.clone(),
                protect_default: false,
                merge_default: false,
                pulls: Vec::new(),
                labels: Vec::new(),
                issues: BTreeMap::new(),
                permissions,
                next_number: 1,
                git,
                trees: b.trees.clone(),
                private: b.private,
                hooks: Vec::new(),
                statuses: Default::default(),
                merges: Vec::new(),
                fork_of: Some(base.clone()),
                pull_heads: BTreeMap::new(),
                actions: false,
                action_runs: Vec::new(),
                trusted_posters: Default::default(),
                messages: Default::default(),
                parents: b.parents.clone(),
            },
        );
        if let Some(list) = self.orgs.get_mut(&owner) {
            list.push(name.clone());
        }
        Ok(name)
    }

    /// `GET .../sync_fork/{branch}`: (allowed, fork commit, base commit, commits behind).
    pub(crate) fn sync_fork_info(
        &self,
        fork: &RepoName,
        branch: &str,
    ) -> Result<(bool, String, String, usize), Refusal> {
        let f = self.repo(fork)?;
        let base = f
            .fork_of
            .as_ref()
            .ok_or_else(|| Refusal::BadRequest("The Repo must be a fork".into()))?;
        let b = self.repo(base)?;
        let mine = f.branches.get(branch).ok_or(Refusal::NotFound)?;
        let fork_commit = mine.last().map(|c| f.commit_name(*c)).unwrap_or_default();
        let Some(theirs) = b.branches.get(branch) else {
            return Ok((false, fork_commit, String::new(), 0));
        };
        let base_commit = b.head_name(branch);
        let tip = mine.last().copied();
        let in_base = tip.is_some_and(|t| theirs.contains(&t));
        if fork_commit == base_commit || !in_base {
            return Ok((false, fork_commit, base_commit, 0));
        }
        let behind = theirs.iter().filter(|c| !mine.contains(c)).count();
        Ok((true, fork_commit, base_commit, behind))
    }

    /// `POST .../sync_fork/{branch}`, as `login` (a writer of the fork).
    pub(crate) fn sync_fork(
        &mut self,
        login: &str,
        fork: &RepoName,
        branch: &str,
    ) -> Result<(), Refusal> {
        if self.permission_of(fork, login) < Permission::Write {
            return Err(Refusal::Forbidden);
        }
        let (allowed, ..) = self.sync_fork_info(fork, branch)?;
        if !allowed {
            return Err(Refusal::BadRequest("You can't sync this branch".into()));
        }
        let base = self.repo(fork)?.fork_of.clone().ok_or(Refusal::NotFound)?;
        let b = self.repo(&base)?.clone();
        if let (Some(bg), Some(fg)) = (&b.git, self.repo(fork)?.git.clone()) {
            let spec = format!("refs/heads/{branch}:refs/heads/{branch}");
            git::git(
                &bg.dir,
                &["push", "--quiet", &fg.dir.to_string_lossy(), &spec],
                &[],
                None,
            )
            .map_err(|e| Refusal::Internal(e.to_string()))?;
            git::sync(self, fork).map_err(|e| Refusal::Internal(e.to_string()))?;
        } else {
            let commits = b.branches.get(branch).cloned().unwrap_or_default();
            let f = self.repo_mut(fork)?;
            f.branches.insert(branch.to_owned(), commits);
            for (id, tree) in &b.trees {
                f.trees.entry(*id).or_insert_with(|| tree.clone());
            }
        }
        Ok(())
    }

    /// Copies the head of pull request `number` from its fork's branch into the repository
    /// (`refs/pull/<n>/head`), with the names of its commits.
    pub(crate) fn mirror_pull_head(
        &mut self,
        repo: &RepoName,
        number: u64,
        fork: &RepoName,
        branch: &str,
    ) {
        let Ok(f) = self.repo(fork) else { return };
        let commits = f.branches.get(branch).cloned().unwrap_or_default();
        let names: Vec<(String, u64)> = f
            .git
            .as_ref()
            .map(|g| {
                g.ids
                    .iter()
                    .filter(|(_, id)| commits.contains(id))
                    .map(|(sha, id)| (sha.clone(), *id))
                    .collect()
            })
            .unwrap_or_default();
        let trees: Vec<_> = commits
            .iter()
            .filter_map(|c| f.trees.get(c).map(|t| (*c, t.clone())))
            .collect();
        let Ok(r) = self.repo_mut(repo) else { return };
        r.pull_heads.insert(number, commits);
        if let Some(g) = r.git.as_mut() {
            g.ids.extend(names);
        }
        for (id, tree) in trees {
            r.trees.entry(id).or_insert(tree);
        }
    }

    /// New commits on `branch` of `fork`: each open pull request from it is synchronised,
    /// its workflow run started with `login` as the pusher.
    pub(crate) fn fork_pushed(&mut self, login: &str, fork: &RepoName, branch: &str) {
        let pulls: Vec<(RepoName, u64)> = self
            .repos
            .values()
            .flat_map(|r| {
                r.pulls
                    .iter()
                    .filter(|p| {
                        p.state == "open" && p.head == branch && p.head_repo.as_ref() == Some(fork)
                    })
                    .map(|p| (r.name.clone(), p.number))
            })
            .collect();
        for (repo, number) in pulls {
            self.mirror_pull_head(&repo, number, fork, branch);
            self.workflow_run(&repo, number, "pull_request_sync", login);
            self.emit_pull(
                "pull_request_sync",
                "synchronized",
                login,
                &repo,
                number,
                None,
            );
        }
    }

    /// Whether `login` is trusted with the workflows of `repo`'s pull requests from forks:
    /// a writer of the Actions unit (`userCanWriteActionsOnRepo`: a team may give it to a
    /// reader of the code), or a poster trusted with "Approve always".
    fn trusted(&self, repo: &RepoName, login: &str) -> bool {
        self.unit_mode(repo, login, "repo.actions") >= Permission::Write
            || self
                .repo(repo)
                .is_ok_and(|r| r.trusted_posters.contains(login))
    }

    /// A pull request event (`pull_request` when opened, `pull_request_sync` on a push by
    /// `doer`) starts a workflow run of its head, when the repository has Actions.
    pub(crate) fn workflow_run(&mut self, repo: &RepoName, number: u64, event: &str, doer: &str) {
        let Ok(r) = self.repo(repo) else { return };
        if !r.actions {
            return;
        }
        let Some(p) = r.pulls.iter().find(|p| p.number == number).cloned() else {
            return;
        };
        let head_sha = r.pull_head_name(&p);
        let poster = r
            .issues
            .get(&number)
            .map(|i| i.author.clone())
            .unwrap_or_default();
        let is_fork = p.head_repo.is_some();
        let need_approval = is_fork && !self.trusted(repo, &poster) && !self.trusted(repo, doer);
        let (id, now) = (self.id(), self.tick());
        let Ok(r) = self.repo_mut(repo) else { return };
        let index = r.action_runs.len() as u64 + 1;
        r.action_runs.push(FActionRun {
            id,
            index,
            pull: number,
            head_sha: head_sha.clone(),
            event: event.to_owned(),
            trigger_user: doer.to_owned(),
            need_approval,
            approved_by: None,
            status: if need_approval { "blocked" } else { "waiting" }.to_owned(),
            is_fork,
            secrets: !is_fork,
            created: now,
        });
        let description = if need_approval {
            "Blocked by required conditions"
        } else {
            "Waiting to run"
        };
        self.job_status(repo, &head_sha, "pending", description);
    }

    /// The workflow job's commit status on `sha`, as Forgejo Actions posts it.
    fn job_status(&mut self, repo: &RepoName, sha: &str, state: &str, description: &str) {
        let Some(commit) = self.repo(repo).ok().and_then(|r| r.commit_named(sha)) else {
            return;
        };
        let now = self.tick();
        let Ok(r) = self.repo_mut(repo) else { return };
        let list = r.statuses.entry(commit).or_default();
        list.push(super::checks::FStatus {
            index: list.len() as u64 + 1,
            context: WORKFLOW_CONTEXT.to_owned(),
            state: state.to_owned(),
            description: description.to_owned(),
            target_url: format!("/{repo}/actions/runs/{}", list.len() + 1),
            creator: "forgejo-actions".to_owned(),
            created: now,
        });
    }

    /// `DELETE .../branches/{branch}` as `login`: a writer's, never the default branch.
    pub(crate) fn delete_branch(
        &mut self,
        login: &str,
        repo: &RepoName,
        branch: &str,
    ) -> Result<(), Refusal> {
        if self.permission_of(repo, login) < Permission::Write {
            return Err(Refusal::Forbidden);
        }
        let r = self.repo(repo)?;
        if branch == r.default_branch {
            return Err(Refusal::Forbidden);
        }
        if !r.branches.contains_key(branch) {
            return Err(Refusal::NotFound);
        }
        if let Some(g) = r.git.clone() {
            git::git(
                &g.dir,
                &["update-ref", "-d", &format!("refs/heads/{branch}")],
                &[],
                None,
            )
            .map_err(|e| Refusal::Internal(e.to_string()))?;
        }
        self.repo_mut(repo)?.branches.remove(branch);
        Ok(())
    }

    /// `GET .../actions/runs` (`head_sha` filters), newest first.
    pub(crate) fn action_runs_json(
        &self,
        repo: &RepoName,
        head_sha: &str,
    ) -> Result<Value, Refusal> {
        let r = self.repo(repo)?;
        let runs: Vec<Value> = r
            .action_runs
            .iter()
            .rev()
            .filter(|a| head_sha.is_empty() || a.head_sha == head_sha)
            .map(|a| {
                json!({
                    "id": a.id,
                    "index_in_repo": a.index,
                    "title": format!("CI for #{}", a.pull),
                    "workflow_id": "ci.yml",
                    "commit_sha": a.head_sha,
                    "prettyref": format!("#{}", a.pull),
                    "event": a.event,
                    "trigger_event": "pull_request",
                    "status": a.status,
                    "need_approval": a.need_approval,
                    "is_fork_pull_request": a.is_fork,
                    "html_url": format!("https://forgejo.example.org/{repo}/actions/runs/{}", a.index),
                    "trigger_user": super::server::user_json(self, &a.trigger_user),
                    "created": rfc3339(a.created),
                })
            })
            .collect();
        Ok(json!({ "total_count": runs.len(), "workflow_runs": runs }))
    }
}

/// A copy of a repository's bare git directory for its fork, with the same commit names.
fn fork_git(g: &git::FGit, fork: &RepoName) -> std::io::Result<git::FGit> {
    let owner_dir = g.root.join(fork.owner());
    std::fs::create_dir_all(&owner_dir)?;
    let dir = owner_dir.join(format!("{}.git", fork.name()));
    git::git(
        &owner_dir,
        &[
            "clone",
            "--quiet",
            "--bare",
            &g.dir.to_string_lossy(),
            &dir.to_string_lossy(),
        ],
        &[],
        None,
    )?;
    git::git(&dir, &["config", "http.receivepack", "true"], &[], None)?;
    git::git(&dir, &["remote", "remove", "origin"], &[], None)?;
    Ok(git::FGit {
        root: g.root.clone(),
        dir,
        ids: g.ids.clone(),
    })
}

impl FakeForge {
    /// Turns Forgejo Actions on for `repo`: every pull request event starts a workflow run.
    pub fn enable_actions(&self, repo: &RepoName) {
        if let Some(r) = self.state().repos.get_mut(repo) {
            r.actions = true;
        }
    }

    /// The fork of `base` that `owner` holds.
    pub fn fork_of(&self, base: &RepoName, owner: &str) -> Option<RepoName> {
        self.state().fork_owned_by(base, owner)
    }

    /// `login` forks `base` through the API (as an attempt that died after it would have).
    pub fn fork_as(&self, login: &str, base: &RepoName) -> RepoName {
        self.state()
            .create_fork(login, base, None)
            .unwrap_or_else(|e| panic!("forking {base}: {e:?}"))
    }

    /// `login` forks `base` into organisation `org` through the API.
    pub fn fork_into(&self, login: &str, base: &RepoName, org: &str) -> RepoName {
        self.state()
            .create_fork(login, base, Some(org))
            .unwrap_or_else(|e| panic!("forking {base}: {e:?}"))
    }

    /// `n` forks of `base` by others (`<prefix><i>/<name>`), without git: a repository
    /// many have forked.
    pub fn add_forks(&self, base: &RepoName, n: usize, prefix: &str) {
        let mut s = self.state();
        let Ok(b) = s.repo(base).cloned() else { return };
        for i in 0..n {
            let Ok(name) = RepoName::new(&format!("{prefix}{i:05}"), base.name()) else {
                continue;
            };
            let id = s.id();
            let mut r = b.clone();
            r.id = id;
            r.name = name.clone();
            r.git = None;
            r.fork_of = Some(base.clone());
            r.pulls.clear();
            r.issues.clear();
            r.hooks.clear();
            r.permissions.clear();
            r.actions = false;
            s.repos.insert(name, r);
        }
    }

    /// Every fork of `base`.
    pub fn forks(&self, base: &RepoName) -> Vec<RepoName> {
        let s = self.state();
        s.repos
            .values()
            .filter(|r| r.fork_of.as_ref() == Some(base))
            .map(|r| r.name.clone())
            .collect()
    }

    /// Where the head of pull request `number` lives, when in a fork.
    pub fn pull_head_repo(&self, repo: &RepoName, number: u64) -> Option<RepoName> {
        let s = self.state();
        s.repo(repo)
            .ok()?
            .pulls
            .iter()
            .find(|p| p.number == number)?
            .head_repo
            .clone()
    }

    /// The workflow runs of pull request `number`: (need approval, status, gets secrets),
    /// oldest first.
    pub fn workflow_runs(&self, repo: &RepoName, number: u64) -> Vec<(bool, String, bool)> {
        let s = self.state();
        s.repo(repo)
            .map(|r| {
                r.action_runs
                    .iter()
                    .filter(|a| a.pull == number)
                    .map(|a| (a.need_approval, a.status.clone(), a.secrets))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// A maintainer presses "Approve once" on pull request `number`'s page (Forgejo's
    /// `pullRequestApprove`): its runs waiting for approval go ahead.
    pub fn approve_workflows(&self, by: &str, repo: &RepoName, number: u64) {
        let mut s = self.state();
        assert!(
            s.permission_of(repo, by) >= Permission::Write,
            "{by} may not approve workflows on {repo}"
        );
        let heads: Vec<String> = {
            let Ok(r) = s.repo_mut(repo) else { return };
            let mut heads = Vec::new();
            for a in r
                .action_runs
                .iter_mut()
                .filter(|a| a.pull == number && a.need_approval)
            {
                a.need_approval = false;
                a.approved_by = Some(by.to_owned());
                a.status = "waiting".into();
                heads.push(a.head_sha.clone());
            }
            heads
        };
        for head in heads {
            s.job_status(repo, &head, "pending", "Waiting to run");
        }
    }

    /// The newest workflow run of pull request `number` ends, with its job's status posted
    /// and Forgejo's `action_run_*` webhook sent. A run still held cannot end.
    pub async fn finish_workflow(&self, repo: &RepoName, number: u64, success: bool) {
        {
            let mut s = self.state();
            let Ok(r) = s.repo_mut(repo) else { return };
            let Some(a) = r.action_runs.iter_mut().rev().find(|a| a.pull == number) else {
                panic!("no workflow run of #{number}");
            };
            assert!(!a.need_approval, "a held workflow run cannot end");
            a.status = if success { "success" } else { "failure" }.into();
            let head = a.head_sha.clone();
            let (state, description) = if success {
                ("success", "Successful in 1m")
            } else {
                ("failure", "Failing after 1m")
            };
            s.job_status(repo, &head, state, description);
        }
        self.send_action_run(repo, number, success).await;
    }
}
