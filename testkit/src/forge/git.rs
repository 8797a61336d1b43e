//! git's smart HTTP protocol for the fake, served as Forgejo serves it: `git http-backend`
//! (Debian's `git` package) as a CGI behind the fake's HTTP server, with Forgejo's rules in
//! front of it. Basic auth carries a token as the password (or the account's password); a
//! repository-restricted token is refused on other repositories; reading needs a
//! `repository` scope and pushing `write:repository` and write access; the protected default
//! branch is refused on push by a pre-receive hook, with Forgejo's message. After every push
//! the API's view of branches and commits is read back from the git repository, so branch
//! checks, compare and pull requests see what git pushed.

use std::collections::{BTreeMap, HashMap};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse};

use super::{Call, FakeForge, State};
use director::domain::RepoName;
use director::forge::Permission;

/// A repository's git side: the bare repository and the fake commit id of every git commit.
#[derive(Clone, Debug)]
pub(crate) struct FGit {
    /// The directory that holds `<owner>/<name>.git` (`GIT_PROJECT_ROOT`).
    pub root: PathBuf,
    pub dir: PathBuf,
    pub ids: HashMap<String, u64>,
}

/// Refuses pushes to the branch named in `FAKEFORGE_PROTECTED` (set per request, for callers
/// the protection applies to), printing `FAKEFORGE_REFUSAL`: what the forge prints.
const PRE_RECEIVE: &str = r#"#!/bin/sh
while read -r old new ref; do
  if [ -n "$FAKEFORGE_PROTECTED" ] && [ "$ref" = "refs/heads/$FAKEFORGE_PROTECTED" ]; then
    echo "$FAKEFORGE_REFUSAL" >&2
    exit 1
  fi
done
exit 0
"#;

/// A fixed identity and date, so the fake's own commits are reproducible.
const IDENTITY: [(&str, &str); 6] = [
    ("GIT_AUTHOR_NAME", "FakeForge"),
    ("GIT_AUTHOR_EMAIL", "fake@forge.invalid"),
    ("GIT_AUTHOR_DATE", "2026-11-30T10:00:00Z"),
    ("GIT_COMMITTER_NAME", "FakeForge"),
    ("GIT_COMMITTER_EMAIL", "fake@forge.invalid"),
    ("GIT_COMMITTER_DATE", "2026-11-30T10:00:00Z"),
];

