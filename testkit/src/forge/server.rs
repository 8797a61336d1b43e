//! The fake's HTTP face: Forgejo's `/api/v1` routes the director uses, answered from the
//! shared state, pretty-printed as Forgejo does. Every request is recorded and checked
//! against the API spec; `fail_next` makes the next requests fail with a chosen status.

use std::net::TcpListener;

use actix_web::dev::ServerHandle;
use actix_web::http::StatusCode;
use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use serde_json::{Value, json};

use super::{
    Call, FComment, FIssue, FLabel, FReview, FakeForge, Refusal, State, contract, rfc3339,
};
use director::domain::{IssueRef, RepoName};
use director::forge::Permission;

/// A running fake server; stopped when dropped. Every request it serves is checked against
/// Forgejo's API description, and dropping it fails the test (panics) when any did not fit,
/// unless the test took them first ([`FakeForge::take_contract_violations`]).
pub struct FakeServer {
    pub url: String,
    handle: ServerHandle,
    forge: FakeForge,
}

impl FakeServer {
    pub fn url(&self) -> &str {
        &self.url
    }
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        let handle = self.handle.clone();
        drop(handle.stop(false));
        // A test already failing says why on its own; a second panic would abort.
        if std::thread::panicking() {
            return;
        }
        let violations = self.forge.take_contract_violations();
        assert!(
            violations.is_empty(),
            "requests outside Forgejo's API description ({}):\n{}",
            violations.len(),
            violations.join("\n")
        );
    }
}

pub(super) fn start(forge: FakeForge) -> std::io::Result<FakeServer> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    let served = forge.clone();
    let server = HttpServer::new(move || {
        App::new()
            .app_data(web::Data::new(served.clone()))
            .app_data(web::PayloadConfig::new(16 << 20))
            .default_service(web::to(handle))
    })
    .listen(listener)?
    .workers(1)
    .disable_signals()
    .run();
    let handle = server.handle();
    tokio::spawn(server);
    Ok(FakeServer {
        url: format!("http://127.0.0.1:{port}"),
        handle,
        forge,
    })
}

fn pretty(status: StatusCode, value: &Value) -> HttpResponse {
    HttpResponse::build(status)
        .content_type("application/json;charset=utf-8")
        .body(serde_json::to_string_pretty(value).unwrap_or_default())
}

fn message(status: StatusCode, text: &str) -> HttpResponse {
    pretty(
        status,
        &json!({ "message": text, "url": "https://forgejo.example.org/api/swagger" }),
    )
}

