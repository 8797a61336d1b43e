//! The [`Forge`] implementation: one method per endpoint the director uses, each request as
//! Forgejo's API description has it.

use async_trait::async_trait;
use reqwest::Method;
use serde_json::json;

use super::wire::*;
use super::{ForgejoClient, absolute, basic, repo_path, run_endpoints, seg, sensitive};
use crate::domain::{CommitSha, IssueRef, RepoName};
use crate::forge::{
    Branch, Check, CheckState, Checks, Comment, CommitSummary, FileAt, Forge, ForgeError, ForkSync,
    Hook, HookSpec, Issue, IssueChanges, Label, MergeAnswer, MergeStyle, MintedToken, Permission,
    PullRequest, Repository, Review, ReviewComment, RunEndpoints, RunnerAccount, TimelineEntry,
};
use crate::settings::Secret;

#[async_trait]
impl Forge for ForgejoClient {
    async fn current_user(&self) -> Result<String, ForgeError> {
        let user: WireUser = self.json(Method::GET, "/user", "/user", &[], None).await?;
        Ok(user.login)
    }

    async fn repository(&self, repo: &RepoName) -> Result<Repository, ForgeError> {
        let path = repo_path(repo);
        let wire: WireRepo = self
            .json(Method::GET, "/repos/{owner}/{repo}", &path, &[], None)
            .await?;
        Ok(Repository {
            name: repo.clone(),
            default_branch: wire.default_branch,
            private: wire.private.unwrap_or(true),
        })
    }

    /// Asked as an anonymous visitor: the forge applies every rule (the repository's and its
    /// owner's visibility, `REQUIRE_SIGNIN_VIEW`) itself.
    async fn anonymous_can_see(&self, repo: &RepoName) -> Result<bool, ForgeError> {
        let path = repo_path(repo);
        let endpoint = "/repos/{owner}/{repo}";
        let resp = self
            .anonymous
            .get(format!("{}{path}", self.api))
            .send()
            .await
            .map_err(|e| ForgeError::Transport {
                method: "GET".into(),
                path: path.clone(),
                reason: e.to_string(),
            })?;
        let status = resp.status();
        self.count(endpoint, status.as_str());
        match status.as_u16() {
            200 => Ok(true),
            401 | 403 | 404 => Ok(false),
            code => Err(ForgeError::Status {
                method: "GET".into(),
                path,
                status: code,
                message: "asked as an anonymous visitor".into(),
            }),
        }
    }

    async fn open_issues_with_label(
        &self,
        repo: &RepoName,
        label: &str,
    ) -> Result<Vec<Issue>, ForgeError> {
        let path = format!("{}/issues", repo_path(repo));
        let query = [
            ("state", "open".to_owned()),
            ("type", "issues".to_owned()),
            ("labels", label.to_owned()),
        ];
        let wire: Vec<WireIssue> = self
            .all_pages("/repos/{owner}/{repo}/issues", &path, &query, true)
            .await?;
        Ok(wire.into_iter().map(Issue::from).collect())
    }

    async fn issues_created_by(
        &self,
        repo: &RepoName,
        login: &str,
    ) -> Result<Vec<Issue>, ForgeError> {
        let path = format!("{}/issues", repo_path(repo));
        let query = [
            ("state", "all".to_owned()),
            ("type", "issues".to_owned()),
            ("created_by", login.to_owned()),
        ];
        let wire: Vec<WireIssue> = self
            .all_pages("/repos/{owner}/{repo}/issues", &path, &query, true)
            .await?;
        Ok(wire.into_iter().map(Issue::from).collect())
    }

    async fn issue(&self, issue: &IssueRef) -> Result<Issue, ForgeError> {
        let path = format!("{}/issues/{}", repo_path(&issue.repo), issue.number);
        let wire: WireIssue = self
            .json(
                Method::GET,
                "/repos/{owner}/{repo}/issues/{index}",
                &path,
                &[],
                None,
            )
            .await?;
        Ok(wire.into())
    }

