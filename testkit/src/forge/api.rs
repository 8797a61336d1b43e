//! The fake forge used in-process, through the [`Forge`] trait.

use async_trait::async_trait;

use director::domain::{CommitSha, IssueRef, RepoName};
use director::forge::{
    Comment, Forge, ForgeError, Hook, HookSpec, Issue, Label, Permission, Repository, TimelineEntry,
};

use super::*;

/// A merge's or an update's answer in process: refusals a person must see, as the client
/// returns them.
fn in_process_answer(
    done: Result<(), Refusal>,
    method: &str,
    path: String,
) -> Result<director::forge::MergeAnswer, ForgeError> {
    use director::forge::MergeAnswer;
    match done {
        Ok(()) => Ok(MergeAnswer::Done),
        Err(r) => match refused(method, path, r) {
            ForgeError::Status {
                status, message, ..
            } if status != 404 => Ok(MergeAnswer::Refused { status, message }),
            other => Err(other),
        },
    }
}

fn refused(method: &str, path: String, r: Refusal) -> ForgeError {
    let method = method.to_owned();
    match r {
        Refusal::NotFound => ForgeError::NotFound { method, path },
        Refusal::Forbidden => ForgeError::Forbidden { method, path },
        Refusal::Unauthorized => ForgeError::Unauthorized { method, path },
        Refusal::Conflict(message) => ForgeError::Status {
            method,
            path,
            status: 409,
            message,
        },
        Refusal::Unprocessable(message) => ForgeError::Status {
            method,
            path,
            status: 422,
            message,
        },
        Refusal::BadRequest(message) => ForgeError::Status {
            method,
            path,
            status: 400,
            message,
        },
        Refusal::NotAllowed(message) => ForgeError::Status {
            method,
            path,
            status: 405,
            message,
        },
        Refusal::Internal(message) => ForgeError::Status {
            method,
            path,
            status: 500,
            message,
        },
    }
}

impl FakeForge {
    fn native_issue(s: &State, repo: &RepoName, i: &FIssue) -> Issue {
        let r = s.repo(repo).ok();
        Issue {
            number: i.number,
            title: i.title.clone(),
            body: i.body.clone(),
            state: i.state.clone(),
            labels: i
                .labels
                .iter()
                .filter_map(|id| r.and_then(|r| r.labels.iter().find(|l| l.id == *id)))
                .map(|l| Label {
                    id: l.id,
                    name: l.name.clone(),
                })
                .collect(),
            author: i.author.clone(),
            updated_at: rfc3339(i.updated),
            is_pull: i.is_pull,
        }
    }

    /// In-process use: the bot is the first account registered with a token.
    fn bot(&self) -> String {
        let s = self.state();
        s.users
            .iter()
            .filter(|(login, _)| s.tokens.values().any(|l| l == *login))
            .min_by_key(|(_, id)| **id)
            .map(|(login, _)| login.clone())
            .unwrap_or_default()
    }
}

#[async_trait]
impl Forge for FakeForge {
    async fn current_user(&self) -> Result<String, ForgeError> {
        Ok(self.bot())
    }

    async fn anonymous_can_see(&self, repo: &RepoName) -> Result<bool, ForgeError> {
        Ok(self.state().anonymous_can_see(repo))
    }

    async fn repository(&self, repo: &RepoName) -> Result<Repository, ForgeError> {
        let s = self.state();
        let r = s
            .repo(repo)
            .map_err(|e| refused("GET", repo.to_string(), e))?;
        Ok(Repository {
            name: r.name.clone(),
            default_branch: r.default_branch.clone(),
            private: r.private,
        })
    }

    async fn open_issues_with_label(
        &self,
        repo: &RepoName,
        label: &str,
    ) -> Result<Vec<Issue>, ForgeError> {
        let s = self.state();
        let list = s
            .list_issues(repo, "open", "issues", label, "")
            .map_err(|e| refused("GET", repo.to_string(), e))?;
        Ok(list
            .into_iter()
            .map(|i| Self::native_issue(&s, repo, i))
            .collect())
    }

