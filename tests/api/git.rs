//! git over HTTP with the run token. FakeForge serves git's smart HTTP protocol through
//! `git http-backend` with Forgejo's rules; the real `git` (on this machine, and in a run
//! image built from it) clones and pushes with only the environment the director gives a run.

use std::path::Path;
use std::process::{Command, Output};

use director::domain::run::{git_environment, log_shows_refused_push};
use director::domain::{Lifecycle, RepoName};
use director::forge::{Forge, Permission};
use director_testkit::forge::FakeForge;

use crate::runs::{RUNNER, RUNNER_PASSWORD, labelled, run_comments, spawn_runs, wait_ended};

const EMAIL: &str = "runner@noreply.forge.example";

/// Mints a token of the runner over the fake's API, as the director does.
async fn mint(url: &str, name: &str, scopes: &[&str], repos: &[&str]) -> String {
    let repositories: Vec<serde_json::Value> = repos
        .iter()
        .map(|r| {
            let (owner, name) = r.split_once('/').expect("owner/name");
            serde_json::json!({ "owner": owner, "name": name })
        })
        .collect();
    let resp = crate::helpers::http_client()
        .post(format!("{url}/api/v1/users/{RUNNER}/tokens"))
        .basic_auth(RUNNER, Some(RUNNER_PASSWORD))
        .json(&serde_json::json!({ "name": name, "scopes": scopes, "repositories": repositories }))
        .send()
        .await
        .expect("mint");
    assert_eq!(resp.status(), 201);
    let body: serde_json::Value = resp.json().await.expect("JSON");
    body["sha1"].as_str().expect("sha1").to_owned()
}

/// git with nothing but what a run gets: the director's git environment and the token.
fn run_git(dir: &Path, home: &Path, url: &str, token: &str, args: &[&str]) -> Output {
    run_env(&mut Command::new("git"), dir, home, url, token)
        .args(args)
        .output()
        .expect("git runs")
}

/// `cmd` with a run's environment: cleared, then the director's git entries and the token.
fn run_env<'a>(
    cmd: &'a mut Command,
    dir: &Path,
    home: &Path,
    url: &str,
    token: &str,
) -> &'a mut Command {
    cmd.current_dir(dir)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("DIRECTOR_TOKEN", token);
    for (k, v) in git_environment(
        url.trim_end_matches('/'),
        RUNNER,
        "DIRECTOR_TOKEN",
        RUNNER,
        EMAIL,
    ) {
        cmd.env(k, v);
    }
    cmd
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

struct GitForge {
    forge: FakeForge,
    server: director_testkit::forge::FakeServer,
    widgets: RepoName,
    other: RepoName,
    _root: tempfile::TempDir,
}

fn git_forge() -> GitForge {
    let forge = FakeForge::new();
    forge.add_user(RUNNER);
    forge.set_password(RUNNER, RUNNER_PASSWORD);
    let widgets = forge.add_repo("acme/widgets");
    let other = forge.add_repo("acme/other");
    forge.grant(&widgets, RUNNER, Permission::Write);
    forge.grant(&other, RUNNER, Permission::Write);
    let root = tempfile::tempdir().expect("dir");
    forge.serve_git(&widgets, root.path()).expect("git serves");
    forge.serve_git(&other, root.path()).expect("git serves");
    let server = forge.serve().expect("serves");
    GitForge {
        forge,
        server,
        widgets,
        other,
        _root: root,
    }
}