    async fn comments(&self, issue: &IssueRef) -> Result<Vec<Comment>, ForgeError> {
        // Not paginated by Forgejo: one call returns every comment.
        let path = format!(
            "{}/issues/{}/comments",
            repo_path(&issue.repo),
            issue.number
        );
        let wire: Vec<WireComment> = self
            .json(
                Method::GET,
                "/repos/{owner}/{repo}/issues/{index}/comments",
                &path,
                &[],
                None,
            )
            .await?;
        Ok(wire.into_iter().map(Comment::from).collect())
    }

    async fn timeline(&self, issue: &IssueRef) -> Result<Vec<TimelineEntry>, ForgeError> {
        let path = format!(
            "{}/issues/{}/timeline",
            repo_path(&issue.repo),
            issue.number
        );
        let wire: Vec<WireTimeline> = self
            .all_pages(
                "/repos/{owner}/{repo}/issues/{index}/timeline",
                &path,
                &[],
                false,
            )
            .await?;
        Ok(wire
            .into_iter()
            .map(|w| TimelineEntry {
                added: w.kind == "label" && w.body == "1",
                kind: w.kind,
                actor: w.user.map(|u| u.login).unwrap_or_default(),
                label: w.label.map(|l| l.name),
                created_at: w.created_at,
            })
            .collect())
    }

    async fn permission(&self, repo: &RepoName, user: &str) -> Result<Permission, ForgeError> {
        let path = format!("{}/collaborators/{}/permission", repo_path(repo), seg(user));
        match self
            .json::<WirePermission>(
                Method::GET,
                "/repos/{owner}/{repo}/collaborators/{collaborator}/permission",
                &path,
                &[],
                None,
            )
            .await
        {
            Ok(p) => Ok(Permission::parse(&p.permission)),
            Err(e) if e.is_not_found() => Ok(Permission::None),
            Err(e) => Err(e),
        }
    }

    async fn ensure_label(
        &self,
        repo: &RepoName,
        name: &str,
        color: &str,
        description: &str,
    ) -> Result<Label, ForgeError> {
        let path = format!("{}/labels", repo_path(repo));
        let labels: Vec<WireLabel> = self
            .all_pages("/repos/{owner}/{repo}/labels", &path, &[], true)
            .await?;
        if let Some(l) = labels.into_iter().find(|l| l.name == name) {
            return Ok(Label {
                id: l.id,
                name: l.name,
            });
        }
        let body = json!({ "name": name, "color": color, "description": description });
        let created: WireLabel = self
            .json(
                Method::POST,
                "/repos/{owner}/{repo}/labels",
                &path,
                &[],
                Some(&body),
            )
            .await?;
        Ok(Label {
            id: created.id,
            name: created.name,
        })
    }

    async fn add_label(&self, issue: &IssueRef, label_id: u64) -> Result<(), ForgeError> {
        let path = format!("{}/issues/{}/labels", repo_path(&issue.repo), issue.number);
        let body = json!({ "labels": [label_id] });
        self.send(
            Method::POST,
            "/repos/{owner}/{repo}/issues/{index}/labels",
            &path,
            &[],
            Some(&body),
        )
        .await?;
        Ok(())
    }

    async fn remove_label(&self, issue: &IssueRef, label_id: u64) -> Result<(), ForgeError> {
        let path = format!(
            "{}/issues/{}/labels/{label_id}",
            repo_path(&issue.repo),
            issue.number
        );
        // Already gone: removing is idempotent.
        self.delete_idempotent(
            None,
            "/repos/{owner}/{repo}/issues/{index}/labels/{identifier}",
            &path,
        )
        .await
    }

    async fn create_comment(&self, issue: &IssueRef, body: &str) -> Result<Comment, ForgeError> {
        let path = format!(
            "{}/issues/{}/comments",
            repo_path(&issue.repo),
            issue.number
        );
        let wire: WireComment = self
            .json(
                Method::POST,
                "/repos/{owner}/{repo}/issues/{index}/comments",
                &path,
                &[],
                Some(&json!({ "body": body })),
            )
            .await?;
        Ok(wire.into())
    }

