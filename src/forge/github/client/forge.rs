//! The [`Forge`] calls, each as GitHub answers it, through the client's transport.

use super::*;

fn not_supported(what: &str) -> ForgeError {
    ForgeError::Status {
        method: String::new(),
        path: String::new(),
        status: 501,
        message: format!(
            "{what}: a GitHub App's webhook is set once, in the App's settings (Webhook URL: this director's /webhooks/github)"
        ),
    }
}

#[async_trait]
impl Forge for GithubClient {
    async fn current_user(&self) -> Result<String, ForgeError> {
        self.bot_login().await
    }

    async fn repository(&self, repo: &RepoName) -> Result<Repository, ForgeError> {
        let r: RawRepository = self
            .json(
                self.on(repo).await?,
                Method::GET,
                "/repos/{o}/{r}",
                &repo_path(repo),
                None,
            )
            .await?;
        Ok(Repository {
            name: r.full_name.parse().unwrap_or_else(|_| repo.clone()),
            default_branch: r.default_branch,
            private: r.private,
        })
    }

    async fn open_issues_with_label(
        &self,
        repo: &RepoName,
        label: &str,
    ) -> Result<Vec<Issue>, ForgeError> {
        self.issues_of(
            repo,
            &[("labels", label.to_owned()), ("state", "open".to_owned())],
        )
        .await
    }

    async fn issue(&self, issue: &IssueRef) -> Result<Issue, ForgeError> {
        let raw: RawIssue = self
            .json(
                self.on(&issue.repo).await?,
                Method::GET,
                "/repos/{o}/{r}/issues/{n}",
                &format!("{}/issues/{}", repo_path(&issue.repo), issue.number),
                None,
            )
            .await?;
        Ok(raw.into())
    }

    async fn comments(&self, issue: &IssueRef) -> Result<Vec<Comment>, ForgeError> {
        let raw: Vec<RawComment> = self
            .all_pages(
                self.on(&issue.repo).await?,
                "/repos/{o}/{r}/issues/{n}/comments",
                &format!(
                    "{}/issues/{}/comments",
                    repo_path(&issue.repo),
                    issue.number
                ),
                &[],
            )
            .await?;
        Ok(raw.into_iter().map(Comment::from).collect())
    }

    async fn timeline(&self, issue: &IssueRef) -> Result<Vec<TimelineEntry>, ForgeError> {
        let raw: Vec<RawEvent> = self
            .all_pages(
                self.on(&issue.repo).await?,
                "/repos/{o}/{r}/issues/{n}/events",
                &format!("{}/issues/{}/events", repo_path(&issue.repo), issue.number),
                &[],
            )
            .await?;
        Ok(raw
            .into_iter()
            .map(|e| {
                let labelled = matches!(e.event.as_str(), "labeled" | "unlabeled");
                TimelineEntry {
                    kind: if labelled {
                        "label".to_owned()
                    } else {
                        e.event.clone()
                    },
                    actor: e.actor.unwrap_or_default().login,
                    label: e.label.filter(|_| labelled).map(|l| l.name),
                    added: e.event == "labeled",
                    created_at: e.created_at,
                }
            })
            .collect())
    }

    async fn permission(&self, repo: &RepoName, user: &str) -> Result<Permission, ForgeError> {
        let path = format!("{}/collaborators/{}/permission", repo_path(repo), enc(user));
        let found: Option<RawPermission> = self
            .get(
                self.on(repo).await?,
                "/repos/{o}/{r}/collaborators/{username}/permission",
                &path,
            )
            .await?;
        Ok(match found {
            // `maintain` is reported as `write` in `permission`; the role says it too.
            Some(p) if p.role_name == "maintain" => Permission::Write,
            Some(p) => match p.permission.as_str() {
                "admin" => Permission::Admin,
                "write" | "maintain" => Permission::Write,
                "read" | "triage" => Permission::Read,
                _ => Permission::None,
            },
            None => Permission::None,
        })
    }

