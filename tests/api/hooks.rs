//! `director hooks install` and `director hooks check` against FakeForge over HTTP, every
//! request checked against Forgejo's API spec.

use director::domain::RepoName;
use director::forge::Permission;
use director_testkit::forge::{FakeForge, FakeServer};

use crate::forge_helpers::{BOT, BOT_TOKEN};

const PUBLIC_URL: &str = "https://director.example.org/webhooks/forgejo";
const FOREIGN_URL: &str = "https://ci.example.org/hook";
const HOOK_TOKEN: &str = "hook-token-77aa";

struct Setup {
    forge: FakeForge,
    server: FakeServer,
    widgets: RepoName,
    gadgets: RepoName,
    hammer: RepoName,
    locked: RepoName,
    dir: tempfile::TempDir,
}

fn setup() -> Setup {
    let forge = FakeForge::new();
    forge.add_account(BOT, BOT_TOKEN);
    let widgets = forge.add_repo("acme/widgets");
    let gadgets = forge.add_repo("acme/gadgets");
    let locked = forge.add_repo("acme/locked");
    let hammer = forge.add_org_repo("tools", "hammer");
    for r in [&widgets, &gadgets, &hammer] {
        forge.grant(r, BOT, Permission::Admin);
    }
    // The bot may write here but not manage hooks.
    forge.grant(&locked, BOT, Permission::Write);
    // gadgets: the director's hook switched off and missing events, and someone's CI hook.
    forge.add_hook(&gadgets, PUBLIC_URL, &["issues", "issue_comment"], false);
    forge.add_hook(&gadgets, FOREIGN_URL, &["push"], false);
    let server = forge.serve().expect("serves");
    Setup {
        forge,
        server,
        widgets,
        gadgets,
        hammer,
        locked,
        dir: tempfile::tempdir().expect("dir"),
    }
}

impl Setup {
    fn config(&self, public_url: &str, secrets: &[&str]) -> String {
        let path = self.dir.path().join("director.toml");
        let secrets: Vec<String> = secrets.iter().map(|s| format!("\"{s}\"")).collect();
        std::fs::write(
            &path,
            format!(
                "[store]\nurl = \"sqlite://{}/d.db\"\n[forge]\nurl = \"{}\"\ntoken = \"{BOT_TOKEN}\"\n[scan]\nrepos = [\"acme/widgets\", \"acme/gadgets\", \"acme/locked\"]\norgs = [\"tools\"]\n[webhook]\nsecrets = [{}]\npublic_url = \"{public_url}\"\nauthorization = \"{HOOK_TOKEN}\"\n",
                self.dir.path().display(),
                self.server.url(),
                secrets.join(", ")
            ),
        )
        .expect("config");
        path.display().to_string()
    }

