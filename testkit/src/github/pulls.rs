//! FakeGitHub's routes under `/repos/{owner}/{repo}`: pull requests and their reviews.

use actix_web::HttpResponse;
use serde_json::json;

use super::*;

pub(super) fn route(at: InRepo<'_>, method: &str, rest: &[&str]) -> HttpResponse {
    let InRepo {
        s,
        echoes,
        full,
        name: _,
        query,
        body,
        bot,
        next_id: _,
        ..
    } = at;
    match (method, rest) {
        ("GET", ["pulls"]) => {
            let state = q(query, "state").unwrap_or("open");
            let head = q(query, "head").map(|h| h.split_once(':').map_or(h, |(_, b)| b).to_owned());
            let base = q(query, "base");
            let items = s.repos[&full]
                .issues
                .values()
                .filter(|i| {
                    i.pull.as_ref().is_some_and(|p| {
                        head.as_deref().is_none_or(|h| p.head == h)
                            && base.is_none_or(|b| p.base == b)
                    })
                })
                .filter(|i| state == "all" || i.state == state)
                .map(|i| s.pull_json(&full, i))
                .collect();
            page(items, query)
        }
        ("POST", ["pulls"]) => {
            let b = body.cloned().unwrap_or_default();
            let head = b["head"].as_str().unwrap_or_default().to_owned();
            let base = b["base"].as_str().unwrap_or_default().to_owned();
            let r = s.repo(&full).expect("repo");
            if !r.branches.contains_key(&head) || !r.branches.contains_key(&base) {
                return message(422, "Validation Failed: head or base");
            }
            if r.issues.values().any(|i| {
                i.state == "open"
                    && i.pull
                        .as_ref()
                        .is_some_and(|p| p.head == head && p.base == base)
            }) {
                return message(422, "A pull request already exists");
            }
            let issue = r.add_issue(
                b["title"].as_str().unwrap_or_default(),
                b["body"].as_str(),
                &bot,
                Some(PullS {
                    head,
                    base,
                    merged: false,
                }),
            );
            let number = issue.number;
            let v = s.pull_json(&full, &issue);
            let _ = echoes.send(Echo { event: "pull_request", body: json!({ "action": "opened", "number": number, "pull_request": v, "repository": { "full_name": full }, "sender": user(&bot) }) });
            reply(201, v)
        }
        ("PATCH", ["pulls", n]) => {
            let number = n.parse::<u64>().unwrap_or(0);
            let title = body.and_then(|b| b["title"].as_str()).map(str::to_owned);
            let r = s.repos.get_mut(&full).expect("the repository");
            match r.issues.get_mut(&number).filter(|i| i.pull.is_some()) {
                Some(i) => {
                    if let Some(title) = title {
                        i.title = title;
                    }
                    let i = i.clone();
                    reply(200, s.pull_json(&full, &i))
                }
                None => message(404, "Not Found"),
            }
        }
        ("GET", ["pulls", n]) => {
            let r = &s.repos[&full];
            match n
                .parse::<u64>()
                .ok()
                .and_then(|n| r.issues.get(&n))
                .filter(|i| i.pull.is_some())
            {
                Some(i) => reply(200, s.pull_json(&full, i)),
                None => message(404, "Not Found"),
            }
        }
        ("GET", ["pulls", n, "reviews"]) => {
            let n: u64 = n.parse().unwrap_or(0);
            let items = s.repos[&full]
                .reviews
                .iter()
                .filter(|r| r.number == n)
                .map(|r| json!({ "id": r.id, "user": user(&r.user), "state": r.state, "body": r.body, "submitted_at": now() }))
                .collect();
            page(items, query)
        }
        ("GET", ["pulls", n, "reviews", id, "comments"]) => {
            let (n, id): (u64, u64) = (n.parse().unwrap_or(0), id.parse().unwrap_or(0));
            let items = s.repos[&full]
                .reviews
                .iter()
                .filter(|r| r.number == n && r.id == id)
                .flat_map(|r| {
                    r.comments.iter().map(
                        |(p, b, l)| json!({ "path": p, "body": b, "line": l, "side": "RIGHT" }),
                    )
                })
                .collect();
            page(items, query)
        }
        _ => message(404, "Not Found"),
    }
}
