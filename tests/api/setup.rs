//! Prepared environments on the real Docker engine: a repository's `[setup]` installs a
//! package from a package index the test serves (on the setup's allow-list only) with a token
//! given as a setup secret; the confined agent finds the package, cannot reach the index, and
//! has no trace of the token. The next run starts warm from the snapshot (the index is not
//! asked again); a changed cache-key file makes it cold again; a setup that leaves the token in
//! the workspace, or fails, ends the run before the agent with the reason.

use std::io::{BufRead as _, BufReader, Write as _};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use director::domain::Lifecycle;
use director::domain::setup::SetupMode;

use crate::egress::Network;
use crate::git::git_agent_image;
use crate::runs::{labelled, run_comments, spawn_runs, wait_ended};

const TOKEN: &str = "pkgtok-5f1e2d3c4b5a6978";

/// A package index on the host, reached at its own address (a repository's
/// entries never open loopback): `GET /pkg` with `Authorization: Bearer <TOKEN>` gets the
/// package; every request is counted, refused ones too.
struct Index {
    host: String,
    port: u16,
    asked: Arc<AtomicUsize>,
}

impl Index {
    fn start() -> Self {
        // This machine's first address that is not loopback.
        let out = std::process::Command::new("hostname")
            .arg("-I")
            .output()
            .expect("hostname runs");
        let host = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .find(|a| {
                a.parse::<std::net::Ipv4Addr>()
                    .is_ok_and(|ip| !ip.is_loopback())
            })
            .expect("this machine has an IPv4 address")
            .to_owned();
        let listener = std::net::TcpListener::bind((host.as_str(), 0)).expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let asked = Arc::new(AtomicUsize::new(0));
        let count = asked.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                count.fetch_add(1, Ordering::SeqCst);
                let mut reader = BufReader::new(stream.try_clone().expect("clone"));
                let mut authorized = false;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                    if line.to_ascii_lowercase().starts_with("authorization:")
                        && line.contains(&format!("Bearer {TOKEN}"))
                    {
                        authorized = true;
                    }
                }
                let (status, body) = if authorized {
                    ("200 OK", "installed-package v1\n")
                } else {
                    ("401 Unauthorized", "")
                };
                let _ = write!(
                    stream,
                    "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        Self { host, port, asked }
    }

    fn asked(&self) -> usize {
        self.asked.load(Ordering::SeqCst)
    }
}

fn settings_file(index: &Index, command: &str) -> String {
    let (host, port) = (&index.host, index.port);
    format!(
        "[setup]\ncommand = '''{command}'''\negress_allow = [\"{host}:{port}\"]\nsecrets = [\"PKG_TOKEN\"]\ncache_key = [\"deps.lock\"]\ntimeout_secs = 60\n"
    )
}

fn install(index: &Index) -> String {
    format!(
        "mkdir -p \"$HOME/.cache/pkg\" && wget -q --header \"Authorization: Bearer $PKG_TOKEN\" -O \"$HOME/.cache/pkg/pkg.txt\" http://{}:{}/pkg",
        index.host, index.port
    )
}

/// The director with confined runs on a network of the test's own, snapshots in `snapshots`,
/// repositories allowed `[setup]`, `command` as the runs' command, and more settings; the
/// repository served over git.
async fn spawn_prepared(
    network: &Network,
    snapshots: &std::path::Path,
    command: &str,
    configure: impl FnOnce(&mut director::settings::Settings),
) -> (
    crate::forge_helpers::ForgeApp,
    director_testkit::llm::FakeLlm,
    tempfile::TempDir,
) {
    let image = git_agent_image();
    let (network_name, snapshot_dir) = (network.0.clone(), snapshots.display().to_string());
    let command = vec!["/bin/sh".to_owned(), command.to_owned()];
    let (t, llm) = spawn_runs(|s| {
        s.runner.image = image;
        s.runner.command = command;
        crate::egress::confine(s, &network_name);
        s.runner.snapshot_dir = snapshot_dir;
        s.repo_settings.allow = vec!["setup".into()];
        configure(s);
    })
    .await;
    let root = tempfile::tempdir().expect("dir");
    t.forge.serve_git(&t.repo, root.path()).expect("git serves");
    (t, llm, root)
}

