//! GitHub behind the director's git gateway: the same push rules as on Forgejo, against
//! FakeGitHub's git smart HTTP (`git http-backend` behind GitHub's token rules), and a run
//! longer than an installation token's hour that keeps pushing.

use director::domain::Lifecycle;

use crate::fake_runs::env;
use crate::git_gateway::{Run, clone, commit, refused, stderr};
use crate::github::{GithubApp, REPO};
use director_testkit::github::FakeGitHub;

/// A director on GitHub with confined runs, its repository served over git and PR-only.
async fn setup(
    clock: Option<director::clock::SharedClock>,
    timeout_secs: u64,
) -> (GithubApp, tempfile::TempDir) {
    let t = GithubApp::spawn_timed(FakeGitHub::start().await, clock, |s| {
        s.runner.egress = director::settings::Egress::Allowlist;
        s.runner.egress_proxy_port = crate::helpers::free_port();
        s.runner.git_gateway_port = crate::helpers::free_port();
        s.runner.timeout_secs = timeout_secs;
        s.runner.idle_timeout_secs = 0;
    })
    .await;
    // Pull requests are required on the default branch (else no run starts).
    t.gh.ruleset(REPO, "active", 1, false);
    let root = tempfile::tempdir().expect("dir");
    t.gh.serve_git(REPO, root.path()).expect("git serves");
    (t, root)
}

/// A run of a new labelled issue that stays up until the test ends it.
async fn started(t: &GithubApp, title: &str) -> Run {
    let n = t.labelled(title, "mode: hang");
    let issue = t.issue(n);
    let current = || async {
        t.app
            .store
            .runs_of(&issue)
            .await
            .ok()
            .and_then(|runs| runs.last().map(|r| r.id.clone()))
            .filter(|id| t.runtime.starts(id) == 1)
    };
    crate::helpers::wait_until("the run starts", || async { current().await.is_some() }).await;
    let id = current().await.expect("a started run");
    let spec = t.runtime.spec_of(&id).expect("the run's spec");
    Run {
        id,
        issue,
        env: spec.env.clone(),
        home: tempfile::tempdir().expect("dir"),
    }
}

/// The git pushes that reached FakeGitHub (not the advertisements).
fn pushes_received(t: &GithubApp) -> usize {
    t.gh.requests()
        .iter()
        .filter(|r| r.method == "POST" && r.path.ends_with("/git-receive-pack"))
        .count()
}

#[tokio::test]
async fn on_github_a_confined_run_pushes_only_its_own_branch_and_ends_in_a_pr() {
    let (t, _root) = setup(None, 600).await;
    let run = started(&t, "Add --verbose").await;
    let branch = run.var("DIRECTOR_BRANCH").to_owned();

    // No value the run holds is a credential GitHub takes, for the API or for git.
    assert!(run.var("DIRECTOR_TOKEN").is_empty(), "no token in the run");
    let client = crate::helpers::http_client();
    for (k, v) in &run.env {
        let api = client
            .get(format!("{}/repos/{REPO}", t.gh.url))
            .header("Authorization", format!("Bearer {v}"))
            .send()
            .await
            .expect("answered");
        assert_eq!(api.status(), 401, "GitHub's API takes {k}");
        let git = client
            .get(format!(
                "{}/{REPO}.git/info/refs?service=git-receive-pack",
                t.gh.site()
            ))
            .basic_auth("x-access-token", Some(v))
            .send()
            .await
            .expect("answered");
        assert_eq!(git.status(), 401, "GitHub's git takes {k}");
    }

    // Clone, commit and push its branch: through the gateway, to GitHub.
    let work = clone(&run).await;
    let w = work.path().join("w");
    commit(&run, &w, "agent.txt", "agent work\n").await;
    run.ok(&w, &["push", "-q", "origin", &format!("HEAD:{branch}")])
        .await;
    assert_eq!(
        t.gh.git_show(REPO, &branch, "agent.txt").as_deref(),
        Some("agent work")
    );
    let main = t.gh.branch_head(REPO, "main");
    let own = t.gh.branch_head(REPO, &branch);
    assert_eq!(pushes_received(&t), 1);

    // Everything else is refused by the gateway in git's words; GitHub never sees it.
    for (target, refname, why) in [
        ("HEAD:other", "other", "a run pushes only"),
        ("HEAD:main", "main", "a run pushes only"),
    ] {
        refused(&run, &w, &["push", "origin", target], refname, why).await;
    }
    run.ok(&w, &["tag", "v1"]).await;
    refused(
        &run,
        &w,
        &["push", "origin", "v1"],
        "v1",
        "tags are not pushed",
    )
    .await;
    refused(
        &run,
        &w,
        &["push", "origin", &format!(":{branch}")],
        &branch,
        "deleting is not allowed",
    )
    .await;
    commit(&run, &w, ".github/workflows/x.yml", "on: push\n").await;
    refused(
        &run,
        &w,
        &["push", "origin", &format!("HEAD:{branch}")],
        &branch,
        "changes .github/workflows/x.yml, which runs may not change",
    )
    .await;
    assert_eq!(pushes_received(&t), 1, "no refused push reached GitHub");
    assert_eq!(t.gh.branch_head(REPO, "main"), main);
    assert_eq!(t.gh.branch_head(REPO, &branch), own);
    assert!(t.gh.branch_head(REPO, "other").is_none());

    // The run ends well: the director opens the pull request from what git pushed.
    t.runtime.exit(&run.id, 0, "done");
    t.app.wait_state(&run.issue, Lifecycle::Succeeded).await;
    let pulls = t.gh.pulls(REPO);
    assert_eq!(pulls.len(), 1, "{pulls:?}");
    assert_eq!(
        (pulls[0].1.as_str(), pulls[0].2.as_str()),
        (branch.as_str(), "main")
    );
    let report =
        t.gh.comments(REPO, run.issue.number)
            .into_iter()
            .map(|(_, b)| b)
            .find(|b| b.contains("<!-- director:run "))
            .expect("a report");
    assert!(report.contains("Pushes refused"), "{report}");
    assert!(report.contains(".github/workflows/x.yml"), "{report}");

    // Its credential opens nothing any more, and its token is revoked.
    let out = run.git(&w, &["ls-remote", "origin"]).await;
    assert!(
        !out.status.success(),
        "an ended run's credential is refused"
    );
    assert!(stderr(&out).contains("403"), "{}", stderr(&out));
    let tokens: Vec<_> =
        t.gh.tokens()
            .into_iter()
            .filter(|k| k.repositories.is_some())
            .collect();
    assert_eq!(tokens.len(), 1);
    assert!(tokens[0].revoked, "revoked when the run ended");
    t.assert_contract();
}

