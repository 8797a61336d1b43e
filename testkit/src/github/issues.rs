//! FakeGitHub's routes under `/repos/{owner}/{repo}`: issues, their comments, events and labels.

use actix_web::HttpResponse;
use serde_json::{Value, json};

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
        next_id,
        ..
    } = at;
    match (method, rest) {
        ("GET", ["issues"]) => {
            let r = &s.repos[&full];
            let state = q(query, "state").unwrap_or("open");
            let labels: Vec<&str> = q(query, "labels")
                .map(|l| l.split(',').collect())
                .unwrap_or_default();
            let creator = q(query, "creator");
            let items: Vec<Value> = r
                .issues
                .values()
                .rev()
                .filter(|i| state == "all" || i.state == state)
                .filter(|i| labels.iter().all(|l| i.labels.iter().any(|x| x == l)))
                .filter(|i| creator.is_none_or(|c| c == i.author))
                .map(|i| s.issue_json(&full, i))
                .collect();
            page(items, query)
        }
        ("POST", ["issues"]) => {
            let b = body.cloned().unwrap_or_default();
            let r = s.repo(&full).expect("repo");
            let issue = r.add_issue(
                b["title"].as_str().unwrap_or_default(),
                b["body"].as_str(),
                &bot,
                None,
            );
            let _ = echoes.send(issues_echo(s, &full, &issue, "opened", &bot, None));
            reply(201, s.issue_json(&full, &issue))
        }
        ("GET", ["issues", n]) => {
            let r = &s.repos[&full];
            match n.parse::<u64>().ok().and_then(|n| r.issues.get(&n)) {
                Some(i) => reply(200, s.issue_json(&full, i)),
                None => message(404, "Not Found"),
            }
        }
        ("GET", ["issues", n, "comments"]) => {
            let n: u64 = n.parse().unwrap_or(0);
            let items = s.repos[&full]
                .comments
                .iter()
                .filter(|c| c.number == n)
                .map(comment_json)
                .collect();
            page(items, query)
        }
        ("POST", ["issues", n, "comments"]) => {
            let n: u64 = n.parse().unwrap_or(0);
            let text = body
                .and_then(|b| b["body"].as_str())
                .unwrap_or_default()
                .to_owned();
            let at = now();
            let r = s.repo(&full).expect("repo");
            let Some(issue) = r.issues.get_mut(&n) else {
                return message(404, "Not Found");
            };
            issue.updated_at = at.clone();
            let issue = issue.clone();
            let c = CommentS {
                id: next_id,
                number: n,
                author: bot.clone(),
                body: text,
                created_at: at.clone(),
                updated_at: at,
            };
            r.comments.push(c.clone());
            let cj = comment_json(&c);
            let _ = echoes.send(Echo {
                event: "issue_comment",
                body: json!({ "action": "created", "issue": s.issue_json(&full, &issue), "comment": cj, "repository": { "full_name": full }, "sender": user(&bot) }),
            });
            reply(201, cj)
        }
        ("PATCH", ["issues", "comments", id]) => {
            let id: u64 = id.parse().unwrap_or(0);
            let text = body
                .and_then(|b| b["body"].as_str())
                .unwrap_or_default()
                .to_owned();
            let r = s.repo(&full).expect("repo");
            match r.comments.iter_mut().find(|c| c.id == id) {
                Some(c) if c.author == bot => {
                    c.body = text;
                    c.updated_at = now();
                    reply(200, comment_json(c))
                }
                Some(_) => message(403, "Resource not accessible by integration"),
                None => message(404, "Not Found"),
            }
        }
        ("GET", ["issues", n, "events"]) => {
            let n: u64 = n.parse().unwrap_or(0);
            let items = s.repos[&full]
                .events
                .iter()
                .filter(|e| e.number == n)
                .map(|e| {
                    let mut v = json!({ "id": 1, "event": e.event, "actor": user(&e.actor), "created_at": e.created_at });
                    if let Some(l) = &e.label {
                        v["label"] = json!({ "name": l, "color": "ededed" });
                    }
                    v
                })
                .collect();
            page(items, query)
        }
        ("GET", ["labels"]) => {
            let items = s.repos[&full]
                .labels
                .iter()
                .map(|(id, n, c)| json!({ "id": id, "name": n, "color": c }))
                .collect();
            page(items, query)
        }
        ("GET", ["labels", label]) => {
            match s.repos[&full].labels.iter().find(|(_, n, _)| n == label) {
                Some((id, n, c)) => reply(200, json!({ "id": id, "name": n, "color": c })),
                None => message(404, "Not Found"),
            }
        }
        ("POST", ["labels"]) => {
            let b = body.cloned().unwrap_or_default();
            let label = b["name"].as_str().unwrap_or_default().to_owned();
            let color = b["color"].as_str().unwrap_or_default().to_owned();
            if color.starts_with('#') {
                return message(422, "Validation Failed: color");
            }
            let r = s.repo(&full).expect("repo");
            if r.labels.iter().any(|(_, n, _)| *n == label) {
                return message(422, "Validation Failed: already_exists");
            }
            r.labels.push((next_id, label.clone(), color.clone()));
            reply(201, json!({ "id": next_id, "name": label, "color": color }))
        }
        ("POST", ["issues", n, "labels"]) => {
            let n: u64 = n.parse().unwrap_or(0);
            let names: Vec<String> = body
                .and_then(|b| b["labels"].as_array())
                .map(|a| {
                    a.iter()
                        .filter_map(|v| v.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default();
            let at = now();
            let r = s.repo(&full).expect("repo");
            let Some(issue) = r.issues.get_mut(&n) else {
                return message(404, "Not Found");
            };
            let mut added = Vec::new();
            for l in &names {
                if !issue.labels.contains(l) {
                    issue.labels.push(l.clone());
                    added.push(l.clone());
                }
            }
            issue.updated_at = at.clone();
            let issue = issue.clone();
            for l in &added {
                if !r.labels.iter().any(|(_, x, _)| x == l) {
                    r.labels.push((next_id, l.clone(), "ededed".into()));
                }
                r.events.push(EventS {
                    number: n,
                    event: "labeled".into(),
                    actor: bot.clone(),
                    label: Some(l.clone()),
                    created_at: at.clone(),
                });
            }
            for l in &added {
                let _ = echoes.send(issues_echo(s, &full, &issue, "labeled", &bot, Some(l)));
            }
            let v = s.issue_json(&full, &issue);
            reply(200, v["labels"].clone())
        }
        ("DELETE", ["issues", n, "labels", label]) => {
            let n: u64 = n.parse().unwrap_or(0);
            let at = now();
            let r = s.repo(&full).expect("repo");
            let Some(issue) = r.issues.get_mut(&n) else {
                return message(404, "Not Found");
            };
            if !issue.labels.iter().any(|l| l == label) {
                return message(404, "Label does not exist");
            }
            issue.labels.retain(|l| l != label);
            issue.updated_at = at.clone();
            let issue = issue.clone();
            r.events.push(EventS {
                number: n,
                event: "unlabeled".into(),
                actor: bot.clone(),
                label: Some((*label).to_owned()),
                created_at: at,
            });
            let _ = echoes.send(issues_echo(
                s,
                &full,
                &issue,
                "unlabeled",
                &bot,
                Some(label),
            ));
            let v = s.issue_json(&full, &issue);
            reply(200, v["labels"].clone())
        }
        _ => message(404, "Not Found"),
    }
}