    async fn issues_updated_since(
        &self,
        since: chrono::DateTime<chrono::Utc>,
    ) -> Result<director::forge::IssueChanges, ForgeError> {
        let bot = self.bot();
        let s = self.state();
        let issues = s
            .search_issues(&bot, "all", "issues", "", Some(since.timestamp()))
            .into_iter()
            .map(|(repo, i)| {
                let issue = Self::native_issue(&s, &repo, i);
                (repo, issue)
            })
            .collect();
        Ok(director::forge::IssueChanges {
            issues,
            server_time: chrono::DateTime::from_timestamp(s.now, 0),
        })
    }

    async fn server_time(&self) -> Result<Option<chrono::DateTime<chrono::Utc>>, ForgeError> {
        Ok(chrono::DateTime::from_timestamp(self.state().now, 0))
    }

    async fn issues_created_by(
        &self,
        repo: &RepoName,
        login: &str,
    ) -> Result<Vec<Issue>, ForgeError> {
        let s = self.state();
        let list = s
            .list_issues(repo, "all", "issues", "", login)
            .map_err(|e| refused("GET", repo.to_string(), e))?;
        Ok(list
            .into_iter()
            .map(|i| Self::native_issue(&s, repo, i))
            .collect())
    }

    async fn issue(&self, issue: &IssueRef) -> Result<Issue, ForgeError> {
        let s = self.state();
        let i = s
            .issue(issue)
            .map_err(|e| refused("GET", issue.to_string(), e))?;
        Ok(Self::native_issue(&s, &issue.repo, i))
    }

    async fn comments(&self, issue: &IssueRef) -> Result<Vec<Comment>, ForgeError> {
        let s = self.state();
        let i = s
            .issue(issue)
            .map_err(|e| refused("GET", issue.to_string(), e))?;
        Ok(i.comments.iter().map(to_comment).collect())
    }

    async fn timeline(&self, issue: &IssueRef) -> Result<Vec<TimelineEntry>, ForgeError> {
        let s = self.state();
        let i = s
            .issue(issue)
            .map_err(|e| refused("GET", issue.to_string(), e))?;
        let r = s
            .repo(&issue.repo)
            .map_err(|e| refused("GET", issue.to_string(), e))?;
        Ok(i.timeline
            .iter()
            .map(|t| TimelineEntry {
                kind: t.kind.clone(),
                actor: t.actor.clone(),
                label: t
                    .label_id
                    .and_then(|id| r.labels.iter().find(|l| l.id == id))
                    .map(|l| l.name.clone()),
                added: t.kind == "label" && t.body == "1",
                created_at: rfc3339(t.created),
            })
            .collect())
    }

    async fn permission(&self, repo: &RepoName, user: &str) -> Result<Permission, ForgeError> {
        Ok(self.state().permission_of(repo, user))
    }

    async fn ensure_label(
        &self,
        repo: &RepoName,
        name: &str,
        color: &str,
        description: &str,
    ) -> Result<Label, ForgeError> {
        let mut s = self.state();
        let l = match s.label_by_name(repo, name) {
            Ok(l) => l,
            Err(_) => s
                .create_label(repo, name, color, description)
                .map_err(|e| refused("POST", repo.to_string(), e))?,
        };
        Ok(Label {
            id: l.id,
            name: l.name,
        })
    }

    async fn add_label(&self, issue: &IssueRef, label_id: u64) -> Result<(), ForgeError> {
        let bot = self.bot();
        self.state()
            .change_label(&bot, issue, label_id, true)
            .map_err(|e| refused("POST", issue.to_string(), e))?;
        self.deliver_webhooks().await;
        Ok(())
    }