#[tokio::test]
async fn a_setup_prepares_the_workspace_with_its_own_network_and_secret_then_starts_warm() {
    let index = Index::start();
    let network = Network(format!("director-setup-test-{:08x}", rand::random::<u32>()));
    let snapshots = tempfile::tempdir().expect("dir");
    let index_host = index.host.clone();
    let (t, _llm, _root) = spawn_prepared(&network, snapshots.path(), "/agent.sh", |s| {
        s.repo_settings.setup_egress_allow_max = vec![format!("{index_host}:*")];
        s.setup_secrets.insert(
            "PKG_TOKEN".into(),
            director::settings::setup::SetupSecret {
                value: director::settings::Secret::new(TOKEN),
                value_file: None,
                repos: vec!["acme/*".into()],
            },
        );
    })
    .await;
    t.forge.put_file(&t.repo, "main", "deps.lock", b"pkg==1\n");
    t.forge.put_file(
        &t.repo,
        "main",
        ".director.toml",
        settings_file(&index, &install(&index)).as_bytes(),
    );
    let body = format!(
        "mode: prepared secret: {TOKEN} index: {}:{}",
        index.host, index.port
    );

    // Cold: the setup asks the index once; the agent finds the package and nothing else.
    let first = labelled(&t, "Prepared, cold", &body).await;
    let record = wait_ended(&t, &first).await;
    let reports = run_comments(&t, &first);
    assert_eq!(record.lifecycle, Lifecycle::Succeeded, "{reports:?}");
    let asked_after_cold = index.asked();
    assert_eq!(
        asked_after_cold, 1,
        "the setup reached the index, the agent did not"
    );
    let cold = t.app.store.runs_of(&first).await.expect("runs")[0]
        .setup
        .clone()
        .expect("the setup is recorded");
    assert_eq!(cold.mode, SetupMode::Cold);
    assert_eq!(cold.exit, Some(0));
    assert!(
        cold.snapshot.as_deref().unwrap_or("").contains("kept"),
        "{cold:?}"
    );
    assert!(
        reports.iter().any(|r| r.contains("Environment: cold")),
        "{reports:?}"
    );
    let status = crate::fake_runs::status_json(&t).await;
    let row = status
        .as_array()
        .and_then(|a| a.iter().find(|r| r["number"] == first.number))
        .expect("the issue's row");
    assert_eq!(row["run"]["setup"]["mode"], "cold", "{row}");
    assert_eq!(row["run"]["setup"]["key"], cold.key.as_str(), "{row}");
    let pull = &t.forge.pulls_of(&t.repo)[0].4;
    assert!(
        pull.contains("Environment: cold"),
        "the pull request says it: {pull}"
    );
    for text in &reports {
        assert!(!text.contains(TOKEN), "no report holds the token: {text}");
    }
    // The agent's transcript neither (the agent printed its check, never the value).
    let run_id = t.app.store.runs_of(&first).await.expect("runs")[0]
        .id
        .clone();
    let transcript = t
        .app
        .store
        .transcript(&run_id)
        .await
        .expect("transcript")
        .map(|t| t.text)
        .unwrap_or_default();
    assert!(!transcript.contains(TOKEN));

    // Warm: the same key; the setup does not run, the index is not asked.
    let second = labelled(&t, "Prepared, warm", &body).await;
    let record = wait_ended(&t, &second).await;
    assert_eq!(
        record.lifecycle,
        Lifecycle::Succeeded,
        "{:?}",
        run_comments(&t, &second)
    );
    assert_eq!(index.asked(), asked_after_cold, "a warm start asks nothing");
    let warm = t.app.store.runs_of(&second).await.expect("runs")[0]
        .setup
        .clone()
        .expect("recorded");
    assert_eq!(warm.mode, SetupMode::Warm);
    assert_eq!(warm.key, cold.key);
    assert!(
        warm.millis < cold.millis,
        "warm ({} ms) is faster than cold ({} ms)",
        warm.millis,
        cold.millis
    );

    // A changed cache-key file: cold again.
    t.forge.put_file(&t.repo, "main", "deps.lock", b"pkg==2\n");
    let third = labelled(&t, "Prepared, new lock", &body).await;
    let record = wait_ended(&t, &third).await;
    assert_eq!(record.lifecycle, Lifecycle::Succeeded);
    let again = t.app.store.runs_of(&third).await.expect("runs")[0]
        .setup
        .clone()
        .expect("recorded");
    assert_eq!(again.mode, SetupMode::Cold);
    assert_ne!(again.key, cold.key);
    assert_eq!(index.asked(), asked_after_cold + 1);

    // A setup that writes the token into the workspace: refused before the agent, the file
    // named, the value nowhere.
    let leak = format!(
        "{} && echo \"$PKG_TOKEN\" > \"$HOME/checkout/.npmrc\"",
        install(&index)
    );
    t.forge.put_file(
        &t.repo,
        "main",
        ".director.toml",
        settings_file(&index, &leak).as_bytes(),
    );
    let fourth = labelled(&t, "Prepared, leaking", &body).await;
    let record = wait_ended(&t, &fourth).await;
    let reports = run_comments(&t, &fourth);
    assert_eq!(record.lifecycle, Lifecycle::Failed, "{reports:?}");
    let report = reports.join("\n");
    assert!(
        report.contains("`checkout/.npmrc`") && report.contains("`PKG_TOKEN`"),
        "{report}"
    );
    assert!(!report.contains(TOKEN), "{report}");
    let refused = t.app.store.runs_of(&fourth).await.expect("runs")[0]
        .setup
        .clone()
        .expect("recorded");
    assert_eq!(
        refused.snapshot.as_deref(),
        Some("no snapshot is taken of a refused workspace")
    );
    assert!(
        t.forge.pulls_of(&t.repo).len() == 3,
        "no pull request from the refused run"
    );

    // A setup that commits the token and removes the file: it is only in a compressed git
    // object, and still found.
    let hidden = format!(
        "{} && echo \"$PKG_TOKEN\" > .npmrc && git add .npmrc && git -c user.name=s -c user.email=s@s commit -qm deps && git rm -q .npmrc && git -c user.name=s -c user.email=s@s commit -qm clean",
        install(&index)
    );
    t.forge.put_file(
        &t.repo,
        "main",
        ".director.toml",
        settings_file(&index, &hidden).as_bytes(),
    );
    let hiding = labelled(&t, "Prepared, hiding", &body).await;
    let record = wait_ended(&t, &hiding).await;
    let report = run_comments(&t, &hiding).join("\n");
    assert_eq!(record.lifecycle, Lifecycle::Failed, "{report}");
    assert!(
        report.contains("`checkout/.git/objects/") && report.contains("`PKG_TOKEN`"),
        "{report}"
    );
    assert!(!report.contains(TOKEN), "{report}");

    // A failing setup: its tail on the issue, the agent never started.
    t.forge.put_file(
        &t.repo,
        "main",
        ".director.toml",
        settings_file(&index, "echo boom-from-setup; exit 3").as_bytes(),
    );
    let fifth = labelled(&t, "Prepared, failing", &body).await;
    let record = wait_ended(&t, &fifth).await;
    let reports = run_comments(&t, &fifth);
    assert_eq!(record.lifecycle, Lifecycle::Failed, "{reports:?}");
    let report = reports.join("\n");
    assert!(
        report.contains("the setup failed (exit 3)") && report.contains("boom-from-setup"),
        "{report}"
    );
    let failed = t.app.store.runs_of(&fifth).await.expect("runs")[0]
        .setup
        .clone()
        .expect("recorded");
    assert_eq!(failed.exit, Some(3));
    // No volume or setup container is left behind.
    let (_, volumes) =
        crate::egress::docker(&["volume", "ls", "-q", "--filter", "label=director.workspace"]);
    for run in t.app.store.runs_of(&fifth).await.expect("runs") {
        assert!(!volumes.contains(run.id.as_str()), "{volumes}");
    }
}