/// Runs `git` in `dir` with a clean environment; its trimmed standard output.
pub(crate) fn git(
    dir: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    stdin: Option<&[u8]>,
) -> std::io::Result<String> {
    let mut cmd = Command::new("git");
    cmd.current_dir(dir)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn()?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(input)?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        return Err(std::io::Error::other(format!(
            "git {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Creates the bare repository for `repo` under `root` with one commit on the default branch
/// (the model's current tip), and the protection hook.
pub(crate) fn init(root: &Path, repo: &RepoName, branch: &str, tip: u64) -> std::io::Result<FGit> {
    let owner_dir = root.join(repo.owner());
    std::fs::create_dir_all(&owner_dir)?;
    let dir = owner_dir.join(format!("{}.git", repo.name()));
    git(
        &owner_dir,
        &[
            "init",
            "--quiet",
            "--bare",
            "-b",
            branch,
            &dir.to_string_lossy(),
        ],
        &[],
        None,
    )?;
    git(&dir, &["config", "http.receivepack", "true"], &[], None)?;
    let hook = dir.join("hooks").join("pre-receive");
    std::fs::write(&hook, PRE_RECEIVE)?;
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755))?;
    let blob = git(
        &dir,
        &["hash-object", "-w", "--stdin"],
        &[],
        Some(format!("# {repo}\n").as_bytes()),
    )?;
    let tree = git(
        &dir,
        &["mktree"],
        &[],
        Some(format!("100644 blob {blob}\tREADME.md\n").as_bytes()),
    )?;
    let commit = git(
        &dir,
        &["commit-tree", &tree, "-m", "Initial commit"],
        &IDENTITY,
        None,
    )?;
    git(
        &dir,
        &["update-ref", &format!("refs/heads/{branch}"), &commit],
        &[],
        None,
    )?;
    Ok(FGit {
        root: root.to_owned(),
        dir,
        ids: HashMap::from([(commit, tip)]),
    })
}

/// Commits `content` at `path` on `branch` (created from `from` when new), as the contents
/// API does on a repository that git serves.
pub(crate) fn commit_file(
    g: &FGit,
    from: &str,
    branch: &str,
    path: &str,
    content: &[u8],
    message: &str,
) -> std::io::Result<String> {
    let parent = git(
        &g.dir,
        &["rev-parse", "--verify", &format!("refs/heads/{from}")],
        &[],
        None,
    )?;
    let index = g.dir.join("fake-index");
    let index_s = index.to_string_lossy().into_owned();
    let env = [("GIT_INDEX_FILE", index_s.as_str())];
    git(&g.dir, &["read-tree", &parent], &env, None)?;
    let blob = git(
        &g.dir,
        &["hash-object", "-w", "--stdin"],
        &[],
        Some(content),
    )?;
    git(
        &g.dir,
        &[
            "update-index",
            "--add",
            "--cacheinfo",
            &format!("100644,{blob},{path}"),
        ],
        &env,
        None,
    )?;
    let tree = git(&g.dir, &["write-tree"], &env, None)?;
    let _ = std::fs::remove_file(&index);
    let message = if message.is_empty() {
        "update"
    } else {
        message
    };
    let commit = git(
        &g.dir,
        &["commit-tree", &tree, "-p", &parent, "-m", message],
        &IDENTITY,
        None,
    )?;
    git(
        &g.dir,
        &["update-ref", &format!("refs/heads/{branch}"), &commit],
        &[],
        None,
    )?;
    Ok(commit)
}

/// Every branch of the bare repository at `dir` and its tip: (name, commit).
pub(crate) fn branch_tips(dir: &Path) -> std::io::Result<Vec<(String, String)>> {
    let refs = git(
        dir,
        &[
            "for-each-ref",
            "--format=%(refname:strip=2) %(objectname)",
            "refs/heads/",
        ],
        &[],
        None,
    )?;
    Ok(refs
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(name, sha)| (name.to_owned(), sha.to_owned()))
        .collect())
}

/// Reads the branches and their histories back from git into the model.
pub(crate) fn sync(s: &mut State, repo: &RepoName) -> std::io::Result<()> {
    let Some(mut g) = s.repos.get(repo).and_then(|r| r.git.clone()) else {
        return Ok(());
    };
    let mut branches = BTreeMap::new();
    let mut parents = HashMap::new();
    for (name, sha) in branch_tips(&g.dir)? {
        // Each line: a commit and its parents, parents listed before their children.
        let history = git(
            &g.dir,
            &["rev-list", "--reverse", "--parents", &sha],
            &[],
            None,
        )?;
        let mut ids = Vec::new();
        for line in history.lines() {
            let mut line_ids = Vec::new();
            for commit in line.split_whitespace() {
                let id = match g.ids.get(commit) {
                    Some(id) => *id,
                    None => {
                        let id = s.id();
                        g.ids.insert(commit.to_owned(), id);
                        id
                    }
                };
                line_ids.push(id);
            }
            if let Some((id, its_parents)) = line_ids.split_first() {
                parents.insert(*id, its_parents.to_vec());
                ids.push(*id);
            }
        }
        branches.insert(name, ids);
    }
    if let Some(r) = s.repos.get_mut(repo) {
        r.branches = branches;
        r.parents.extend(parents);
        r.git = Some(g);
    }
    Ok(())
}

/// The parts of a smart-HTTP request path: the repository and the service asked for.
pub(crate) fn parse(path: &str, query: &str) -> Option<(RepoName, &'static str, bool)> {
    let path = path.trim_start_matches('/');
    let (repo, rest) = path.split_once(".git/")?;
    let repo: RepoName = repo.parse().ok()?;
    let service = match rest {
        "info/refs" => query
            .split('&')
            .find_map(|kv| kv.strip_prefix("service="))?,
        "git-upload-pack" | "git-receive-pack" => rest,
        _ => return None,
    };
    let (service, advert) = match service {
        "git-upload-pack" => ("git-upload-pack", rest == "info/refs"),
        "git-receive-pack" => ("git-receive-pack", rest == "info/refs"),
        _ => return None,
    };
    Some((repo, service, advert))
}

/// Whether this path is one the git side answers.
pub(super) fn is_git_path(path: &str) -> bool {
    !path.starts_with("/api/") && path.contains(".git/")
}

pub(crate) fn text(status: StatusCode, body: &str) -> HttpResponse {
    let mut r = HttpResponse::build(status);
    if status == StatusCode::UNAUTHORIZED {
        r.insert_header(("WWW-Authenticate", "Basic realm=\"Gitea\""));
    }
    r.content_type("text/plain; charset=utf-8")
        .body(format!("{body}\n"))
}

/// Who the request is, and what it may do: `Ok((login, protected branch))`.
fn admit(
    s: &State,
    req: &HttpRequest,
    repo: &RepoName,
    push: bool,
) -> Result<(String, String), (StatusCode, &'static str)> {
    use base64::Engine as _;
    let unauthorized = (StatusCode::UNAUTHORIZED, "Unauthorized");
    let header = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Basic "))
        .ok_or(unauthorized)?;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(header.trim())
        .map_err(|_| unauthorized)?;
    let raw = String::from_utf8(raw).map_err(|_| unauthorized)?;
    let (user, password) = raw.split_once(':').ok_or(unauthorized)?;
    // A token as the password (any user name), or the account's own password.
    let (login, restricted) = if let Some(login) = s.tokens.get(password) {
        (login.clone(), None)
    } else if let Some(t) = s.user_tokens.iter().find(|t| t.sha1 == password) {
        (t.login.clone(), Some(t))
    } else if s.check_password(user, password).is_ok() {
        (user.to_owned(), None)
    } else {
        return Err(unauthorized);
    };
    if let Some(t) = restricted {
        if let Some(repos) = &t.repos
            && !repos.contains(repo)
        {
            return Err((
                StatusCode::FORBIDDEN,
                "the token does not have access to this repository",
            ));
        }
        let scope_ok = t
            .scopes
            .iter()
            .any(|sc| sc == "write:repository" || (!push && sc == "read:repository"));
        if !scope_ok {
            return Err((
                StatusCode::FORBIDDEN,
                "the token's scopes do not allow this",
            ));
        }
    }
    let r = s
        .repo(repo)
        .map_err(|_| (StatusCode::NOT_FOUND, "Repository not found"))?;
    let perm = s.permission_of(repo, &login);
    let needed = if push {
        Permission::Write
    } else {
        Permission::Read
    };
    if perm < needed {
        return Err(if perm == Permission::None {
            (StatusCode::NOT_FOUND, "Repository not found")
        } else {
            (StatusCode::FORBIDDEN, "User permission denied")
        });
    }
    let protected = if r.protect_default && perm < Permission::Admin {
        r.default_branch.clone()
    } else {
        String::new()
    };
    Ok((login, protected))
}

/// Answers one smart-HTTP request.
pub(super) async fn serve(
    req: HttpRequest,
    body: actix_web::web::Bytes,
    forge: &FakeForge,
) -> HttpResponse {
    let method = req.method().as_str().to_owned();
    let path = req.path().to_owned();
    let query = req.query_string().to_owned();
    let Some((repo, service, advert)) = parse(&path, &query) else {
        return text(StatusCode::NOT_FOUND, "Not found");
    };
    let push = service == "git-receive-pack";
    if push && !advert {
        let failure = forge.state().fail_pushes.pop_front();
        if let Some(code) = failure {
            record(forge, &method, &path, code, None);
            let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            return text(status, "injected failure");
        }
    }
    let admitted = {
        let s = forge.state();
        match s.repos.get(&repo).and_then(|r| r.git.clone()) {
            None => Err((StatusCode::NOT_FOUND, "Repository not found")),
            Some(g) => admit(&s, &req, &repo, push).map(|a| (a, g)),
        }
    };
    let ((login, protected), g) = match admitted {
        Ok(a) => a,
        Err((status, why)) => {
            record(forge, &method, &path, status.as_u16(), None);
            return text(status, why);
        }
    };
    let refusal = format!("Forgejo: Not allowed to push to protected branch {protected}");
    let (status, response) = backend(&req, &body, &g.root, &login, &protected, &refusal).await;
    if push && !advert && status.is_success() {
        let mut s = forge.state();
        let before = s
            .repos
            .get(&repo)
            .map(|r| r.branches.clone())
            .unwrap_or_default();
        if let Err(e) = sync(&mut s, &repo) {
            s.violations.push(format!("git sync of {repo}: {e}"));
        }
        // A push to a fork's branch synchronises the pull requests from it.
        let moved: Vec<String> = s
            .repos
            .get(&repo)
            .filter(|r| r.fork_of.is_some())
            .map(|r| {
                r.branches
                    .iter()
                    .filter(|(name, commits)| before.get(*name) != Some(*commits))
                    .map(|(name, _)| name.clone())
                    .collect()
            })
            .unwrap_or_default();
        for branch in moved {
            s.fork_pushed(&login, &repo, &branch);
        }
    }
    record(forge, &method, &path, status.as_u16(), Some(&login));
    response
}

/// Runs `git http-backend` for one request, as `login`, with pushes to `protected` (when not
/// empty) refused by the hook printing `refusal`.
pub(crate) async fn backend(
    req: &HttpRequest,
    body: &[u8],
    root: &Path,
    login: &str,
    protected: &str,
    refusal: &str,
) -> (StatusCode, HttpResponse) {
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let mut cmd = tokio::process::Command::new("git");
    cmd.arg("http-backend")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", root)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_PROJECT_ROOT", root)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("PATH_INFO", req.path())
        .env("REQUEST_METHOD", req.method().as_str())
        .env("QUERY_STRING", req.query_string())
        .env("CONTENT_TYPE", header("content-type"))
        .env("CONTENT_LENGTH", body.len().to_string())
        .env("HTTP_CONTENT_ENCODING", header("content-encoding"))
        .env("GIT_PROTOCOL", header("git-protocol"))
        .env("REMOTE_USER", login)
        .env("REMOTE_ADDR", "127.0.0.1")
        .env("FAKEFORGE_PROTECTED", protected)
        .env("FAKEFORGE_REFUSAL", refusal)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let output = async {
        let mut child = cmd.spawn()?;
        if let Some(mut stdin) = child.stdin.take() {
            use tokio::io::AsyncWriteExt as _;
            stdin.write_all(body).await?;
        }
        child.wait_with_output().await
    }
    .await;
    match output {
        Ok(out) => cgi_response(&out.stdout),
        Err(e) => {
            let status = StatusCode::INTERNAL_SERVER_ERROR;
            (status, text(status, &format!("git http-backend: {e}")))
        }
    }
}

