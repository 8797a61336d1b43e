//! FakeGitHub's routes under `/repos/{owner}/{repo}`: the repository itself: collaborators, branches and their rules, refs, contents and compare.

use actix_web::HttpResponse;
use serde_json::{Value, json};

use super::*;

pub(super) fn route(at: InRepo<'_>, method: &str, rest: &[&str]) -> HttpResponse {
    let InRepo {
        s,
        echoes: _,
        full,
        name,
        query,
        body,
        bot: _,
        next_id,
        ..
    } = at;
    match (method, rest) {
        // A commit's checks: this fake has no CI, so none has reported.
        ("GET", ["commits", reference, "status"]) => reply(
            200,
            json!({ "state": "pending", "sha": reference, "total_count": 0, "statuses": [],
                    "repository": { "full_name": full },
                    "commit_url": format!("https://api.github.com/repos/{full}/commits/{reference}"),
                    "url": format!("https://api.github.com/repos/{full}/commits/{reference}/status") }),
        ),
        // Whether Actions runs here (the App needs Administration: read to ask).
        ("GET", ["actions", "permissions"]) => {
            let enabled = !s.repos[&full].actions_off;
            reply(
                200,
                json!({ "enabled": enabled, "allowed_actions": if enabled { json!("all") } else { Value::Null } }),
            )
        }
        // A commit status, kept as posted; a commit the repository lacks is a 422.
        ("POST", ["statuses", sha]) => {
            let r = s.repos.get_mut(&full).expect("the repository");
            if !r.commits.contains_key(*sha) {
                return message(422, "No commit found for SHA");
            }
            let body = body.cloned().unwrap_or(Value::Null);
            let answer =
                json!({ "id": next_id, "state": body["state"], "context": body["context"] });
            r.statuses.push(((*sha).to_owned(), body));
            reply(201, answer)
        }
        ("GET", ["commits", _, "check-runs"]) => {
            reply(200, json!({ "total_count": 0, "check_runs": [] }))
        }
        ("GET", []) => {
            let r = &s.repos[&full];
            reply(
                200,
                json!({ "id": r.id, "full_name": full, "name": name, "default_branch": r.default_branch, "private": r.private }),
            )
        }
        ("GET", ["collaborators", login, "permission"]) => {
            let role = s.role(&full, login);
            let (permission, role_name) = match role.as_deref() {
                Some("admin") => ("admin", "admin"),
                Some("maintain") => ("write", "maintain"),
                Some("write") => ("write", "write"),
                Some("triage") => ("read", "triage"),
                Some("read") => ("read", "read"),
                _ => ("read", "read"),
            };
            if role.is_none() && !login.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
                return message(404, "Not Found");
            }
            reply(
                200,
                json!({ "permission": permission, "role_name": role_name, "user": user(login) }),
            )
        }
        ("GET", ["branches", branch]) => {
            let r = &s.repos[&full];
            match r.branches.get(*branch) {
                Some(sha) => {
                    let protected = *branch == r.default_branch && r.protection.is_some();
                    reply(
                        200,
                        json!({ "name": branch, "commit": { "sha": sha }, "protected": protected,
                        "protection": { "enabled": protected, "required_status_checks": { "enforcement_level": "off", "contexts": [] } },
                        "protection_url": format!("https://api.github.com/repos/{full}/branches/{branch}/protection") }),
                    )
                }
                None => message(404, "Branch not found"),
            }
        }
        ("GET", ["branches", branch, "protection"]) => {
            let r = &s.repos[&full];
            match (&r.protection, *branch == r.default_branch) {
                (Some((approvals, bypass)), true) => {
                    let apps: Vec<Value> = bypass
                        .iter()
                        .map(|a| json!({ "slug": a, "id": 1 }))
                        .collect();
                    reply(
                        200,
                        json!({ "required_pull_request_reviews": {
                        "required_approving_review_count": approvals,
                        "bypass_pull_request_allowances": { "users": [], "teams": [], "apps": apps } } }),
                    )
                }
                _ => message(404, "Branch not protected"),
            }
        }
        ("GET", ["rules", "branches", branch]) => {
            let r = &s.repos[&full];
            let items: Vec<Value> = if *branch == r.default_branch {
                r.rulesets
                    .iter()
                    .filter(|x| x.enforcement == "active")
                    .map(|x| json!({ "type": "pull_request", "ruleset_id": x.id, "ruleset_source_type": "Repository", "ruleset_source": full,
                        "parameters": { "required_approving_review_count": x.approvals, "dismiss_stale_reviews_on_push": false,
                            "require_code_owner_review": false, "require_last_push_approval": false, "required_review_thread_resolution": false } }))
                    .collect()
            } else {
                Vec::new()
            };
            page(items, query)
        }
        ("GET", ["rulesets", id]) => {
            let id: u64 = id.parse().unwrap_or(0);
            match s.repos[&full].rulesets.iter().find(|x| x.id == id) {
                Some(x) => reply(
                    200,
                    json!({ "id": x.id, "name": "protect main", "target": "branch", "enforcement": x.enforcement,
                    "current_user_can_bypass": if x.app_can_bypass { "always" } else { "never" } }),
                ),
                None => message(404, "Not Found"),
            }
        }
        ("GET", ["compare", basehead]) => {
            let r = &s.repos[&full];
            let Some((base, head)) = basehead.split_once("...") else {
                return message(404, "Not Found");
            };
            let sha_of = |x: &str| {
                r.branches
                    .get(x)
                    .cloned()
                    .or_else(|| r.commits.contains_key(x).then(|| x.to_owned()))
            };
            let (Some(b), Some(h)) = (sha_of(base), sha_of(head)) else {
                return message(404, "Not Found");
            };
            let known = State::history(r, &b);
            let ahead = State::history(r, &h)
                .iter()
                .take_while(|c| !known.contains(c))
                .count();
            reply(
                200,
                json!({ "status": if ahead > 0 { "ahead" } else { "identical" }, "ahead_by": ahead, "behind_by": 0, "total_commits": ahead, "commits": [], "files": [] }),
            )
        }
        ("POST", ["git", "refs"]) => {
            let b = body.cloned().unwrap_or_default();
            let Some(branch) = b["ref"]
                .as_str()
                .and_then(|r| r.strip_prefix("refs/heads/"))
            else {
                return message(422, "Reference name must start with refs/heads/");
            };
            let sha = b["sha"].as_str().unwrap_or_default().to_owned();
            let r = s.repo(&full).expect("repo");
            if r.branches.contains_key(branch) {
                return message(422, "Reference already exists");
            }
            if !r.commits.contains_key(&sha) {
                return message(422, "Object does not exist");
            }
            if let Some(refused) = guard_push(r, branch) {
                return refused;
            }
            if let Some(g) = r.git.clone() {
                if git::create_branch(&g, branch, &sha).is_err() {
                    return message(422, "Object does not exist");
                }
                let _ = git::sync(r, &g);
            } else {
                r.branches.insert(branch.to_owned(), sha.clone());
            }
            reply(
                201,
                json!({ "ref": format!("refs/heads/{branch}"), "object": { "sha": sha, "type": "commit" } }),
            )
        }
        ("GET", ["git", "ref", "heads", branch @ ..]) => {
            let branch = branch.join("/");
            match s.repos[&full].branches.get(&branch) {
                Some(sha) => reply(
                    200,
                    json!({ "ref": format!("refs/heads/{branch}"), "object": { "sha": sha, "type": "commit" } }),
                ),
                None => message(404, "Not Found"),
            }
        }
        ("GET", ["contents", file @ ..]) if !file.is_empty() => {
            // `?ref=` a branch, or a branch's head commit; else the default branch.
            let file = file.join("/");
            let r = &s.repos[&full];
            let wanted = q(query, "ref").map_or_else(|| r.default_branch.clone(), str::to_owned);
            let branch = if r.branches.contains_key(&wanted) {
                Some(wanted)
            } else {
                r.branches
                    .iter()
                    .find(|(_, head)| **head == wanted)
                    .map(|(b, _)| b.clone())
            };
            match branch.and_then(|b| r.files.get(&(b, file.clone()))) {
                Some(content) => {
                    use base64::Engine as _;
                    let size = base64::engine::general_purpose::STANDARD
                        .decode(content)
                        .map_or(0, |b| b.len());
                    let name = file.rsplit('/').next().unwrap_or_default().to_owned();
                    reply(
                        200,
                        json!({ "type": "file", "encoding": "base64", "size": size, "name": name, "path": file, "content": content, "sha": format!("b{size}"), "url": "", "git_url": null, "html_url": null, "download_url": null, "_links": {} }),
                    )
                }
                None => message(404, "Not Found"),
            }
        }
        ("PUT", ["contents", file @ ..]) => {
            let file = file.join("/");
            let b = body.cloned().unwrap_or_default();
            let r = s.repo(&full).expect("repo");
            let branch = b["branch"]
                .as_str()
                .map_or_else(|| r.default_branch.clone(), str::to_owned);
            let Some(head) = r.branches.get(&branch).cloned() else {
                return message(404, "Branch not found");
            };
            if let Some(refused) = guard_push(r, &branch) {
                return refused;
            }
            let content = b["content"].as_str().unwrap_or_default().to_owned();
            if let Some(g) = r.git.clone() {
                use base64::Engine as _;
                let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(&content) else {
                    return message(422, "content is not valid Base64");
                };
                let text = b["message"].as_str().unwrap_or_default();
                let Ok(sha) = git::commit_file(&g, &branch, &file, &bytes, text) else {
                    return message(409, "could not commit");
                };
                let _ = git::sync(r, &g);
                r.files.insert((branch, file.clone()), content);
                return reply(
                    201,
                    json!({ "content": { "path": file }, "commit": { "sha": sha } }),
                );
            }
            let sha = format!("c{next_id}");
            r.commits.insert(sha.clone(), Some(head));
            r.branches.insert(branch.clone(), sha.clone());
            r.files.insert(
                (branch, file.clone()),
                b["content"].as_str().unwrap_or_default().to_owned(),
            );
            reply(
                201,
                json!({ "content": { "path": file }, "commit": { "sha": sha } }),
            )
        }
        _ => message(404, "Not Found"),
    }
}