#[tokio::test]
async fn a_prepared_workspace_belongs_to_the_runs_user_and_goes_with_the_run() {
    use director::runtime::Runtime as _;
    let image = git_agent_image();
    let settings = director::settings::RunnerSettings::default();
    let user = settings.user.clone();
    let rt = director::runtime::docker::DockerRuntime::connect(settings)
        .await
        .expect("docker");
    let run_id = director::domain::RunId::parse(&format!("{:012x}", rand::random::<u64>() >> 16))
        .expect("id");
    let volume = rt.make_workspace(&run_id, &image).await.expect("made");
    assert!(
        rt.list_workspaces()
            .await
            .expect("listed")
            .contains(&run_id),
        "the sweep finds it by its label"
    );
    let (ok, owner) = crate::egress::docker(&[
        "run",
        "--rm",
        "--user",
        &user,
        "-v",
        &format!("{volume}:/workspace"),
        &image,
        "sh",
        "-c",
        "stat -c %u:%g /workspace && touch /workspace/x && echo writable",
    ]);
    rt.remove_workspace(&run_id).await.expect("removed");
    assert!(
        !rt.list_workspaces()
            .await
            .expect("listed")
            .contains(&run_id)
    );
    assert!(ok, "{owner}");
    assert_eq!(owner, format!("{user}\nwritable"));
    let (_, volumes) = crate::egress::docker(&["volume", "ls", "-q"]);
    assert!(!volumes.contains(&volume), "{volumes}");
}

