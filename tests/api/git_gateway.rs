//! The git gateway, as a confined run uses it and as an attacker inside one would: the real
//! `git` of this machine, with nothing but the environment the director gives the run,
//! against FakeForge's smart HTTP (`git http-backend`) through the director's gateway.
//! (The same from inside a container on the real Docker engine is in `egress`.)

use director::domain::RunId;
use std::path::Path;
use std::process::{Command, Output};

use director::domain::{IssueRef, Lifecycle};
use director_testkit::runtime::FakeRuntime;

use crate::fake_runs::{labelled, run_ids};
use crate::forge_helpers::{ForgeApp, TRIGGER, WRITER};

struct Setup {
    t: ForgeApp,
    fake: FakeRuntime,
    gateway: u16,
    _llm: director_testkit::llm::FakeLlm,
    _git: tempfile::TempDir,
}

async fn setup(configure: impl FnOnce(&mut director::settings::Settings)) -> Setup {
    let gateway = crate::helpers::free_port();
    let proxy = crate::helpers::free_port();
    let (t, llm, fake) = crate::fake_runs::spawn(|s| {
        s.runner.egress = director::settings::Egress::Allowlist;
        s.runner.egress_proxy_port = proxy;
        s.runner.git_gateway_port = gateway;
        s.runner.max_per_repo = 2;
        configure(s);
    })
    .await;
    let root = tempfile::tempdir().expect("dir");
    t.forge.serve_git(&t.repo, root.path()).expect("git serves");
    Setup {
        t,
        fake,
        gateway,
        _llm: llm,
        _git: root,
    }
}

/// A run that stays up, and the environment it was given.
pub(crate) struct Run {
    pub(crate) id: RunId,
    pub(crate) issue: IssueRef,
    pub(crate) env: Vec<(String, String)>,
    pub(crate) home: tempfile::TempDir,
}

impl Run {
    pub(crate) fn var(&self, name: &str) -> &str {
        self.env
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .unwrap_or_default()
    }

    /// git with the run's environment and nothing else (its own empty home), on a blocking
    /// thread: the director in this process goes on serving it meanwhile.
    pub(crate) async fn git(&self, dir: &Path, args: &[&str]) -> Output {
        let mut cmd = Command::new("git");
        cmd.current_dir(dir)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("GIT_CONFIG_NOSYSTEM", "1");
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd.env("HOME", self.home.path());
        cmd.args(args);
        tokio::task::spawn_blocking(move || cmd.output())
            .await
            .expect("joined")
            .expect("git runs")
    }

    pub(crate) async fn ok(&self, dir: &Path, args: &[&str]) {
        let out = self.git(dir, args).await;
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    }
}

pub(crate) fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

async fn started(s: &Setup, title: &str) -> Run {
    let issue = labelled(&s.t, title, "mode: hang").await;
    run_started(s, issue, None).await
}

/// The newest run of `issue` once it started (one other than `not`), and what it was given.
async fn run_started(s: &Setup, issue: IssueRef, not: Option<&RunId>) -> Run {
    let current = || async {
        run_ids(&s.t, &issue)
            .await
            .pop()
            .filter(|id| Some(id) != not && s.fake.starts(id) == 1)
    };
    crate::helpers::wait_until("the run starts", || async { current().await.is_some() }).await;
    let id = current().await.expect("a started run");
    let spec = s.fake.spec_of(&id).expect("the run's spec");
    Run {
        id,
        issue,
        env: spec.env.clone(),
        home: tempfile::tempdir().expect("dir"),
    }
}

/// Clones the run's repository into a fresh directory.
pub(crate) async fn clone(run: &Run) -> tempfile::TempDir {
    let work = tempfile::tempdir().expect("dir");
    run.ok(
        work.path(),
        &["clone", "-q", run.var("DIRECTOR_CLONE_URL"), "w"],
    )
    .await;
    work
}

pub(crate) async fn commit(run: &Run, w: &Path, path: &str, text: &str) {
    let file = w.join(path);
    std::fs::create_dir_all(file.parent().expect("a parent")).expect("dirs");
    std::fs::write(&file, text).expect("write");
    run.ok(w, &["add", path]).await;
    run.ok(w, &["commit", "-q", "-m", &format!("add {path}")])
        .await;
}

