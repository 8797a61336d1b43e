//! git's smart HTTP protocol for FakeGitHub, as github.com serves it at
//! `https://github.com/<owner>/<name>.git` (beside the API, not below it): `git
//! http-backend` behind GitHub's rules. An installation token is the password of
//! `x-access-token`; it must be live (not expired, not revoked), reach the repository
//! (else `Repository not found`, as GitHub hides what a token cannot see) and hold the
//! `contents` permission, `write` to push; a public repository is read without one. The
//! default branch, when protection or an active ruleset requires a pull request the App may
//! not bypass, is refused on push with GitHub's `GH006`/`GH013` message. After a push, the
//! API's branches and commits are read back from git, so compare and pull requests see it.

use std::path::Path;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse};

use super::{Recorded, Repo, Shared, State, Token, protection_of};
use crate::forge::git::{self as fgit, backend, git, parse, text};

/// Where a served repository's bare repository lives: (`GIT_PROJECT_ROOT`, the repository).
#[derive(Clone, Debug)]
pub(super) struct Served {
    pub root: std::path::PathBuf,
    pub dir: std::path::PathBuf,
}

/// Whether `path` (below the site, not the API) is a git request.
pub(super) fn is_git_path(path: &str) -> bool {
    let mut parts = path.trim_start_matches('/').splitn(3, '/');
    let (_owner, name) = (parts.next(), parts.next());
    name.is_some_and(|n| n.ends_with(".git")) && parts.next().is_some()
}

fn refused(status: StatusCode, why: &str) -> HttpResponse {
    let mut r = text(status, why);
    if status == StatusCode::UNAUTHORIZED {
        r.headers_mut().insert(
            actix_web::http::header::WWW_AUTHENTICATE,
            actix_web::http::header::HeaderValue::from_static("Basic realm=\"GitHub\""),
        );
    }
    r
}

/// The token in a Basic `x-access-token:<token>` header, if one was sent.
fn presented(req: &HttpRequest) -> Result<Option<String>, ()> {
    use base64::Engine as _;
    let Some(value) = req.headers().get("authorization") else {
        return Ok(None);
    };
    let raw = value
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Basic "))
        .and_then(|v| {
            base64::engine::general_purpose::STANDARD
                .decode(v.trim())
                .ok()
        })
        .and_then(|v| String::from_utf8(v).ok())
        .ok_or(())?;
    match raw.split_once(':') {
        Some(("x-access-token", token)) => Ok(Some(token.to_owned())),
        _ => Err(()),
    }
}

/// Who may do what: `Ok((login, protected branch, refusal))`, or GitHub's refusal.
fn admit(
    s: &mut State,
    req: &HttpRequest,
    full: &str,
    push: bool,
) -> Result<(String, String, String), (StatusCode, &'static str)> {
    let invalid = (
        StatusCode::UNAUTHORIZED,
        "Invalid username or token. Password authentication is not supported for Git operations.",
    );
    let not_found = (StatusCode::NOT_FOUND, "Repository not found.");
    let token = presented(req).map_err(|()| invalid)?;
    let Some(r) = s.repos.get(full) else {
        return Err(not_found);
    };
    let private = r.private;
    let Some(value) = token else {
        if push || private {
            return Err(invalid);
        }
        return Ok(("anonymous".into(), String::new(), String::new()));
    };
    if !s.credentials.contains(&value) {
        s.credentials.push(value.clone());
    }
    let token: Token = match s.tokens.iter().find(|t| t.value == value) {
        Some(t) if !t.revoked && t.expires_at > s.now() => t.clone(),
        _ => return Err(invalid),
    };
    let reaches = s
        .installations
        .get(&token.installation)
        .is_some_and(|i| i.repos.iter().any(|x| x == full))
        && token
            .repositories
            .as_ref()
            .is_none_or(|list| list.iter().any(|x| x.eq_ignore_ascii_case(full)));
    if !reaches {
        return Err(not_found);
    }
    let contents = token.permissions.get("contents").map(String::as_str);
    let allowed = match contents {
        Some("write") => true,
        Some("read") => !push,
        _ => false,
    };
    if !allowed {
        return Err((
            StatusCode::FORBIDDEN,
            "Permission denied to the integration: contents",
        ));
    }
    let r = &s.repos[full];
    let (protected, refusal) = match protection_of(r, &r.default_branch) {
        Some(code) => (
            r.default_branch.clone(),
            format!("{code} for refs/heads/{}.", r.default_branch),
        ),
        None => (String::new(), String::new()),
    };
    Ok((format!("token:{}", token.installation), protected, refusal))
}

