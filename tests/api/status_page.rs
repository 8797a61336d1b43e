//! The status page in a real browser (headless Chromium, Debian's `chromium`), and its JSON:
//! issues of public repositories for anyone, private ones only with the status token, every
//! title shown as text.

use std::time::Duration;

use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use director::domain::{IssueRef, Lifecycle, RepoName};
use director::forge::Permission;
use director::settings::Secret;

use crate::forge_helpers::{BOT, ForgeApp, TRIGGER, WRITER};

pub const TOKEN: &str = "status-token-4b7e91";
const HOSTILE: &str = "<img src=x onerror=\"document.title='pwned'\"><b>bold</b> & more";
const GO: &str = "Context to front-load: none.\n\nFine.\n\nGO";

struct Page {
    t: ForgeApp,
    _llm: director_testkit::llm::FakeLlm,
    secret_repo: RepoName,
}

async fn page(configure: impl FnOnce(&mut director::settings::Settings)) -> Page {
    let (t, llm) = ForgeApp::spawn_with_llm(|s| {
        s.scan.repos.push("acme/secret".parse().expect("repo"));
        s.status.token = Secret::new(TOKEN);
        configure(s);
    })
    .await;
    llm.always(GO);
    let secret_repo = t.forge.add_repo("acme/secret");
    t.forge.make_private(&secret_repo);
    t.forge.grant(&secret_repo, BOT, Permission::Admin);
    t.forge.grant(&secret_repo, WRITER, Permission::Write);
    t.forge.define_label(&secret_repo, TRIGGER);
    Page {
        t,
        _llm: llm,
        secret_repo,
    }
}

impl Page {
    async fn queued(&self, repo: &RepoName, title: &str) -> IssueRef {
        let issue = self
            .t
            .forge
            .open_issue(repo, "reporter", title, "Please.")
            .await;
        self.t.forge.label(WRITER, &issue, TRIGGER).await;
        self.t.app.wait_state(&issue, Lifecycle::Queued).await;
        issue
    }

    async fn get(&self, path: &str, token: Option<&str>) -> reqwest::Response {
        let mut req = crate::helpers::http_client().get(format!("{}{path}", self.t.app.address));
        if let Some(token) = token {
            req = req.bearer_auth(token);
        }
        req.send().await.expect("request")
    }
}

fn refs(rows: &serde_json::Value) -> Vec<String> {
    rows.as_array()
        .expect("an array")
        .iter()
        .map(|r| format!("{}#{}", r["repo"].as_str().unwrap_or_default(), r["number"]))
        .collect()
}

/// Runs headless Chromium on `url`: the DOM it rendered, and a screenshot at `shot`.
pub async fn chromium(url: &str, shot: Option<&std::path::Path>) -> String {
    let profile = tempfile::tempdir().expect("dir");
    let mut cmd = tokio::process::Command::new("chromium");
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--hide-scrollbars",
        "--window-size=1280,720",
    ])
    .arg(format!("--user-data-dir={}", profile.path().display()));
    match shot {
        Some(path) => cmd.arg(format!("--screenshot={}", path.display())),
        None => cmd.arg("--dump-dom"),
    };
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.arg(url).output())
        .await
        .expect("chromium finishes")
        .expect("chromium is installed (.ci/run installs it)");
    assert!(
        out.status.success(),
        "chromium: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Serves the app's pages with the status token added, so the browser can see what a holder
/// of the token sees.
pub fn with_token(target: String) -> (String, actix_web::dev::ServerHandle) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let server = HttpServer::new(move || {
        let target = target.clone();
        App::new().default_service(web::to(move |req: HttpRequest| {
            let url = format!("{target}{}", req.uri());
            async move {
                let Ok(resp) = crate::helpers::http_client()
                    .get(url)
                    .bearer_auth(TOKEN)
                    .send()
                    .await
                else {
                    return HttpResponse::BadGateway().finish();
                };
                let status = resp.status().as_u16();
                let ct = resp
                    .headers()
                    .get("content-type")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("text/plain")
                    .to_owned();
                let body = resp.bytes().await.unwrap_or_default();
                HttpResponse::build(
                    actix_web::http::StatusCode::from_u16(status)
                        .unwrap_or(actix_web::http::StatusCode::BAD_GATEWAY),
                )
                .content_type(ct)
                .body(body)
            }
        }))
    })
    .listen(listener)
    .expect("listen")
    .workers(1)
    .disable_signals()
    .run();
    let handle = server.handle();
    tokio::spawn(server);
    (format!("http://127.0.0.1:{port}"), handle)
}