/// Pushes and expects git's own refusal of `refname`, naming `why`.
pub(crate) async fn refused(run: &Run, w: &Path, args: &[&str], refname: &str, why: &str) {
    let out = run.git(w, args).await;
    let err = stderr(&out);
    assert!(!out.status.success(), "{args:?} must fail: {err}");
    assert!(err.contains("[remote rejected]"), "{args:?}: {err}");
    assert!(
        err.contains(refname) && err.contains(why),
        "{args:?}: {err}"
    );
}

#[tokio::test]
async fn a_confined_run_holds_no_forge_credential_and_pushes_only_its_own_branch() {
    let s = setup(|_| {}).await;
    let run = started(&s, "Add --verbose").await;
    let branch = run.var("DIRECTOR_BRANCH").to_owned();

    // Nothing in the run's environment is a forge credential: FakeForge is asked about each
    // value, and none is a token it minted.
    for k in ["DIRECTOR_TOKEN", "DIRECTOR_API_URL"] {
        assert!(run.var(k).is_empty(), "{k} left the run contract");
    }
    let minted: Vec<String> = s.t.forge.minted_tokens().into_iter().map(|m| m.2).collect();
    assert!(!minted.is_empty(), "the run's token was minted");
    let client = crate::helpers::http_client();
    for (k, v) in &run.env {
        assert!(!minted.contains(v), "{k} holds a minted token");
        let answer = client
            .get(format!("{}/api/v1/user", s.t.forge_url()))
            .header("Authorization", format!("token {v}"))
            .send()
            .await
            .expect("answered");
        assert_eq!(answer.status(), 401, "the forge accepts {k} as a token");
    }
    let clone_url = run.var("DIRECTOR_CLONE_URL");
    assert_eq!(
        clone_url,
        format!("http://127.0.0.1:{}/{}.git", s.gateway, s.t.repo)
    );
    assert_eq!(
        run.var("NO_PROXY"),
        "127.0.0.1",
        "only the gateway is direct"
    );

    // Clone, commit and push its branch: through the gateway, to the forge.
    let work = clone(&run).await;
    let w = work.path().join("w");
    commit(&run, &w, "agent.txt", "agent work\n").await;
    run.ok(&w, &["push", "-q", "origin", &format!("HEAD:{branch}")])
        .await;
    assert!(s.t.forge.branches_of(&s.t.repo).contains(&branch));
    let before = s.t.forge.branches_of(&s.t.repo);

    // Everything else is refused in git's own words, and the forge is left as it was.
    refused(
        &run,
        &w,
        &["push", "origin", "HEAD:other"],
        "other",
        "a run pushes only",
    )
    .await;
    refused(
        &run,
        &w,
        &["push", "origin", "HEAD:main"],
        "main",
        "a run pushes only",
    )
    .await;
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
    commit(&run, &w, "more.txt", "more\n").await;
    refused(
        &run,
        &w,
        &["push", "origin", &format!("HEAD:{branch}"), "HEAD:second"],
        &branch,
        "refused with the rest of the push",
    )
    .await;
    commit(&run, &w, ".forgejo/workflows/x.yml", "on: push\n").await;
    refused(
        &run,
        &w,
        &["push", "origin", &format!("HEAD:{branch}")],
        &branch,
        "changes .forgejo/workflows/x.yml, which runs may not change",
    )
    .await;
    // Hidden under a later commit that removes it again: every pushed commit is checked.
    run.ok(&w, &["rm", "-q", ".forgejo/workflows/x.yml"]).await;
    run.ok(&w, &["commit", "-q", "-m", "remove it again"]).await;
    refused(
        &run,
        &w,
        &["push", "origin", &format!("HEAD:{branch}")],
        &branch,
        ".forgejo/workflows/x.yml",
    )
    .await;
    assert_eq!(
        s.t.forge.branches_of(&s.t.repo),
        before,
        "the forge is unchanged"
    );
    let tags = run.git(&w, &["ls-remote", "--tags", "origin"]).await;
    assert!(
        tags.status.success() && tags.stdout.is_empty(),
        "no tag on the forge"
    );

    // Each refusal is kept for the run's report, and counted.
    let kept = s.t.app.store.egress_refusals(&run.id).await.expect("store");
    let pushes: Vec<&String> = kept
        .iter()
        .map(|(w, _)| w)
        .filter(|w| w.starts_with("git push "))
        .collect();
    assert!(
        pushes
            .iter()
            .any(|w| w.contains("refs/tags/v1: tags are not pushed")),
        "{kept:?}"
    );
    assert!(
        pushes.iter().any(|w| w.contains("refs/heads/other")),
        "{kept:?}"
    );
    s.t.app
        .wait_for_metric(r#"director_git_pushes_refused_total{reason="refused"} 7"#)
        .await;

    // The run ends: its credential opens nothing any more.
    s.t.forge.unlabel(WRITER, &run.issue, TRIGGER).await;
    let record = crate::runs::wait_ended(&s.t, &run.issue).await;
    assert_eq!(record.lifecycle, Lifecycle::Cancelled);
    let out = run.git(&w, &["ls-remote", "origin"]).await;
    assert!(
        !out.status.success(),
        "an ended run's credential is refused"
    );
    assert!(stderr(&out).contains("403"), "{}", stderr(&out));
}

#[tokio::test]
async fn another_runs_credential_a_wrong_one_and_bad_requests_open_nothing() {
    let s = setup(|s| s.runner.max_push_mb = 1).await;
    let a = started(&s, "First").await;
    let b = started(&s, "Second").await;
    let a_branch = a.var("DIRECTOR_BRANCH").to_owned();
    let url = a.var("DIRECTOR_CLONE_URL").to_owned();

    // B may read the repository, as A may, but never push A's branch.
    let work = clone(&b).await;
    let w = work.path().join("w");
    commit(&b, &w, "b.txt", "b\n").await;
    refused(
        &b,
        &w,
        &["push", "origin", &format!("HEAD:{a_branch}")],
        &a_branch,
        "a run pushes only",
    )
    .await;
    assert!(!s.t.forge.branches_of(&s.t.repo).contains(&a_branch));

    // A pack over runner.max_push_mb is refused whole.
    // Random bytes: a pack does not compress them below the cap.
    let big: Vec<u8> = (0..1_500_000).map(|_| rand::random::<u8>()).collect();
    std::fs::write(w.join("big.bin"), &big).expect("write");
    b.ok(&w, &["add", "big.bin"]).await;
    b.ok(&w, &["commit", "-q", "-m", "big"]).await;
    let out = b
        .git(
            &w,
            &[
                "push",
                "origin",
                &format!("HEAD:{}", b.var("DIRECTOR_BRANCH")),
            ],
        )
        .await;
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("larger than runner.max_push_mb"),
        "{}",
        stderr(&out)
    );
    s.t.app
        .wait_for_metric(r#"director_git_pushes_refused_total{reason="too_large"} 1"#)
        .await;

    let client = crate::helpers::http_client();
    let basic = |user: &str, password: &str| {
        use base64::Engine as _;
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
        )
    };
    let a_auth = basic(&format!("run-{}", a.id), a.var("DIRECTOR_GIT_PASSWORD"));
    let refs = |auth: String, path: String| {
        let client = client.clone();
        async move {
            client
                .get(path)
                .header("Authorization", auth)
                .send()
                .await
                .expect("answered")
                .status()
                .as_u16()
        }
    };
    let info = format!("{url}/info/refs?service=git-upload-pack");
    assert_eq!(refs(a_auth.clone(), info.clone()).await, 200);
    // A's password under B's name, or a made-up one: not a credential.
    assert_eq!(
        refs(
            basic(&format!("run-{}", b.id), a.var("DIRECTOR_GIT_PASSWORD")),
            info.clone()
        )
        .await,
        401
    );
    assert_eq!(
        refs(basic(&format!("run-{}", a.id), "guess"), info.clone()).await,
        401
    );
    // Another repository's path: not found, whoever asks.
    let other = info.replace(&s.t.repo.to_string(), "acme/other");
    assert_eq!(refs(a_auth.clone(), other).await, 404);
    // The dumb protocol is not served.
    assert_eq!(refs(a_auth.clone(), format!("{url}/info/refs")).await, 403);

    // Malformed pkt-lines: a clear refusal in git's protocol, nothing forwarded.
    for body in [&b"zzzz"[..], b"0003", b"00ff0000", b"0000"] {
        let answer = client
            .post(format!("{url}/git-receive-pack"))
            .header("Authorization", a_auth.clone())
            .header("Content-Type", "application/x-git-receive-pack-request")
            .body(body.to_vec())
            .send()
            .await
            .expect("answered");
        assert_eq!(answer.status(), 200);
        let text = answer.text().await.expect("text");
        assert!(text.contains("ERR "), "{text}");
    }
    assert!(!s.t.forge.branches_of(&s.t.repo).contains(&a_branch));
    // And the gateway still serves.
    let work = clone(&a).await;
    let w = work.path().join("w");
    commit(&a, &w, "a.txt", "a\n").await;
    a.ok(&w, &["push", "-q", "origin", &format!("HEAD:{a_branch}")])
        .await;
    assert!(s.t.forge.branches_of(&s.t.repo).contains(&a_branch));
}