/// The example entrypoint in a prepared workspace: it reuses the setup's checkout (fetching,
/// not cloning), the agent works there, and what the setup left untracked stays out of the
/// commit.
#[tokio::test]
async fn the_example_entrypoint_works_in_the_prepared_checkout_and_commits_none_of_the_setups_files()
 {
    let network = Network(format!("director-setup-test-{:08x}", rand::random::<u32>()));
    let snapshots = tempfile::tempdir().expect("dir");
    let (t, _llm, _root) =
        spawn_prepared(&network, snapshots.path(), "/director-entrypoint", |_| {}).await;
    t.forge.put_file(
        &t.repo,
        "main",
        ".director.toml",
        b"[setup]\ncommand = \"mkdir -p deps && echo built > deps/lib.txt\"\n",
    );
    let issue = labelled(&t, "Be verbose", "Print each step.").await;
    let record = wait_ended(&t, &issue).await;
    let reports = run_comments(&t, &issue);
    assert_eq!(record.lifecycle, Lifecycle::Succeeded, "{reports:?}");
    let run = &t.app.store.runs_of(&issue).await.expect("runs")[0];
    assert_eq!(
        t.forge
            .git_show(&t.repo, &run.branch, "VERBOSE.md")
            .as_deref(),
        Some("verbose: true"),
        "the agent's change is pushed"
    );
    assert_eq!(
        t.forge.git_show(&t.repo, &run.branch, "deps/lib.txt"),
        None,
        "what the setup built is not committed"
    );
    let transcript = t
        .app
        .store
        .transcript(&run.id)
        .await
        .expect("transcript")
        .map(|t| t.text)
        .unwrap_or_default();
    assert!(
        transcript.contains("the workspace was prepared (cold)"),
        "{transcript}"
    );
}

/// On Kubernetes a `[setup]` is refused before anything is made: the setup's own network and
/// secrets could not be kept apart from the agent there, so no Job starts with them mixed.
#[tokio::test]
async fn on_kubernetes_a_setup_is_refused_before_any_job_is_made() {
    let fake = director_testkit::kube::FakeKube::start();
    let (t, _llm) = crate::kube::spawn_kube_with(&fake, |s| {
        s.repo_settings.allow = vec!["setup".into()];
    })
    .await;
    t.forge.put_file(
        &t.repo,
        "main",
        ".director.toml",
        b"[setup]\ncommand = \"make deps\"\n",
    );
    let issue = labelled(&t, "Add --verbose", "Print each step.").await;
    t.app.wait_state(&issue, Lifecycle::Failed).await;
    let report = run_comments(&t, &issue).join("\n");
    assert!(
        report.contains("needs runs on Docker") && report.contains("nothing was started"),
        "{report}"
    );
    assert!(fake.jobs(crate::kube::NS).is_empty(), "no Job was made");
}

/// A tmpfs mounted for the test, unmounted after it.
struct SmallDisk(std::path::PathBuf);