/// Turns a CGI answer (headers, a blank line, the body) into a response.
fn cgi_response(out: &[u8]) -> (StatusCode, HttpResponse) {
    let split = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, i + 4))
        .or_else(|| {
            out.windows(2)
                .position(|w| w == b"\n\n")
                .map(|i| (i, i + 2))
        });
    let Some((end, start)) = split else {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            text(
                StatusCode::INTERNAL_SERVER_ERROR,
                "git http-backend gave no headers",
            ),
        );
    };
    let head = String::from_utf8_lossy(&out[..end]);
    let mut status = StatusCode::OK;
    let mut headers = Vec::new();
    for line in head.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let v = v.trim();
        if k.eq_ignore_ascii_case("status") {
            status = v
                .split(' ')
                .next()
                .and_then(|c| c.parse().ok())
                .and_then(|c| StatusCode::from_u16(c).ok())
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        } else {
            headers.push((k.trim().to_owned(), v.to_owned()));
        }
    }
    let mut r = HttpResponse::build(status);
    for (k, v) in headers {
        r.insert_header((k, v));
    }
    (status, r.body(out[start..].to_vec()))
}

fn record(forge: &FakeForge, method: &str, path: &str, status: u16, login: Option<&str>) {
    let at_us = chrono::Utc::now().timestamp_micros();
    let mut state = forge.state();
    state.calls.push(Call {
        method: method.to_owned(),
        path: path.to_owned(),
        query: Vec::new(),
        body: None,
        status,
        login: login.map(str::to_owned),
        at_us,
    });
    let recorded = state.calls.len();
    state.called.send_replace(recorded);
}

