//! GitHub webhook bodies, parsed into the same [`ForgeEvent`]s the Forgejo webhooks give, so
//! nothing after intake knows which forge spoke.
//!
//! | `X-GitHub-Event` | `action` | becomes |
//! |---|---|---|
//! | `issues` | `labeled`, `unlabeled` | [`EventKind::IssueLabel`] |
//! | `issues` | any other (`edited`, `closed`, `reopened`, ...) | [`EventKind::Issues`] |
//! | `issue_comment` | any | [`EventKind::IssueComment`], or [`EventKind::PullComment`] on a pull request |
//! | `pull_request` | any | [`EventKind::PullRequest`] |
//! | `pull_request_review` | `submitted` | [`EventKind::PullReview`] of the review's state; other actions as a plain comment review (they start nothing) |
//!
//! GitHub sends `null` for an empty body; every field the director does not need may be
//! missing.

use serde::Deserialize;

use crate::domain::{IssueRef, RepoName};
use crate::event::{
    CommentSnapshot, EventKind, ForgeEvent, IssueSnapshot, ReviewKind, ReviewSnapshot,
};
use crate::forge::payload::PayloadError;

#[derive(Debug, Deserialize, Default)]
struct User {
    #[serde(default)]
    login: String,
}

#[derive(Debug, Deserialize)]
struct Repo {
    #[serde(default)]
    full_name: String,
}

#[derive(Debug, Deserialize)]
struct Label {
    name: String,
}