    async fn director(&self, args: &[&str]) -> (Option<i32>, String, String) {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_director"))
            .args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .output()
            .await
            .expect("runs");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn writes_to_hooks(&self) -> usize {
        self.forge
            .calls()
            .iter()
            .filter(|c| c.method != "GET" && c.path.contains("/hooks"))
            .count()
    }
}

fn status_of(rows: &serde_json::Value, repo: &str) -> String {
    rows.as_array()
        .and_then(|a| a.iter().find(|r| r["repo"] == repo))
        .map(|r| r["status"].as_str().unwrap_or_default().to_owned())
        .unwrap_or_else(|| panic!("{repo} not reported: {rows}"))
}

#[tokio::test]
async fn install_creates_and_repairs_hooks_leaves_foreign_ones_alone_and_is_idempotent() {
    let s = setup();
    let config = s.config(PUBLIC_URL, &["first-secret-1234", "older-secret-5678"]);

    // Before: check reports what is missing and drifted, changes nothing, exits 1.
    let (code, out, err) = s
        .director(&["hooks", "check", "--json", "--config", &config])
        .await;
    assert_eq!(code, Some(1), "{out}{err}");
    let rows: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(status_of(&rows, "acme/widgets"), "missing");
    assert_eq!(status_of(&rows, "acme/gadgets"), "drifted");
    assert_eq!(status_of(&rows, "tools/hammer"), "missing");
    assert_eq!(status_of(&rows, "acme/locked"), "failed");
    assert_eq!(s.writes_to_hooks(), 0, "check writes nothing");

    // Install: created, repaired; the repository it may not manage is named, the rest done.
    let (code, out, err) = s.director(&["hooks", "install", "--config", &config]).await;
    assert_eq!(code, Some(1), "one repository failed: {out}{err}");
    assert!(
        out.contains("acme/locked") && out.contains("failed"),
        "{out}"
    );
    assert!(
        out.contains("acme/widgets") && out.contains("created"),
        "{out}"
    );
    assert!(
        out.contains("acme/gadgets") && out.contains("repaired"),
        "{out}"
    );
    for repo in [&s.widgets, &s.hammer] {
        let hooks = s.forge.hooks_of(repo);
        assert_eq!(hooks.len(), 1, "{repo}: {hooks:?}");
        let (_, url, events, active, secret) = &hooks[0];
        assert_eq!(url, PUBLIC_URL);
        assert!(*active);
        assert_eq!(secret, "first-secret-1234", "signed with the first secret");
        assert_eq!(
            s.forge.hook_authorization(repo, hooks[0].0).as_deref(),
            Some(format!("Bearer {HOOK_TOKEN}").as_str()),
            "deliveries prove themselves before their body is read"
        );
        for e in director::hooks::EVENTS {
            // As Forgejo 15 lists them: the review flag comes back as its three events.
            let listed = director::hooks::listed_as(e);
            let names: Vec<&str> = if listed.is_empty() {
                vec![*e]
            } else {
                listed.to_vec()
            };
            for name in names {
                assert!(
                    events.iter().any(|x| x == name),
                    "{repo}: {name} missing in {events:?}"
                );
            }
        }
    }
    let gadgets = s.forge.hooks_of(&s.gadgets);
    let ours = gadgets.iter().find(|h| h.1 == PUBLIC_URL).expect("ours");
    assert!(ours.3, "re-activated");
    assert!(
        ours.2.iter().any(|e| e == "pull_request_review_approved"),
        "{:?}",
        ours.2
    );
    let foreign = gadgets
        .iter()
        .find(|h| h.1 == FOREIGN_URL)
        .expect("foreign");
    assert_eq!(
        (foreign.2.clone(), foreign.3),
        (vec!["push".to_owned()], false),
        "untouched"
    );
    assert!(s.forge.hooks_of(&s.locked).is_empty());
    assert!(!out.contains("first-secret-1234") && !err.contains("first-secret-1234"));

    // A second install changes nothing; check now finds only the locked repository.
    let writes = s.writes_to_hooks();
    let (_, out, _) = s.director(&["hooks", "install", "--config", &config]).await;
    assert_eq!(s.writes_to_hooks(), writes, "idempotent: {out}");
    assert!(out.contains("acme/widgets") && out.contains("ok"), "{out}");
    assert!(
        !out.contains("repaired"),
        "a hook just installed is not drifted: {out}"
    );
    s.forge.grant(&s.locked, BOT, Permission::Admin);
    let (code, _, _) = s.director(&["hooks", "install", "--config", &config]).await;
    assert_eq!(code, Some(0));
    let (code, out, _) = s.director(&["hooks", "check", "--config", &config]).await;
    assert_eq!(code, Some(0), "{out}");

    // Someone switches a hook off by hand: check sees it, install repairs it.
    let id = s.forge.hooks_of(&s.widgets)[0].0;
    let resp = crate::helpers::http_client()
        .patch(format!(
            "{}/api/v1/repos/acme/widgets/hooks/{id}",
            s.server.url()
        ))
        .header("Authorization", format!("token {BOT_TOKEN}"))
        .json(&serde_json::json!({ "active": false }))
        .send()
        .await
        .expect("patch");
    assert_eq!(resp.status(), 200);
    let (code, out, _) = s.director(&["hooks", "check", "--config", &config]).await;
    assert_eq!(code, Some(1));
    assert!(out.contains("inactive"), "{out}");

    // Rotating the secret deletes and recreates the director's hooks, and says so.
    let rotated = s.config(PUBLIC_URL, &["new-secret-9999", "first-secret-1234"]);
    let (code, out, _) = s
        .director(&["hooks", "install", "--rotate-secret", "--config", &rotated])
        .await;
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("recreated"), "{out}");
    let hooks = s.forge.hooks_of(&s.widgets);
    assert_eq!(hooks.len(), 1);
    assert_eq!(hooks[0].4, "new-secret-9999");
    assert!(hooks[0].3);
    assert!(
        s.forge
            .hooks_of(&s.gadgets)
            .iter()
            .any(|h| h.1 == FOREIGN_URL)
    );
    assert!(
        s.forge.contract_violations().is_empty(),
        "{:?}",
        s.forge.contract_violations()
    );
}

