//! What the fake forge holds and the rules it answers by, shared by its HTTP face and its
//! in-process [`Forge`](director::forge::Forge) face.

use serde_json::{Value, json};

use director::domain::{IssueRef, RepoName};
use director::forge::Permission;

use super::*;

impl State {
    /// As Forgejo answers an anonymous visitor: the repository is public and so is its owner.
    pub(crate) fn anonymous_can_see(&self, repo: &RepoName) -> bool {
        self.repos.get(repo).is_some_and(|r| !r.private)
            && !self.hidden_owners.contains(repo.owner())
    }

    pub(super) fn tick(&mut self) -> i64 {
        self.now += 1;
        self.now
    }

    pub(super) fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    pub(crate) fn repo(&self, repo: &RepoName) -> Result<&FRepo, Refusal> {
        self.repos.get(repo).ok_or(Refusal::NotFound)
    }

    pub(super) fn repo_mut(&mut self, repo: &RepoName) -> Result<&mut FRepo, Refusal> {
        self.repos.get_mut(repo).ok_or(Refusal::NotFound)
    }

    pub(crate) fn issue(&self, issue: &IssueRef) -> Result<&FIssue, Refusal> {
        self.repo(&issue.repo)?
            .issues
            .get(&issue.number)
            .ok_or(Refusal::NotFound)
    }

    pub(super) fn issue_mut(&mut self, issue: &IssueRef) -> Result<&mut FIssue, Refusal> {
        self.repo_mut(&issue.repo)?
            .issues
            .get_mut(&issue.number)
            .ok_or(Refusal::NotFound)
    }

    pub(super) fn ensure_user(&mut self, login: &str) {
        if !self.users.contains_key(login) {
            let id = self.id();
            self.users.insert(login.to_owned(), id);
        }
    }

    pub(crate) fn permission_of(&self, repo: &RepoName, login: &str) -> Permission {
        let Ok(r) = self.repo(repo) else {
            return Permission::None;
        };
        if repo.owner() == login {
            return Permission::Owner;
        }
        let own = r
            .permissions
            .get(login)
            .copied()
            // Public repositories: everyone with an account can read; a private one only
            // its owner and those given access (Forgejo's `accessLevel`).
            .unwrap_or(if self.users.contains_key(login) && !r.private {
                Permission::Read
            } else {
                Permission::None
            });
        own.max(self.team_mode(repo, login))
    }

    /// Issues of a repository as `GET .../issues` answers: `labels` names that the repository
    /// does not define are dropped from the filter, and every remaining one must match.
    pub(crate) fn list_issues(
        &self,
        repo: &RepoName,
        state: &str,
        kind: &str,
        labels: &str,
        created_by: &str,
    ) -> Result<Vec<&FIssue>, Refusal> {
        let r = self.repo(repo)?;
        let wanted: Vec<u64> = labels
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .filter_map(|n| r.labels.iter().find(|l| l.name == n).map(|l| l.id))
            .collect();
        Ok(r.issues
            .values()
            .rev() // newest first, as Forgejo sorts by default
            .filter(|i| state == "all" || i.state == state)
            .filter(|i| match kind {
                "issues" => !i.is_pull,
                "pulls" => i.is_pull,
                _ => true,
            })
            .filter(|i| wanted.iter().all(|id| i.labels.contains(id)))
            .filter(|i| created_by.is_empty() || i.author == created_by)
            .collect())
    }

    /// `GET /repos/issues/search`, as Forgejo answers it: every repository `login` can read,
    /// `labels` matching any of the names (unknown names dropped), `since` meaning updated at
    /// or after; most recently updated first.
    pub(crate) fn search_issues(
        &self,
        login: &str,
        state: &str,
        kind: &str,
        labels: &str,
        since: Option<i64>,
    ) -> Vec<(RepoName, &FIssue)> {
        let names: Vec<&str> = labels
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .collect();
        let mut out: Vec<(RepoName, &FIssue)> = Vec::new();
        for (name, r) in &self.repos {
            let readable = if r.private {
                name.owner() == login || r.permissions.contains_key(login)
            } else {
                self.permission_of(name, login) >= Permission::Read
            };
            if !readable {
                continue;
            }
            let wanted: Vec<u64> = names
                .iter()
                .filter_map(|n| r.labels.iter().find(|l| l.name == *n).map(|l| l.id))
                .collect();
            for i in r.issues.values() {
                let keep = (state == "all" || i.state == state)
                    && match kind {
                        "issues" => !i.is_pull,
                        "pulls" => i.is_pull,
                        _ => true,
                    }
                    && (names.is_empty() || wanted.iter().any(|id| i.labels.contains(id)))
                    && since.is_none_or(|t| i.updated >= t);
                if keep {
                    out.push((name.clone(), i));
                }
            }
        }
        out.sort_by(|a, b| {
            b.1.updated
                .cmp(&a.1.updated)
                .then(b.1.number.cmp(&a.1.number))
        });
        out
    }