fn percent_decode(s: &str) -> String {
    let hex = |b: u8| (b as char).to_digit(16);
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
        {
            out.push((h * 16 + l) as u8);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Who a request authenticates as.
enum Caller {
    /// An API token; restricted tokens carry their scopes and repositories.
    Token {
        login: String,
        restricted: Option<super::FToken>,
    },
    /// Basic auth with the account's password.
    Basic { login: String },
}

impl Caller {
    fn login(&self) -> &str {
        match self {
            Self::Token { login, .. } | Self::Basic { login } => login,
        }
    }
}

fn authenticate(state: &State, req: &HttpRequest) -> Option<Caller> {
    use base64::Engine;
    let value = req.headers().get("authorization")?.to_str().ok()?;
    if let Some(b64) = value.strip_prefix("Basic ") {
        let raw = base64::engine::general_purpose::STANDARD
            .decode(b64.trim())
            .ok()?;
        let raw = String::from_utf8(raw).ok()?;
        let (login, password) = raw.split_once(':')?;
        state.check_password(login, password).ok()?;
        return Some(Caller::Basic {
            login: login.to_owned(),
        });
    }
    let token = value
        .strip_prefix("token ")
        .or_else(|| value.strip_prefix("Bearer "))?
        .trim();
    if let Some(login) = state.tokens.get(token) {
        return Some(Caller::Token {
            login: login.clone(),
            restricted: None,
        });
    }
    let t = state.user_tokens.iter().find(|t| t.sha1 == token)?;
    Some(Caller::Token {
        login: t.login.clone(),
        restricted: Some(t.clone()),
    })
}

/// Why a restricted token may not make this request, if it may not: repositories outside its
/// list, and scopes it lacks (`issue` endpoints need an issue scope; writes need `write:`).
fn restriction(t: &super::FToken, method: &str, seg: &[String]) -> Option<&'static str> {
    let parts: Vec<&str> = seg.iter().map(String::as_str).collect();
    let ["repos", owner, name, rest @ ..] = parts.as_slice() else {
        return Some("the token's scopes do not cover this endpoint");
    };
    if let Some(repos) = &t.repos
        && !repos
            .iter()
            .any(|r| r.owner() == *owner && r.name() == *name)
    {
        return Some("the token does not have access to this repository");
    }
    let category = match rest.first() {
        Some(&"issues") | Some(&"labels") => "issue",
        _ => "repository",
    };
    let write = method != "GET";
    let ok = t
        .scopes
        .iter()
        .any(|s| s == &format!("write:{category}") || (!write && s == &format!("read:{category}")));
    (!ok).then_some("the token's scopes do not cover this endpoint")
}

async fn handle(req: HttpRequest, body: web::Bytes, forge: web::Data<FakeForge>) -> HttpResponse {
    if super::git::is_git_path(req.path()) {
        return super::git::serve(req, body, forge.get_ref()).await;
    }
    // When it arrived, before it is answered.
    let at_us = chrono::Utc::now().timestamp_micros();
    let method = req.method().as_str().to_owned();
    let raw_path = req.path().to_owned();
    let segments: Vec<String> = raw_path
        .trim_start_matches("/api/v1")
        .trim_matches('/')
        .split('/')
        .map(percent_decode)
        .collect();
    let path = format!("/api/v1/{}", segments.join("/"));
    let query: Vec<(String, String)> =
        web::Query::<Vec<(String, String)>>::from_query(req.query_string())
            .map(|q| q.into_inner())
            .unwrap_or_default();
    let json_body: Option<Value> = if body.is_empty() {
        None
    } else {
        match serde_json::from_slice(&body) {
            Ok(v) => Some(v),
            Err(e) => return message(StatusCode::BAD_REQUEST, &format!("invalid JSON: {e}")),
        }
    };
    let response = {
        let mut state = forge.state();
        let login = authenticate(&state, &req);
        match contract::spec() {
            Ok(spec) => {
                if let Err(v) = spec.check(&method, &path, &query, json_body.as_ref()) {
                    state.violations.push(v);
                }
            }
            Err(e) => state.violations.push(format!("spec unavailable: {e}")),
        }
        let injected = state.fail_next.pop_front().or_else(|| {
            let at = state
                .fail_paths
                .iter()
                .position(|(part, _)| path.contains(part.as_str()))?;
            state.fail_paths.remove(at).map(|(_, code)| code)
        });
        let (status, value, headers) = if let Some(code) = injected {
            (
                StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                json!({ "message": "injected failure" }),
                Vec::new(),
            )
        } else if let Some(caller) = &login {
            let refused = match caller {
                Caller::Token {
                    restricted: Some(t),
                    ..
                } => restriction(t, &method, &segments),
                // Tokens are listed, minted and deleted with Basic auth only (Forgejo's
                // password auth serves the rest of the API too).
                Caller::Token { .. } if segments.first().map(String::as_str) == Some("users") => {
                    Some("this endpoint needs Basic auth")
                }
                _ => None,
            };
            match refused {
                Some(why) => (StatusCode::FORBIDDEN, json!({ "message": why }), Vec::new()),
                None => route(
                    &mut state,
                    &method,
                    &segments,
                    &query,
                    json_body.as_ref(),
                    caller.login(),
                ),
            }
        } else if let (true, ["repos", o, r]) = (
            // No credential at all (a wrong one is refused, as Forgejo refuses it).
            method == "GET" && req.headers().get("authorization").is_none(),
            segments
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>()
                .as_slice(),
        ) {
            // An anonymous visitor sees a repository only when it and its owner are public.
            match RepoName::new(o, r) {
                Ok(repo) if state.anonymous_can_see(&repo) => {
                    (StatusCode::OK, repo_json(&state, &repo), Vec::new())
                }
                _ => (
                    StatusCode::NOT_FOUND,
                    json!({ "message": "The target couldn't be found." }),
                    Vec::new(),
                ),
            }
        } else {
            (
                StatusCode::UNAUTHORIZED,
                json!({ "message": "token is required" }),
                Vec::new(),
            )
        };
        let (status, value) = match state
            .answer_after_applying
            .iter()
            .position(|(m, part, _)| *m == method && path.contains(part.as_str()))
        {
            Some(at) if status.is_success() => {
                let (_, _, code) = state.answer_after_applying.remove(at);
                (
                    StatusCode::from_u16(code).unwrap_or(StatusCode::GATEWAY_TIMEOUT),
                    json!({ "message": "the proxy gave up waiting (the forge applied the request)" }),
                )
            }
            _ => (status, value),
        };
        state.calls.push(Call {
            method: method.clone(),
            path: path.clone(),
            query: query.clone(),
            body: json_body.clone(),
            status: status.as_u16(),
            login: login.as_ref().map(|c| c.login().to_owned()),
            at_us,
        });
        let recorded = state.calls.len();
        state.called.send_replace(recorded);
        let mut resp = if status == StatusCode::NO_CONTENT {
            HttpResponse::NoContent().finish()
        } else {
            // A text answer (a diff) is sent as it is, not as a JSON string.
            let mut r = match &value {
                Value::String(text) if headers.iter().any(|(k, _)| k == "content-type") => {
                    HttpResponse::build(status).body(text.clone())
                }
                _ => pretty(status, &value),
            };
            for (k, v) in headers {
                if let (Ok(name), Ok(val)) = (
                    actix_web::http::header::HeaderName::from_bytes(k.as_bytes()),
                    actix_web::http::header::HeaderValue::from_str(&v),
                ) {
                    r.headers_mut().insert(name, val);
                }
            }
            r
        };
        if status.is_server_error() {
            resp.headers_mut().remove("x-total-count");
        }
        // Forgejo's `Date` is the clock its `updated_at` values come from: so is the fake's.
        if let Some(date) = chrono::DateTime::from_timestamp(state.now, 0)
            .map(|t| t.format("%a, %d %b %Y %H:%M:%S GMT").to_string())
            .and_then(|d| actix_web::http::header::HeaderValue::from_str(&d).ok())
        {
            resp.headers_mut()
                .insert(actix_web::http::header::DATE, date);
        }
        resp
    };
    // Forgejo sends webhooks from a queue, after the API has answered.
    let echo = forge.get_ref().clone();
    tokio::spawn(async move {
        echo.deliver_webhooks().await;
    });
    response
}

pub(super) type Answer = (StatusCode, Value, Vec<(String, String)>);

fn ok(value: Value) -> Answer {
    (StatusCode::OK, value, Vec::new())
}

fn refusal(r: Refusal) -> Answer {
    match r {
        Refusal::NotFound => (
            StatusCode::NOT_FOUND,
            json!({ "message": "The target couldn't be found." }),
            Vec::new(),
        ),
        Refusal::Forbidden => (
            StatusCode::FORBIDDEN,
            json!({ "message": "forbidden" }),
            Vec::new(),
        ),
        Refusal::Unauthorized => (
            StatusCode::UNAUTHORIZED,
            json!({ "message": "unauthorized" }),
            Vec::new(),
        ),
        Refusal::Conflict(m) => (StatusCode::CONFLICT, json!({ "message": m }), Vec::new()),
        Refusal::Unprocessable(m) => (
            StatusCode::UNPROCESSABLE_ENTITY,
            json!({ "message": m }),
            Vec::new(),
        ),
        Refusal::BadRequest(m) => (StatusCode::BAD_REQUEST, json!({ "message": m }), Vec::new()),
        Refusal::NotAllowed(m) => (
            StatusCode::METHOD_NOT_ALLOWED,
            json!({ "message": m }),
            Vec::new(),
        ),
        Refusal::Internal(m) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({ "message": m }),
            Vec::new(),
        ),
    }
}

fn param<'a>(query: &'a [(String, String)], name: &str) -> Option<&'a str> {
    query
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