    async fn edit_comment(
        &self,
        repo: &RepoName,
        comment_id: u64,
        body: &str,
    ) -> Result<Comment, ForgeError> {
        let path = format!("{}/issues/comments/{comment_id}", repo_path(repo));
        let wire: WireComment = self
            .json(
                Method::PATCH,
                "/repos/{owner}/{repo}/issues/comments/{id}",
                &path,
                &[],
                Some(&json!({ "body": body })),
            )
            .await?;
        Ok(wire.into())
    }

    async fn create_issue(
        &self,
        repo: &RepoName,
        title: &str,
        body: &str,
    ) -> Result<u64, ForgeError> {
        let path = format!("{}/issues", repo_path(repo));
        let wire: WireIssue = self
            .json(
                Method::POST,
                "/repos/{owner}/{repo}/issues",
                &path,
                &[],
                Some(&json!({ "title": title, "body": body })),
            )
            .await?;
        Ok(wire.number)
    }

    async fn branch(&self, repo: &RepoName, name: &str) -> Result<Option<Branch>, ForgeError> {
        self.branch_with(None, repo, name).await
    }

    async fn file_at(
        &self,
        repo: &RepoName,
        file: &str,
        at: &str,
        max_bytes: u64,
    ) -> Result<FileAt, ForgeError> {
        let encoded: Vec<String> = file.split('/').map(seg).collect();
        let path = format!("{}/contents/{}", repo_path(repo), encoded.join("/"));
        let wire = match self
            .json::<crate::forge::WireContents>(
                Method::GET,
                "/repos/{owner}/{repo}/contents/{filepath}",
                &path,
                &[("ref", at.to_owned())],
                None,
            )
            .await
        {
            Ok(w) => Some(w),
            Err(e) if e.is_not_found() => None,
            Err(e) => return Err(e),
        };
        Ok(FileAt::from_wire(wire, file, max_bytes))
    }

    async fn branch_as(
        &self,
        token: &Secret,
        repo: &RepoName,
        name: &str,
    ) -> Result<Option<Branch>, ForgeError> {
        let auth = sensitive(format!("token {}", token.expose()))?;
        self.branch_with(Some(&auth), repo, name).await
    }

    async fn commits_ahead(
        &self,
        repo: &RepoName,
        base: &str,
        head: &str,
    ) -> Result<u64, ForgeError> {
        self.compare_with(None, repo, base, head).await
    }

