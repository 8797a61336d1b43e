//! Webhook bodies as Forgejo sends them, parsed into the compact [`ForgeEvent`] the director keeps.
//!
//! Only the fields the director reads are declared; everything else is ignored, and every
//! field that Forgejo may omit has a default, so a body from an older or newer Forgejo parses.

use serde::Deserialize;

use crate::domain::{IssueRef, RepoName};
pub use crate::event::{CommentSnapshot, EventKind, ForgeEvent, IssueSnapshot};

#[derive(Debug, Deserialize)]
struct RawUser {
    #[serde(default)]
    login: String,
}

#[derive(Debug, Deserialize)]
struct RawOwner {
    #[serde(default)]
    login: String,
    #[serde(default)]
    username: String,
}

#[derive(Debug, Deserialize)]
struct RawRepo {
    #[serde(default)]
    full_name: String,
    #[serde(default)]
    name: String,
    owner: Option<RawOwner>,
}

#[derive(Debug, Deserialize)]
struct RawLabel {
    name: String,
}

#[derive(Debug, Deserialize)]
struct RawIssue {
    #[serde(default)]
    number: u64,
    #[serde(default)]
    title: String,
    #[serde(default)]
    body: String,
    #[serde(default)]
    state: String,
    #[serde(default)]
    labels: Option<Vec<RawLabel>>,
    #[serde(default)]
    updated_at: Option<String>,
    user: Option<RawUser>,
    #[serde(default)]
    merged: bool,
}

#[derive(Debug, Deserialize)]
struct RawComment {
    id: u64,
    #[serde(default)]
    body: String,
    user: Option<RawUser>,
    #[serde(default)]
    updated_at: Option<String>,
}

#[derive(Debug, Deserialize)]
struct RawReview {
    #[serde(default)]
    content: String,
}