    async fn ensure_label(
        &self,
        repo: &RepoName,
        name: &str,
        color: &str,
        description: &str,
    ) -> Result<Label, ForgeError> {
        let who = self.on(repo).await?;
        let path = format!("{}/labels/{}", repo_path(repo), enc(name));
        let found: Option<RawLabel> = self.get(who, "/repos/{o}/{r}/labels/{name}", &path).await?;
        let label = match found {
            Some(l) => l,
            None => {
                let body = json!({
                    "name": name,
                    "color": color.trim_start_matches('#'),
                    "description": description,
                });
                match self
                    .json::<RawLabel>(
                        who,
                        Method::POST,
                        "/repos/{o}/{r}/labels",
                        &format!("{}/labels", repo_path(repo)),
                        Some(&body),
                    )
                    .await
                {
                    Ok(l) => l,
                    // Created meanwhile (another replica): read it.
                    Err(ForgeError::Status { status: 422, .. }) => {
                        self.json(
                            who,
                            Method::GET,
                            "/repos/{o}/{r}/labels/{name}",
                            &path,
                            None,
                        )
                        .await?
                    }
                    Err(e) => return Err(e),
                }
            }
        };
        self.remember_label(repo, label.id, &label.name);
        Ok(Label {
            id: label.id,
            name: label.name,
        })
    }

    async fn add_label(&self, issue: &IssueRef, label_id: u64) -> Result<(), ForgeError> {
        let name = self.label_name(&issue.repo, label_id).await?;
        self.send(
            self.on(&issue.repo).await?,
            Method::POST,
            "/repos/{o}/{r}/issues/{n}/labels",
            &format!("{}/issues/{}/labels", repo_path(&issue.repo), issue.number),
            Some(&json!({ "labels": [name] })),
        )
        .await
        .map(|_| ())
    }