    pub(crate) fn label_by_name(&self, repo: &RepoName, name: &str) -> Result<FLabel, Refusal> {
        self.repo(repo)?
            .labels
            .iter()
            .find(|l| l.name == name)
            .cloned()
            .ok_or_else(|| Refusal::Unprocessable(format!("label `{name}` does not exist")))
    }

    pub(crate) fn create_label(
        &mut self,
        repo: &RepoName,
        name: &str,
        color: &str,
        description: &str,
    ) -> Result<FLabel, Refusal> {
        if self.repo(repo)?.labels.iter().any(|l| l.name == name) {
            return Err(Refusal::Unprocessable(format!(
                "label `{name}` already exists"
            )));
        }
        let id = self.id();
        let label = FLabel {
            id,
            name: name.to_owned(),
            color: color.to_owned(),
            description: description.to_owned(),
        };
        self.repo_mut(repo)?.labels.push(label.clone());
        Ok(label)
    }

    pub(crate) fn create_issue(
        &mut self,
        author: &str,
        repo: &RepoName,
        title: &str,
        body: &str,
    ) -> Result<u64, Refusal> {
        let number = self.insert_issue(author, repo, title, body)?;
        self.emit(
            "issues",
            "opened",
            author,
            &IssueRef::new(repo.clone(), number),
            None,
        );
        Ok(number)
    }

    /// A new open issue, told to no one yet.
    pub(crate) fn insert_issue(
        &mut self,
        author: &str,
        repo: &RepoName,
        title: &str,
        body: &str,
    ) -> Result<u64, Refusal> {
        self.repo(repo)?;
        let now = self.tick();
        let id = self.id();
        let r = self.repo_mut(repo)?;
        let number = r.next_number;
        r.next_number += 1;
        r.issues.insert(
            number,
            FIssue {
                id,
                number,
                title: title.to_owned(),
                body: body.to_owned(),
                state: "open".into(),
                labels: Vec::new(),
                author: author.to_owned(),
                created: now,
                updated: now,
                is_pull: false,
                comments: Vec::new(),
                timeline: Vec::new(),
            },
        );
        Ok(number)
    }

    /// Adds or removes labels as `actor`: a timeline entry per change, `updated_at` bumped,
    /// and one `label_updated` webhook carrying the full label set.
    pub(crate) fn change_label(
        &mut self,
        actor: &str,
        issue: &IssueRef,
        label_id: u64,
        add: bool,
    ) -> Result<(), Refusal> {
        if !self
            .repo(&issue.repo)?
            .labels
            .iter()
            .any(|l| l.id == label_id)
        {
            return Err(if add {
                Refusal::Unprocessable(format!("label {label_id} does not exist"))
            } else {
                Refusal::NotFound
            });
        }
        let has = self.issue(issue)?.labels.contains(&label_id);
        if has == add {
            return Ok(());
        }
        let now = self.tick();
        let entry_id = self.id();
        let i = self.issue_mut(issue)?;
        if add {
            i.labels.push(label_id);
        } else {
            i.labels.retain(|l| *l != label_id);
        }
        i.updated = now;
        i.timeline.push(FTimeline {
            id: entry_id,
            kind: "label".into(),
            actor: actor.to_owned(),
            label_id: Some(label_id),
            body: if add { "1".into() } else { String::new() },
            created: now,
        });
        let kind = if i.is_pull {
            "pull_request_label"
        } else {
            "issue_label"
        };
        self.emit(kind, "label_updated", actor, issue, None);
        Ok(())
    }