#[tokio::test]
async fn hooks_without_a_public_url_exit_2_naming_the_key() {
    let s = setup();
    let config = s.config("", &["first-secret-1234"]);
    for verb in ["install", "check"] {
        let (code, _, err) = s.director(&["hooks", verb, "--config", &config]).await;
        assert_eq!(code, Some(2), "{verb}");
        assert!(err.contains("webhook.public_url"), "{verb}: {err}");
    }
    assert!(s.forge.calls().is_empty(), "nothing asked of the forge");
}

#[tokio::test]
async fn check_names_each_repository_where_a_writer_runner_would_run_workflows_unapproved() {
    // Runs push to the runner's fork (the default): a runner that can write to a watched
    // repository defeats Forgejo's approval gate there, so `hooks check` says so per
    // repository and exits 1; a reader's repository is fine.
    let s = setup();
    let config = s.config(PUBLIC_URL, &["first-secret-1234"]);
    let mut text = std::fs::read_to_string(&config).expect("config");
    text.push_str("[runner]\nimage = \"agent:1\"\negress = \"open\"\n");
    text = text.replace(
        "[forge]\n",
        "[forge]\nrunner_login = \"director-runner\"\nrunner_password = \"runner-pass\"\n",
    );
    std::fs::write(&config, text).expect("config");
    s.forge.add_user("director-runner");
    // The runner reads its own teams and fork with its password.
    s.forge.set_password("director-runner", "runner-pass");
    s.forge
        .grant(&s.widgets, "director-runner", Permission::Write);
    s.forge
        .grant(&s.gadgets, "director-runner", Permission::Read);
    s.forge.grant(&s.locked, BOT, Permission::Admin);
    // Install does what it can (the hooks), prints the runner's line, and succeeds.
    let (code, out, err) = s.director(&["hooks", "install", "--config", &config]).await;
    assert_eq!(code, Some(0), "{out} {err}");
    assert!(
        out.contains("has `write` permission on acme/widgets"),
        "{out}"
    );
    let (code, out, _) = s
        .director(&["hooks", "check", "--json", "--config", &config])
        .await;
    assert_eq!(code, Some(1), "{out}");
    let rows: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    let runner_of = |repo: &str| {
        rows.as_array()
            .and_then(|a| a.iter().find(|r| r["repo"] == repo))
            .map(|r| r["runner"].as_str().unwrap_or_default().to_owned())
            .unwrap_or_default()
    };
    let widgets = runner_of("acme/widgets");
    assert!(
        widgets.contains("has `write` permission on acme/widgets")
            && widgets.contains("runner.allow_writer_runner"),
        "{out}"
    );
    assert_eq!(runner_of("acme/gadgets"), "", "a reader is fine: {out}");
    let (_, text_out, _) = s.director(&["hooks", "check", "--config", &config]).await;
    assert!(
        text_out
            .lines()
            .any(|l| l.trim_start().starts_with("runner") && l.contains("acme/widgets")),
        "{text_out}"
    );
}