/// Forgejo's paging: `page` from 1, `limit` defaulting to 30 and capped at 50. The `Link`
/// header is built from a ROOT_URL that is wrong on purpose, as it can be behind a proxy.
fn paginate(items: Vec<Value>, query: &[(String, String)], total_is_page_size: bool) -> Answer {
    let page = param(query, "page")
        .and_then(|p| p.parse::<usize>().ok())
        .filter(|p| *p > 0)
        .unwrap_or(1);
    let limit = param(query, "limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|l| *l > 0)
        .unwrap_or(30)
        .min(50);
    let total = items.len();
    let slice: Vec<Value> = items
        .into_iter()
        .skip((page - 1) * limit)
        .take(limit)
        .collect();
    let count = if total_is_page_size {
        slice.len()
    } else {
        total
    };
    let mut headers = vec![("X-Total-Count".to_owned(), count.to_string())];
    if !total_is_page_size && page * limit < total {
        headers.push((
            "Link".to_owned(),
            format!(
                "<http://forgejo.invalid:3000/api/v1/wrong?page={}&limit={limit}>; rel=\"next\"",
                page + 1
            ),
        ));
    }
    (StatusCode::OK, Value::Array(slice), headers)
}

fn route(
    s: &mut State,
    method: &str,
    seg: &[String],
    query: &[(String, String)],
    body: Option<&Value>,
    login: &str,
) -> Answer {
    let parts: Vec<&str> = seg.iter().map(String::as_str).collect();
    // A private repository (a private repository's fork is one) does not exist for those
    // who cannot read it: Forgejo answers 404.
    if let ["repos", o, r, ..] = parts.as_slice()
        && let Ok(repo) = RepoName::new(o, r)
        && s.repos.get(&repo).is_some_and(|r| r.private)
        && s.permission_of(&repo, login) < Permission::Read
    {
        return refusal(Refusal::NotFound);
    }
    if let Some(answer) = checks_route(s, method, &parts, query, body, login) {
        return answer.unwrap_or_else(refusal);
    }
    // By resource, as Forgejo's API groups them.
    let by = match parts.as_slice() {
        ["repos", "issues", "search"] | ["repos", _, _, "issues", ..] => issues,
        ["repos", _, _, "pulls", ..] => pulls,
        ["repos", ..] => repos,
        _ => accounts,
    };
    by(s, method, &parts, query, body, login).unwrap_or_else(refusal)
}

/// Commit statuses, the combined status, merging and updating a pull request (their state
/// in `checks.rs`).
fn checks_route(
    s: &mut State,
    method: &str,
    parts: &[&str],
    query: &[(String, String)],
    body: Option<&Value>,
    login: &str,
) -> Option<Result<Answer, Refusal>> {
    let repo = |o: &str, r: &str| RepoName::new(o, r).map_err(|_| Refusal::NotFound);
    let empty = Value::Null;
    let body = body.unwrap_or(&empty);
    Some(match (method, parts) {
        ("POST", ["repos", o, r, "statuses", sha]) => repo(o, r)
            .and_then(|repo| s.post_status(login, &repo, sha, body))
            .map(|v| (StatusCode::CREATED, v, Vec::new())),
        ("GET", ["repos", o, r, "commits", reference, "status"]) => repo(o, r)
            .and_then(|repo| s.combined_status(&repo, reference, query))
            .map(|v| (StatusCode::OK, v, Vec::new())),
        ("POST", ["repos", o, r, "pulls", n, "merge"]) => {
            let Ok(n) = n.parse::<u64>() else {
                return Some(Err(Refusal::NotFound));
            };
            repo(o, r)
                .and_then(|repo| s.merge_by_api(login, &repo, n, body))
                .map(|()| (StatusCode::OK, Value::Null, Vec::new()))
        }
        ("POST", ["repos", o, r, "pulls", n, "update"]) => {
            let Ok(n) = n.parse::<u64>() else {
                return Some(Err(Refusal::NotFound));
            };
            repo(o, r)
                .and_then(|repo| s.update_pull(login, &repo, n))
                .map(|()| (StatusCode::OK, Value::Null, Vec::new()))
        }
        ("GET", ["repos", o, r, "forks"]) => repo(o, r).map(|base| {
            let forks: Vec<Value> = s
                .repos
                .values()
                .filter(|f| f.fork_of.as_ref() == Some(&base))
                .filter(|f| !f.private || s.permission_of(&f.name, login) >= Permission::Read)
                .map(|f| repo_json(s, &f.name))
                .collect();
            paginate(forks, query, false)
        }),
        ("POST", ["repos", o, r, "forks"]) => repo(o, r)
            .and_then(|base| s.create_fork(login, &base, body["organization"].as_str()))
            .map(|fork| (StatusCode::ACCEPTED, repo_json(s, &fork), Vec::new())),
        ("GET", ["repos", o, r, "sync_fork", branch]) => repo(o, r)
            .and_then(|fork| s.sync_fork_info(&fork, branch))
            .map(|(allowed, fork_commit, base_commit, behind)| {
                (
                    StatusCode::OK,
                    json!({ "allowed": allowed, "fork_commit": fork_commit, "base_commit": base_commit, "commits_behind": behind }),
                    Vec::new(),
                )
            }),
        ("POST", ["repos", o, r, "sync_fork", branch]) => repo(o, r)
            .and_then(|fork| s.sync_fork(login, &fork, branch))
            .map(|()| (StatusCode::NO_CONTENT, Value::Null, Vec::new())),
        ("GET", ["repos", o, r, "actions", "runs"]) => repo(o, r)
            .and_then(|repo| {
                if s.permission_of(&repo, login) < Permission::Read {
                    return Err(Refusal::NotFound);
                }
                s.action_runs_json(&repo, param(query, "head_sha").unwrap_or_default())
            })
            .map(|v| (StatusCode::OK, v, Vec::new())),
        ("GET", ["repos", o, r, "git", "commits", file]) if file.ends_with(".diff") => {
            repo(o, r).and_then(|repo| {
                if s.permission_of(&repo, login) < Permission::Read {
                    return Err(Refusal::NotFound);
                }
                s.commit_diff(&repo, file)
            })
        }
        ("GET", ["repos", o, r, "commits"]) => repo(o, r)
            .and_then(|repo| {
                s.recent_commits(
                    &repo,
                    param(query, "sha").unwrap_or_default(),
                    param(query, "not"),
                    param(query, "limit")
                        .and_then(|l| l.parse().ok())
                        .unwrap_or(30),
                )
            })
            .map(|v| (StatusCode::OK, Value::Array(v), Vec::new())),
        ("DELETE", ["repos", o, r, "branches", branch]) => repo(o, r)
            .and_then(|repo| s.delete_branch(login, &repo, branch))
            .map(|()| (StatusCode::NO_CONTENT, Value::Null, Vec::new())),
        _ => return None,
    })
}

/// `owner/name` from two path segments; a name Forgejo could not have is not found.
fn repo_of(o: &str, r: &str) -> Result<RepoName, Refusal> {
    RepoName::new(o, r).map_err(|_| Refusal::NotFound)
}

/// Issues: search, list, create, and each issue's comments, labels and timeline.
fn issues(
    s: &mut State,
    method: &str,
    parts: &[&str],
    query: &[(String, String)],
    body: Option<&Value>,
    login: &str,
) -> Result<Answer, Refusal> {
    match (method, parts) {
        ("GET", ["repos", "issues", "search"]) => {
            let since = match param(query, "since") {
                Some(t) => Some(
                    chrono::DateTime::parse_from_rfc3339(t)
                        .map_err(|e| Refusal::Unprocessable(format!("since: {e}")))?
                        .timestamp(),
                ),
                None => None,
            };
            let found = s.search_issues(
                login,
                param(query, "state").unwrap_or("open"),
                param(query, "type").unwrap_or(""),
                param(query, "labels").unwrap_or(""),
                since,
            );
            let items = found
                .into_iter()
                .map(|(repo, i)| issue_json(s, &repo, i))
                .collect();
            Ok(paginate(items, query, false))
        }
        ("GET", ["repos", o, r, "issues"]) => {
            let repo = repo_of(o, r)?;
            let list = s.list_issues(
                &repo,
                param(query, "state").unwrap_or("open"),
                param(query, "type").unwrap_or(""),
                param(query, "labels").unwrap_or(""),
                param(query, "created_by").unwrap_or(""),
            )?;
            let items = list.into_iter().map(|i| issue_json(s, &repo, i)).collect();
            Ok(paginate(items, query, false))
        }
        ("POST", ["repos", o, r, "issues"]) => {
            let repo = repo_of(o, r)?;
            let b = body.cloned().unwrap_or(Value::Null);
            let title = b["title"].as_str().unwrap_or_default();
            if title.is_empty() {
                return Err(Refusal::Unprocessable("title is required".into()));
            }
            let labels: Vec<u64> = b["labels"]
                .as_array()
                .map(|l| l.iter().filter_map(Value::as_u64).collect())
                .unwrap_or_default();
            let number = s.file_issue(
                login,
                &repo,
                title,
                b["body"].as_str().unwrap_or_default(),
                &labels,
            )?;
            let issue = IssueRef::new(repo.clone(), number);
            let i = s.issue(&issue)?;
            Ok((StatusCode::CREATED, issue_json(s, &repo, i), Vec::new()))
        }
        ("PATCH", ["repos", o, r, "issues", "comments", id]) => {
            let repo = repo_of(o, r)?;
            let id: u64 = id.parse().map_err(|_| Refusal::NotFound)?;
            let text = body.and_then(|b| b["body"].as_str()).unwrap_or_default();
            let (c, number) = s.edit_comment(login, &repo, id, text)?;
            Ok(ok(comment_json(s, &repo, number, &c)))
        }
        (_, ["repos", o, r, "issues", n, rest @ ..]) => {
            let repo = repo_of(o, r)?;
            let number: u64 = n.parse().map_err(|_| Refusal::NotFound)?;
            let issue = IssueRef::new(repo.clone(), number);
            match (method, rest) {
                ("GET", []) => {
                    let i = s.issue(&issue)?;
                    Ok(ok(issue_json(s, &repo, i)))
                }
                ("GET", ["comments"]) => {
                    let i = s.issue(&issue)?;
                    let list = i
                        .comments
                        .iter()
                        .map(|c| comment_json(s, &repo, number, c))
                        .collect();
                    Ok(ok(Value::Array(list)))
                }
                ("POST", ["comments"]) => {
                    let text = body.and_then(|b| b["body"].as_str()).unwrap_or_default();
                    let c = s.add_comment(login, &issue, text)?;
                    Ok((
                        StatusCode::CREATED,
                        comment_json(s, &repo, number, &c),
                        Vec::new(),
                    ))
                }
                ("GET", ["timeline"]) => {
                    let i = s.issue(&issue)?;
                    let items = i.timeline.iter().map(|t| {
                        let label = t.label_id.and_then(|id| s.repo(&repo).ok()?.labels.iter().find(|l| l.id == id).map(|l| label_json(&repo, l)));
                        json!({
                            "id": t.id,
                            "type": t.kind,
                            "html_url": format!("https://forgejo.example.org/{repo}/issues/{number}#issuecomment-{}", t.id),
                            "issue_url": format!("https://forgejo.example.org/{repo}/issues/{number}"),
                            "pull_request_url": "",
                            "user": user_json(s, &t.actor),
                            "body": t.body,
                            "label": label,
                            "created_at": rfc3339(t.created),
                            "updated_at": rfc3339(t.created),
                        })
                    }).collect();
                    Ok(paginate(items, query, true))
                }
                ("POST", ["labels"]) => {
                    if s.permission_of(&repo, login) < director::forge::Permission::Write {
                        return Err(Refusal::Forbidden);
                    }
                    let wanted = body
                        .and_then(|b| b["labels"].as_array())
                        .cloned()
                        .unwrap_or_default();
                    for w in wanted {
                        let id = match &w {
                            Value::Number(n) => n.as_u64(),
                            Value::String(name) => s.label_by_name(&repo, name).ok().map(|l| l.id),
                            _ => None,
                        };
                        if let Some(id) = id {
                            match s.change_label(login, &issue, id, true) {
                                Ok(()) | Err(Refusal::Unprocessable(_)) => {}
                                Err(e) => return Err(e),
                            }
                        }
                    }
                    let i = s.issue(&issue)?;
                    Ok(ok(issue_json(s, &repo, i)["labels"].clone()))
                }
                ("DELETE", ["labels", ident]) => {
                    if s.permission_of(&repo, login) < director::forge::Permission::Write {
                        return Err(Refusal::Forbidden);
                    }
                    let id = match ident.parse::<u64>() {
                        Ok(id) => id,
                        Err(_) => s.label_by_name(&repo, ident)?.id,
                    };
                    match s.change_label(login, &issue, id, false) {
                        Ok(()) => Ok((StatusCode::NO_CONTENT, Value::Null, Vec::new())),
                        Err(Refusal::NotFound) => {
                            Err(Refusal::Unprocessable(format!("label {id} not found")))
                        }
                        Err(e) => Err(e),
                    }
                }
                _ => Err(Refusal::NotFound),
            }
        }
        _ => Err(Refusal::NotFound),
    }
}

/// Pull requests, their reviews and review comments.
fn pulls(
    s: &mut State,
    method: &str,
    parts: &[&str],
    query: &[(String, String)],
    body: Option<&Value>,
    login: &str,
) -> Result<Answer, Refusal> {
    match (method, parts) {
        ("GET", ["repos", o, r, "pulls", n, "reviews"]) if n.parse::<u64>().is_ok() => {
            let repo = repo_of(o, r)?;
            let n: u64 = n.parse().map_err(|_| Refusal::NotFound)?;
            let reviews = reviews_json(s, &repo, n)?;
            Ok(paginate(reviews, query, false))
        }
        ("GET", ["repos", o, r, "pulls", n, "reviews", id, "comments"]) => {
            let repo = repo_of(o, r)?;
            let n: u64 = n.parse().map_err(|_| Refusal::NotFound)?;
            let id: u64 = id.parse().map_err(|_| Refusal::NotFound)?;
            Ok(ok(Value::Array(review_comments_json(s, &repo, n, id)?)))
        }
        ("PATCH", ["repos", o, r, "pulls", n]) => {
            let repo = repo_of(o, r)?;
            let n: u64 = n.parse().map_err(|_| Refusal::NotFound)?;
            if let Some(title) = body.and_then(|b| b["title"].as_str()) {
                s.edit_pull_title(login, &repo, n, title)?;
            }
            Ok(ok(pull_json(s, &repo, n)?))
        }
        ("GET", ["repos", o, r, "pulls", n]) => {
            let repo = repo_of(o, r)?;
            let n: u64 = n.parse().map_err(|_| Refusal::NotFound)?;
            Ok(ok(pull_json(s, &repo, n)?))
        }
        ("GET", ["repos", o, r, "pulls", base, head]) => {
            let repo = repo_of(o, r)?;
            let rr = s.repo(&repo)?;
            // `owner/name:branch` (or `owner:branch`, the same name) names a fork's branch,
            // as Forgejo's `GetPullRequestByBaseHead` reads it.
            let (head_repo, head) = match head.split_once(':') {
                Some((fork, branch)) => {
                    let fork = match fork.split_once('/') {
                        Some((o, n)) => repo_of(o, n)?,
                        None => repo_of(fork, repo.name())?,
                    };
                    s.repo(&fork)?;
                    (Some(fork), branch)
                }
                None => (None, *head),
            };
            let p = rr
                .pulls
                .iter()
                .find(|p| p.base == *base && p.head == head && p.head_repo == head_repo)
                .ok_or(Refusal::NotFound)?;
            Ok(ok(
                json!({ "id": p.number, "number": p.number, "state": p.state, "head": { "ref": p.head }, "base": { "ref": p.base } }),
            ))
        }
        ("POST", ["repos", o, r, "pulls"]) => {
            let repo = repo_of(o, r)?;
            let b = body.cloned().unwrap_or(Value::Null);
            let number = s.create_pull(
                login,
                &repo,
                b["head"].as_str().unwrap_or_default(),
                b["base"].as_str().unwrap_or_default(),
                b["title"].as_str().unwrap_or_default(),
                b["body"].as_str().unwrap_or_default(),
            )?;
            Ok((
                StatusCode::CREATED,
                json!({ "id": number, "number": number, "state": "open" }),
                Vec::new(),
            ))
        }
        _ => Err(Refusal::NotFound),
    }
}

/// A repository and what hangs off it: labels, permissions, branches, contents, hooks, compare.
fn repos(
    s: &mut State,
    method: &str,
    parts: &[&str],
    query: &[(String, String)],
    body: Option<&Value>,
    login: &str,
) -> Result<Answer, Refusal> {
    match (method, parts) {
        ("GET", ["repos", o, r]) => {
            let repo = repo_of(o, r)?;
            s.repo(&repo)?;
            Ok(ok(repo_json(s, &repo)))
        }
        ("GET", ["repos", o, r, "labels"]) => {
            let repo = repo_of(o, r)?;
            let items = s
                .repo(&repo)?
                .labels
                .iter()
                .map(|l| label_json(&repo, l))
                .collect();
            Ok(paginate(items, query, false))
        }
        ("POST", ["repos", o, r, "labels"]) => {
            let repo = repo_of(o, r)?;
            let b = body.cloned().unwrap_or(Value::Null);
            let name = b["name"].as_str().unwrap_or_default();
            let color = b["color"].as_str().unwrap_or_default();
            if name.is_empty() || color.is_empty() {
                return Err(Refusal::Unprocessable("name and color are required".into()));
            }
            let l = s.create_label(
                &repo,
                name,
                color,
                b["description"].as_str().unwrap_or_default(),
            )?;
            Ok((StatusCode::CREATED, label_json(&repo, &l), Vec::new()))
        }
        ("GET", ["repos", o, r, "collaborators"]) => {
            let repo = repo_of(o, r)?;
            let mut people: Vec<&String> = s.repo(&repo)?.permissions.keys().collect();
            people.sort();
            let items = people.into_iter().map(|p| user_json(s, p)).collect();
            Ok(paginate(items, query, false))
        }
        ("GET", ["repos", o, r, "teams"]) => {
            let repo = repo_of(o, r)?;
            s.repo(&repo)?;
            if !s.orgs.contains_key(repo.owner()) {
                return Err(Refusal::NotAllowed(
                    "repo is not owned by an organization".into(),
                ));
            }
            let teams = s.teams_of(&repo).iter().map(|t| t.json(s)).collect();
            Ok(ok(Value::Array(teams)))
        }
        ("GET", ["repos", o, r, "collaborators", user, "permission"]) => {
            let repo = repo_of(o, r)?;
            s.repo(&repo)?;
            // Forgejo shows a collaborator's permission only to repository admins (or the user).
            if s.permission_of(&repo, login) < director::forge::Permission::Admin && login != *user
            {
                return Err(Refusal::Forbidden);
            }
            if !s.users.contains_key(*user) {
                return Err(Refusal::NotFound);
            }
            let p = s.permission_of(&repo, user);
            Ok(ok(
                json!({ "permission": p.as_str(), "role_name": p.as_str(), "user": user_json(s, user) }),
            ))
        }
        ("GET", ["repos", o, r, "branches", branch]) => {
            let repo = repo_of(o, r)?;
            let rr = s.repo(&repo)?;
            let commits = rr.branches.get(*branch).ok_or(Refusal::NotFound)?;
            let protected = *branch == rr.default_branch && rr.protect_default;
            Ok(ok(json!({
                "name": branch,
                "commit": { "id": rr.commit_name(commits.last().copied().unwrap_or(0)), "message": "commit" },
                "protected": protected,
                "required_approvals": 0,
                "enable_status_check": false,
                "status_check_contexts": [],
                "user_can_push": s.can_push(&repo, login, branch),
                "user_can_merge": s.can_merge(&repo, login, branch),
                "effective_branch_protection_name": if protected { branch.to_string() } else { String::new() },
            })))
        }
        ("GET", ["repos", o, r, "contents", file @ ..]) if !file.is_empty() => {
            let repo = repo_of(o, r)?;
            let path = file.join("/");
            let reference = query
                .iter()
                .find(|(k, _)| k == "ref")
                .map(|(_, v)| v.clone())
                .unwrap_or_else(|| {
                    s.repo(&repo)
                        .map(|r| r.default_branch.clone())
                        .unwrap_or_default()
                });
            let (bytes, commit) = s
                .file_at(&repo, &reference, &path)?
                .ok_or(Refusal::NotFound)?;
            use base64::Engine as _;
            let name = file.last().copied().unwrap_or_default();
            Ok(ok(json!({
                "name": name,
                "path": path,
                "sha": format!("{:040x}", bytes.len() as u64 ^ commit),
                "last_commit_sha": s.repo(&repo)?.commit_name(commit),
                "type": "file",
                "size": bytes.len(),
                "encoding": "base64",
                "content": base64::engine::general_purpose::STANDARD.encode(&bytes),
                "url": format!("/api/v1/repos/{repo}/contents/{path}"),
                "html_url": format!("/{repo}/src/commit/{commit:040x}/{path}"),
                "git_url": null,
                "download_url": format!("/{repo}/raw/commit/{commit:040x}/{path}"),
            })))
        }
        ("POST", ["repos", o, r, "contents", ..]) => {
            let repo = repo_of(o, r)?;
            let b = body.cloned().unwrap_or(Value::Null);
            let default = s.repo(&repo)?.default_branch.clone();
            let from = b["branch"]
                .as_str()
                .filter(|x| !x.is_empty())
                .unwrap_or(&default)
                .to_owned();
            let target = b["new_branch"]
                .as_str()
                .filter(|x| !x.is_empty())
                .unwrap_or(&from)
                .to_owned();
            if let Some(g) = s.repo(&repo)?.git.clone() {
                if !s.can_push(&repo, login, &target) {
                    return Err(Refusal::Forbidden);
                }
                use base64::Engine as _;
                let content = base64::engine::general_purpose::STANDARD
                    .decode(b["content"].as_str().unwrap_or_default())
                    .map_err(|e| Refusal::Unprocessable(format!("content: {e}")))?;
                let file = parts.get(4..).map(|p| p.join("/")).unwrap_or_default();
                let message = b["message"].as_str().unwrap_or_default();
                let sha = super::git::commit_file(&g, &from, &target, &file, &content, message)
                    .and_then(|sha| super::git::sync(s, &repo).map(|()| sha))
                    .map_err(|e| Refusal::Unprocessable(e.to_string()))?;
                return Ok((
                    StatusCode::CREATED,
                    json!({ "content": null, "commit": { "sha": sha } }),
                    Vec::new(),
                ));
            }
            use base64::Engine as _;
            let content = base64::engine::general_purpose::STANDARD
                .decode(b["content"].as_str().unwrap_or_default())
                .map_err(|e| Refusal::Unprocessable(format!("content: {e}")))?;
            let file = parts.get(4..).map(|p| p.join("/")).unwrap_or_default();
            let commit = s.commit_file(login, &repo, &from, &target, (&file, &content))?;
            s.pull_pushed(login, &repo, &target);
            s.fork_pushed(login, &repo, &target);
            Ok((
                StatusCode::CREATED,
                json!({ "content": null, "commit": { "sha": s.repo(&repo)?.commit_name(commit) } }),
                Vec::new(),
            ))
        }
        ("GET", ["repos", o, r, "hooks"]) => {
            let repo = repo_of(o, r)?;
            let hooks: Vec<Value> = s.list_hooks(login, &repo)?.iter().map(hook_json).collect();
            Ok(paginate(hooks, query, false))
        }
        ("POST", ["repos", o, r, "hooks"]) => {
            let repo = repo_of(o, r)?;
            let h = s.create_hook(login, &repo, body.unwrap_or(&Value::Null))?;
            Ok((StatusCode::CREATED, hook_json(&h), Vec::new()))
        }
        ("PATCH", ["repos", o, r, "hooks", id]) => {
            let repo = repo_of(o, r)?;
            let id: u64 = id.parse().map_err(|_| Refusal::NotFound)?;
            let h = s.edit_hook(login, &repo, id, body.unwrap_or(&Value::Null))?;
            Ok(ok(hook_json(&h)))
        }
        ("DELETE", ["repos", o, r, "hooks", id]) => {
            let repo = repo_of(o, r)?;
            let id: u64 = id.parse().map_err(|_| Refusal::NotFound)?;
            s.delete_hook(login, &repo, id)?;
            Ok((StatusCode::NO_CONTENT, Value::Null, Vec::new()))
        }
        ("GET", ["repos", o, r, "compare", basehead]) => {
            let repo = repo_of(o, r)?;
            let (base, head) = basehead.split_once("...").ok_or(Refusal::NotFound)?;
            let ahead = s.commits_ahead(&repo, base, head)?;
            let commits: Vec<Value> = (0..ahead)
                .map(|i| json!({ "sha": format!("{i:040x}") }))
                .collect();
            Ok(ok(
                json!({ "total_commits": ahead, "commits": commits, "files": [] }),
            ))
        }
        _ => Err(Refusal::NotFound),
    }
}

/// The signed-in user, runner tokens and organisations' repositories.
fn accounts(
    s: &mut State,
    method: &str,
    parts: &[&str],
    query: &[(String, String)],
    body: Option<&Value>,
    login: &str,
) -> Result<Answer, Refusal> {
    match (method, parts) {
        ("GET", ["user"]) => Ok(ok(user_json(s, login))),
        ("GET", ["teams", id, "members"]) => {
            // Forgejo shows a team's members to its members (and the organisation's owners).
            let team = s
                .teams
                .iter()
                .find(|t| t.id.to_string() == *id)
                .ok_or(Refusal::NotFound)?;
            if !team.members.contains(login) {
                return Err(Refusal::Forbidden);
            }
            let items = team.members.iter().map(|m| user_json(s, m)).collect();
            Ok(paginate(items, query, false))
        }
        ("GET", ["user", "teams"]) => Ok(paginate(s.user_teams_json(login), query, false)),
        ("POST", ["users", user, "tokens"]) => {
            if *user != login {
                return Err(Refusal::Forbidden);
            }
            let b = body.cloned().unwrap_or(Value::Null);
            let scopes: Vec<String> = b["scopes"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect();
            let repos: Option<Vec<RepoName>> = b["repositories"].as_array().map(|list| {
                list.iter()
                    .filter_map(|r| RepoName::new(r["owner"].as_str()?, r["name"].as_str()?).ok())
                    .collect()
            });
            let password = s.passwords.get(login).cloned().unwrap_or_default();
            let t = s.mint_token(
                login,
                &password,
                b["name"].as_str().unwrap_or_default(),
                scopes,
                repos,
            )?;
            Ok((
                StatusCode::CREATED,
                json!({
                    "id": t.id, "name": t.name, "sha1": t.sha1,
                    "token_last_eight": t.sha1.chars().rev().take(8).collect::<String>().chars().rev().collect::<String>(),
                    "scopes": t.scopes,
                    "repositories": t.repos.as_ref().map(|list| list.iter().map(|r| json!({
                        "id": s.repo(r).map(|x| x.id).unwrap_or(0),
                        "name": r.name(),
                        "owner": r.owner(),
                        "full_name": r.to_string(),
                    })).collect::<Vec<_>>()),
                }),
                Vec::new(),
            ))
        }
        ("GET", ["users", user, "tokens"]) => {
            if *user != login {
                return Err(Refusal::Forbidden);
            }
            let items = s.user_tokens.iter().filter(|t| t.login == login).map(|t| json!({ "id": t.id, "name": t.name, "scopes": t.scopes, "sha1": "", "token_last_eight": "" })).collect();
            Ok(paginate(items, query, false))
        }
        ("DELETE", ["users", user, "tokens", token]) => {
            if *user != login {
                return Err(Refusal::Forbidden);
            }
            let before = s.user_tokens.len();
            s.user_tokens.retain(|t| {
                !(t.login == login && (t.name == *token || t.id.to_string() == *token))
            });
            if s.user_tokens.len() == before {
                return Err(Refusal::NotFound);
            }
            Ok((StatusCode::NO_CONTENT, Value::Null, Vec::new()))
        }
        ("GET", ["orgs", org, "repos"]) => {
            let repos = s.orgs.get(*org).cloned().ok_or(Refusal::NotFound)?;
            let items = repos.iter().map(|r| repo_json(s, r)).collect();
            Ok(paginate(items, query, false))
        }
        _ => Err(Refusal::NotFound),
    }
}

/// A hook as Forgejo lists it: the secret never shown.
fn hook_json(h: &super::FHook) -> Value {
    json!({
        "id": h.id,
        "type": h.kind,
        "config": { "url": h.url, "content_type": h.content_type, "http_method": "post" },
        "events": h.events,
        "active": h.active,
        "authorization_header": h.authorization,
        "branch_filter": "*",
        "created_at": rfc3339(super::EPOCH),
        "updated_at": rfc3339(super::EPOCH),
    })
}

pub(super) fn user_json(s: &State, login: &str) -> Value {
    let id = s.users.get(login).copied().unwrap_or(0);
    json!({
        "id": id,
        "login": login,
        "login_name": "",
        "source_id": 0,
        "full_name": "",
        "email": format!("{login}@noreply.example.org"),
        "avatar_url": format!("https://forgejo.example.org/avatars/{id}"),
        "html_url": format!("https://forgejo.example.org/{login}"),
        "language": "",
        "is_admin": false,
        "restricted": false,
        "active": true,
        "prohibit_login": false,
        "visibility": "public",
        "username": login,
    })
}

pub(super) fn label_json(repo: &RepoName, l: &FLabel) -> Value {
    json!({
        "id": l.id,
        "name": l.name,
        "exclusive": false,
        "is_archived": false,
        "color": l.color.trim_start_matches('#'),
        "description": l.description,
        "url": format!("https://forgejo.example.org/api/v1/repos/{repo}/labels/{}", l.id),
    })
}

pub(super) fn repo_json(s: &State, repo: &RepoName) -> Value {
    let (id, branch, private, actions) = s
        .repo(repo)
        .map(|r| (r.id, r.default_branch.clone(), r.private, r.actions))
        .unwrap_or((0, "main".into(), false, false));
    let parent = s
        .repo(repo)
        .ok()
        .and_then(|r| r.fork_of.clone())
        .map(|base| {
            json!({ "id": s.repo(&base).map(|b| b.id).unwrap_or(0), "full_name": base.to_string(), "name": base.name(), "owner": user_json(s, base.owner()) })
        });
    json!({
        "id": id,
        "owner": user_json(s, repo.owner()),
        "name": repo.name(),
        "full_name": repo.to_string(),
        "description": "",
        "empty": false,
        "private": private,
        "fork": parent.is_some(),
        "parent": parent,
        "html_url": format!("https://forgejo.example.org/{repo}"),
        "clone_url": format!("https://forgejo.example.org/{repo}.git"),
        "default_branch": branch,
        "permissions": { "admin": true, "push": true, "pull": true },
        "has_issues": true,
        "has_pull_requests": true,
        "has_actions": actions,
    })
}

pub(super) fn issue_json(s: &State, repo: &RepoName, i: &FIssue) -> Value {
    let labels: Vec<Value> = i
        .labels
        .iter()
        .filter_map(|id| s.repo(repo).ok()?.labels.iter().find(|l| l.id == *id))
        .map(|l| label_json(repo, l))
        .collect();
    json!({
        "id": i.id,
        "url": format!("https://forgejo.example.org/api/v1/repos/{repo}/issues/{}", i.number),
        "html_url": format!("https://forgejo.example.org/{repo}/issues/{}", i.number),
        "number": i.number,
        "user": user_json(s, &i.author),
        "original_author": "",
        "original_author_id": 0,
        "title": i.title,
        "body": i.body,
        "ref": "",
        "assets": [],
        "labels": labels,
        "milestone": null,
        "assignee": null,
        "assignees": null,
        "state": i.state,
        "is_locked": false,
        "comments": i.comments.len(),
        "created_at": rfc3339(i.created),
        "updated_at": rfc3339(i.updated),
        "closed_at": null,
        "due_date": null,
        "pull_request": if i.is_pull {
            let merged = s.repo(repo).ok().and_then(|r| r.pulls.iter().find(|p| p.number == i.number)).is_some_and(|p| p.merged);
            json!({ "merged": merged, "merged_at": null })
        } else { Value::Null },
        "repository": { "id": s.repo(repo).map(|r| r.id).unwrap_or(0), "name": repo.name(), "owner": repo.owner(), "full_name": repo.to_string() },
        "pin_order": 0,
    })
}

pub(super) fn comment_json(s: &State, repo: &RepoName, number: u64, c: &FComment) -> Value {
    json!({
        "id": c.id,
        "html_url": format!("https://forgejo.example.org/{repo}/issues/{number}#issuecomment-{}", c.id),
        "pull_request_url": "",
        "issue_url": format!("https://forgejo.example.org/{repo}/issues/{number}"),
        "user": user_json(s, &c.author),
        "original_author": "",
        "original_author_id": 0,
        "body": c.body,
        "assets": [],
        "created_at": rfc3339(c.created),
        "updated_at": rfc3339(c.updated),
    })
}

// ---- pull requests and their reviews ----

pub(super) fn pull_json(s: &State, repo: &RepoName, number: u64) -> Result<Value, Refusal> {
    let r = s.repo(repo)?;
    let p = r
        .pulls
        .iter()
        .find(|p| p.number == number)
        .ok_or(Refusal::NotFound)?;
    let i = r.issues.get(&number).ok_or(Refusal::NotFound)?;
    let head_commits = r.pull_commits(p);
    let base_commits = r.branches.get(&p.base).cloned().unwrap_or_default();
    let head_sha = r.pull_head_name(p);
    let head_repo = p.head_repo.as_ref().unwrap_or(repo);
    let base_sha = r.head_name(&p.base);
    // The newest base commit the head has.
    let merge_base = head_commits
        .iter()
        .rev()
        .find(|c| base_commits.contains(c))
        .map(|c| r.commit_name(*c))
        .unwrap_or_default();
    Ok(json!({
        "id": number,
        "number": number,
        "url": format!("https://forgejo.example.org/{repo}/pulls/{number}"),
        "html_url": format!("https://forgejo.example.org/{repo}/pulls/{number}"),
        "user": user_json(s, &i.author),
        "title": i.title,
        "body": i.body,
        "state": p.state,
        "merged": p.merged,
        "merged_at": if p.merged { json!(rfc3339(i.updated)) } else { Value::Null },
        "mergeable": !p.merged && p.mergeable,
        // The merge made no commit of its own here: the head's last one is what landed.
        "merge_commit_sha": if p.merged { json!(head_sha) } else { Value::Null },
        "merge_base": merge_base,
        "labels": [],
        "head": {
            "label": p.head,
            "ref": p.head,
            "sha": head_sha,
            "repo_id": s.repo(head_repo).map(|h| h.id).unwrap_or(r.id),
            "repo": repo_json(s, head_repo),
        },
        "base": { "label": p.base, "ref": p.base, "sha": base_sha, "repo_id": r.id },
        "created_at": rfc3339(i.created),
        "updated_at": rfc3339(i.updated),
        "closed_at": if p.state == "closed" { json!(rfc3339(i.updated)) } else { Value::Null },
    }))
}

fn review_value(s: &State, repo: &RepoName, number: u64, v: &FReview) -> Value {
    json!({
        "id": v.id,
        "user": user_json(s, &v.user),
        "team": null,
        "state": v.state,
        "body": v.body,
        "commit_id": v.commit,
        "stale": pull_json(s, repo, number).ok().and_then(|p| p["head"]["sha"].as_str().map(|h| h != v.commit)).unwrap_or(true),
        "official": s.permission_of(repo, &v.user) >= Permission::Write,
        "dismissed": v.dismissed,
        "comments_count": v.comments.len(),
        "submitted_at": rfc3339(v.submitted),
        "updated_at": rfc3339(v.submitted),
        "html_url": format!("https://forgejo.example.org/{repo}/pulls/{number}#issuecomment-{}", v.id),
        "pull_request_url": format!("https://forgejo.example.org/{repo}/pulls/{number}"),
    })
}

pub(super) fn reviews_of<'a>(
    s: &'a State,
    repo: &RepoName,
    number: u64,
) -> Result<&'a [FReview], Refusal> {
    let r = s.repo(repo)?;
    r.pulls
        .iter()
        .find(|p| p.number == number)
        .map(|p| p.reviews.as_slice())
        .ok_or(Refusal::NotFound)
}