    /// What `login` (through a token restricted or not) may do on `repo`'s branch `name`.
    pub(crate) fn can_merge(&self, repo: &RepoName, login: &str, name: &str) -> bool {
        let Ok(r) = self.repo(repo) else { return false };
        if name == r.default_branch && r.protect_default && r.merge_default {
            self.permission_of(repo, login) >= Permission::Write
        } else {
            self.can_push(repo, login, name)
        }
    }

    pub(crate) fn can_push(&self, repo: &RepoName, login: &str, name: &str) -> bool {
        let Ok(r) = self.repo(repo) else { return false };
        let perm = self.permission_of(repo, login);
        if name == r.default_branch && r.protect_default {
            perm >= Permission::Admin
        } else {
            perm >= Permission::Write
        }
    }

    /// A commit on `branch`, created from `from` when new; as `login`.
    pub(crate) fn commit_file(
        &mut self,
        login: &str,
        repo: &RepoName,
        from: &str,
        branch: &str,
        file: (&str, &[u8]),
    ) -> Result<u64, Refusal> {
        if !self.can_push(repo, login, branch) {
            return Err(Refusal::Forbidden);
        }
        let commit = self.id();
        let r = self.repo_mut(repo)?;
        let base = r.branches.get(from).cloned().ok_or(Refusal::NotFound)?;
        let entry = r.branches.entry(branch.to_owned()).or_insert(base);
        let parent = entry.last().copied();
        entry.push(commit);
        let mut tree = parent
            .and_then(|p| r.trees.get(&p).cloned())
            .unwrap_or_default();
        tree.insert(file.0.to_owned(), file.1.to_vec());
        r.trees.insert(commit, tree);
        r.parents.insert(commit, parent.into_iter().collect());
        Ok(commit)
    }

    /// The file at `path` as of `reference` (a branch, or a commit as the API shows ids),
    /// with the commit it was read at; `Ok(None)` when the commit has no such file.
    pub(crate) fn file_at(
        &self,
        repo: &RepoName,
        reference: &str,
        path: &str,
    ) -> Result<Option<(Vec<u8>, u64)>, Refusal> {
        let r = self.repo(repo)?;
        let commit = r.commit_named(reference).ok_or(Refusal::NotFound)?;
        if let Some(g) = &r.git {
            let Some(sha) = g
                .ids
                .iter()
                .find(|(_, id)| **id == commit)
                .map(|(sha, _)| sha)
            else {
                return Err(Refusal::NotFound);
            };
            let read = super::git::git(
                &g.dir,
                &["cat-file", "blob", &format!("{sha}:{path}")],
                &[],
                None,
            );
            return Ok(read.ok().map(|text| (text.into_bytes(), commit)));
        }
        Ok(r.trees
            .get(&commit)
            .and_then(|t| t.get(path))
            .map(|bytes| (bytes.clone(), commit)))
    }

    pub(crate) fn create_pull(
        &mut self,
        login: &str,
        repo: &RepoName,
        head: &str,
        base: &str,
        title: &str,
        body: &str,
    ) -> Result<u64, Refusal> {
        // `owner:branch` names a branch of `owner`'s fork of the repository, as Forgejo's
        // `parseCompareInfo` reads it: the poster must read both.
        let (head_repo, head) = match head.split_once(':') {
            Some((owner, branch)) if owner != repo.owner() => {
                let fork = self.fork_owned_by(repo, owner).ok_or(Refusal::NotFound)?;
                if self.permission_of(&fork, login) < Permission::Read {
                    return Err(Refusal::NotFound);
                }
                (Some(fork), branch)
            }
            Some((_, branch)) => (None, branch),
            None => (None, head),
        };
        if self.permission_of(repo, login) < Permission::Read {
            return Err(Refusal::NotFound);
        }
        let r = self.repo(repo)?;
        let head_exists = match &head_repo {
            Some(fork) => self.repo(fork)?.branches.contains_key(head),
            None => r.branches.contains_key(head),
        };
        if !head_exists || !r.branches.contains_key(base) {
            return Err(Refusal::NotFound);
        }
        if r.pulls.iter().any(|p| {
            p.head == head && p.head_repo == head_repo && p.base == base && p.state == "open"
        }) {
            return Err(Refusal::Conflict("pull request already exists".into()));
        }
        let number = self.create_issue(login, repo, title, body)?;
        let r = self.repo_mut(repo)?;
        if let Some(i) = r.issues.get_mut(&number) {
            i.is_pull = true;
        }
        r.pulls.push(FPull {
            number,
            head: head.to_owned(),
            head_repo: head_repo.clone(),
            base: base.to_owned(),
            state: "open".into(),
            merged: false,
            reviews: Vec::new(),
            mergeable: true,
        });
        if let Some(fork) = &head_repo {
            self.mirror_pull_head(repo, number, fork, head);
        }
        self.workflow_run(repo, number, "pull_request", login);
        Ok(number)
    }