#[tokio::test]
async fn the_fake_serves_git_with_forgejo_rules_and_keeps_its_api_in_step() {
    let g = git_forge();
    let url = g.server.url().to_owned();
    let token = mint(&url, "run", &["write:repository"], &["acme/widgets"]).await;
    let work = tempfile::tempdir().expect("dir");
    let home = tempfile::tempdir().expect("dir");
    let clone_url = format!("{url}/acme/widgets.git");
    let trace = home.path().join("trace");

    // Clone and push a branch with nothing in the URL: the helper answers for the forge.
    let out = run_git(
        work.path(),
        home.path(),
        &url,
        &token,
        &["clone", "-q", &clone_url, "w"],
    );
    assert!(out.status.success(), "clone: {}", stderr(&out));
    let w = work.path().join("w");
    std::fs::write(w.join("agent.txt"), "agent work\n").expect("write");
    for args in [
        &["add", "agent.txt"][..],
        &["commit", "-q", "-m", "agent work"],
    ] {
        let out = run_git(&w, home.path(), &url, &token, args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    }
    let mut push = Command::new("git");
    let out = {
        let o = run_env(&mut push, &w, home.path(), &url, &token);
        o.env("GIT_TRACE", &trace)
            .args(["push", "-q", "origin", "HEAD:feature"])
            .output()
            .expect("git")
    };
    assert!(out.status.success(), "push: {}", stderr(&out));
    assert!(
        g.forge
            .branches_of(&g.widgets)
            .contains(&"feature".to_owned())
    );
    assert_eq!(
        g.forge
            .commits_ahead(&g.widgets, "main", "feature")
            .await
            .expect("compare"),
        1,
        "the API sees what git pushed"
    );
    assert_eq!(
        g.forge
            .git_show(&g.widgets, "feature", "agent.txt")
            .as_deref(),
        Some("agent work")
    );
    assert_eq!(
        g.forge.git_author(&g.widgets, "feature").as_deref(),
        Some(format!("{RUNNER} <{EMAIL}>").as_str())
    );
    // The token went to git through the environment only.
    let config = std::fs::read_to_string(w.join(".git/config")).expect("config");
    assert!(!config.contains(&token), "{config}");
    let traced = std::fs::read_to_string(&trace).expect("trace");
    assert!(
        traced.contains("remote-http"),
        "the trace saw the push: {traced}"
    );
    assert!(!traced.contains(&token), "no argument list holds the token");

    // The protected default branch refuses the push, with Forgejo's words.
    let out = run_git(
        &w,
        home.path(),
        &url,
        &token,
        &["push", "origin", "HEAD:main"],
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("Not allowed to push to protected branch main"),
        "{}",
        stderr(&out)
    );
    assert!(
        log_shows_refused_push(&stderr(&out), "main"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        g.forge
            .commits_ahead(&g.widgets, "feature", "main")
            .await
            .expect("compare"),
        0,
        "main did not move"
    );

    // A token restricted to widgets is refused on another repository, even to read.
    let out = run_git(
        work.path(),
        home.path(),
        &url,
        &token,
        &["clone", "-q", &format!("{url}/acme/other.git"), "o"],
    );
    assert!(!out.status.success());
    assert!(stderr(&out).contains("403"), "{}", stderr(&out));
    assert!(!work.path().join("o").exists());
    assert_eq!(g.forge.branches_of(&g.other), vec!["main".to_owned()]);

    // A read-only token clones but cannot push.
    let read = mint(&url, "read", &["read:repository"], &["acme/widgets"]).await;
    let out = run_git(
        &w,
        home.path(),
        &url,
        &read,
        &["push", "origin", "HEAD:feature2"],
    );
    assert!(!out.status.success(), "a read token pushed");
    assert!(
        !g.forge
            .branches_of(&g.widgets)
            .contains(&"feature2".to_owned())
    );

    // No token: git fails at once and never prompts.
    let out = run_git(
        work.path(),
        home.path(),
        &url,
        "",
        &["clone", "-q", &clone_url, "n"],
    );
    assert!(!out.status.success());
    assert!(!work.path().join("n").exists());

    // The token is sent to the forge's origin only, never to another host's URL.
    let mut fill = Command::new("git");
    let o = run_env(&mut fill, work.path(), home.path(), &url, &token)
        .args(["credential", "fill"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("git credential");
    let out = write_and_wait(o, "protocol=http\nhost=attacker.example\n\n");
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains(&token),
        "the token was offered to another host"
    );

    // The contents API on a repository git serves commits in git too.
    let resp = crate::helpers::http_client()
        .post(format!("{url}/api/v1/repos/acme/widgets/contents/api.txt"))
        .header("Authorization", format!("token {token}"))
        .json(&serde_json::json!({"content": "aGVsbG8K", "message": "api", "branch": "main", "new_branch": "api-branch"}))
        .send()
        .await
        .expect("contents");
    assert_eq!(resp.status(), 201);
    assert_eq!(
        g.forge
            .git_show(&g.widgets, "api-branch", "api.txt")
            .as_deref(),
        Some("hello")
    );
    assert_eq!(
        g.forge
            .commits_ahead(&g.widgets, "main", "api-branch")
            .await
            .expect("compare"),
        1
    );
    assert!(
        g.forge.contract_violations().is_empty(),
        "{:?}",
        g.forge.contract_violations()
    );
}

fn write_and_wait(mut child: std::process::Child, input: &str) -> Output {
    use std::io::Write as _;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(input.as_bytes()).expect("stdin");
    }
    child.wait_with_output().expect("wait")
}

const ENTRYPOINT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/examples/entrypoint/director-entrypoint.sh"
);

/// Runs the example entrypoint as the director would start it, with `agent` as the agent.
fn entrypoint(g: &GitForge, token: &str, agent: &str, task: &str) -> (Output, tempfile::TempDir) {
    let (mut cmd, ws) = entrypoint_command(g, token, agent, task);
    (cmd.output().expect("sh runs"), ws)
}

/// The entrypoint's command as the director would start it, and its workspace.
fn entrypoint_command(
    g: &GitForge,
    token: &str,
    agent: &str,
    task: &str,
) -> (Command, tempfile::TempDir) {
    let ws = tempfile::tempdir().expect("dir");
    let task_file = ws.path().join("task.md");
    std::fs::write(&task_file, task).expect("task");
    let agent_file = ws.path().join("agent.sh");
    std::fs::write(&agent_file, agent).expect("agent");
    let url = g.server.url();
    let mut cmd = Command::new("sh");
    run_env(&mut cmd, ws.path(), ws.path(), url, token)
        .arg(ENTRYPOINT)
        .env("DIRECTOR_RUN_ID", "0123456789ab")
        .env("DIRECTOR_REPO", "acme/widgets")
        .env("DIRECTOR_ISSUE", "7")
        .env("DIRECTOR_BASE_BRANCH", "main")
        .env("DIRECTOR_BRANCH", "director-issue-7-01234567")
        .env("DIRECTOR_CLONE_URL", format!("{url}/acme/widgets.git"))
        .env("DIRECTOR_TASK_FILE", &task_file)
        .env("DIRECTOR_RESULT_FILE", ws.path().join("result.json"))
        .env("AGENT_COMMAND", format!("sh {}", agent_file.display()));
    (cmd, ws)
}

fn result(ws: &tempfile::TempDir) -> Option<serde_json::Value> {
    let text = std::fs::read_to_string(ws.path().join("result.json")).ok()?;
    Some(serde_json::from_str(&text).unwrap_or_else(|e| panic!("result JSON {text:?}: {e}")))
}

#[tokio::test]
async fn the_example_entrypoint_clones_runs_the_agent_commits_pushes_and_writes_its_result() {
    let g = git_forge();
    let token = mint(
        g.server.url(),
        "run",
        &["write:repository"],
        &["acme/widgets"],
    )
    .await;
    let task = "# Add --verbose\n\nIssue acme/widgets#7.\n";
    let summary = "Added `VERBOSE.md`.\n\"quoted\" \\ back\tslash \u{1} done";
    let agent = format!(
        "grep -q '## How to work' || exit 9\nprintf 'verbose: true\\n' > VERBOSE.md\nprintf '%s' '{}'\n",
        summary.replace('\'', "'\\''")
    );
    let (out, ws) = entrypoint(&g, &token, &agent, task);
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        stderr(&out)
    );
    let branch = "director-issue-7-01234567";
    assert_eq!(
        g.forge
            .git_show(&g.widgets, branch, "VERBOSE.md")
            .as_deref(),
        Some("verbose: true")
    );
    assert_eq!(
        g.forge
            .commits_ahead(&g.widgets, "main", branch)
            .await
            .expect("compare"),
        1
    );
    let r = result(&ws).expect("a result file");
    assert_eq!(r["outcome"], "done");
    assert_eq!(
        r["summary"].as_str(),
        Some(summary.replace('\u{1}', "").as_str()),
        "the summary survives quotes, backslashes and tabs; control characters are dropped"
    );
    let all = format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
    assert!(
        !all.contains(&token),
        "the entrypoint never prints the token"
    );

    // An agent that changes nothing: blocked, and no branch.
    let (out, ws) = entrypoint(
        &g,
        &token,
        "echo 'This cannot be done: the file is generated.'\n",
        "# Other\n",
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let r = result(&ws).expect("a result file");
    assert_eq!(r["outcome"], "blocked");
    assert_eq!(r["reason"], "the agent changed nothing");
    assert!(
        r["summary"]
            .as_str()
            .is_some_and(|s| s.contains("generated"))
    );

    // An agent that fails: its exit status, and no result file.
    let (out, ws) = entrypoint(&g, &token, "echo broken; exit 3\n", "# Broken\n");
    assert_eq!(out.status.code(), Some(3));
    assert!(result(&ws).is_none());
}

#[tokio::test]
async fn the_example_entrypoint_streams_keeps_scratch_files_out_and_pushes_the_work_on_a_stop() {
    use std::io::{BufRead as _, BufReader};
    let g = git_forge();
    let token = mint(
        g.server.url(),
        "run",
        &["write:repository"],
        &["acme/widgets"],
    )
    .await;
    // An agent that writes its change and a scratch file of its own, says so, and then works
    // on until it is stopped.
    let agent = "printf 'verbose: true\\n' > VERBOSE.md\nprintf 'chat\\n' > .aider.chat.history.md\necho 'halfway there'\nwhile :; do sleep 1; done\n";
    let (mut cmd, ws) = entrypoint_command(&g, &token, agent, "# Add --verbose\n");
    use std::os::unix::process::CommandExt as _;
    // A group of its own, so a failing test can end all of it (the agent never ends alone).
    let mut child = cmd
        .env("AGENT_EXCLUDE", ".aider*")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("sh runs");
    let group = format!("-{}", child.id());
    struct EndGroup(String);
    impl Drop for EndGroup {
        fn drop(&mut self) {
            let _ = Command::new("kill").args(["-KILL", "--", &self.0]).status();
        }
    }
    let _end = EndGroup(group);
    // Its output arrives while it runs, not when it ends.
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let seen = tokio::task::spawn_blocking(move || {
        let found = lines.any(|l| l.is_ok_and(|l| l.contains("halfway there")));
        (found, lines)
    });
    let (found, lines) = tokio::time::timeout(std::time::Duration::from_secs(30), seen)
        .await
        .expect("the output streams while the agent runs")
        .expect("joined");
    assert!(found, "the agent's line was streamed");
    // The director's stop: SIGTERM to the entrypoint, which pushes the work so far.
    let pid = child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill")
            .success()
    );
    let out = tokio::task::spawn_blocking(move || {
        let rest: Vec<String> = lines.map_while(Result::ok).collect();
        (child.wait_with_output().expect("wait"), rest)
    });
    let (out, rest) = tokio::time::timeout(std::time::Duration::from_secs(30), out)
        .await
        .expect("it ends within the grace")
        .expect("joined");
    assert_eq!(out.status.code(), Some(143), "{rest:?} {}", stderr(&out));
    assert!(rest.iter().any(|l| l.contains("pushed")), "{rest:?}");
    let branch = "director-issue-7-01234567";
    assert_eq!(
        g.forge
            .git_show(&g.widgets, branch, "VERBOSE.md")
            .as_deref(),
        Some("verbose: true")
    );
    assert_eq!(
        g.forge
            .git_show(&g.widgets, branch, ".aider.chat.history.md"),
        None,
        "the agent's scratch file stays out"
    );
    assert_eq!(
        g.forge.git_show(&g.widgets, branch, ".gitignore"),
        g.forge.git_show(&g.widgets, "main", ".gitignore"),
        "the repository's .gitignore is untouched"
    );
    let result = result(&ws).expect("a result");
    assert_eq!(result["outcome"], "done");
}