impl FakeForge {
    /// Serves `repo` over git's smart HTTP at `<url>/<owner>/<name>.git`, its bare repository
    /// kept under `root` (which the caller owns and removes). Needs the `git` binary.
    pub fn serve_git(&self, repo: &RepoName, root: &Path) -> std::io::Result<()> {
        let mut s = self.state();
        let r = s
            .repos
            .get(repo)
            .ok_or_else(|| std::io::Error::other(format!("no repository {repo}")))?;
        let branch = r.default_branch.clone();
        let tip = r
            .branches
            .get(&branch)
            .and_then(|c| c.last().copied())
            .unwrap_or_default();
        let g = init(root, repo, &branch, tip)?;
        if let Some(r) = s.repos.get_mut(repo) {
            r.git = Some(g);
        }
        sync(&mut s, repo)
    }

    /// Commits `content` at `path` on `branch` (made from the default branch if new), as a
    /// maintainer would push it, past any protection; with git, into the bare repository.
    pub fn put_file(&self, repo: &RepoName, branch: &str, path: &str, content: &[u8]) {
        let mut s = self.state();
        let r = s.repos.get(repo).expect("a known repository");
        let from = if r.branches.contains_key(branch) {
            branch.to_owned()
        } else {
            r.default_branch.clone()
        };
        if let Some(g) = r.git.clone() {
            commit_file(&g, &from, branch, path, content, "put a file").expect("git commit");
            sync(&mut s, repo).expect("git sync");
            return;
        }
        let commit = s.id();
        let r = s.repos.get_mut(repo).expect("a known repository");
        let mut commits = r.branches.get(&from).cloned().unwrap_or_default();
        let mut tree = commits
            .last()
            .and_then(|p| r.trees.get(p).cloned())
            .unwrap_or_default();
        tree.insert(path.to_owned(), content.to_vec());
        commits.push(commit);
        r.branches.insert(branch.to_owned(), commits);
        r.trees.insert(commit, tree);
    }