    async fn remove_label(&self, issue: &IssueRef, label_id: u64) -> Result<(), ForgeError> {
        let name = self.label_name(&issue.repo, label_id).await?;
        match self
            .send(
                self.on(&issue.repo).await?,
                Method::DELETE,
                "/repos/{o}/{r}/issues/{n}/labels/{name}",
                &format!(
                    "{}/issues/{}/labels/{}",
                    repo_path(&issue.repo),
                    issue.number,
                    enc(&name)
                ),
                None,
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn create_comment(&self, issue: &IssueRef, body: &str) -> Result<Comment, ForgeError> {
        let raw: RawComment = self
            .json(
                self.on(&issue.repo).await?,
                Method::POST,
                "/repos/{o}/{r}/issues/{n}/comments",
                &format!(
                    "{}/issues/{}/comments",
                    repo_path(&issue.repo),
                    issue.number
                ),
                Some(&json!({ "body": body })),
            )
            .await?;
        Ok(raw.into())
    }

    async fn edit_comment(
        &self,
        repo: &RepoName,
        comment_id: u64,
        body: &str,
    ) -> Result<Comment, ForgeError> {
        let raw: RawComment = self
            .json(
                self.on(repo).await?,
                Method::PATCH,
                "/repos/{o}/{r}/issues/comments/{id}",
                &format!("{}/issues/comments/{comment_id}", repo_path(repo)),
                Some(&json!({ "body": body })),
            )
            .await?;
        Ok(raw.into())
    }

    async fn issues_created_by(
        &self,
        repo: &RepoName,
        login: &str,
    ) -> Result<Vec<Issue>, ForgeError> {
        self.issues_of(
            repo,
            &[("creator", login.to_owned()), ("state", "all".to_owned())],
        )
        .await
    }

    async fn create_issue(
        &self,
        repo: &RepoName,
        title: &str,
        body: &str,
    ) -> Result<u64, ForgeError> {
        let raw: RawIssue = self
            .json(
                self.on(repo).await?,
                Method::POST,
                "/repos/{o}/{r}/issues",
                &format!("{}/issues", repo_path(repo)),
                Some(&json!({ "title": title, "body": body })),
            )
            .await?;
        Ok(raw.number)
    }

    async fn branch(&self, repo: &RepoName, name: &str) -> Result<Option<Branch>, ForgeError> {
        let path = format!("{}/branches/{}", repo_path(repo), enc(name));
        let found: Option<RawBranch> = self
            .get(
                self.on(repo).await?,
                "/repos/{o}/{r}/branches/{branch}",
                &path,
            )
            .await?;
        Ok(found.map(|b| Branch {
            name: b.name,
            commit: b.commit.sha,
            // The App's own view is not a PR-only check (that is `branch_as`).
            user_can_push: true,
            user_can_merge: true,
        }))
    }

    async fn file_at(
        &self,
        repo: &RepoName,
        file: &str,
        at: &str,
        max_bytes: u64,
    ) -> Result<crate::forge::FileAt, ForgeError> {
        let encoded: Vec<String> = file.split('/').map(enc).collect();
        let path = format!(
            "{}/contents/{}?ref={}",
            repo_path(repo),
            encoded.join("/"),
            enc(at)
        );
        let found: Option<crate::forge::WireContents> = self
            .get(
                self.on(repo).await?,
                "/repos/{o}/{r}/contents/{path}",
                &path,
            )
            .await?;
        Ok(crate::forge::FileAt::from_wire(found, file, max_bytes))
    }

    /// PR-only, as GitHub can show it: the branch counts as closed to the token's holder
    /// when an active ruleset requires a pull request with an approving review and GitHub
    /// says the holder can never bypass it, or a classic protection requires one and names
    /// no bypass for this App. Anything else (including what cannot be read) is "can push".
    async fn branch_as(
        &self,
        token: &Secret,
        repo: &RepoName,
        name: &str,
    ) -> Result<Option<Branch>, ForgeError> {
        let path = format!("{}/branches/{}", repo_path(repo), enc(name));
        let Some(b) = self
            .get::<RawBranch>(As::Token(token), "/repos/{o}/{r}/branches/{branch}", &path)
            .await?
        else {
            return Ok(None);
        };
        let closed = self.ruleset_binds(token, repo, name).await?
            || self.protection_binds(repo, name).await?;
        Ok(Some(Branch {
            name: b.name,
            commit: b.commit.sha,
            user_can_push: !closed,
            user_can_merge: !closed,
        }))
    }

    async fn commits_ahead(
        &self,
        repo: &RepoName,
        base: &str,
        head: &str,
    ) -> Result<u64, ForgeError> {
        let c: RawCompare = self
            .json(
                self.on(repo).await?,
                Method::GET,
                "/repos/{o}/{r}/compare/{basehead}",
                &format!("{}/compare/{}...{}", repo_path(repo), enc(base), enc(head)),
                None,
            )
            .await?;
        Ok(c.ahead_by)
    }

    async fn find_pull(
        &self,
        repo: &RepoName,
        base: &str,
        head: &str,
    ) -> Result<Option<u64>, ForgeError> {
        let pulls: Vec<RawPull> = self
            .all_pages(
                self.on(repo).await?,
                "/repos/{o}/{r}/pulls",
                &format!("{}/pulls", repo_path(repo)),
                &[
                    ("head", format!("{}:{head}", repo.owner())),
                    ("base", base.to_owned()),
                    ("state", "open".to_owned()),
                ],
            )
            .await?;
        Ok(pulls.first().map(|p| p.number))
    }

    async fn create_pull(
        &self,
        repo: &RepoName,
        head: &str,
        base: &str,
        title: &str,
        body: &str,
    ) -> Result<u64, ForgeError> {
        let p: RawPull = self
            .json(
                self.on(repo).await?,
                Method::POST,
                "/repos/{o}/{r}/pulls",
                &format!("{}/pulls", repo_path(repo)),
                Some(&json!({ "title": title, "head": head, "base": base, "body": body })),
            )
            .await?;
        Ok(p.number)
    }

    async fn pull(&self, repo: &RepoName, number: u64) -> Result<PullRequest, ForgeError> {
        let p: RawPull = self
            .json(
                self.on(repo).await?,
                Method::GET,
                "/repos/{o}/{r}/pulls/{n}",
                &format!("{}/pulls/{number}", repo_path(repo)),
                None,
            )
            .await?;
        let (head, base) = (p.head.unwrap_or_default(), p.base.unwrap_or_default());
        Ok(PullRequest {
            number: p.number,
            state: p.state,
            merged: p.merged || p.merged_at.is_some(),
            updated_at: p.updated_at,
            head_sha: CommitSha::read(&head.sha),
            head_ref: head.name,
            base_ref: base.name,
            merge_base: String::new(),
            mergeable: p.mergeable,
            behind: p.mergeable_state.map(|s| s == "behind"),
            // Runs on GitHub push to the repository itself (an App owns no fork).
            head_repo: None,
            merge_commit: None,
        })
    }

    /// Commit statuses (latest per context) and check runs, a page of each.
    async fn edit_pull_title(
        &self,
        repo: &RepoName,
        number: u64,
        title: &str,
    ) -> Result<(), ForgeError> {
        let who = self.on(repo).await?;
        self.send(
            who,
            Method::PATCH,
            "/repos/{o}/{r}/pulls/{n}",
            &format!("{}/pulls/{number}", repo_path(repo)),
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
        // A commit status (not a check run: those need the App's `checks: write` and show
        // apart); 201 with the status.
        let who = self.on(repo).await?;
        self.send(
            who,
            Method::POST,
            "/repos/{o}/{r}/statuses/{sha}",
            &format!("{}/statuses/{sha}", repo_path(repo)),
            Some(&status.body()),
        )
        .await?;
        Ok(())
    }

    async fn checks(&self, repo: &RepoName, sha: &CommitSha) -> Result<Checks, ForgeError> {
        let who = self.on(repo).await?;
        let combined: RawCombined = self
            .json(
                who,
                Method::GET,
                "/repos/{o}/{r}/commits/{ref}/status",
                &format!("{}/commits/{sha}/status?per_page=100", repo_path(repo)),
                None,
            )
            .await?;
        let runs: RawCheckRuns = self
            .json(
                who,
                Method::GET,
                "/repos/{o}/{r}/commits/{ref}/check-runs",
                &format!("{}/commits/{sha}/check-runs?per_page=100", repo_path(repo)),
                None,
            )
            .await?;
        let truncated = combined.total_count > combined.statuses.len()
            || runs.total_count > runs.check_runs.len();
        let mut checks: Vec<Check> = combined
            .statuses
            .into_iter()
            .map(|s| Check {
                state: CheckState::from_forge(&s.state),
                context: s.context,
                description: s.description.unwrap_or_default(),
                target_url: s.target_url.unwrap_or_default(),
            })
            .collect();
        checks.extend(runs.check_runs.into_iter().map(|r| {
            let state = match r.conclusion.as_deref() {
                Some(conclusion) if r.status == "completed" => CheckState::from_forge(conclusion),
                _ => CheckState::Pending,
            };
            Check {
                context: r.name,
                state,
                description: r.output.and_then(|o| o.title).unwrap_or_default(),
                target_url: r.details_url.or(r.html_url).unwrap_or_default(),
            }
        }));
        let truncated = truncated || checks.len() > MAX_CHECKS;
        checks.truncate(MAX_CHECKS);
        Ok(Checks {
            checks,
            truncated,
            held: 0,
        })
    }

    async fn merge_pull(
        &self,
        repo: &RepoName,
        number: u64,
        style: MergeStyle,
        head_sha: &CommitSha,
        delete_branch: bool,
    ) -> Result<MergeAnswer, ForgeError> {
        let method = match style {
            MergeStyle::Merge => "merge",
            MergeStyle::Squash => "squash",
            MergeStyle::Rebase => "rebase",
            MergeStyle::RebaseMerge | MergeStyle::FastForwardOnly => {
                return Ok(MergeAnswer::Refused {
                    status: 422,
                    message: format!("GitHub has no `{}` merge", style.as_str()),
                });
            }
        };
        let who = self.on(repo).await?;
        let merged = self
            .send(
                who,
                Method::PUT,
                "/repos/{o}/{r}/pulls/{n}/merge",
                &format!("{}/pulls/{number}/merge", repo_path(repo)),
                Some(&json!({ "merge_method": method, "sha": head_sha.as_str() })),
            )
            .await;
        let answer = crate::forge::refused_or_done(merged, &[405, 409, 422])?;
        if answer == MergeAnswer::Done && delete_branch {
            let head = self.pull(repo, number).await?.head_ref;
            let deleted = self
                .send(
                    who,
                    Method::DELETE,
                    "/repos/{o}/{r}/git/refs/{ref}",
                    &format!("{}/git/refs/heads/{head}", repo_path(repo)),
                    None,
                )
                .await;
            if let Err(e) = deleted {
                // Merged all the same: the branch stays, and the log says why.
                tracing::warn!(error = %e, "the merged pull request's branch was not deleted");
            }
        }
        Ok(answer)
    }

    async fn update_pull(&self, repo: &RepoName, number: u64) -> Result<MergeAnswer, ForgeError> {
        let who = self.on(repo).await?;
        let sent = self
            .send(
                who,
                Method::PUT,
                "/repos/{o}/{r}/pulls/{n}/update-branch",
                &format!("{}/pulls/{number}/update-branch", repo_path(repo)),
                Some(&json!({})),
            )
            .await;
        crate::forge::refused_or_done(sent, &[403, 422])
    }

    async fn reviews(&self, repo: &RepoName, number: u64) -> Result<Vec<Review>, ForgeError> {
        let raw: Vec<RawReview> = self
            .all_pages(
                self.on(repo).await?,
                "/repos/{o}/{r}/pulls/{n}/reviews",
                &format!("{}/pulls/{number}/reviews", repo_path(repo)),
                &[],
            )
            .await?;
        Ok(raw
            .into_iter()
            .map(|r| Review {
                id: r.id,
                user: r.user.unwrap_or_default().login,
                dismissed: r.state == "DISMISSED",
                state: review_state(&r.state),
                body: r.body.unwrap_or_default(),
                submitted_at: r.submitted_at,
                commit_id: r.commit_id.as_deref().and_then(CommitSha::read),
            })
            .collect())
    }

    async fn review_comments(
        &self,
        repo: &RepoName,
        number: u64,
        review: u64,
    ) -> Result<Vec<ReviewComment>, ForgeError> {
        let raw: Vec<RawReviewComment> = self
            .all_pages(
                self.on(repo).await?,
                "/repos/{o}/{r}/pulls/{n}/reviews/{id}/comments",
                &format!(
                    "{}/pulls/{number}/reviews/{review}/comments",
                    repo_path(repo)
                ),
                &[],
            )
            .await?;
        Ok(raw
            .into_iter()
            .map(|c| {
                let left = c.side.as_deref() == Some("LEFT");
                ReviewComment {
                    path: c.path,
                    body: c.body,
                    line: if left {
                        None
                    } else {
                        c.line.or(c.original_line)
                    },
                    old_line: if left {
                        c.line.or(c.original_line)
                    } else {
                        None
                    },
                }
            })
            .collect())
    }

    async fn mint_run_token(
        &self,
        _runner: &RunnerAccount,
        repo: &RepoName,
        name: &str,
    ) -> Result<MintedToken, ForgeError> {
        self.mint_installation_token(repo, name).await
    }

    async fn runner_tokens(
        &self,
        _runner: &RunnerAccount,
    ) -> Result<Vec<(u64, String)>, ForgeError> {
        Ok(self.held_tokens())
    }

    async fn delete_run_token(
        &self,
        _runner: &RunnerAccount,
        name: &str,
    ) -> Result<(), ForgeError> {
        self.revoke_held_token(name).await
    }

    async fn org_repos(&self, org: &str) -> Result<Vec<RepoName>, ForgeError> {
        let installation = self.owner_installation(org).await?;
        let repos: Vec<RawRepository> = self
            .all_pages(
                As::Installation(installation),
                "/orgs/{org}/repos",
                &format!("/orgs/{}/repos", enc(org)),
                &[],
            )
            .await?;
        Ok(repos
            .into_iter()
            .filter_map(|r| r.full_name.parse().ok())
            .collect())
    }

    /// One search per watched owner (`is:issue updated:>=SINCE user:OWNER`), every page.
    /// GitHub's search shows at most 1,000 results: more than that is an error, and the full
    /// pass catches up.
    async fn issues_updated_since(
        &self,
        since: chrono::DateTime<chrono::Utc>,
    ) -> Result<IssueChanges, ForgeError> {
        let mut issues = Vec::new();
        let stamp = since.format("%Y-%m-%dT%H:%M:%SZ");
        for owner in &self.owners {
            let who = As::Installation(self.owner_installation(owner).await?);
            let q = format!("is:issue updated:>={stamp} user:{owner}");
            for page in 1..=10usize {
                let path = format!(
                    "/search/issues?{}",
                    query(&[
                        ("q", q.clone()),
                        ("sort", "updated".to_owned()),
                        ("order", "asc".to_owned()),
                        ("per_page", PAGE_SIZE.to_string()),
                        ("page", page.to_string()),
                    ])
                );
                let found: RawSearch = self
                    .json(who, Method::GET, "/search/issues", &path, None)
                    .await?;
                if found.total_count > 1000 {
                    return Err(ForgeError::Status {
                        method: "GET".into(),
                        path: "/search/issues".into(),
                        status: 422,
                        message: format!(
                            "{} issues of {owner} changed since {stamp}, more than GitHub's search shows; the full pass reads them",
                            found.total_count
                        ),
                    });
                }
                let short = found.items.len() < PAGE_SIZE;
                for item in found.items {
                    if let Some(repo) = repo_of_url(&item.repository_url) {
                        let issue = Issue::from(item);
                        if !issue.is_pull {
                            issues.push((repo, issue));
                        }
                    }
                }
                if short {
                    break;
                }
            }
        }
        Ok(IssueChanges {
            issues,
            server_time: *self.last_date.lock().unwrap_or_else(|e| e.into_inner()),
        })
    }

    async fn server_time(&self) -> Result<Option<chrono::DateTime<chrono::Utc>>, ForgeError> {
        Ok(*self.last_date.lock().unwrap_or_else(|e| e.into_inner()))
    }

    async fn hooks(&self, _repo: &RepoName) -> Result<Vec<Hook>, ForgeError> {
        Err(not_supported("listing repository webhooks"))
    }

    async fn create_hook(&self, _repo: &RepoName, _spec: &HookSpec) -> Result<Hook, ForgeError> {
        Err(not_supported("creating a repository webhook"))
    }

    async fn edit_hook(
        &self,
        _repo: &RepoName,
        _id: u64,
        _spec: &HookSpec,
        _events: &[String],
    ) -> Result<Hook, ForgeError> {
        Err(not_supported("repairing a repository webhook"))
    }

    async fn delete_hook(&self, _repo: &RepoName, _id: u64) -> Result<(), ForgeError> {
        Err(not_supported("deleting a repository webhook"))
    }

    fn hold_run_token(&self, name: &str, token: &Secret) {
        self.run_tokens
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_owned(), token.clone());
    }

    async fn workflows_run_unapproved(&self, repo: &RepoName) -> Result<Option<bool>, ForgeError> {
        #[derive(serde::Deserialize)]
        struct Permissions {
            enabled: bool,
        }
        let answer: Option<Permissions> = self
            .get(
                self.on(repo).await?,
                "/repos/{o}/{r}/actions/permissions",
                &format!("{}/actions/permissions", repo_path(repo)),
            )
            .await?;
        Ok(answer.map(|p| p.enabled))
    }

    fn run_endpoints(&self, repo: &RepoName, _runner: &RunnerAccount) -> RunEndpoints {
        let web = web_base(&self.api);
        let bot = self
            .bot
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .unwrap_or_else(|| "director[bot]".to_owned());
        let host = reqwest::Url::parse(&web)
            .ok()
            .and_then(|u| u.host_str().map(str::to_owned))
            .unwrap_or_else(|| "github.com".to_owned());
        RunEndpoints {
            clone_url: format!("{web}/{repo}.git"),
            api_url: self.api.clone(),
            git_origin: reqwest::Url::parse(&web)
                .map(|u| u.origin().ascii_serialization())
                .unwrap_or(web.clone()),
            // GitHub takes an installation token as the password of `x-access-token`.
            git_user: "x-access-token".to_owned(),
            author: (bot.clone(), format!("{bot}@users.noreply.{host}")),
            token_scopes: RUN_TOKEN_PERMISSIONS
                .iter()
                .map(|s| (*s).to_owned())
                .collect(),
            runner_account: false,
            name: "GitHub",
            token_lifetime_secs: Some(crate::settings::GITHUB_TOKEN_LIFETIME_SECS),
        }
    }
}
