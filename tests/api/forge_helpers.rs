//! `ForgeApp`: the real app wired to a FakeForge served over HTTP, with webhooks from the fake
//! delivered to the app, as a Forgejo instance would.

use std::sync::Arc;

use director::domain::{IssueRef, RepoName};
use director::engine::scanner::{ScanReport, Scanner};
use director::forge::Permission;
use director::settings::Secret;
use director::store::IssueRecord;
use director_testkit::forge::{FakeForge, FakeServer};

use crate::helpers::{SECRET, TestApp};
use director_testkit::llm::FakeLlm;

pub const BOT: &str = "director-bot";
pub const BOT_TOKEN: &str = "bot-token-5f1e9a";
pub const WRITER: &str = "alice";
pub const READER: &str = "rita";
pub const TRIGGER: &str = "headless";

pub struct ForgeApp {
    pub app: TestApp,
    pub forge: FakeForge,
    server: FakeServer,
    pub repo: RepoName,
    scanner: Option<Arc<Scanner>>,
}

impl ForgeApp {
    pub async fn spawn() -> Self {
        Self::spawn_with(|_| {}).await
    }

    pub async fn spawn_with(configure: impl FnOnce(&mut director::settings::Settings)) -> Self {
        Self::spawn_overridden(configure, Default::default()).await
    }

    /// With a fake runtime or clock in place of the real one.
    pub async fn spawn_overridden(
        configure: impl FnOnce(&mut director::settings::Settings),
        overrides: director::startup::Overrides,
    ) -> Self {
        let forge = FakeForge::new();
        forge.add_account(BOT, BOT_TOKEN);
        let repo = forge.add_repo("acme/widgets");
        forge.grant(&repo, BOT, Permission::Admin);
        forge.grant(&repo, WRITER, Permission::Write);
        forge.add_user(READER);
        forge.define_label(&repo, TRIGGER);
        forge.define_label(&repo, "bug");
        let server = forge.serve().expect("fake forge serves");
        let url = server.url().to_owned();
        let (app, scanner) = TestApp::spawn_overridden(
            |s| {
                s.forge.url = url;
                s.forge.token = Secret::new(BOT_TOKEN);
                // Learned from GET /user, as in production.
                s.forge.bot_login = None;
                s.forge.max_attempts = 4;
                s.scan.repos = vec![repo.clone()];
                s.scan.enabled = false;
                // Picked-up issues wait in `pending` unless a test gives them a model.
                s.preflight.enabled = false;
                configure(s);
            },
            overrides,
        )
        .await;
        forge.set_webhook(&format!("{}/webhooks/forgejo", app.address), SECRET);
        let this = Self {
            app,
            forge,
            server,
            repo,
            scanner,
        };
        this.app
            .wait_for_metric(r#"director_forge_requests_total{endpoint="/user",status="200"} 1"#)
            .await;
        this
    }

    /// With a fake model server behind an OpenAI-compatible pre-flight.
    pub async fn spawn_with_llm(
        configure: impl FnOnce(&mut director::settings::Settings),
    ) -> (Self, FakeLlm) {
        Self::spawn_with_llm_overridden(configure, Default::default()).await
    }

    pub async fn spawn_with_llm_overridden(
        configure: impl FnOnce(&mut director::settings::Settings),
        overrides: director::startup::Overrides,
    ) -> (Self, FakeLlm) {
        let llm = FakeLlm::start();
        let url = format!("{}/v1", llm.url);
        let this = Self::spawn_overridden(
            |s| {
                s.preflight.enabled = true;
                s.preflight.provider = director::settings::Provider::Openai;
                s.preflight.base_url = url;
                s.preflight.model = "fake-model".into();
                s.preflight.api_key = Secret::new("llm-key-7c1d");
                s.preflight.retry_backoff_ms = 20;
                s.preflight.timeout_secs = 5;
                configure(s);
            },
            overrides,
        )
        .await;
        (this, llm)
    }

    pub fn forge_url(&self) -> String {
        self.server.url().to_owned()
    }

    /// The body of the director's one pre-flight comment on the issue.
    pub fn preflight_comment(&self, issue: &IssueRef) -> String {
        self.preflight_comments(issue)
            .pop()
            .map(|c| c.body)
            .expect("the pre-flight comment")
    }

    /// The director's pre-flight comments on the issue.
    pub fn preflight_comments(&self, issue: &IssueRef) -> Vec<director::forge::Comment> {
        self.forge
            .comments_on(issue)
            .into_iter()
            .filter(|c| c.body.starts_with("<!-- director:preflight"))
            .collect()
    }

    pub async fn scan(&self) -> ScanReport {
        let report = self
            .scanner
            .as_ref()
            .expect("a scanner")
            .scan_once()
            .await
            .expect("scan runs");
        self.app.wait_processed().await;
        report
    }

    pub async fn scan_incremental(&self) -> ScanReport {
        let report = self
            .scanner
            .as_ref()
            .expect("a scanner")
            .scan_incremental()
            .await
            .expect("scan runs");
        self.app.wait_processed().await;
        report
    }

    pub async fn record(&self, issue: &IssueRef) -> Option<IssueRecord> {
        self.app.store.issue(issue).await.expect("query")
    }

    pub fn assert_contract(&self) {
        let v = self.forge.contract_violations();
        assert!(
            v.is_empty(),
            "requests that do not fit Forgejo's API spec: {v:#?}"
        );
    }

    /// Calls received for a path ending in `suffix` with `method`.
    pub fn calls_to(&self, method: &str, suffix: &str) -> usize {
        self.forge
            .calls()
            .iter()
            .filter(|c| c.method == method && c.path.ends_with(suffix))
            .count()
    }
}