#[tokio::test]
async fn a_follow_up_only_fast_forwards_the_pull_requests_branch() {
    let s = setup(|_| {}).await;
    let first = started(&s, "Add --verbose").await;
    let branch = first.var("DIRECTOR_BRANCH").to_owned();
    let work = clone(&first).await;
    let w = work.path().join("w");
    commit(&first, &w, "agent.txt", "agent work\n").await;
    first
        .ok(&w, &["push", "-q", "origin", &format!("HEAD:{branch}")])
        .await;
    s.fake.exit(&first.id, 0, "pushed");
    s.t.app.wait_state(&first.issue, Lifecycle::Succeeded).await;
    let pr =
        s.t.record(&first.issue)
            .await
            .and_then(|r| r.pr)
            .map(|p| p.number)
            .expect("a pull request");

    // A writer asks for more on the pull request: a follow-up run on the same branch.
    let pull = IssueRef::new(s.t.repo.clone(), pr);
    s.t.forge
        .comment(WRITER, &pull, "/director fix print the elapsed time too")
        .await;
    let follow = run_started(&s, first.issue.clone(), Some(&first.id)).await;
    assert_eq!(follow.var("DIRECTOR_BRANCH"), branch);
    assert_eq!(follow.var("DIRECTOR_PR"), pr.to_string());

    // The ended first run's credential opens nothing.
    let out = first.git(&w, &["ls-remote", "origin"]).await;
    assert!(!out.status.success(), "an ended run is refused");

    let work = clone(&follow).await;
    let w = work.path().join("w");
    follow.ok(&w, &["checkout", "-q", &branch]).await;
    let tip = s.t.forge.branches_of(&s.t.repo);
    // Rewriting the pull request's history is refused.
    follow
        .ok(&w, &["commit", "-q", "--amend", "-m", "rewritten"])
        .await;
    refused(
        &follow,
        &w,
        &["push", "--force", "origin", &format!("HEAD:{branch}")],
        &branch,
        "a follow-up only adds commits",
    )
    .await;
    assert_eq!(s.t.forge.branches_of(&s.t.repo), tip);
    // Adding to it goes through.
    follow
        .ok(&w, &["reset", "-q", "--hard", &format!("origin/{branch}")])
        .await;
    commit(&follow, &w, "elapsed.txt", "elapsed\n").await;
    follow
        .ok(&w, &["push", "-q", "origin", &format!("HEAD:{branch}")])
        .await;
    let log = follow.git(&w, &["ls-remote", "origin", &branch]).await;
    let head = follow.git(&w, &["rev-parse", "HEAD"]).await;
    assert!(
        String::from_utf8_lossy(&log.stdout)
            .starts_with(String::from_utf8_lossy(&head.stdout).trim()),
        "the branch moved to the follow-up's commit"
    );
}