#[tokio::test]
async fn the_example_entrypoint_refuses_to_run_outside_the_director() {
    let out = Command::new("sh")
        .arg(ENTRYPOINT)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .output()
        .expect("sh");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("DIRECTOR_CLONE_URL is not set"),
        "{}",
        stderr(&out)
    );
}

// ---- in real runs, against the Docker engine ----

/// The run image with real git: a static busybox, this machine's `git` and `git-remote-http`
/// with every library they link, the test agent, the example entrypoint and two stand-in
/// agents (one edits a file, one spends its model budget).
/// Built once per content, like the plain agent image.
pub fn git_agent_image() -> String {
    let agent_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/agent");
    let mut files: Vec<(String, Vec<u8>)> = vec![
        (
            "bin/busybox".into(),
            std::fs::read("/bin/busybox").expect("busybox-static is installed"),
        ),
        (
            "agent.sh".into(),
            std::fs::read(format!("{agent_dir}/agent.sh")).expect("agent.sh"),
        ),
        (
            "standin-agent.sh".into(),
            std::fs::read(format!("{agent_dir}/standin-agent.sh")).expect("stand-in"),
        ),
        (
            "budget-agent.sh".into(),
            std::fs::read(format!("{agent_dir}/budget-agent.sh")).expect("budget agent"),
        ),
        (
            "director-entrypoint".into(),
            std::fs::read(ENTRYPOINT).expect("entrypoint"),
        ),
    ];
    let binaries = ["/usr/bin/git", "/usr/lib/git-core/git-remote-http"];
    let mut paths: Vec<String> = binaries.iter().map(|b| (*b).to_owned()).collect();
    let ldd = Command::new("ldd").args(binaries).output().expect("ldd");
    for line in String::from_utf8_lossy(&ldd.stdout).lines() {
        if line.trim_end().ends_with(':') {
            continue; // the "/usr/bin/git:" heading ldd prints for each of several files
        }
        // "libz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x...)" or "/lib64/ld-linux... (0x...)"
        let path = line
            .split("=>")
            .last()
            .and_then(|rest| rest.split_whitespace().next())
            .filter(|p| p.starts_with('/'));
        if let Some(p) = path
            && !paths.iter().any(|x| x == p)
        {
            paths.push(p.to_owned());
        }
    }
    for p in paths {
        let data = std::fs::read(&p).unwrap_or_else(|e| panic!("{p}: {e}"));
        files.push((p.trim_start_matches('/').to_owned(), data));
    }
    let dockerfile = "FROM scratch\nCOPY rootfs/ /\nRUN [\"/bin/busybox\", \"--install\", \"-s\", \"/bin\"]\nENV AGENT_COMMAND=\"sh /standin-agent.sh\"\nCMD [\"/bin/sh\", \"/agent.sh\"]\n";
    let files = files
        .into_iter()
        .map(|(path, data)| (format!("rootfs/{path}"), data))
        .collect();
    crate::runs::build_image("director-test-git-agent", dockerfile, files)
}