#[tokio::test]
async fn a_run_longer_than_a_token_hour_keeps_pushing_on_a_renewed_token() {
    let clock = director::clock::ManualClock::new(director::clock::now_ms());
    // Three hours: longer than an installation token lives.
    let (t, _root) = setup(Some(clock.clone()), 3 * 3600).await;
    let run = started(&t, "Take the afternoon").await;
    let branch = run.var("DIRECTOR_BRANCH").to_owned();
    assert!(run.var("DIRECTOR_TOKEN").is_empty(), "no token in the run");
    let run_tokens = || {
        t.gh.tokens()
            .into_iter()
            .filter(|k| k.repositories.is_some())
            .collect::<Vec<_>>()
    };
    let kept = || async { t.app.store.run_token(&run.id).await.expect("store") };
    let (first, minted) = kept().await.expect("the run's token is kept, sealed");

    let work = clone(&run).await;
    let w = work.path().join("w");
    commit(&run, &w, "one.txt", "one\n").await;
    run.ok(&w, &["push", "-q", "origin", &format!("HEAD:{branch}")])
        .await;
    assert_eq!(kept().await, Some((first.clone(), minted)), "not due yet");
    assert_eq!(run_tokens().len(), 1);

    // Fifty-one minutes on, for the director and GitHub alike: the gateway renews the token
    // before it forwards, revokes the old one, and the push goes through on the new one.
    let advance = |minutes: i64| {
        clock.advance(minutes * 60 * 1000);
        t.gh.advance(std::time::Duration::from_secs(minutes.unsigned_abs() * 60));
    };
    advance(51);
    commit(&run, &w, "two.txt", "two\n").await;
    run.ok(&w, &["push", "-q", "origin", &format!("HEAD:{branch}")])
        .await;
    assert_eq!(
        t.gh.git_show(REPO, &branch, "two.txt").as_deref(),
        Some("two")
    );
    let (second, renewed) = kept().await.expect("kept");
    assert_ne!(second, first);
    assert!(renewed > minted);
    let tokens = run_tokens();
    assert_eq!(tokens.len(), 2, "{tokens:?}");
    assert!(tokens[0].revoked, "the old token is revoked");
    assert!(!tokens[1].revoked, "the new one is live");
    assert_eq!(tokens[1].repositories, Some(vec![REPO.to_owned()]));
    // The last git requests GitHub saw carried the new token.
    let last =
        t.gh.requests()
            .into_iter()
            .rev()
            .find(|r| r.path.contains(".git/"));
    assert!(
        last.is_some_and(|r| r.auth.starts_with("token:")),
        "GitHub took the renewed token"
    );

    // Another hour on, past the second token's expiry too: a third push, renewed again
    // first, still lands.
    advance(61);
    commit(&run, &w, "three.txt", "three\n").await;
    run.ok(&w, &["push", "-q", "origin", &format!("HEAD:{branch}")])
        .await;
    assert_eq!(run_tokens().len(), 3);
    // The second token expired before it could be revoked (GitHub takes a token's own
    // DELETE only while it lives): one token is live, the newest.
    let fake_now = chrono::Utc::now() + chrono::Duration::minutes(112);
    let live: Vec<_> = run_tokens()
        .into_iter()
        .filter(|k| !k.revoked && k.expires_at > fake_now)
        .collect();
    assert_eq!(live.len(), 1, "{live:?}");
    assert_eq!(
        run_tokens().last().map(|k| k.value.clone()),
        Some(live[0].value.clone())
    );
    assert_eq!(
        t.gh.git_show(REPO, &branch, "three.txt").as_deref(),
        Some("three")
    );
    assert!(env(&t.runtime.spec_of(&run.id).expect("spec"), "DIRECTOR_TOKEN").is_empty());
    t.assert_contract();
}