/// Answers one smart-HTTP request for the site.
pub(super) async fn serve(req: HttpRequest, body: &[u8], shared: &Shared) -> HttpResponse {
    let state = &shared.0;
    let path = req.path().to_owned();
    let Some((repo, service, advert)) = parse(&path, req.query_string()) else {
        return text(StatusCode::NOT_FOUND, "Not Found");
    };
    let full = repo.to_string().to_ascii_lowercase();
    let push = service == "git-receive-pack";
    let admitted = {
        let mut s = state.lock().expect("lock");
        let served = s.repos.get(&full).and_then(|r| r.git.clone());
        let admitted = admit(&mut s, &req, &full, push);
        let auth = match &admitted {
            Ok((who, _, _)) => who.clone(),
            Err((StatusCode::UNAUTHORIZED, _)) => "dead-token".into(),
            Err(_) => "refused".into(),
        };
        s.requests.push(Recorded {
            method: req.method().as_str().to_owned(),
            path: path.clone(),
            query: req.query_string().to_owned(),
            body: serde_json::Value::Null,
            auth,
        });
        match (served, admitted) {
            (_, Err(e)) => Err(e),
            (None, Ok(_)) => Err((StatusCode::NOT_FOUND, "Repository not found.")),
            (Some(g), Ok(a)) => Ok((g, a)),
        }
    };
    let (g, (login, protected, refusal)) = match admitted {
        Ok(a) => a,
        Err((status, why)) => return refused(status, why),
    };
    let (status, response) = backend(&req, body, &g.root, &login, &protected, &refusal).await;
    if push && !advert && status.is_success() {
        let mut s = state.lock().expect("lock");
        if let Some(r) = s.repos.get_mut(&full)
            && let Err(e) = sync(r, &g)
        {
            s.violations.push(format!("git sync of {full}: {e}"));
        }
    }
    response
}

/// Reads the branches and their commits back from git into the API's view.
pub(super) fn sync(r: &mut Repo, g: &Served) -> std::io::Result<()> {
    let branches: std::collections::BTreeMap<String, String> =
        fgit::branch_tips(&g.dir)?.into_iter().collect();
    let heads: Vec<&str> = branches.values().map(String::as_str).collect();
    let mut args = vec!["rev-list", "--parents"];
    args.extend(heads.iter().copied());
    let listed = if heads.is_empty() {
        String::new()
    } else {
        git(&g.dir, &args, &[], None)?
    };
    for line in listed.lines() {
        let mut ids = line.split(' ');
        if let Some(sha) = ids.next() {
            r.commits
                .insert(sha.to_owned(), ids.next().map(str::to_owned));
        }
    }
    r.branches = branches;
    Ok(())
}

/// Makes the bare repository of `full` under `root` (one commit on the default branch) and
/// serves it: from now on git holds the repository's branches.
pub(super) fn serve_repo(r: &mut Repo, full: &str, root: &Path) -> std::io::Result<()> {
    let name: director::domain::RepoName = full
        .parse()
        .map_err(|_| std::io::Error::other(format!("not a repository name: {full}")))?;
    let made = fgit::init(root, &name, &r.default_branch, 0)?;
    let g = Served {
        root: made.root,
        dir: made.dir,
    };
    r.commits.clear();
    sync(r, &g)?;
    r.git = Some(g);
    Ok(())
}

/// The API's writes to a served repository go to git: a new branch at `sha`.
pub(super) fn create_branch(g: &Served, branch: &str, sha: &str) -> std::io::Result<()> {
    git(
        &g.dir,
        &["update-ref", &format!("refs/heads/{branch}"), sha, ""],
        &[],
        None,
    )
    .map(|_| ())
}

/// The API's writes to a served repository go to git: `content` at `path` on `branch`.
pub(super) fn commit_file(
    g: &Served,
    branch: &str,
    path: &str,
    content: &[u8],
    message: &str,
) -> std::io::Result<String> {
    let served = fgit::FGit {
        root: g.root.clone(),
        dir: g.dir.clone(),
        ids: Default::default(),
    };
    fgit::commit_file(&served, branch, branch, path, content, message)
}