    pub(crate) fn add_comment(
        &mut self,
        actor: &str,
        issue: &IssueRef,
        body: &str,
    ) -> Result<FComment, Refusal> {
        self.issue(issue)?;
        let now = self.tick();
        let id = self.id();
        let comment = FComment {
            id,
            author: actor.to_owned(),
            body: body.to_owned(),
            created: now,
            updated: now,
        };
        let i = self.issue_mut(issue)?;
        i.comments.push(comment.clone());
        i.updated = now;
        i.timeline.push(FTimeline {
            id,
            kind: "comment".into(),
            actor: actor.to_owned(),
            label_id: None,
            body: body.to_owned(),
            created: now,
        });
        let kind = if self.issue(issue).is_ok_and(|i| i.is_pull) {
            "pull_request_comment"
        } else {
            "issue_comment"
        };
        self.emit(kind, "created", actor, issue, Some(&comment));
        Ok(comment)
    }

    pub(crate) fn edit_comment(
        &mut self,
        actor: &str,
        repo: &RepoName,
        id: u64,
        body: &str,
    ) -> Result<(FComment, u64), Refusal> {
        let now = self.tick();
        let r = self.repo_mut(repo)?;
        let (number, comment) = r
            .issues
            .values_mut()
            .find_map(|i| {
                i.comments
                    .iter_mut()
                    .find(|c| c.id == id)
                    .map(|c| (i.number, c))
            })
            .ok_or(Refusal::NotFound)?;
        if comment.author != actor {
            return Err(Refusal::Forbidden);
        }
        comment.body = body.to_owned();
        comment.updated = now;
        let comment = comment.clone();
        let issue = IssueRef::new(repo.clone(), number);
        if let Ok(i) = self.issue_mut(&issue) {
            i.updated = now;
        }
        self.emit("issue_comment", "edited", actor, &issue, Some(&comment));
        Ok((comment, number))
    }

    pub(crate) fn check_password(&self, login: &str, password: &str) -> Result<(), Refusal> {
        match self.passwords.get(login) {
            Some(p) if p == password => Ok(()),
            _ => Err(Refusal::Unauthorized),
        }
    }

    pub(crate) fn mint_token(
        &mut self,
        login: &str,
        password: &str,
        name: &str,
        scopes: Vec<String>,
        repos: Option<Vec<RepoName>>,
    ) -> Result<FToken, Refusal> {
        self.check_password(login, password)?;
        if name.is_empty()
            || self
                .user_tokens
                .iter()
                .any(|t| t.login == login && t.name == name)
        {
            return Err(Refusal::Unprocessable(format!(
                "access token name `{name}` is empty or taken"
            )));
        }
        let repos = if self.ignore_token_restrictions {
            None
        } else {
            repos
        };
        let id = self.id();
        let sha1 = format!("{:040x}", rand::random::<u128>());
        let token = FToken {
            id,
            name: name.to_owned(),
            sha1,
            login: login.to_owned(),
            scopes,
            repos,
        };
        self.user_tokens.push(token.clone());
        self.minted
            .push((token.login.clone(), token.name.clone(), token.sha1.clone()));
        Ok(token)
    }

    pub(crate) fn commits_ahead(
        &self,
        repo: &RepoName,
        base: &str,
        head: &str,
    ) -> Result<u64, Refusal> {
        let r = self.repo(repo)?;
        let head = r.branches.get(head).ok_or(Refusal::NotFound)?;
        // A base may be a branch or a commit (as Forgejo's compare accepts both): the history
        // of a commit is that of a branch holding it, up to it.
        let base: Vec<u64> = match r.branches.get(base) {
            Some(b) => b.clone(),
            None => {
                let id = r.commit_named(base).ok_or(Refusal::NotFound)?;
                let history = r
                    .branches
                    .values()
                    .find(|b| b.contains(&id))
                    .ok_or(Refusal::NotFound)?;
                let at = history.iter().position(|c| *c == id).unwrap_or(0);
                history[..=at].to_vec()
            }
        };
        Ok(head.iter().filter(|c| !base.contains(c)).count() as u64)
    }