    async fn remove_label(&self, issue: &IssueRef, label_id: u64) -> Result<(), ForgeError> {
        let bot = self.bot();
        match self.state().change_label(&bot, issue, label_id, false) {
            Ok(()) | Err(Refusal::NotFound) => {}
            Err(e) => return Err(refused("DELETE", issue.to_string(), e)),
        }
        self.deliver_webhooks().await;
        Ok(())
    }

    async fn create_comment(&self, issue: &IssueRef, body: &str) -> Result<Comment, ForgeError> {
        let bot = self.bot();
        let c = self
            .state()
            .add_comment(&bot, issue, body)
            .map_err(|e| refused("POST", issue.to_string(), e))?;
        self.deliver_webhooks().await;
        Ok(to_comment(&c))
    }

    async fn edit_comment(
        &self,
        repo: &RepoName,
        comment_id: u64,
        body: &str,
    ) -> Result<Comment, ForgeError> {
        let bot = self.bot();
        let (c, _) = self
            .state()
            .edit_comment(&bot, repo, comment_id, body)
            .map_err(|e| refused("PATCH", repo.to_string(), e))?;
        self.deliver_webhooks().await;
        Ok(to_comment(&c))
    }

    async fn create_issue(
        &self,
        repo: &RepoName,
        title: &str,
        body: &str,
    ) -> Result<u64, ForgeError> {
        let bot = self.bot();
        let number = self
            .state()
            .create_issue(&bot, repo, title, body)
            .map_err(|e| refused("POST", repo.to_string(), e))?;
        self.deliver_webhooks().await;
        Ok(number)
    }

    async fn file_at(
        &self,
        repo: &RepoName,
        path: &str,
        at: &str,
        max_bytes: u64,
    ) -> Result<director::forge::FileAt, ForgeError> {
        use director::forge::FileAt;
        let s = self.state();
        match s.file_at(repo, at, path) {
            Ok(Some((bytes, _))) if bytes.len() as u64 > max_bytes => {
                Ok(FileAt::Unusable(format!(
                    "`{path}` is {} bytes; at most {max_bytes} are read",
                    bytes.len()
                )))
            }
            Ok(Some((bytes, _))) => Ok(FileAt::File(bytes)),
            Ok(None) | Err(Refusal::NotFound) => Ok(FileAt::Missing),
            Err(e) => Err(refused("GET", repo.to_string(), e)),
        }
    }

    async fn branch(
        &self,
        repo: &RepoName,
        name: &str,
    ) -> Result<Option<director::forge::Branch>, ForgeError> {
        let bot = self.bot();
        let s = self.state();
        let r = s
            .repo(repo)
            .map_err(|e| refused("GET", repo.to_string(), e))?;
        Ok(r.branches.get(name).map(|_| director::forge::Branch {
            name: name.to_owned(),
            commit: r.head_name(name),
            user_can_push: s.can_push(repo, &bot, name),
            user_can_merge: s.can_merge(repo, &bot, name),
        }))
    }

    async fn branch_as(
        &self,
        token: &director::settings::Secret,
        repo: &RepoName,
        name: &str,
    ) -> Result<Option<director::forge::Branch>, ForgeError> {
        let s = self.state();
        let t = s
            .user_tokens
            .iter()
            .find(|t| t.sha1 == token.expose())
            .cloned();
        let Some(t) = t else {
            return Err(ForgeError::Unauthorized {
                method: "GET".into(),
                path: repo.to_string(),
            });
        };
        let r = s
            .repo(repo)
            .map_err(|e| refused("GET", repo.to_string(), e))?;
        Ok(r.branches.get(name).map(|_| director::forge::Branch {
            name: name.to_owned(),
            commit: r.head_name(name),
            user_can_push: s.can_push(repo, &t.login, name),
            user_can_merge: s.can_merge(repo, &t.login, name),
        }))
    }

    async fn commits_ahead(
        &self,
        repo: &RepoName,
        base: &str,
        head: &str,
    ) -> Result<u64, ForgeError> {
        let s = self.state();
        s.commits_ahead(repo, base, head)
            .map_err(|e| refused("GET", repo.to_string(), e))
    }