#[tokio::test]
async fn a_pack_that_also_carries_another_refs_objects_lands_nothing_unchecked() {
    let s = setup(|_| {}).await;
    let run = started(&s, "Smuggle").await;
    let branch = run.var("DIRECTOR_BRANCH").to_owned();
    let work = clone(&run).await;
    let w = work.path().join("w");
    commit(&run, &w, "clean.txt", "clean\n").await;
    let clean = run.git(&w, &["rev-parse", "HEAD"]).await;
    let clean = String::from_utf8_lossy(&clean.stdout).trim().to_owned();
    // A workflow on a side branch, in the same pack as the clean commit.
    run.ok(&w, &["checkout", "-q", "-b", "side", "origin/main"])
        .await;
    commit(&run, &w, ".forgejo/workflows/x.yml", "on: push\n").await;
    let side = run.git(&w, &["rev-parse", "HEAD"]).await;
    let side = String::from_utf8_lossy(&side.stdout).trim().to_owned();
    let mut pack_objects = Command::new("git");
    pack_objects
        .current_dir(&w)
        .args(["pack-objects", "--stdout", "--revs", "-q"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped());
    let mut child = pack_objects.spawn().expect("pack-objects");
    {
        use std::io::Write as _;
        let mut stdin = child.stdin.take().expect("stdin");
        writeln!(stdin, "{clean}\n{side}\n^origin/main").expect("revs");
    }
    let pack = child.wait_with_output().expect("a pack").stdout;
    assert!(pack.starts_with(b"PACK"));

    // The push names only the run's branch, at the clean commit.
    let command = format!(
        "{} {clean} refs/heads/{branch}\0report-status agent=test\n",
        "0".repeat(40)
    );
    let mut body = director::git_gateway::pkt::line(command.as_bytes());
    body.extend_from_slice(director::git_gateway::pkt::FLUSH);
    body.extend_from_slice(&pack);
    let answer = crate::helpers::http_client()
        .post(format!(
            "{}/git-receive-pack",
            run.var("DIRECTOR_CLONE_URL")
        ))
        .basic_auth(
            format!("run-{}", run.id),
            Some(run.var("DIRECTOR_GIT_PASSWORD")),
        )
        .header("Content-Type", "application/x-git-receive-pack-request")
        .body(body)
        .send()
        .await
        .expect("answered");
    assert_eq!(answer.status(), 200);
    let report = answer.text().await.expect("report");
    assert!(
        report.contains(&format!("ok refs/heads/{branch}")),
        "{report}"
    );
    let remote = run.git(&w, &["ls-remote", "origin"]).await;
    let remote = String::from_utf8_lossy(&remote.stdout).into_owned();
    assert!(
        remote.contains(&format!("{clean}\trefs/heads/{branch}")),
        "{remote}"
    );
    assert!(
        !remote.contains(&side),
        "no ref holds the smuggled commit: {remote}"
    );

    // The smuggled commit, named later, is checked like any other.
    refused(
        &run,
        &w,
        &["push", "--force", "origin", &format!("side:{branch}")],
        &branch,
        ".forgejo/workflows/x.yml",
    )
    .await;
}

#[tokio::test]
async fn a_private_repositorys_clone_push_and_mirror_use_the_runs_token() {
    let s = setup(|_| {}).await;
    s.t.forge.make_private(&s.t.repo);
    let run = started(&s, "Quietly").await;
    let branch = run.var("DIRECTOR_BRANCH").to_owned();
    // Anonymous git is refused by the forge: what works below works with the run's token,
    // which only the gateway (and its mirror's fetch) sends.
    let anonymous = Command::new("git")
        .args([
            "ls-remote",
            &format!("{}/{}.git", s.t.forge_url(), s.t.repo),
        ])
        .env("GIT_TERMINAL_PROMPT", "0")
        .output()
        .expect("git");
    assert!(!anonymous.status.success(), "the repository is private");
    let work = clone(&run).await;
    let w = work.path().join("w");
    commit(&run, &w, "agent.txt", "agent work\n").await;
    run.ok(&w, &["push", "-q", "origin", &format!("HEAD:{branch}")])
        .await;
    assert!(s.t.forge.branches_of(&s.t.repo).contains(&branch));
    // A workflow is still refused: the check read the private repository's base.
    commit(&run, &w, ".gitea/workflows/ci.yml", "on: push\n").await;
    refused(
        &run,
        &w,
        &["push", "origin", &format!("HEAD:{branch}")],
        &branch,
        ".gitea/workflows/ci.yml",
    )
    .await;
}

#[tokio::test]
async fn a_forge_failing_mid_push_fails_the_runs_push_and_applies_nothing() {
    let s = setup(|_| {}).await;
    let run = started(&s, "Unlucky").await;
    let branch = run.var("DIRECTOR_BRANCH").to_owned();
    let work = clone(&run).await;
    let w = work.path().join("w");
    commit(&run, &w, "agent.txt", "agent work\n").await;
    s.t.forge.fail_pushes(&[502]);
    let out = run
        .git(&w, &["push", "origin", &format!("HEAD:{branch}")])
        .await;
    assert!(!out.status.success(), "the run sees the failure");
    assert!(stderr(&out).contains("502"), "{}", stderr(&out));
    assert!(
        !s.t.forge.branches_of(&s.t.repo).contains(&branch),
        "nothing applied"
    );
    // The same push, once the forge is well: it lands.
    run.ok(&w, &["push", "-q", "origin", &format!("HEAD:{branch}")])
        .await;
    assert!(s.t.forge.branches_of(&s.t.repo).contains(&branch));
}

#[tokio::test]
async fn a_run_holding_thirty_slow_pushes_cannot_keep_another_runs_push_from_landing() {
    let s = setup(|s| {
        s.runner.max_push_mb = 2;
        s.runner.gateway_memory_mb = Some(8);
        s.runner.gateway_requests_per_run = 40;
        s.runner.gateway_body_timeout_secs = 60;
        s.models.max_request_mb = 1;
    })
    .await;
    let flood = started(&s, "Flood").await;
    let ordinary = started(&s, "Ordinary").await;
    // Thirty pushes of one run, each 300 KB into a body that never ends (git sends its
    // pushes chunked): each holds what arrived, and the run no more than its share (2 MB,
    // a quarter of the room), so those past it wait on the run's own.
    let mut held = Vec::new();
    for _ in 0..30 {
        held.push(held_push(&s, &flood, None, 300 * 1024).await);
    }
    s.t.app
        .wait_for_metric_where("director_gateway_body_memory_bytes", |v| v >= 1_900_000.0)
        .await;
    let work = clone(&ordinary).await;
    let w = work.path().join("w");
    commit(&ordinary, &w, "notes.txt", "amid the flood\n").await;
    let branch = ordinary.var("DIRECTOR_BRANCH").to_owned();
    ordinary
        .ok(&w, &["push", "-q", "origin", &format!("HEAD:{branch}")])
        .await;
    assert!(s.t.forge.branches_of(&s.t.repo).contains(&branch));
    let in_use = s.t.app.metric("director_gateway_body_memory_bytes").await;
    assert!(
        in_use <= 2.0 * 1024.0 * 1024.0 + 64.0 * 1024.0,
        "one run holds its share at most: {in_use}"
    );
    drop(held);
}

#[tokio::test]
async fn a_run_cannot_push_a_change_to_its_repositorys_settings_file() {
    let s = setup(|_| {}).await;
    let run = started(&s, "Widen my own limits").await;
    let branch = run.var("DIRECTOR_BRANCH").to_owned();
    let work = clone(&run).await;
    let w = work.path().join("w");
    commit(
        &run,
        &w,
        ".director.toml",
        "[runner]\nimage = \"evil/agent\"\ntimeout_secs = 999999\n",
    )
    .await;
    refused(
        &run,
        &w,
        &["push", "origin", &format!("HEAD:{branch}")],
        &branch,
        "changes .director.toml, which runs may not change",
    )
    .await;
    assert!(
        !s.t.forge.branches_of(&s.t.repo).contains(&branch),
        "nothing reached the forge"
    );
}

/// The base's history holds a retired, permissive workflow: its old commit is an ancestor of
/// the base, so walking only the commits a push adds never sees it.
async fn with_a_retired_workflow(s: &Setup) {
    let path = ".forgejo/workflows/ci.yml";
    s.t.forge.put_file(
        &s.t.repo,
        "main",
        path,
        b"on: push\njobs: {deploy: {runs-on: x, steps: [{run: 'curl $SECRET'}]}}\n",
    );
    s.t.forge.put_file(
        &s.t.repo,
        "main",
        path,
        b"on: pull_request\njobs: {test: {runs-on: x, steps: [{run: make test}]}}\n",
    );
}

#[tokio::test]
async fn a_branch_started_from_an_old_base_commit_cannot_bring_back_old_workflows() {
    let s = setup(|_| {}).await;
    with_a_retired_workflow(&s).await;
    let run = started(&s, "Tidy the README").await;
    let branch = run.var("DIRECTOR_BRANCH").to_owned();
    let work = clone(&run).await;
    let w = work.path().join("w");
    // The attacker's branch: from the base's parent (where the permissive workflow lives), one
    // harmless commit on top. No commit it adds touches a protected path.
    run.ok(&w, &["checkout", "-q", "-b", "old", "HEAD~1"]).await;
    commit(&run, &w, "notes.txt", "harmless\n").await;
    refused(
        &run,
        &w,
        &["push", "origin", &format!("HEAD:{branch}")],
        &branch,
        "the branch does not start from",
    )
    .await;
    assert!(
        !s.t.forge.branches_of(&s.t.repo).contains(&branch),
        "nothing reached the forge"
    );
    // The same work on the base's tip goes through.
    run.ok(&w, &["checkout", "-q", "-B", "new", "origin/main"])
        .await;
    commit(&run, &w, "notes.txt", "harmless\n").await;
    run.ok(&w, &["push", "-q", "origin", &format!("HEAD:{branch}")])
        .await;
    assert!(s.t.forge.branches_of(&s.t.repo).contains(&branch));
}

#[tokio::test]
async fn a_merge_taking_an_ancestors_protected_file_is_refused_by_its_tree() {
    let s = setup(|_| {}).await;
    with_a_retired_workflow(&s).await;
    let run = started(&s, "Tidy the README").await;
    let branch = run.var("DIRECTOR_BRANCH").to_owned();
    let work = clone(&run).await;
    let w = work.path().join("w");
    commit(&run, &w, "notes.txt", "harmless\n").await;
    // A merge of the tip's work with the base's parent, whose tree takes the parent's
    // workflow: it differs from the first parent but not from the second, so `log -c` lists
    // nothing for it.
    run.ok(
        &w,
        &["checkout", "HEAD~2", "--", ".forgejo/workflows/ci.yml"],
    )
    .await;
    let tree = run.git(&w, &["write-tree"]).await;
    let tree = String::from_utf8_lossy(&tree.stdout).trim().to_owned();
    let old = run.git(&w, &["rev-parse", "HEAD~2"]).await;
    let old = String::from_utf8_lossy(&old.stdout).trim().to_owned();
    let merge = run
        .git(
            &w,
            &[
                "commit-tree",
                &tree,
                "-p",
                "HEAD",
                "-p",
                &old,
                "-m",
                "merge",
            ],
        )
        .await;
    assert!(merge.status.success(), "{}", stderr(&merge));
    let merge = String::from_utf8_lossy(&merge.stdout).trim().to_owned();
    let listed = run
        .git(
            &w,
            &[
                "log",
                "-c",
                "--name-only",
                "--format=",
                &merge,
                "--not",
                "origin/main",
            ],
        )
        .await;
    assert!(
        !String::from_utf8_lossy(&listed.stdout).contains("ci.yml"),
        "the merge hides the path from a walk of the new commits"
    );
    refused(
        &run,
        &w,
        &["push", "origin", &format!("{merge}:refs/heads/{branch}")],
        &branch,
        ".forgejo/workflows/ci.yml differs from main's",
    )
    .await;
    assert!(
        !s.t.forge.branches_of(&s.t.repo).contains(&branch),
        "nothing reached the forge"
    );
}

/// Starts a push as raw HTTP that sends a first chunk of its body and then nothing, and
/// returns the connection (the answer is read from it).
async fn endless_push(s: &Setup, run: &Run) -> tokio::net::TcpStream {
    held_push(s, run, None, 4).await
}

/// A push whose body starts (`sent` bytes of it) and never ends; with `declared`, it says
/// it is that long.
async fn held_push(
    s: &Setup,
    run: &Run,
    declared: Option<usize>,
    sent: usize,
) -> tokio::net::TcpStream {
    use base64::Engine as _;
    use tokio::io::AsyncWriteExt as _;
    let auth = base64::engine::general_purpose::STANDARD.encode(format!(
        "run-{}:{}",
        run.id,
        run.var("DIRECTOR_GIT_PASSWORD")
    ));
    let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", s.gateway))
        .await
        .expect("the gateway listens");
    let length = match declared {
        Some(n) => format!("Content-Length: {n}"),
        None => "Transfer-Encoding: chunked".to_owned(),
    };
    let head = format!(
        "POST /{}.git/git-receive-pack HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Basic {auth}\r\nContent-Type: application/x-git-receive-pack-request\r\n{length}\r\n\r\n",
        s.t.repo
    );
    let mut body = b"0000".to_vec();
    body.resize(sent.max(4), b'x');
    let mut out = head.into_bytes();
    if declared.is_some() {
        out.extend_from_slice(&body);
    } else {
        out.extend_from_slice(format!("{:x}\r\n", body.len()).as_bytes());
        out.extend_from_slice(&body);
        out.extend_from_slice(b"\r\n");
    }
    conn.write_all(&out).await.expect("sent");
    conn
}

/// The status line of the answer on `conn`, within `secs`.
async fn status_of(conn: &mut tokio::net::TcpStream, secs: u64) -> String {
    use tokio::io::AsyncReadExt as _;
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(std::time::Duration::from_secs(secs), conn.read(&mut buf))
        .await
        .expect("answered in time")
        .expect("read");
    String::from_utf8_lossy(&buf[..n])
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn a_run_cannot_hold_the_gateways_memory_with_parallel_or_endless_pushes() {
    let s = setup(|s| {
        s.runner.max_push_mb = 1;
        s.runner.gateway_memory_mb = Some(1);
        s.runner.gateway_requests_per_run = 1;
        s.runner.gateway_body_timeout_secs = 7;
    })
    .await;
    let first = started(&s, "Flood").await;
    let second = started(&s, "Flood too").await;
    // The first run's push declares the length of a whole push (all the room there is),
    // which is reserved, and its body never ends.
    let mut held = held_push(&s, &first, Some(1024 * 1024), 4).await;
    s.t.app
        .wait_for_metric("director_gateway_body_memory_bytes 1048576")
        .await;
    // The first run's next push, meanwhile (its body ends, as git's does): over its cap of
    // one, refused unread.
    let mut again = endless_push(&s, &first).await;
    {
        use tokio::io::AsyncWriteExt as _;
        again.write_all(b"0\r\n\r\n").await.expect("sent");
    }
    assert!(status_of(&mut again, 3).await.contains("429"));
    // Another run's push finds no room, and is told so within its wait (5 s), unread.
    let mut other = endless_push(&s, &second).await;
    assert!(status_of(&mut other, 10).await.contains("503"));
    // The endless body is cut at its deadline, and its room is free again.
    assert!(status_of(&mut held, 10).await.contains("408"));
    s.t.app
        .wait_for_metric("director_gateway_body_memory_bytes 0")
        .await;
    let work = clone(&second).await;
    let w = work.path().join("w");
    commit(&second, &w, "notes.txt", "after the flood\n").await;
    let branch = second.var("DIRECTOR_BRANCH").to_owned();
    second
        .ok(&w, &["push", "-q", "origin", &format!("HEAD:{branch}")])
        .await;
    assert!(s.t.forge.branches_of(&s.t.repo).contains(&branch));
}

/// Commits `bytes` random bytes (a pack does not compress them) at `path`.
async fn commit_random(run: &Run, w: &Path, path: &str, bytes: usize) {
    let data: Vec<u8> = (0..bytes).map(|_| rand::random::<u8>()).collect();
    std::fs::write(w.join(path), &data).expect("write");
    run.ok(w, &["add", path]).await;
    run.ok(w, &["commit", "-q", "-m", &format!("add {path}")])
        .await;
}

async fn head(run: &Run, w: &Path) -> String {
    let out = run.git(w, &["rev-parse", "HEAD"]).await;
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[tokio::test]
async fn a_push_the_gateways_disk_cannot_hold_is_refused_in_gits_words_and_a_later_one_lands() {
    // Two pushes of 2 MB fit the cap while checked (twice their size); a mirror holding one
    // leaves no room for a second.
    let s = setup(|s| {
        s.runner.max_push_mb = 2;
        s.runner.gateway_disk_mb = 5;
    })
    .await;
    let run = started(&s, "Fill the disk").await;
    let branch = run.var("DIRECTOR_BRANCH").to_owned();
    let work = clone(&run).await;
    let w = work.path().join("w");
    commit_random(&run, &w, "first.bin", 1_800_000).await;
    run.ok(&w, &["push", "-q", "origin", &format!("HEAD:{branch}")])
        .await;
    let landed = head(&run, &w).await;

    // The mirror now holds the first pack: the second finds no room, and is refused in
    // git's words before anything reaches the forge.
    commit_random(&run, &w, "second.bin", 1_800_000).await;
    refused(
        &run,
        &w,
        &["push", "origin", &format!("HEAD:{branch}")],
        &branch,
        "no room for this push",
    )
    .await;
    let out = run.git(&w, &["ls-remote", "origin", &branch]).await;
    let remote = String::from_utf8_lossy(&out.stdout);
    assert!(
        remote.starts_with(&landed),
        "the forge kept {landed}: {remote}"
    );

    // The gateway goes on serving: a small push lands.
    run.ok(&w, &["reset", "-q", "--hard", "HEAD~1"]).await;
    commit(&run, &w, "notes.txt", "small\n").await;
    run.ok(&w, &["push", "-q", "origin", &format!("HEAD:{branch}")])
        .await;
    let out = run.git(&w, &["ls-remote", "origin", &branch]).await;
    let remote = String::from_utf8_lossy(&out.stdout);
    assert!(remote.starts_with(&head(&run, &w).await), "{remote}");
}