#[derive(Debug, Deserialize)]
struct RawPayload {
    #[serde(default)]
    action: String,
    /// Top-level copy of the item's number (issue and pull request events).
    #[serde(default)]
    number: u64,
    issue: Option<RawIssue>,
    pull_request: Option<RawIssue>,
    comment: Option<RawComment>,
    repository: Option<RawRepo>,
    sender: Option<RawUser>,
    #[serde(default)]
    is_pull: bool,
    #[serde(default)]
    review: Option<RawReview>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PayloadError {
    #[error("body is not valid JSON: {0}")]
    Json(String),
    #[error("payload has no `{0}`")]
    Missing(&'static str),
    #[error("payload field `{0}` is invalid: {1}")]
    Invalid(&'static str, String),
    /// A valid delivery the director has no use for (answered 200, not stored).
    #[error("{0}")]
    NotUsed(&'static str),
}

/// Parses a verified body whose `X-Forgejo-Event-Type` is `event_type` (already known to map
/// to `kind`). Fails with the first missing or bad field.
pub fn parse_typed(
    event_type: &str,
    kind: EventKind,
    body: &[u8],
) -> Result<ForgeEvent, PayloadError> {
    if kind == EventKind::ActionRun {
        return parse_action_run(body);
    }
    let mut event = parse_event(kind, body)?;
    if kind == EventKind::PullReview {
        let review_kind = crate::event::ReviewKind::from_header(event_type).ok_or(
            PayloadError::Invalid("X-Forgejo-Event-Type", event_type.to_owned()),
        )?;
        event.review = Some(crate::event::ReviewSnapshot {
            kind: review_kind,
            body: event.review.map(|r| r.body).unwrap_or_default(),
        });
    }
    Ok(event)
}

/// Parses a verified body of the given kind. Fails with the first missing or bad field.
pub fn parse_event(kind: EventKind, body: &[u8]) -> Result<ForgeEvent, PayloadError> {
    let raw: RawPayload = serde_json::from_slice(body).map_err(|e| {
        // serde_json's message carries line and column, never the body itself.
        PayloadError::Json(e.to_string())
    })?;
    if raw.action.is_empty() {
        return Err(PayloadError::Missing("action"));
    }
    let sender = raw
        .sender
        .map(|s| s.login)
        .filter(|l| !l.is_empty())
        .ok_or(PayloadError::Missing("sender.login"))?;
    let repository = raw.repository.ok_or(PayloadError::Missing("repository"))?;
    let repo = repo_name(&repository)?;
    let (item, item_key) = match kind {
        EventKind::PullRequest | EventKind::PullReview => (raw.pull_request, "pull_request"),
        _ => (raw.issue, "issue"),
    };
    let item = item.ok_or(PayloadError::Missing(item_key))?;
    let number = if item.number != 0 {
        item.number
    } else {
        raw.number
    };
    if number == 0 {
        return Err(PayloadError::Missing("number"));
    }
    let comment = match kind {
        EventKind::IssueComment | EventKind::PullComment => {
            let c = raw.comment.ok_or(PayloadError::Missing("comment"))?;
            Some(CommentSnapshot {
                id: c.id,
                author: c.user.map(|u| u.login).unwrap_or_default(),
                body: c.body,
                updated_at: c.updated_at,
            })
        }
        _ => None,
    };
    Ok(ForgeEvent {
        kind,
        action: raw.action,
        issue: IssueRef::new(repo, number),
        sender,
        is_pull: raw.is_pull
            || matches!(
                kind,
                EventKind::PullRequest | EventKind::PullComment | EventKind::PullReview
            ),
        snapshot: IssueSnapshot {
            title: item.title,
            body: item.body,
            state: item.state,
            labels: item
                .labels
                .unwrap_or_default()
                .into_iter()
                .map(|l| l.name)
                .collect(),
            author: item.user.map(|u| u.login).unwrap_or_default(),
            updated_at: item.updated_at,
            merged: item.merged,
        },
        comment,
        // The kind comes from the header: `parse_typed` fills it in.
        review: raw.review.map(|r| crate::event::ReviewSnapshot {
            kind: crate::event::ReviewKind::Comment,
            body: r.content,
        }),
    })
}

/// An `ActionPayload`: no top-level repository or sender; the run names its repository, and
/// its `prettyref` is `#<index>` for a pull request's run. Only those are used.
fn parse_action_run(body: &[u8]) -> Result<ForgeEvent, PayloadError> {
    #[derive(Deserialize)]
    struct RawActionPayload {
        #[serde(default)]
        action: String,
        run: Option<RawActionRun>,
    }
    #[derive(Deserialize)]
    struct RawActionRun {
        #[serde(default)]
        prettyref: String,
        repository: Option<RawRepo>,
    }
    let raw: RawActionPayload =
        serde_json::from_slice(body).map_err(|e| PayloadError::Json(e.to_string()))?;
    let run = raw.run.ok_or(PayloadError::Missing("run"))?;
    let repository = run
        .repository
        .ok_or(PayloadError::Missing("run.repository"))?;
    let repo = repo_name(&repository)?;
    let Some(number) = run
        .prettyref
        .strip_prefix('#')
        .and_then(|n| n.parse::<u64>().ok())
        .filter(|n| *n > 0)
    else {
        return Err(PayloadError::NotUsed(
            "a workflow run not of a pull request; its checks are polled",
        ));
    };
    Ok(ForgeEvent {
        kind: EventKind::ActionRun,
        action: raw.action.chars().take(20).collect(),
        issue: IssueRef::new(repo, number),
        // Forgejo Actions, not a person: never the bot's own event.
        sender: String::new(),
        is_pull: true,
        snapshot: IssueSnapshot::default(),
        comment: None,
        review: None,
    })
}

fn repo_name(repo: &RawRepo) -> Result<RepoName, PayloadError> {
    if !repo.full_name.is_empty() {
        return repo
            .full_name
            .parse()
            .map_err(|e: crate::domain::DomainError| {
                PayloadError::Invalid("repository.full_name", e.to_string())
            });
    }
    let owner = repo
        .owner
        .as_ref()
        .map(|o| {
            if o.login.is_empty() {
                &o.username
            } else {
                &o.login
            }
        })
        .ok_or(PayloadError::Missing("repository.full_name"))?;
    RepoName::new(owner, &repo.name)
        .map_err(|e| PayloadError::Invalid("repository.full_name", e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn action_run(prettyref: &str) -> String {
        format!(
            r#"{{"action": "failure", "prior_status": "running",
              "run": {{"id": 9, "index_in_repo": 3, "prettyref": "{prettyref}",
                       "commit_sha": "abc", "status": "failure",
                       "repository": {{"full_name": "acme/widgets", "name": "widgets",
                                       "owner": {{"login": "acme"}}}},
                       "trigger_user": {{"login": "alice"}}}}}}"#
        )
    }

    #[test]
    fn an_actions_run_of_a_pull_request_names_it_and_other_runs_are_not_used() {
        let e = parse_typed(
            "action_run_failure",
            EventKind::ActionRun,
            action_run("#12").as_bytes(),
        )
        .expect("parses");
        assert_eq!(e.kind, EventKind::ActionRun);
        assert_eq!(e.issue.to_string(), "acme/widgets#12");
        assert!(e.is_pull);
        assert_eq!(e.sender, "", "Forgejo Actions, never taken for the bot");
        assert!(matches!(
            parse_typed(
                "action_run_success",
                EventKind::ActionRun,
                action_run("main").as_bytes()
            ),
            Err(PayloadError::NotUsed(_))
        ));
        assert!(matches!(
            parse_typed(
                "action_run_success",
                EventKind::ActionRun,
                action_run("#0").as_bytes()
            ),
            Err(PayloadError::NotUsed(_))
        ));
        assert!(matches!(
            parse_typed(
                "action_run_success",
                EventKind::ActionRun,
                br#"{"action": "success"}"#
            ),
            Err(PayloadError::Missing("run"))
        ));
        assert_eq!(
            EventKind::from_header("pull_request_sync"),
            Some(EventKind::PullRequest)
        );
    }

    const LABEL_EVENT: &str = r#"{
  "action": "label_updated",
  "number": 3,
  "issue": {
    "id": 9, "number": 3, "title": "Fix", "body": "text", "state": "open",
    "user": {"id": 1, "login": "reporter"},
    "labels": [{"id": 1, "name": "headless"}, {"id": 2, "name": "bug"}],
    "updated_at": "2026-11-30T10:00:00Z", "pull_request": null
  },
  "repository": {"id": 4, "name": "widgets", "full_name": "acme/widgets", "owner": {"login": "acme"}},
  "sender": {"id": 2, "login": "alice"}
}"#;

    #[test]
    fn parses_a_label_event() {
        let e = parse_event(EventKind::IssueLabel, LABEL_EVENT.as_bytes()).expect("parses");
        assert_eq!(e.issue.to_string(), "acme/widgets#3");
        assert_eq!(e.sender, "alice");
        assert_eq!(e.snapshot.labels, vec!["headless", "bug"]);
        assert_eq!(e.snapshot.author, "reporter");
        assert!(!e.is_pull);
    }

    #[test]
    fn parses_every_real_pull_request_capture() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/forgejo");
        let mut seen = 0;
        for entry in std::fs::read_dir(dir).expect("fixtures") {
            let path = entry.expect("entry").path();
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default()
                .to_owned();
            if !name.starts_with("HookPullRequest") {
                continue;
            }
            let body = std::fs::read(&path).expect("read");
            let e = parse_event(EventKind::PullRequest, &body)
                .unwrap_or_else(|err| panic!("{name}: {err}"));
            assert!(e.is_pull, "{name}");
            let raw: serde_json::Value = serde_json::from_slice(&body).expect("json");
            // One identity per repository, however the forge spells it.
            assert_eq!(
                Some(e.issue.repo.to_string()),
                raw["repository"]["full_name"]
                    .as_str()
                    .map(str::to_ascii_lowercase),
                "{name}"
            );
            assert_eq!(raw["number"].as_u64(), Some(e.issue.number), "{name}");
            seen += 1;
        }
        assert!(seen >= 10, "fixtures missing: {seen}");
    }

    #[test]
    fn a_real_merge_close_and_reopen_read_as_such() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/forgejo");
        let read = |name: &str| {
            let body = std::fs::read(format!("{dir}/{name}.json")).expect(name);
            parse_typed("pull_request", EventKind::PullRequest, &body).expect(name)
        };
        let merged = read("HookPullRequestMerged");
        assert_eq!(
            (
                merged.action.as_str(),
                merged.snapshot.state.as_str(),
                merged.snapshot.merged
            ),
            ("closed", "closed", true)
        );
        let closed = read("HookPullRequestClosed");
        assert_eq!(
            (closed.snapshot.state.as_str(), closed.snapshot.merged),
            ("closed", false)
        );
        let reopened = read("HookPullRequestReopened");
        assert_eq!(
            (reopened.action.as_str(), reopened.snapshot.state.as_str()),
            ("reopened", "open")
        );
    }

    #[test]
    fn a_review_is_told_by_its_event_type_and_a_pr_comment_is_a_pull_fact() {
        let review = r#"{"action":"reviewed","number":5,"pull_request":{"number":5,"state":"open","title":"t"},
            "repository":{"full_name":"acme/widgets"},"sender":{"login":"alice"},
            "review":{"type":"pull_request_review_rejected","content":"Rename it."}}"#;
        let e = parse_typed(
            "pull_request_review_rejected",
            EventKind::PullReview,
            review.as_bytes(),
        )
        .expect("parses");
        assert!(e.is_pull);
        assert_eq!(
            e.review,
            Some(crate::event::ReviewSnapshot {
                kind: crate::event::ReviewKind::ChangesRequested,
                body: "Rename it.".into()
            })
        );
        assert_eq!(
            EventKind::from_header("pull_request_review_approved"),
            Some(EventKind::PullReview)
        );
        let comment = r#"{"action":"created","issue":{"number":5,"title":"t","state":"open","pull_request":{"merged":false}},
            "comment":{"id":9,"body":"/director fix","user":{"login":"alice"}},
            "repository":{"full_name":"acme/widgets"},"sender":{"login":"alice"},"is_pull":true}"#;
        let e = parse_typed(
            "pull_request_comment",
            EventKind::PullComment,
            comment.as_bytes(),
        )
        .expect("parses");
        assert!(e.is_pull);
        assert_eq!(e.comment.map(|c| c.id), Some(9));
    }

    #[test]
    fn a_comment_event_needs_its_comment() {
        let err =
            parse_event(EventKind::IssueComment, LABEL_EVENT.as_bytes()).expect_err("no comment");
        assert_eq!(err, PayloadError::Missing("comment"));
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(body in proptest::collection::vec(any::<u8>(), 0..2048)) {
            for kind in [EventKind::Issues, EventKind::IssueLabel, EventKind::IssueComment, EventKind::PullRequest] {
                let _ = parse_event(kind, &body);
            }
            for (header, kind) in [("pull_request_comment", EventKind::PullComment), ("pull_request_review_rejected", EventKind::PullReview)] {
                let _ = parse_typed(header, kind, &body);
            }
        }

        /// Intake hands a parsed event to the consumer in memory while the database keeps its
        /// JSON, read after a restart: the two must decide alike, so they must be equal.
        #[test]
        fn a_parsed_event_reads_back_from_its_stored_json_as_the_same_event(
            title in any::<String>(),
            body in any::<String>(),
            comment in any::<String>(),
            labels in proptest::collection::vec(any::<String>(), 0..4),
            login in "[A-Za-z0-9_.-]{1,20}",
            number in 1u64..u64::MAX,
            updated in proptest::option::of(any::<String>()),
        ) {
            let payload = serde_json::json!({
                "action": "created",
                "issue": {"number": number, "title": title, "body": body, "state": "open",
                          "labels": labels.iter().map(|l| serde_json::json!({"name": l})).collect::<Vec<_>>(),
                          "user": {"login": login}, "updated_at": updated},
                "comment": {"id": number, "body": comment, "user": {"login": login}},
                "repository": {"full_name": "acme/widgets"},
                "sender": {"login": login},
            });
            let fact = parse_event(EventKind::IssueComment, payload.to_string().as_bytes())
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            let event = crate::event::Event::Forge(fact);
            let stored = serde_json::to_string(&event).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(
                crate::event::Event::from_stored(crate::event::SCHEMA_VERSION, &stored),
                Ok(event)
            );
        }

        #[test]
        fn mutated_real_payloads_never_panic(
            cut in 0usize..LABEL_EVENT.len(),
            pos in 0usize..LABEL_EVENT.len(),
            byte in any::<u8>(),
        ) {
            let mut body = LABEL_EVENT.as_bytes().to_vec();
            body[pos] = byte;
            let _ = parse_event(EventKind::IssueLabel, &body);
            let _ = parse_event(EventKind::IssueLabel, &body[..cut]);
        }

        #[test]
        fn field_values_of_any_shape_are_errors_not_panics(
            value in prop_oneof![
                Just("null".to_owned()), Just("-1".to_owned()), Just("1e400".to_owned()),
                Just("\"\"".to_owned()), Just("[]".to_owned()), Just("{}".to_owned()),
                "\"[a-z/ ]{0,20}\"".prop_map(|s| s),
            ],
            field in prop_oneof![
                Just("\"number\": 3"), Just("\"login\": \"alice\""), Just("\"full_name\": \"acme/widgets\""),
                Just("\"labels\": [{\"id\": 1, \"name\": \"headless\"}, {\"id\": 2, \"name\": \"bug\"}]"),
            ],
        ) {
            let key = field.split(':').next().unwrap_or_default();
            let body = LABEL_EVENT.replacen(field, &format!("{key}: {value}"), 1);
            if let Ok(e) = parse_event(EventKind::IssueLabel, body.as_bytes()) {
                prop_assert!(e.issue.number > 0);
                prop_assert!(!e.sender.is_empty());
            }
        }
    }
}