#[tokio::test]
async fn the_page_in_a_browser_shows_public_issues_as_text_and_private_ones_only_with_the_token() {
    let p = page(|_| {}).await;
    let plain = p.queued(&p.t.repo, "Add --verbose").await;
    let hostile = p.queued(&p.t.repo, HOSTILE).await;
    let private = p.queued(&p.secret_repo, "Private plans").await;

    let dom = chromium(&format!("{}/status", p.t.app.address), None).await;
    for issue in [&plain, &hostile] {
        assert!(
            dom.contains(&format!("data-issue=\"{issue}\"")),
            "{issue} shown: {dom}"
        );
    }
    assert!(dom.contains("Add --verbose"));
    assert!(dom.contains(">queued<"), "the state is shown: {dom}");
    assert!(dom.contains("queue position 1"), "why it waits: {dom}");
    // The hostile title is text: no element came of it, and its script never ran.
    assert!(dom.contains("&lt;img src=x onerror="), "{dom}");
    assert!(dom.contains("&lt;b&gt;bold&lt;/b&gt;"), "{dom}");
    assert!(!dom.contains("<img") && !dom.contains("<b>bold"), "{dom}");
    assert!(
        dom.contains("<title>director: status</title>"),
        "the title's script ran: {dom}"
    );
    assert!(
        !dom.contains("acme/secret") && !dom.contains("Private plans"),
        "a private issue without the token: {dom}"
    );
    assert!(dom.contains("not shown without the status token"));

    let (proxy, handle) = with_token(p.t.app.address.clone());
    let dom = chromium(&format!("{proxy}/status"), None).await;
    assert!(dom.contains(&format!("data-issue=\"{private}\"")), "{dom}");
    assert!(dom.contains("Private plans"));
    // Kept as a test artefact: what the page looks like.
    let shot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("status-page.png");
    chromium(&format!("{proxy}/status"), Some(&shot)).await;
    let png = std::fs::read(&shot).expect("a screenshot");
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 5_000,
        "{} bytes",
        png.len()
    );
    handle.stop(false).await;
}

#[tokio::test]
async fn status_json_holds_the_rows_of_director_status_and_the_same_visibility_rules() {
    let p = page(|_| {}).await;
    let public = p.queued(&p.t.repo, "Public work").await;
    let private = p.queued(&p.secret_repo, "Private plans").await;

    let anon: serde_json::Value = p
        .get("/status.json", None)
        .await
        .json()
        .await
        .expect("JSON");
    assert_eq!(refs(&anon), vec![public.to_string()]);
    let row = &anon[0];
    assert_eq!(row["state"], "queued");
    assert_eq!(row["verdict"], "GO");
    assert_eq!(row["queue_position"], 1);
    assert_eq!(
        row["url"],
        format!("{}/acme/widgets/issues/{}", p.t.forge_url(), public.number)
    );

    let full: serde_json::Value = p
        .get("/status.json", Some(TOKEN))
        .await
        .json()
        .await
        .expect("JSON");
    let mut got = refs(&full);
    got.sort();
    let mut want = vec![public.to_string(), private.to_string()];
    want.sort();
    assert_eq!(got, want);

    // A wrong token is told so, and sees nothing.
    for path in ["/status", "/status.json"] {
        let resp = p.get(path, Some("not-the-token")).await;
        assert_eq!(resp.status(), 401, "{path}");
        let body = resp.text().await.expect("body");
        assert!(
            !body.contains("Private plans") && !body.contains(TOKEN),
            "{body}"
        );
    }
    let text = serde_json::to_string(&full).expect("JSON");
    assert!(!text.contains(TOKEN), "no secret in the page");
}

#[tokio::test]
async fn without_a_configured_token_private_issues_are_never_shown() {
    let p = page(|s| s.status.token = Secret::default()).await;
    p.queued(&p.secret_repo, "Private plans").await;
    let anon: serde_json::Value = p
        .get("/status.json", None)
        .await
        .json()
        .await
        .expect("JSON");
    assert!(refs(&anon).is_empty(), "{anon}");
    // An empty bearer is not a match for an empty token.
    assert_eq!(p.get("/status.json", Some("")).await.status(), 401);
}

#[tokio::test]
async fn a_disabled_page_is_not_there() {
    let p = page(|s| s.status.enabled = false).await;
    assert_eq!(p.get("/status", None).await.status(), 404);
    assert_eq!(p.get("/status.json", Some(TOKEN)).await.status(), 404);
}

#[tokio::test]
async fn a_repository_of_a_limited_organisation_is_hidden_from_anonymous_visitors() {
    let p = page(|s| s.scan.orgs.push("inner".into())).await;
    // `private: false`, but its organisation is `limited`: an anonymous visitor of the forge
    // cannot see it, so neither may one of the status page.
    let limited = p.t.forge.add_org_repo("inner", "tools");
    p.t.forge.set_owner_visibility("inner", "limited");
    p.t.forge.grant(&limited, BOT, Permission::Admin);
    p.t.forge.grant(&limited, WRITER, Permission::Write);
    p.t.forge.define_label(&limited, TRIGGER);
    let public = p.queued(&p.t.repo, "Public work").await;
    let hidden = p.queued(&limited, "Limited plans").await;
    let anon: serde_json::Value = p
        .get("/status.json", None)
        .await
        .json()
        .await
        .expect("JSON");
    assert_eq!(refs(&anon), vec![public.to_string()], "{anon}");
    let page = p.get("/status", None).await.text().await.expect("body");
    assert!(!page.contains("Limited plans"), "{page}");
    let full: serde_json::Value = p
        .get("/status.json", Some(TOKEN))
        .await
        .json()
        .await
        .expect("JSON");
    assert!(refs(&full).contains(&hidden.to_string()), "{full}");
}