async fn spawn_git_runs(
    command: &[&str],
) -> (
    crate::forge_helpers::ForgeApp,
    director_testkit::llm::FakeLlm,
    tempfile::TempDir,
) {
    let image = git_agent_image();
    let command: Vec<String> = command.iter().map(|s| (*s).to_owned()).collect();
    let (t, llm) = spawn_runs(|s| {
        s.runner.image = image;
        s.runner.command = command;
    })
    .await;
    let root = tempfile::tempdir().expect("dir");
    t.forge.serve_git(&t.repo, root.path()).expect("git serves");
    (t, llm, root)
}

#[tokio::test]
async fn a_run_with_real_git_clones_commits_pushes_and_ends_in_a_pull_request() {
    let (t, _llm, _root) = spawn_git_runs(&["/bin/sh", "/agent.sh"]).await;
    let issue = labelled(&t, "Use git", "mode: git").await;
    let record = wait_ended(&t, &issue).await;
    assert_eq!(
        record.lifecycle,
        Lifecycle::Succeeded,
        "{:?}",
        run_comments(&t, &issue)
    );
    let pulls = t.forge.pulls_of(&t.repo);
    assert_eq!(pulls.len(), 1, "{pulls:?}");
    let head = &pulls[0].1;
    assert_eq!(
        t.forge.git_show(&t.repo, head, "agent.txt").as_deref(),
        Some("agent work")
    );
    assert_eq!(
        t.forge.git_author(&t.repo, head).as_deref(),
        Some(format!("{RUNNER} <{RUNNER}@noreply.127.0.0.1>").as_str()),
        "commits carry the runner account's identity"
    );
    // git authenticated with the run token (restricted, now revoked), never the bot's.
    let pushes: Vec<_> = t
        .forge
        .calls()
        .into_iter()
        .filter(|c| c.path.ends_with("/git-receive-pack") && c.method == "POST")
        .collect();
    assert_eq!(pushes.len(), 1, "{pushes:?}");
    assert_eq!(pushes[0].login.as_deref(), Some(RUNNER));
    assert!(
        t.forge.tokens_of(RUNNER).is_empty(),
        "the run token is revoked"
    );
    t.assert_contract();
}