    async fn find_pull(
        &self,
        repo: &RepoName,
        base: &str,
        head: &str,
    ) -> Result<Option<u64>, ForgeError> {
        // A head in a fork is `owner:branch`: the owner as it is, the branch escaped.
        let head = match head.split_once(':') {
            Some((owner, branch)) => format!("{}:{}", seg(owner), seg(branch)),
            None => seg(head),
        };
        let path = format!("{}/pulls/{}/{head}", repo_path(repo), seg(base));
        match self
            .json::<WirePull>(
                Method::GET,
                "/repos/{owner}/{repo}/pulls/{base}/{head}",
                &path,
                &[],
                None,
            )
            .await
        {
            Ok(p) if p.state == "open" => Ok(Some(p.number)),
            Ok(_) => Ok(None),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn pull(&self, repo: &RepoName, number: u64) -> Result<PullRequest, ForgeError> {
        let path = format!("{}/pulls/{number}", repo_path(repo));
        let w: WirePull = self
            .json(
                Method::GET,
                "/repos/{owner}/{repo}/pulls/{index}",
                &path,
                &[],
                None,
            )
            .await?;
        let (head, base) = (w.head.unwrap_or_default(), w.base.unwrap_or_default());
        Ok(PullRequest {
            number: w.number,
            state: w.state,
            merged: w.merged,
            updated_at: w.updated_at,
            head_sha: CommitSha::read(&head.sha),
            head_ref: head.name,
            base_ref: base.name,
            merge_base: w.merge_base.unwrap_or_default(),
            mergeable: w.mergeable,
            behind: None,
            head_repo: head.repo.and_then(|r| r.full_name.parse().ok()),
            merge_commit: w.merge_commit_sha.filter(|s| !s.is_empty()),
        })
    }

    /// The combined status, page by page (each page combines only its own contexts, so the
    /// state is worked out here), up to [`crate::forge::MAX_CHECKS`] contexts.
    async fn edit_pull_title(
        &self,
        repo: &RepoName,
        number: u64,
        title: &str,
    ) -> Result<(), ForgeError> {
        // `EditPullRequestOption`: only the title is sent, so nothing else changes.
        let path = format!("{}/pulls/{number}", repo_path(repo));
        self.send(
            Method::PATCH,
            "/repos/{owner}/{repo}/pulls/{index}",
            &path,
            &[],
            Some(&json!({ "title": title })),
        )
        .await?;
        Ok(())
    }

    async fn post_status(
        &self,
        repo: &RepoName,
        sha: &CommitSha,
        status: &crate::forge::NewStatus,
    ) -> Result<(), ForgeError> {
        // 201 with the `CommitStatus` (its state under `status`); 404 when the commit is not
        // in this repository (a fork's head before its pull request exists).
        let path = format!("{}/statuses/{sha}", repo_path(repo));
        self.send(
            Method::POST,
            "/repos/{owner}/{repo}/statuses/{sha}",
            &path,
            &[],
            Some(&status.body()),
        )
        .await?;
        Ok(())
    }

    async fn checks(&self, repo: &RepoName, sha: &CommitSha) -> Result<Checks, ForgeError> {
        const LIMIT: usize = 50;
        let path = format!("{}/commits/{sha}/status", repo_path(repo));
        let web = self.api.trim_end_matches("/api/v1").to_owned();
        let mut checks = Checks::default();
        for page in 1..=crate::forge::MAX_CHECKS.div_ceil(LIMIT) {
            let query = [("page", page.to_string()), ("limit", LIMIT.to_string())];
            let w: WireCombined = self
                .json(
                    Method::GET,
                    "/repos/{owner}/{repo}/commits/{ref}/status",
                    &path,
                    &query,
                    None,
                )
                .await?;
            let statuses = w.statuses.unwrap_or_default();
            let count = statuses.len();
            checks.checks.extend(statuses.into_iter().map(|s| Check {
                state: CheckState::from_forge(&s.status),
                context: s.context,
                description: s.description.unwrap_or_default(),
                target_url: absolute(&web, s.target_url.as_deref().unwrap_or_default()),
            }));
            let read = checks.checks.len();
            if count < LIMIT || read >= w.total_count {
                break;
            }
            if page == crate::forge::MAX_CHECKS.div_ceil(LIMIT) {
                checks.truncated = true;
            }
        }
        checks.held = self.held_runs(repo, sha).await?;
        Ok(checks)
    }

    async fn merge_pull(
        &self,
        repo: &RepoName,
        number: u64,
        style: MergeStyle,
        head_sha: &CommitSha,
        delete_branch: bool,
    ) -> Result<MergeAnswer, ForgeError> {
        let path = format!("{}/pulls/{number}/merge", repo_path(repo));
        let body = serde_json::json!({
            "Do": style.as_str(),
            "head_commit_id": head_sha.as_str(),
            "delete_branch_after_merge": delete_branch,
        });
        let sent = self
            .send(
                Method::POST,
                "/repos/{owner}/{repo}/pulls/{index}/merge",
                &path,
                &[],
                Some(&body),
            )
            .await;
        crate::forge::refused_or_done(sent, &[405, 409, 413, 423])
    }

    async fn update_pull(&self, repo: &RepoName, number: u64) -> Result<MergeAnswer, ForgeError> {
        self.update_branch_of(None, repo, number).await
    }

    async fn reviews(&self, repo: &RepoName, number: u64) -> Result<Vec<Review>, ForgeError> {
        let path = format!("{}/pulls/{number}/reviews", repo_path(repo));
        let wire: Vec<WireReview> = self
            .all_pages(
                "/repos/{owner}/{repo}/pulls/{index}/reviews",
                &path,
                &[],
                false,
            )
            .await?;
        Ok(wire
            .into_iter()
            .map(|r| Review {
                id: r.id,
                user: r.user.map(|u| u.login).unwrap_or_default(),
                state: r.state,
                body: r.body,
                submitted_at: r.submitted_at,
                commit_id: CommitSha::read(&r.commit_id),
                dismissed: r.dismissed,
            })
            .collect())
    }

    async fn review_comments(
        &self,
        repo: &RepoName,
        number: u64,
        review: u64,
    ) -> Result<Vec<ReviewComment>, ForgeError> {
        // Not paginated by Forgejo.
        let path = format!(
            "{}/pulls/{number}/reviews/{review}/comments",
            repo_path(repo)
        );
        let wire: Vec<WireReviewComment> = self
            .json(
                Method::GET,
                "/repos/{owner}/{repo}/pulls/{index}/reviews/{id}/comments",
                &path,
                &[],
                None,
            )
            .await?;
        Ok(wire
            .into_iter()
            .map(|c| ReviewComment {
                path: c.path,
                body: c.body,
                line: c.position.filter(|p| *p > 0),
                old_line: c.original_position.filter(|p| *p > 0),
            })
            .collect())
    }

    async fn create_pull(
        &self,
        repo: &RepoName,
        head: &str,
        base: &str,
        title: &str,
        body: &str,
    ) -> Result<u64, ForgeError> {
        self.open_pull(None, repo, head, base, title, body).await
    }

    async fn mint_run_token(
        &self,
        runner: &RunnerAccount,
        repo: &RepoName,
        name: &str,
    ) -> Result<MintedToken, ForgeError> {
        ForgejoClient::mint_run_token(self, runner, repo, name).await
    }

    async fn runner_tokens(
        &self,
        runner: &RunnerAccount,
    ) -> Result<Vec<(u64, String)>, ForgeError> {
        ForgejoClient::runner_tokens(self, runner).await
    }

    async fn delete_run_token(&self, runner: &RunnerAccount, name: &str) -> Result<(), ForgeError> {
        ForgejoClient::delete_run_token(self, runner, name).await
    }

    async fn org_repos(&self, org: &str) -> Result<Vec<RepoName>, ForgeError> {
        let path = format!("/orgs/{}/repos", seg(org));
        let wire: Vec<WireRepo> = self
            .all_pages("/orgs/{org}/repos", &path, &[], true)
            .await?;
        Ok(wire
            .into_iter()
            .filter_map(|r| {
                r.full_name.parse().ok().or_else(|| {
                    let owner = r.owner.map(|o| o.login).unwrap_or_else(|| org.to_owned());
                    RepoName::new(&owner, &r.name).ok()
                })
            })
            .collect())
    }

    async fn issues_updated_since(
        &self,
        since: chrono::DateTime<chrono::Utc>,
    ) -> Result<IssueChanges, ForgeError> {
        let query = [
            ("type", "issues".to_owned()),
            ("state", "all".to_owned()),
            (
                "since",
                since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            ),
        ];
        let (wire, server_time): (Vec<WireIssue>, _) = self
            .all_pages_dated("/repos/issues/search", "/repos/issues/search", &query, true)
            .await?;
        let issues = wire
            .into_iter()
            .filter_map(|w| {
                let repo = w.repository.as_ref()?.repo()?;
                Some((repo, Issue::from(w)))
            })
            .collect();
        Ok(IssueChanges {
            issues,
            server_time,
        })
    }

    async fn server_time(&self) -> Result<Option<chrono::DateTime<chrono::Utc>>, ForgeError> {
        Ok(*self.last_date.lock().unwrap_or_else(|e| e.into_inner()))
    }

    async fn hooks(&self, repo: &RepoName) -> Result<Vec<Hook>, ForgeError> {
        let path = format!("{}/hooks", repo_path(repo));
        let wire: Vec<WireHook> = self
            .all_pages("/repos/{owner}/{repo}/hooks", &path, &[], true)
            .await?;
        Ok(wire.into_iter().map(Hook::from).collect())
    }

    async fn create_hook(&self, repo: &RepoName, spec: &HookSpec) -> Result<Hook, ForgeError> {
        let path = format!("{}/hooks", repo_path(repo));
        let wire: WireHook = self
            .json(
                Method::POST,
                "/repos/{owner}/{repo}/hooks",
                &path,
                &[],
                Some(&spec.create_body()),
            )
            .await?;
        Ok(wire.into())
    }

    async fn edit_hook(
        &self,
        repo: &RepoName,
        id: u64,
        spec: &HookSpec,
        events: &[String],
    ) -> Result<Hook, ForgeError> {
        let path = format!("{}/hooks/{id}", repo_path(repo));
        let wire: WireHook = self
            .json(
                Method::PATCH,
                "/repos/{owner}/{repo}/hooks/{id}",
                &path,
                &[],
                Some(&spec.edit_body(events)),
            )
            .await?;
        Ok(wire.into())
    }

    async fn delete_hook(&self, repo: &RepoName, id: u64) -> Result<(), ForgeError> {
        let path = format!("{}/hooks/{id}", repo_path(repo));
        self.delete_idempotent(None, "/repos/{owner}/{repo}/hooks/{id}", &path)
            .await
    }

    async fn recent_commits(
        &self,
        repo: &RepoName,
        branch: &str,
        not: Option<&str>,
    ) -> Result<Vec<CommitSummary>, ForgeError> {
        ForgejoClient::recent_commits(self, repo, branch, not).await
    }

    async fn commit_diff(
        &self,
        repo: &RepoName,
        sha: &str,
        cap: usize,
    ) -> Result<Option<String>, ForgeError> {
        ForgejoClient::commit_diff(self, repo, sha, cap).await
    }

    async fn fork_of(
        &self,
        runner: &RunnerAccount,
        base: &RepoName,
        owner: &str,
    ) -> Result<Option<RepoName>, ForgeError> {
        ForgejoClient::fork_of(self, runner, base, owner).await
    }

    async fn fork_problems(
        &self,
        runner: &RunnerAccount,
        fork: &RepoName,
    ) -> Result<Vec<String>, ForgeError> {
        ForgejoClient::fork_problems(self, runner, fork).await
    }

    async fn create_fork(
        &self,
        runner: &RunnerAccount,
        base: &RepoName,
        org: Option<&str>,
    ) -> Result<RepoName, ForgeError> {
        ForgejoClient::create_fork(self, runner, base, org).await
    }

    async fn sync_fork(
        &self,
        runner: &RunnerAccount,
        fork: &RepoName,
        branch: &str,
    ) -> Result<ForkSync, ForgeError> {
        ForgejoClient::sync_fork(self, runner, fork, branch).await
    }

    async fn create_pull_as(
        &self,
        runner: &RunnerAccount,
        repo: &RepoName,
        head: &str,
        base: &str,
        title: &str,
        body: &str,
    ) -> Result<u64, ForgeError> {
        self.open_pull(Some(&basic(runner)?), repo, head, base, title, body)
            .await
    }

    async fn update_pull_as(
        &self,
        runner: &RunnerAccount,
        repo: &RepoName,
        number: u64,
    ) -> Result<MergeAnswer, ForgeError> {
        self.update_branch_of(Some(&basic(runner)?), repo, number)
            .await
    }

    async fn delete_branch_as(
        &self,
        runner: &RunnerAccount,
        repo: &RepoName,
        branch: &str,
    ) -> Result<(), ForgeError> {
        ForgejoClient::delete_branch_as(self, runner, repo, branch).await
    }

    async fn runner_actions_access(
        &self,
        runner: &RunnerAccount,
        repo: &RepoName,
    ) -> Result<Permission, ForgeError> {
        ForgejoClient::runner_actions_access(self, runner, repo).await
    }

    async fn fork_branch(
        &self,
        runner: &RunnerAccount,
        fork: &RepoName,
        name: &str,
    ) -> Result<Option<Branch>, ForgeError> {
        self.branch_with(Some(&super::basic(runner)?), fork, name)
            .await
    }

    async fn fork_commits_ahead(
        &self,
        runner: &RunnerAccount,
        fork: &RepoName,
        base: &str,
        head: &str,
    ) -> Result<u64, ForgeError> {
        self.compare_with(Some(&super::basic(runner)?), fork, base, head)
            .await
    }

    fn run_endpoints(&self, repo: &RepoName, runner: &RunnerAccount) -> RunEndpoints {
        run_endpoints(self.api.trim_end_matches("/api/v1"), repo, runner)
    }
}
