//! What a test arranges in the fake forge and reads back from it, and its webhooks.

use std::collections::{BTreeMap, HashMap};
use std::sync::MutexGuard;

use director::domain::{IssueRef, RepoName};
use director::forge::{Comment, Permission};

use super::*;

impl FakeForge {
    pub fn new() -> Self {
        let forge = Self::default();
        forge.state().now = EPOCH;
        forge
    }

    /// The client webhooks are sent with. It keeps no idle connection: a forge made under
    /// one test's runtime may deliver under another's.
    fn webhook_client(&self) -> reqwest::Client {
        self.webhooks
            .get_or_init(|| {
                reqwest::Client::builder()
                    .pool_max_idle_per_host(0)
                    .build()
                    .unwrap_or_default()
            })
            .clone()
    }

    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        // A test that panicked while holding the lock has failed already; keep the data.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers an account and the API token that authenticates as it.
    pub fn add_account(&self, login: &str, token: &str) {
        let mut s = self.state();
        s.ensure_user(login);
        s.tokens.insert(token.to_owned(), login.to_owned());
    }

    pub fn add_user(&self, login: &str) {
        self.state().ensure_user(login);
    }

    /// A repository with branch `main`, owned by its owner (user or organisation).
    pub fn add_repo(&self, repo: &str) -> RepoName {
        let name: RepoName = repo
            .parse()
            .unwrap_or_else(|e| panic!("test repo {repo}: {e}"));
        let mut s = self.state();
        s.ensure_user(name.owner());
        let id = s.id();
        let commit = s.id();
        s.repos.entry(name.clone()).or_insert_with(|| FRepo {
            id,
            name: name.clone(),
            default_branch: "main".into(),
            branches: BTreeMap::from([("main".to_owned(), vec![commit])]),
            protect_default: true,
            merge_default: false,
            pulls: Vec::new(),
            labels: Vec::new(),
            issues: BTreeMap::new(),
            permissions: HashMap::new(),
            next_number: 1,
            git: None,
            trees: HashMap::new(),
            private: false,
            hooks: Vec::new(),
            statuses: HashMap::new(),
            merges: Vec::new(),
            fork_of: None,
            pull_heads: BTreeMap::new(),
            actions: false,
            action_runs: Vec::new(),
            trusted_posters: Default::default(),
            messages: HashMap::new(),
            parents: HashMap::new(),
        });
        name
    }

    /// Sets an owner's visibility as Forgejo names it (`public`, `limited`, `private`).
    pub fn set_owner_visibility(&self, owner: &str, visibility: &str) {
        let mut s = self.state();
        let owner = owner.to_ascii_lowercase();
        if visibility == "public" {
            s.hidden_owners.remove(&owner);
        } else {
            s.hidden_owners.insert(owner);
        }
    }

    /// Makes a repository private (visible to those granted access only).
    pub fn make_private(&self, repo: &RepoName) {
        if let Some(r) = self.state().repos.get_mut(repo) {
            r.private = true;
        }
    }

    /// Whether a repository is private.
    pub fn is_private(&self, repo: &RepoName) -> bool {
        self.state().repos.get(repo).is_some_and(|r| r.private)
    }

    /// A webhook on `repo` set up by hand (as someone clicking through Forgejo's form would);
    /// returns its id.
    pub fn add_hook(&self, repo: &RepoName, url: &str, events: &[&str], active: bool) -> u64 {
        let mut s = self.state();
        let id = s.id();
        if let Some(r) = s.repos.get_mut(repo) {
            r.hooks.push(FHook {
                id,
                kind: "forgejo".into(),
                url: url.to_owned(),
                content_type: "json".into(),
                secret: String::new(),
                events: events.iter().map(|e| (*e).to_owned()).collect(),
                active,
                authorization: String::new(),
            });
        }
        id
    }

    /// The `Authorization` header the hook `id` of `repo` sends.
    pub fn hook_authorization(&self, repo: &RepoName, id: u64) -> Option<String> {
        let s = self.state();
        let r = s.repo(repo).ok()?;
        r.hooks
            .iter()
            .find(|h| h.id == id)
            .map(|h| h.authorization.clone())
    }