pub(super) fn review_of<'a>(
    s: &'a State,
    repo: &RepoName,
    number: u64,
    id: u64,
) -> Result<&'a FReview, Refusal> {
    reviews_of(s, repo, number)?
        .iter()
        .find(|v| v.id == id)
        .ok_or(Refusal::NotFound)
}

pub(super) fn reviews_json(s: &State, repo: &RepoName, number: u64) -> Result<Vec<Value>, Refusal> {
    Ok(reviews_of(s, repo, number)?
        .iter()
        .map(|v| review_value(s, repo, number, v))
        .collect())
}

pub(super) fn review_comments_json(
    s: &State,
    repo: &RepoName,
    number: u64,
    id: u64,
) -> Result<Vec<Value>, Refusal> {
    let review = review_of(s, repo, number, id)?;
    Ok(review
        .comments
        .iter()
        .map(|c| {
            json!({
                "id": c.id,
                "body": c.body,
                "user": user_json(s, &review.user),
                "resolver": null,
                "pull_request_review_id": review.id,
                "created_at": rfc3339(review.submitted),
                "updated_at": rfc3339(review.submitted),
                "path": c.path,
                "commit_id": "",
                "original_commit_id": "",
                "diff_hunk": "",
                "position": c.line,
                "original_position": 0,
                "html_url": "",
                "pull_request_url": format!("https://forgejo.example.org/{repo}/pulls/{number}"),
            })
        })
        .collect())
}