#[derive(Debug, Deserialize)]
struct Item {
    #[serde(default)]
    number: u64,
    #[serde(default)]
    title: String,
    #[serde(default)]
    body: Option<String>,
    #[serde(default)]
    state: String,
    #[serde(default)]
    labels: Option<Vec<Label>>,
    #[serde(default)]
    updated_at: Option<String>,
    #[serde(default)]
    user: Option<User>,
    #[serde(default)]
    merged: Option<bool>,
    /// On an issue: present (an object) when the issue is a pull request.
    #[serde(default)]
    pull_request: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
struct Comment {
    id: u64,
    #[serde(default)]
    body: Option<String>,
    #[serde(default)]
    user: Option<User>,
    #[serde(default)]
    updated_at: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Review {
    #[serde(default)]
    state: String,
    #[serde(default)]
    body: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Payload {
    #[serde(default)]
    action: String,
    issue: Option<Item>,
    pull_request: Option<Item>,
    comment: Option<Comment>,
    review: Option<Review>,
    repository: Option<Repo>,
    sender: Option<User>,
}

/// Whether the director reads events of this `X-GitHub-Event` (others, `ping` and `push`
/// among them, are answered and dropped).
pub fn is_used(event: &str) -> bool {
    matches!(
        event,
        "issues" | "issue_comment" | "pull_request" | "pull_request_review"
    )
}

/// Parses a verified body of `X-GitHub-Event: event` (one [`is_used`] accepts).
pub fn parse(event: &str, body: &[u8]) -> Result<ForgeEvent, PayloadError> {
    let raw: Payload =
        serde_json::from_slice(body).map_err(|e| PayloadError::Json(e.to_string()))?;
    if raw.action.is_empty() {
        return Err(PayloadError::Missing("action"));
    }
    let sender = raw
        .sender
        .map(|s| s.login)
        .filter(|l| !l.is_empty())
        .ok_or(PayloadError::Missing("sender.login"))?;
    let repo: RepoName = raw
        .repository
        .ok_or(PayloadError::Missing("repository"))?
        .full_name
        .parse()
        .map_err(|e: crate::domain::DomainError| {
            PayloadError::Invalid("repository.full_name", e.to_string())
        })?;
    let (item, key) = match event {
        "pull_request" | "pull_request_review" => (raw.pull_request, "pull_request"),
        _ => (raw.issue, "issue"),
    };
    let item = item.ok_or(PayloadError::Missing(key))?;
    if item.number == 0 {
        return Err(PayloadError::Missing("number"));
    }
    let on_pull = matches!(event, "pull_request" | "pull_request_review")
        || item.pull_request.as_ref().is_some_and(|p| !p.is_null());
    let kind = match (event, raw.action.as_str()) {
        ("issues", "labeled" | "unlabeled") => EventKind::IssueLabel,
        ("issues", _) => EventKind::Issues,
        ("issue_comment", _) if on_pull => EventKind::PullComment,
        ("issue_comment", _) => EventKind::IssueComment,
        ("pull_request", _) => EventKind::PullRequest,
        ("pull_request_review", _) => EventKind::PullReview,
        _ => return Err(PayloadError::Invalid("X-GitHub-Event", event.to_owned())),
    };
    let comment = match kind {
        EventKind::IssueComment | EventKind::PullComment => {
            let c = raw.comment.ok_or(PayloadError::Missing("comment"))?;
            Some(CommentSnapshot {
                id: c.id,
                author: c.user.unwrap_or_default().login,
                body: c.body.unwrap_or_default(),
                updated_at: c.updated_at,
            })
        }
        _ => None,
    };
    let review = match kind {
        EventKind::PullReview => {
            let r = raw.review.ok_or(PayloadError::Missing("review"))?;
            // Webhooks spell the state in lower case; the API in upper case.
            let state = r.state.to_ascii_lowercase();
            Some(ReviewSnapshot {
                kind: match (raw.action.as_str(), state.as_str()) {
                    ("submitted", "changes_requested") => ReviewKind::ChangesRequested,
                    ("submitted", "approved") => ReviewKind::Approved,
                    _ => ReviewKind::Comment,
                },
                body: r.body.unwrap_or_default(),
            })
        }
        _ => None,
    };
    Ok(ForgeEvent {
        kind,
        action: raw.action,
        issue: IssueRef::new(repo, item.number),
        sender,
        is_pull: on_pull,
        snapshot: IssueSnapshot {
            title: item.title,
            body: item.body.unwrap_or_default(),
            state: item.state,
            labels: item
                .labels
                .unwrap_or_default()
                .into_iter()
                .map(|l| l.name)
                .collect(),
            author: item.user.unwrap_or_default().login,
            updated_at: item.updated_at,
            merged: item.merged.unwrap_or(false),
        },
        comment,
        review,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// GitHub's own examples (`tests/fixtures/github`, from octokit/webhooks).
    fn shared(name: &str) -> Vec<u8> {
        let path = format!(
            "{}/tests/fixtures/github/{name}.payload.json",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    #[test]
    fn github_s_own_examples_read_as_the_director_s_events() {
        let labeled = parse("issues", &shared("issues-labeled")).expect("labeled");
        assert_eq!(labeled.kind, EventKind::IssueLabel);
        // GitHub spells it `Codertocat/Hello-World`; one repository has one (lower-case) identity.
        assert_eq!(labeled.issue.to_string(), "codertocat/hello-world#1");
        assert_eq!(labeled.sender, "Codertocat");
        assert!(!labeled.is_pull);
        assert!(labeled.snapshot.labels.iter().any(|l| l == "bug"));

        let unlabeled = parse("issues", &shared("issues-unlabeled")).expect("unlabeled");
        assert_eq!(unlabeled.kind, EventKind::IssueLabel);

        let edited = parse("issues", &shared("issues-edited")).expect("edited");
        assert_eq!(
            (edited.kind, edited.action.as_str()),
            (EventKind::Issues, "edited")
        );

        let reopened = parse("issues", &shared("issues-reopened")).expect("reopened");
        assert_eq!(reopened.snapshot.state, "open");

        let comment = parse("issue_comment", &shared("issue_comment-created")).expect("comment");
        assert_eq!(comment.kind, EventKind::IssueComment);
        assert!(
            comment
                .comment
                .is_some_and(|c| c.id > 0 && !c.body.is_empty())
        );

        let closed = parse("pull_request", &shared("pull_request-closed")).expect("closed");
        assert_eq!(closed.kind, EventKind::PullRequest);
        assert!(closed.is_pull);
        assert_eq!(closed.snapshot.state, "closed");

        let review = parse(
            "pull_request_review",
            &shared("pull_request_review-submitted"),
        )
        .expect("review");
        assert_eq!(review.kind, EventKind::PullReview);
        assert_eq!(review.review.map(|r| r.kind), Some(ReviewKind::Comment));
    }

    #[test]
    fn a_comment_on_a_pull_request_is_a_pull_fact_and_changes_requested_is_told() {
        let comment = r#"{"action":"created","issue":{"number":5,"title":"t","state":"open","body":null,
            "pull_request":{"url":"x"}},"comment":{"id":9,"body":"/director fix","user":{"login":"alice"}},
            "repository":{"full_name":"acme/widgets"},"sender":{"login":"alice"}}"#;
        let e = parse("issue_comment", comment.as_bytes()).expect("parses");
        assert_eq!(e.kind, EventKind::PullComment);
        assert!(e.is_pull);
        let review = r#"{"action":"submitted","review":{"state":"changes_requested","body":"Rename it."},
            "pull_request":{"number":5,"state":"open","title":"t","merged":false},
            "repository":{"full_name":"acme/widgets"},"sender":{"login":"alice"}}"#;
        let e = parse("pull_request_review", review.as_bytes()).expect("parses");
        assert_eq!(
            e.review,
            Some(ReviewSnapshot {
                kind: ReviewKind::ChangesRequested,
                body: "Rename it.".into()
            })
        );
        let dismissed = review.replace("\"submitted\"", "\"dismissed\"");
        let e = parse("pull_request_review", dismissed.as_bytes()).expect("parses");
        assert_eq!(e.review.map(|r| r.kind), Some(ReviewKind::Comment));
    }

    #[test]
    fn missing_parts_are_named() {
        let no_repo = r#"{"action":"labeled","issue":{"number":1},"sender":{"login":"a"}}"#;
        assert_eq!(
            parse("issues", no_repo.as_bytes()).expect_err("no repo"),
            PayloadError::Missing("repository")
        );
        let bad_repo = r#"{"action":"labeled","issue":{"number":1},"sender":{"login":"a"},"repository":{"full_name":"../x"}}"#;
        assert!(matches!(
            parse("issues", bad_repo.as_bytes()),
            Err(PayloadError::Invalid("repository.full_name", _))
        ));
        assert!(matches!(parse("issues", b"{"), Err(PayloadError::Json(_))));
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(body in proptest::collection::vec(any::<u8>(), 0..2048)) {
            for event in ["issues", "issue_comment", "pull_request", "pull_request_review"] {
                let _ = parse(event, &body);
            }
        }

        #[test]
        fn mutated_real_payloads_never_panic(pos in 0usize..4000, byte in any::<u8>(), cut in 0usize..4000) {
            let mut body = shared("issues-labeled");
            let pos = pos % body.len();
            body[pos] = byte;
            let _ = parse("issues", &body);
            let _ = parse("issues", &body[..cut % body.len()]);
        }
    }
}