    /// The hooks of `repo`: (id, url, events, active, secret).
    pub fn hooks_of(&self, repo: &RepoName) -> Vec<(u64, String, Vec<String>, bool, String)> {
        self.state()
            .repos
            .get(repo)
            .map(|r| {
                r.hooks
                    .iter()
                    .map(|h| {
                        (
                            h.id,
                            h.url.clone(),
                            h.events.clone(),
                            h.active,
                            h.secret.clone(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// A repository that belongs to organisation `org` (listed by `GET /orgs/{org}/repos`).
    pub fn add_org_repo(&self, org: &str, name: &str) -> RepoName {
        let repo = self.add_repo(&format!("{org}/{name}"));
        self.state()
            .orgs
            .entry(org.to_owned())
            .or_default()
            .push(repo.clone());
        repo
    }

    pub fn define_label(&self, repo: &RepoName, name: &str) -> u64 {
        let mut s = self.state();
        match s.label_by_name(repo, name) {
            Ok(l) => l.id,
            Err(_) => s
                .create_label(repo, name, "#e11d21", "")
                .map(|l| l.id)
                .unwrap_or_default(),
        }
    }

    pub fn grant(&self, repo: &RepoName, login: &str, permission: Permission) {
        let mut s = self.state();
        s.ensure_user(login);
        if let Ok(r) = s.repo_mut(repo) {
            r.permissions.insert(login.to_owned(), permission);
        }
    }

    /// Gives an account a password (Basic auth: the only way to mint, list and delete its tokens).
    pub fn set_password(&self, login: &str, password: &str) {
        let mut s = self.state();
        s.ensure_user(login);
        s.passwords.insert(login.to_owned(), password.to_owned());
    }

    /// Lets writers push to the default branch (an unprotected repository).
    /// The default branch stays protected against pushes but lets writers merge into it.
    pub fn allow_merge_into_default_branch(&self, repo: &RepoName) {
        if let Ok(r) = self.state().repo_mut(repo) {
            r.merge_default = true;
        }
    }

    /// Behave like a Forgejo older than 15: accept a repository restriction when minting a
    /// token, ignore it, and answer without it.
    pub fn ignore_token_restrictions(&self) {
        self.state().ignore_token_restrictions = true;
    }

    pub fn unprotect_default_branch(&self, repo: &RepoName) {
        if let Ok(r) = self.state().repo_mut(repo) {
            r.protect_default = false;
        }
    }

    /// Tokens of `login`: (name, restricted repositories, scopes).
    pub fn tokens_of(&self, login: &str) -> Vec<(String, Option<Vec<String>>, Vec<String>)> {
        self.state()
            .user_tokens
            .iter()
            .filter(|t| t.login == login)
            .map(|t| {
                (
                    t.name.clone(),
                    t.repos
                        .as_ref()
                        .map(|r| r.iter().map(|r| r.to_string()).collect()),
                    t.scopes.clone(),
                )
            })
            .collect()
    }

    /// Every token ever minted: (login, name, value).
    pub fn minted_tokens(&self) -> Vec<(String, String, String)> {
        self.state().minted.clone()
    }

    /// Branch names of a repository.
    pub fn branches_of(&self, repo: &RepoName) -> Vec<String> {
        self.state()
            .repo(repo)
            .map(|r| r.branches.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// Open pull requests of a repository: (number, head, base, title, body).
    pub fn pulls_of(&self, repo: &RepoName) -> Vec<(u64, String, String, String, String)> {
        let s = self.state();
        let Ok(r) = s.repo(repo) else {
            return Vec::new();
        };
        r.pulls
            .iter()
            .filter_map(|p| {
                let i = r.issues.get(&p.number)?;
                Some((
                    p.number,
                    p.head.clone(),
                    p.base.clone(),
                    i.title.clone(),
                    i.body.clone(),
                ))
            })
            .collect()
    }

    /// Where webhooks go, signed with `secret`. Until set, changes send nothing.
    pub fn set_webhook(&self, url: &str, secret: &str) {
        self.state().webhook = Some(Webhook {
            url: url.to_owned(),
            secret: secret.to_owned(),
            enabled: true,
            held: false,
        });
    }

    /// With webhooks off, changes happen but their deliveries are lost (the receiver was down:
    /// Forgejo never retries).
    pub fn webhooks_enabled(&self, enabled: bool) {
        if let Some(w) = self.state().webhook.as_mut() {
            w.enabled = enabled;
        }
    }

    /// While held, webhooks queue up instead of being sent; [`FakeForge::take_webhooks`]
    /// hands them to the test to deliver in any order, any number of times.
    pub fn hold_webhooks(&self, held: bool) {
        if let Some(w) = self.state().webhook.as_mut() {
            w.held = held;
        }
    }

    pub fn take_webhooks(&self) -> Vec<Outgoing> {
        std::mem::take(&mut self.state().outbox)
    }

    /// Sends one webhook as Forgejo would (a fresh delivery id each time, like *Replay*).
    pub async fn send_webhook(&self, out: &Outgoing) -> u16 {
        let target = self
            .state()
            .webhook
            .as_ref()
            .map(|w| (w.url.clone(), w.secret.clone()));
        match target {
            Some((url, secret)) => send_webhook(&self.webhook_client(), &url, &secret, out).await,
            None => 0,
        }
    }

    /// Sends one delivery, under one delivery id, to each of `urls` at once (a load balancer
    /// that retried it on every replica); returns their statuses.
    pub async fn send_webhook_to_all(&self, urls: &[String], out: &Outgoing) -> Vec<u16> {
        let secret = self
            .state()
            .webhook
            .as_ref()
            .map(|w| w.secret.clone())
            .unwrap_or_default();
        let delivery = format!("{:032x}", rand::random::<u128>());
        let client = self.webhook_client();
        let sends = urls
            .iter()
            .map(|url| send_delivery(&client, url, &secret, out, &delivery));
        futures_util::future::join_all(sends).await
    }

    /// Sends every queued webhook, in order, and returns the HTTP statuses.
    pub async fn deliver_webhooks(&self) -> Vec<u16> {
        let (target, outbox) = {
            let mut s = self.state();
            if s.webhook.as_ref().is_some_and(|w| w.held) {
                return Vec::new();
            }
            let outbox = std::mem::take(&mut s.outbox);
            match &s.webhook {
                Some(w) if w.enabled => (Some((w.url.clone(), w.secret.clone())), outbox),
                _ => (None, outbox),
            }
        };
        let Some((url, secret)) = target else {
            return Vec::new();
        };
        let client = self.webhook_client();
        let mut statuses = Vec::new();
        for out in outbox {
            statuses.push(send_webhook(&client, &url, &secret, &out).await);
        }
        statuses
    }

    /// A new issue by `author`; returns its reference.
    pub async fn open_issue(
        &self,
        repo: &RepoName,
        author: &str,
        title: &str,
        body: &str,
    ) -> IssueRef {
        let number = {
            let mut s = self.state();
            s.ensure_user(author);
            s.create_issue(author, repo, title, body)
                .unwrap_or_else(|_| panic!("no repo {repo}"))
        };
        self.deliver_webhooks().await;
        IssueRef::new(repo.clone(), number)
    }

    /// The issues of a repository (title, body, author), oldest first.
    /// The issue's `updated_at`, as the API shows it.
    pub fn issue_updated_at(&self, issue: &IssueRef) -> Option<String> {
        self.state().issue(issue).ok().map(|i| rfc3339(i.updated))
    }

    pub fn issues_in(&self, repo: &RepoName) -> Vec<(u64, String, String, String)> {
        let s = self.state();
        s.repo(repo)
            .map(|r| {
                r.issues
                    .values()
                    .map(|i| (i.number, i.title.clone(), i.body.clone(), i.author.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// `actor` applies a label in the web UI.
    pub async fn label(&self, actor: &str, issue: &IssueRef, name: &str) {
        self.set_label(actor, issue, name, true).await;
    }

    /// `actor` removes a label in the web UI.
    pub async fn unlabel(&self, actor: &str, issue: &IssueRef, name: &str) {
        self.set_label(actor, issue, name, false).await;
    }

    async fn set_label(&self, actor: &str, issue: &IssueRef, name: &str, add: bool) {
        {
            let mut s = self.state();
            s.ensure_user(actor);
            let label = s
                .label_by_name(&issue.repo, name)
                .unwrap_or_else(|e| panic!("{e:?}"));
            s.change_label(actor, issue, label.id, add)
                .unwrap_or_else(|e| panic!("{e:?}"));
        }
        self.deliver_webhooks().await;
    }

    pub async fn comment(&self, actor: &str, issue: &IssueRef, body: &str) -> u64 {
        let id = {
            let mut s = self.state();
            s.ensure_user(actor);
            s.add_comment(actor, issue, body)
                .map(|c| c.id)
                .unwrap_or_else(|e| panic!("{e:?}"))
        };
        self.deliver_webhooks().await;
        id
    }

    pub async fn set_state(&self, actor: &str, issue: &IssueRef, state: &str) {
        {
            let mut s = self.state();
            let now = s.tick();
            let i = s.issue_mut(issue).unwrap_or_else(|e| panic!("{e:?}"));
            i.state = state.to_owned();
            i.updated = now;
            let action = if state == "closed" {
                "closed"
            } else {
                "reopened"
            };
            s.emit("issues", action, actor, issue, None);
        }
        self.deliver_webhooks().await;
    }

    /// `actor` edits their own comment `id` on `issue` (its `updated_at` moves on).
    pub async fn edit_comment(&self, actor: &str, issue: &IssueRef, id: u64, body: &str) {
        self.state()
            .edit_comment(actor, &issue.repo, id, body)
            .unwrap_or_else(|e| panic!("{e:?}"));
        self.deliver_webhooks().await;
    }

    /// `actor` edits the issue's body (Forgejo lets its author and writers do so).
    pub async fn edit_body(&self, actor: &str, issue: &IssueRef, body: &str) {
        {
            let mut s = self.state();
            let now = s.tick();
            let i = s.issue_mut(issue).unwrap_or_else(|e| panic!("{e:?}"));
            i.body = body.to_owned();
            i.updated = now;
            s.emit("issues", "edited", actor, issue, None);
        }
        self.deliver_webhooks().await;
    }

    /// The issue's comments, oldest first.
    pub fn comments_on(&self, issue: &IssueRef) -> Vec<Comment> {
        let s = self.state();
        s.issue(issue)
            .map(|i| i.comments.iter().map(to_comment).collect())
            .unwrap_or_default()
    }

    /// The bodies of the comments on `issue` (or a pull request) that contain `text`.
    pub fn comments_saying(&self, issue: &IssueRef, text: &str) -> Vec<String> {
        self.comments_on(issue)
            .into_iter()
            .map(|c| c.body)
            .filter(|b| b.contains(text))
            .collect()
    }

    pub fn labels_on(&self, issue: &IssueRef) -> Vec<String> {
        let s = self.state();
        let Ok(i) = s.issue(issue) else {
            return Vec::new();
        };
        let Ok(r) = s.repo(&issue.repo) else {
            return Vec::new();
        };
        i.labels
            .iter()
            .filter_map(|id| {
                r.labels
                    .iter()
                    .find(|l| l.id == *id)
                    .map(|l| l.name.clone())
            })
            .collect()
    }

    /// Every API call received so far.
    pub fn calls(&self) -> Vec<Call> {
        self.state().calls.clone()
    }

    /// The first call received that `wanted` accepts, waiting for it up to `within`: woken
    /// by each call as it is recorded, never by a timer.
    pub async fn first_call(
        &self,
        wanted: impl Fn(&Call) -> bool,
        within: std::time::Duration,
    ) -> Option<Call> {
        let deadline = tokio::time::Instant::now() + within;
        // Subscribed before looking: a call recorded after the look wakes the wait below.
        let mut recorded = self.state().called.subscribe();
        loop {
            if let Some(call) = self.state().calls.iter().find(|c| wanted(c)) {
                return Some(call.clone());
            }
            match tokio::time::timeout_at(deadline, recorded.changed()).await {
                Ok(Ok(())) => {}
                _ => return None,
            }
        }
    }

    pub fn clear_calls(&self) {
        self.state().calls.clear();
    }

    /// The next API requests are answered with these statuses instead, one each.
    /// The next git pushes fail with these statuses, before anything reaches the repository
    /// (a forge that fails mid-push).
    pub fn fail_pushes(&self, statuses: &[u16]) {
        self.state().fail_pushes.extend(statuses.iter().copied());
    }

    /// Fails the next requests whose path holds `part`, one per status, whatever comes
    /// between them.
    pub fn fail_path(&self, part: &str, statuses: &[u16]) {
        self.state()
            .fail_paths
            .extend(statuses.iter().map(|s| (part.to_owned(), *s)));
    }

    /// The next `method` request whose path holds `part` is applied, and then answered with
    /// `status` (a 502 or 504 from a proxy that gave up after the forge wrote), once.
    pub fn answer_after_applying(&self, method: &str, part: &str, status: u16) {
        self.state()
            .answer_after_applying
            .push((method.to_owned(), part.to_owned(), status));
    }

    /// How many of the answers planned by `answer_after_applying` are still to be given.
    pub fn answers_after_applying_left(&self) -> usize {
        self.state().answer_after_applying.len()
    }

    pub fn fail_next(&self, statuses: &[u16]) {
        self.state().fail_next.extend(statuses.iter().copied());
    }

    /// Failures queued by `fail_next` and not yet served are dropped: the forge is well again.
    pub fn heal(&self) {
        self.state().fail_next.clear();
    }

    /// Requests that did not fit Forgejo's API spec.
    pub fn contract_violations(&self) -> Vec<String> {
        self.state().violations.clone()
    }

    /// Requests that did not fit Forgejo's API spec, forgotten here: a test that makes such
    /// requests on purpose takes them, so that dropping the server does not fail it.
    pub fn take_contract_violations(&self) -> Vec<String> {
        std::mem::take(&mut self.state().violations)
    }

    /// Serves the API over HTTP on a random loopback port.
    pub fn serve(&self) -> std::io::Result<FakeServer> {
        server::start(self.clone())
    }
}

async fn send_webhook(client: &reqwest::Client, url: &str, secret: &str, out: &Outgoing) -> u16 {
    let delivery = format!("{:032x}", rand::random::<u128>());
    send_delivery(client, url, secret, out, &delivery).await
}

async fn send_delivery(
    client: &reqwest::Client,
    url: &str,
    secret: &str,
    out: &Outgoing,
    delivery: &str,
) -> u16 {
    let sig = director::forge::signature::sign(secret, out.body.as_bytes());
    let (family, _) = out
        .event_type
        .split_once('_')
        .unwrap_or((&out.event_type, ""));
    let event = if family == "issue" && out.event_type == "issue_comment" {
        "issue_comment"
    } else if family == "issue" {
        "issues"
    } else {
        family
    };
    client
        .post(url)
        .header("Content-Type", "application/json")
        .header("X-Forgejo-Delivery", delivery)
        .header("X-Gitea-Delivery", delivery)
        .header("X-Forgejo-Event", event)
        .header("X-Gitea-Event", event)
        .header("X-Forgejo-Event-Type", &out.event_type)
        .header("X-Gitea-Event-Type", &out.event_type)
        .header("X-Forgejo-Signature", &sig)
        .header("X-Gitea-Signature", &sig)
        .header("X-Hub-Signature-256", format!("sha256={sig}"))
        .body(out.body.clone())
        .send()
        .await
        .map(|r| r.status().as_u16())
        .unwrap_or(0)
}