    /// The file at `path` on `branch`, as git has it (for tests of what was pushed).
    pub fn git_show(&self, repo: &RepoName, branch: &str, path: &str) -> Option<String> {
        let g = self.state().repos.get(repo).and_then(|r| r.git.clone())?;
        git(
            &g.dir,
            &["show", &format!("refs/heads/{branch}:{path}")],
            &[],
            None,
        )
        .ok()
    }

    /// The author line of the tip commit of `branch`.
    pub fn git_author(&self, repo: &RepoName, branch: &str) -> Option<String> {
        let g = self.state().repos.get(repo).and_then(|r| r.git.clone())?;
        git(
            &g.dir,
            &[
                "log",
                "-1",
                "--format=%an <%ae>",
                &format!("refs/heads/{branch}"),
            ],
            &[],
            None,
        )
        .ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_the_repository_and_the_service() {
        assert_eq!(
            parse("/acme/widgets.git/info/refs", "service=git-receive-pack"),
            Some((
                "acme/widgets".parse().expect("valid"),
                "git-receive-pack",
                true
            ))
        );
        assert_eq!(
            parse("/acme/widgets.git/git-upload-pack", ""),
            Some((
                "acme/widgets".parse().expect("valid"),
                "git-upload-pack",
                false
            ))
        );
        assert_eq!(parse("/acme/widgets.git/objects/info/packs", ""), None);
        assert_eq!(
            parse("/acme/widgets.git/info/refs", "service=git-shell"),
            None
        );
        assert_eq!(
            parse("/acme/../x.git/info/refs", "service=git-upload-pack"),
            None
        );
        assert!(is_git_path("/acme/widgets.git/info/refs"));
        assert!(!is_git_path("/api/v1/repos/acme/widgets.git/x"));
    }

    #[test]
    fn cgi_headers_become_the_status_and_headers() {
        let (status, _) =
            cgi_response(b"Status: 403 Forbidden\r\nContent-Type: text/plain\r\n\r\nno");
        assert_eq!(status, StatusCode::FORBIDDEN);
        let (status, _) =
            cgi_response(b"Content-Type: application/x-git-upload-pack-advertisement\n\n001e");
        assert_eq!(status, StatusCode::OK);
        let (status, _) = cgi_response(b"garbage");
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    }
}