    async fn find_pull(
        &self,
        repo: &RepoName,
        base: &str,
        head: &str,
    ) -> Result<Option<u64>, ForgeError> {
        let s = self.state();
        let r = s
            .repo(repo)
            .map_err(|e| refused("GET", repo.to_string(), e))?;
        Ok(r.pulls
            .iter()
            .find(|p| p.base == base && p.head == head && p.state == "open")
            .map(|p| p.number))
    }

    async fn create_pull(
        &self,
        repo: &RepoName,
        head: &str,
        base: &str,
        title: &str,
        body: &str,
    ) -> Result<u64, ForgeError> {
        let bot = self.bot();
        let n = self
            .state()
            .create_pull(&bot, repo, head, base, title, body)
            .map_err(|e| refused("POST", repo.to_string(), e))?;
        self.deliver_webhooks().await;
        Ok(n)
    }

    async fn pull(
        &self,
        repo: &RepoName,
        number: u64,
    ) -> Result<director::forge::PullRequest, ForgeError> {
        pulls::pull(&self.state(), repo, number)
            .map_err(|e| refused("GET", format!("{repo}/pulls/{number}"), e))
    }

    async fn checks(
        &self,
        repo: &RepoName,
        sha: &CommitSha,
    ) -> Result<director::forge::Checks, ForgeError> {
        checks::checks(&self.state(), repo, sha.as_str())
            .map_err(|e| refused("GET", format!("{repo}/commits/{sha}/status"), e))
    }

    async fn edit_pull_title(
        &self,
        repo: &RepoName,
        number: u64,
        title: &str,
    ) -> Result<(), ForgeError> {
        let bot = self.bot();
        self.state()
            .edit_pull_title(&bot, repo, number, title)
            .map_err(|e| refused("PATCH", format!("{repo}/pulls/{number}"), e))
    }

    async fn post_status(
        &self,
        repo: &RepoName,
        sha: &CommitSha,
        status: &director::forge::NewStatus,
    ) -> Result<(), ForgeError> {
        let bot = self.bot();
        self.state()
            .post_status(&bot, repo, sha.as_str(), &status.body())
            .map(|_| ())
            .map_err(|e| refused("POST", format!("{repo}/statuses/{sha}"), e))
    }

    async fn merge_pull(
        &self,
        repo: &RepoName,
        number: u64,
        style: director::forge::MergeStyle,
        head_sha: &CommitSha,
        delete_branch: bool,
    ) -> Result<director::forge::MergeAnswer, ForgeError> {
        let body = serde_json::json!({
            "Do": style.as_str(),
            "head_commit_id": head_sha.as_str(),
            "delete_branch_after_merge": delete_branch,
        });
        let bot = self.bot();
        let merged = self.state().merge_by_api(&bot, repo, number, &body);
        self.deliver_webhooks().await;
        in_process_answer(merged, "POST", format!("{repo}/pulls/{number}/merge"))
    }

    async fn update_pull(
        &self,
        repo: &RepoName,
        number: u64,
    ) -> Result<director::forge::MergeAnswer, ForgeError> {
        let bot = self.bot();
        let updated = self.state().update_pull(&bot, repo, number);
        self.deliver_webhooks().await;
        in_process_answer(updated, "POST", format!("{repo}/pulls/{number}/update"))
    }

    async fn reviews(
        &self,
        repo: &RepoName,
        number: u64,
    ) -> Result<Vec<director::forge::Review>, ForgeError> {
        pulls::reviews(&self.state(), repo, number)
            .map_err(|e| refused("GET", format!("{repo}/pulls/{number}/reviews"), e))
    }

    async fn review_comments(
        &self,
        repo: &RepoName,
        number: u64,
        review: u64,
    ) -> Result<Vec<director::forge::ReviewComment>, ForgeError> {
        pulls::review_comments(&self.state(), repo, number, review).map_err(|e| {
            refused(
                "GET",
                format!("{repo}/pulls/{number}/reviews/{review}/comments"),
                e,
            )
        })
    }