#[tokio::test]
async fn a_run_pushing_to_the_default_branch_is_refused_and_the_report_says_so() {
    let (t, _llm, _root) = spawn_git_runs(&["/bin/sh", "/agent.sh"]).await;
    let issue = labelled(&t, "Push to main", "mode: git-main").await;
    let record = wait_ended(&t, &issue).await;
    assert_eq!(record.lifecycle, Lifecycle::Failed);
    let reports = run_comments(&t, &issue);
    assert_eq!(reports.len(), 1);
    assert!(
        reports[0].contains("the forge refused its push to the default branch `main`"),
        "{}",
        reports[0]
    );
    assert_eq!(
        t.forge.git_show(&t.repo, "main", "agent.txt"),
        None,
        "main did not move"
    );
    assert!(t.forge.pulls_of(&t.repo).is_empty());
}

#[tokio::test]
async fn the_example_entrypoint_in_a_run_ends_in_a_pull_request() {
    let (t, _llm, _root) = spawn_git_runs(&["/bin/sh", "/director-entrypoint"]).await;
    let issue = labelled(&t, "Add --verbose", "Print each step.").await;
    let record = wait_ended(&t, &issue).await;
    assert_eq!(
        record.lifecycle,
        Lifecycle::Succeeded,
        "{:?}",
        run_comments(&t, &issue)
    );
    let pulls = t.forge.pulls_of(&t.repo);
    assert_eq!(pulls.len(), 1, "{pulls:?}");
    assert_eq!(
        t.forge
            .git_show(&t.repo, &pulls[0].1, "VERBOSE.md")
            .as_deref(),
        Some("verbose: true")
    );
}