impl SmallDisk {
    fn mount(dir: &std::path::Path, size: &str) -> Self {
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .expect("mount runs")
            .success();
        assert!(ok, "the tests run as root and may mount a tmpfs");
        Self(dir.to_owned())
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

/// The disk holding snapshots full: the run is not lost (its workspace is read where it is
/// and the agent starts in it), and the report says why no snapshot was kept. A setup that
/// outlives its time is stopped and said.
#[tokio::test]
async fn a_full_snapshot_disk_loses_no_run_and_a_setup_over_its_time_is_stopped() {
    let network = Network(format!("director-setup-test-{:08x}", rand::random::<u32>()));
    let snapshots = tempfile::tempdir().expect("dir");
    let _disk = SmallDisk::mount(snapshots.path(), "64k");
    let (t, _llm, _root) = spawn_prepared(&network, snapshots.path(), "/agent.sh", |_| {}).await;
    t.forge.put_file(
        &t.repo,
        "main",
        ".director.toml",
        b"[setup]\ncommand = \"head -c 1048576 /dev/zero > $HOME/big\"\n",
    );
    let issue = labelled(&t, "Prepared, disk full", "mode: git").await;
    let record = wait_ended(&t, &issue).await;
    let reports = run_comments(&t, &issue);
    assert_eq!(record.lifecycle, Lifecycle::Succeeded, "{reports:?}");
    let setup = t.app.store.runs_of(&issue).await.expect("runs")[0]
        .setup
        .clone()
        .expect("recorded");
    let said = setup.snapshot.unwrap_or_default();
    assert!(
        said.contains("the snapshot was not kept") && said.contains("setup's own volume"),
        "{said}"
    );
    assert!(reports.join("\n").contains("was not kept"), "{reports:?}");

    t.forge.put_file(
        &t.repo,
        "main",
        ".director.toml",
        b"[setup]\ncommand = \"sleep 60\"\ntimeout_secs = 2\n",
    );
    let slow = labelled(&t, "Prepared, slow", "mode: git").await;
    let record = wait_ended(&t, &slow).await;
    let report = run_comments(&t, &slow).join("\n");
    assert_eq!(record.lifecycle, Lifecycle::Failed, "{report}");
    assert!(
        report.contains("did not end within its setup.timeout_secs (2 s)"),
        "{report}"
    );
}

/// `director check-repo` shows the setup a run would get and whether a snapshot is warm.
#[tokio::test]
async fn check_repo_says_whether_the_next_run_starts_warm() {
    let (t, _llm) = crate::runs::spawn_runs(|_| {}).await;
    let snapshots = tempfile::tempdir().expect("dir");
    t.forge.put_file(
        &t.repo,
        "main",
        ".director.toml",
        b"[setup]\ncommand = \"make deps\"\n",
    );
    let check = || async {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_director"))
            .args(["check-repo", &t.repo.to_string()])
            .env("DIRECTOR_FORGE__URL", t.forge_url())
            .env("DIRECTOR_FORGE__TOKEN", crate::forge_helpers::BOT_TOKEN)
            .env("DIRECTOR_STORE__URL", "sqlite:///nonexistent-dir/never.db")
            .env("DIRECTOR_REPO_SETTINGS__ALLOW", "setup")
            .env("DIRECTOR_FORGE__RUNNER_LOGIN", "director-runner")
            .env("DIRECTOR_FORGE__RUNNER_PASSWORD", "runner-password")
            .env("DIRECTOR_RUNNER__IMAGE", "director-test/absent:1")
            .env("DIRECTOR_RUNNER__SNAPSHOT_DIR", snapshots.path())
            .output()
            .await
            .expect("runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let cold = check().await;
    assert!(cold.contains("command = \"make deps\""), "{cold}");
    let key = cold
        .split("cold: no snapshot `")
        .nth(1)
        .and_then(|rest| rest.split('`').next())
        .expect("the cold line names the key")
        .to_owned();
    // A snapshot under that key, as a run would keep it: the next check says warm.
    let store = director::prepared::store::SnapshotStore::new(snapshots.path().to_owned(), 64, 24);
    let mut pending = store.begin(&t.repo, &key).expect("begin");
    std::io::Write::write_all(&mut pending.file, &[0u8; 1024]).expect("write");
    let meta = director::prepared::store::Meta {
        repo: t.repo.to_string(),
        key: key.clone(),
        bytes: 1024,
        created_ms: director::clock::now_ms(),
        used_ms: director::clock::now_ms(),
        image: "director-test/absent:1".into(),
        command: "make deps".into(),
    };
    store
        .keep(pending, &meta, director::clock::now_ms())
        .expect("kept");
    let warm = check().await;
    assert!(warm.contains(&format!("warm: snapshot `{key}`")), "{warm}");
}