    async fn mint_run_token(
        &self,
        runner: &director::forge::RunnerAccount,
        repo: &RepoName,
        name: &str,
    ) -> Result<director::forge::MintedToken, ForgeError> {
        let mut s = self.state();
        let t = s
            .mint_token(
                &runner.login,
                runner.password.expose(),
                name,
                vec![director::forge::RUN_TOKEN_SCOPE.into()],
                Some(vec![repo.clone()]),
            )
            .map_err(|e| refused("POST", format!("/users/{}/tokens", runner.login), e))?;
        Ok(director::forge::MintedToken {
            id: t.id,
            name: t.name,
            token: director::settings::Secret::new(t.sha1),
            repositories: t.repos,
            scopes: t.scopes,
        })
    }

    async fn runner_tokens(
        &self,
        runner: &director::forge::RunnerAccount,
    ) -> Result<Vec<(u64, String)>, ForgeError> {
        let s = self.state();
        s.check_password(&runner.login, runner.password.expose())
            .map_err(|e| refused("GET", runner.login.clone(), e))?;
        Ok(s.user_tokens
            .iter()
            .filter(|t| t.login == runner.login)
            .map(|t| (t.id, t.name.clone()))
            .collect())
    }

    async fn delete_run_token(
        &self,
        runner: &director::forge::RunnerAccount,
        name: &str,
    ) -> Result<(), ForgeError> {
        let mut s = self.state();
        s.check_password(&runner.login, runner.password.expose())
            .map_err(|e| refused("DELETE", runner.login.clone(), e))?;
        s.user_tokens
            .retain(|t| !(t.login == runner.login && (t.name == name || t.id.to_string() == name)));
        Ok(())
    }

    async fn org_repos(&self, org: &str) -> Result<Vec<RepoName>, ForgeError> {
        self.state()
            .orgs
            .get(org)
            .cloned()
            .ok_or_else(|| ForgeError::NotFound {
                method: "GET".into(),
                path: format!("/orgs/{org}/repos"),
            })
    }

    async fn hooks(&self, repo: &RepoName) -> Result<Vec<Hook>, ForgeError> {
        let bot = self.bot();
        let hooks = self
            .state()
            .list_hooks(&bot, repo)
            .map_err(|e| refused("GET", format!("{repo}/hooks"), e))?;
        Ok(hooks.iter().map(to_hook).collect())
    }

    async fn create_hook(&self, repo: &RepoName, spec: &HookSpec) -> Result<Hook, ForgeError> {
        let bot = self.bot();
        let body = spec.create_body();
        let h = self
            .state()
            .create_hook(&bot, repo, &body)
            .map_err(|e| refused("POST", format!("{repo}/hooks"), e))?;
        Ok(to_hook(&h))
    }

    async fn edit_hook(
        &self,
        repo: &RepoName,
        id: u64,
        spec: &director::forge::HookSpec,
        events: &[String],
    ) -> Result<Hook, ForgeError> {
        let bot = self.bot();
        let body = spec.edit_body(events);
        let h = self
            .state()
            .edit_hook(&bot, repo, id, &body)
            .map_err(|e| refused("PATCH", format!("{repo}/hooks/{id}"), e))?;
        Ok(to_hook(&h))
    }

    async fn delete_hook(&self, repo: &RepoName, id: u64) -> Result<(), ForgeError> {
        let bot = self.bot();
        match self.state().delete_hook(&bot, repo, id) {
            Ok(()) | Err(Refusal::NotFound) => Ok(()),
            Err(e) => Err(refused("DELETE", format!("{repo}/hooks/{id}"), e)),
        }
    }

    fn run_endpoints(
        &self,
        repo: &RepoName,
        runner: &director::forge::RunnerAccount,
    ) -> director::forge::RunEndpoints {
        director::forge::forgejo::run_endpoints("http://fake-forge.invalid", repo, runner)
    }
}