    /// Hooks are managed by repository admins only.
    pub(super) fn hook_admin(
        &mut self,
        login: &str,
        repo: &RepoName,
    ) -> Result<&mut FRepo, Refusal> {
        if self.permission_of(repo, login) < Permission::Admin {
            return Err(if self.permission_of(repo, login) == Permission::None {
                Refusal::NotFound
            } else {
                Refusal::Forbidden
            });
        }
        self.repo_mut(repo)
    }

    pub(crate) fn list_hooks(
        &mut self,
        login: &str,
        repo: &RepoName,
    ) -> Result<Vec<FHook>, Refusal> {
        Ok(self.hook_admin(login, repo)?.hooks.clone())
    }

    /// As Forgejo: `active` defaults to false and `events` to `["push"]`.
    pub(crate) fn create_hook(
        &mut self,
        login: &str,
        repo: &RepoName,
        body: &Value,
    ) -> Result<FHook, Refusal> {
        let id = self.id();
        let config = &body["config"];
        let url = config["url"].as_str().unwrap_or_default().to_owned();
        let content_type = config["content_type"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if url.is_empty() || content_type.is_empty() {
            return Err(Refusal::Unprocessable(
                "Missing config option: url and content_type are required".into(),
            ));
        }
        let events: Vec<String> = match body["events"].as_array() {
            Some(list) => stored_events(list),
            None => vec!["push".to_owned()],
        };
        let hook = FHook {
            id,
            kind: body["type"].as_str().unwrap_or("forgejo").to_owned(),
            url,
            content_type,
            secret: config["secret"].as_str().unwrap_or_default().to_owned(),
            events,
            active: body["active"].as_bool().unwrap_or(false),
            authorization: body["authorization_header"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        };
        self.hook_admin(login, repo)?.hooks.push(hook.clone());
        Ok(hook)
    }

    /// PATCH: config keys, events and `active` as given; the secret stays as it was.
    pub(crate) fn edit_hook(
        &mut self,
        login: &str,
        repo: &RepoName,
        id: u64,
        body: &Value,
    ) -> Result<FHook, Refusal> {
        let r = self.hook_admin(login, repo)?;
        let h = r
            .hooks
            .iter_mut()
            .find(|h| h.id == id)
            .ok_or(Refusal::NotFound)?;
        if let Some(url) = body["config"]["url"].as_str() {
            h.url = url.to_owned();
        }
        if let Some(ct) = body["config"]["content_type"].as_str() {
            h.content_type = ct.to_owned();
        }
        if let Some(list) = body["events"].as_array() {
            h.events = stored_events(list);
        }
        if let Some(active) = body["active"].as_bool() {
            h.active = active;
        }
        if let Some(a) = body["authorization_header"].as_str() {
            h.authorization = a.to_owned();
        }
        Ok(h.clone())
    }

    pub(crate) fn delete_hook(
        &mut self,
        login: &str,
        repo: &RepoName,
        id: u64,
    ) -> Result<(), Refusal> {
        let r = self.hook_admin(login, repo)?;
        let before = r.hooks.len();
        r.hooks.retain(|h| h.id != id);
        if r.hooks.len() == before {
            return Err(Refusal::NotFound);
        }
        Ok(())
    }

    /// Queues the webhook Forgejo would send for a change.
    pub(super) fn emit(
        &mut self,
        event_type: &str,
        action: &str,
        sender: &str,
        issue: &IssueRef,
        comment: Option<&FComment>,
    ) {
        if self.webhook.is_none() {
            return;
        }
        let Ok(i) = self.issue(issue) else { return };
        let issue_json = server::issue_json(self, &issue.repo, i);
        let mut body = json!({
            "action": action,
            "number": issue.number,
            "issue": issue_json,
            "repository": server::repo_json(self, &issue.repo),
            "sender": server::user_json(self, sender),
        });
        if let Some(c) = comment {
            body["comment"] = server::comment_json(self, &issue.repo, issue.number, c);
            body["is_pull"] = json!(i.is_pull);
        }
        let body = serde_json::to_string_pretty(&body).unwrap_or_default();
        self.outbox.push(Outgoing {
            event_type: event_type.to_owned(),
            body,
        });
    }
}
