//! Actions on the issue's pull request: who gave feedback and whether they may write, the
//! review behind a webhook (its body and inline comments, read from the API: the payload
//! carries neither its id nor its comments), and comments on the pull request.

use anyhow::Context;

use super::Acts;
use crate::domain::command::fix_request;
use crate::domain::{Command, Feedback, IssueRef, same_login};
use crate::engine::action::FeedbackSource;
use crate::event::{Event, PullAsk};
use crate::forge::Review;
use crate::preflight::prompt::strip_hidden;

/// Reviews of other writers a bare `/director fix` brings along.
const REVIEWS_FOR_FIX: usize = 3;

/// Checks the sender and reads what they asked. Nothing is reported for the bot, the runner
/// account (a run's token could review its own pull request), or anyone without write
/// access: their text never reaches a task.
pub(super) async fn read_feedback(
    acts: &Acts,
    issue: &IssueRef,
    pr: u64,
    sender: &str,
    source: &FeedbackSource,
) -> anyhow::Result<Option<Event>> {
    let runner = acts.runs.as_ref().map(|r| r.runner.login.as_str());
    let own = acts.bot().is_some_and(|b| same_login(&b, sender))
        || runner.is_some_and(|r| same_login(r, sender));
    let may_write = !own
        && acts
            .permission(&issue.repo, sender)
            .await
            .context("checking the permission of the feedback's author")?
            .can_write();
    if !may_write {
        tracing::info!(
            actor = sender,
            pr,
            own,
            "feedback on the pull request from an account that may not give it; ignored"
        );
        return Ok(None);
    }
    let ask = match source {
        FeedbackSource::Review { body } => {
            let reviews = acts.forge.reviews(&issue.repo, pr).await?;
            let Some(review) = the_review(&reviews, sender, body) else {
                tracing::warn!(
                    actor = sender,
                    pr,
                    "the review behind the webhook is not listed; ignored"
                );
                return Ok(None);
            };
            PullAsk::Fix {
                feedback: Feedback {
                    key: format!("review:{}", review.id),
                    by: sender.to_owned(),
                    text: review_text(acts, issue, pr, review).await?,
                },
            }
        }
        FeedbackSource::Comment { id, body } => {
            if let Some(instructions) = fix_request(body) {
                PullAsk::Fix {
                    feedback: Feedback {
                        key: format!("comment:{id}"),
                        by: sender.to_owned(),
                        text: fix_text(acts, issue, pr, sender, &instructions).await?,
                    },
                }
            } else {
                match Command::find(body, &[Command::Cancel, Command::Retry]) {
                    Some(Command::Cancel) => PullAsk::Cancel { comment_id: *id },
                    Some(Command::Retry) => PullAsk::Retry { comment_id: *id },
                    _ => return Ok(None),
                }
            }
        }
    };
    Ok(Some(Event::PullAsked {
        pr,
        actor: sender.to_owned(),
        allowed: true,
        ask,
    }))
}

/// The review a `pull_request_review_rejected` delivery announced: the newest submitted
/// request for changes by its sender, with its body when one matches.
fn the_review<'a>(reviews: &'a [Review], sender: &str, body: &str) -> Option<&'a Review> {
    let theirs: Vec<&Review> = reviews
        .iter()
        .filter(|r| same_login(&r.user, sender) && r.state == "REQUEST_CHANGES")
        .collect();
    theirs
        .iter()
        .rev()
        .find(|r| r.body == body)
        .or_else(|| theirs.last())
        .copied()
}

/// A review as the follow-up's task holds it: its body and each inline comment with its
/// file and line, hidden content stripped.
async fn review_text(
    acts: &Acts,
    issue: &IssueRef,
    pr: u64,
    review: &Review,
) -> anyhow::Result<String> {
    let comments = acts
        .forge
        .review_comments(&issue.repo, pr, review.id)
        .await?;
    let kind = match review.state.as_str() {
        "REQUEST_CHANGES" => "requesting changes",
        _ => "commenting",
    };
    let mut text = format!("Review by @{} {kind}:\n\n", review.user);
    let body = strip_hidden(&review.body);
    text.push_str(if body.trim().is_empty() {
        "(no summary)"
    } else {
        body.trim()
    });
    if !comments.is_empty() {
        text.push_str("\n\nInline comments:\n");
        for c in comments {
            let at = match (c.line, c.old_line) {
                (Some(l), _) => format!("line {l}"),
                (None, Some(l)) => format!("line {l} of the old version"),
                (None, None) => "the file".to_owned(),
            };
            let body = strip_hidden(&c.body);
            text.push_str(&format!("\n- `{}`, {at}: {}", c.path, body.trim()));
        }
    }
    Ok(text)
}

/// `/director fix` and its instructions, with the newest reviews by writers on the pull
/// request (what a maintainer saying "fix" usually points at).
async fn fix_text(
    acts: &Acts,
    issue: &IssueRef,
    pr: u64,
    sender: &str,
    instructions: &str,
) -> anyhow::Result<String> {
    let instructions = strip_hidden(instructions);
    let mut text = format!("@{sender} asked for a fix");
    if instructions.trim().is_empty() {
        text.push('.');
    } else {
        text.push_str(&format!(":\n\n{}", instructions.trim()));
    }
    let reviews = acts.forge.reviews(&issue.repo, pr).await?;
    let runner = acts.runs.as_ref().map(|r| r.runner.login.clone());
    let mut taken = Vec::new();
    for review in reviews.iter().rev() {
        if taken.len() >= REVIEWS_FOR_FIX {
            break;
        }
        let relevant = matches!(review.state.as_str(), "REQUEST_CHANGES" | "COMMENT")
            && !runner
                .as_deref()
                .is_some_and(|r| same_login(r, &review.user))
            && !acts.bot().is_some_and(|b| same_login(&b, &review.user));
        if relevant
            && acts
                .permission(&issue.repo, &review.user)
                .await?
                .can_write()
        {
            taken.push(review_text(acts, issue, pr, review).await?);
        }
    }
    if !taken.is_empty() {
        taken.reverse();
        text.push_str("\n\nReviews on the pull request:\n\n");
        text.push_str(&taken.join("\n\n"));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn review(id: u64, user: &str, state: &str, body: &str) -> Review {
        Review {
            id,
            user: user.into(),
            state: state.into(),
            body: body.into(),
            submitted_at: None,
            ..Default::default()
        }
    }

    #[test]
    fn the_review_is_the_senders_newest_request_for_changes_with_that_body() {
        let reviews = [
            review(1, "alice", "REQUEST_CHANGES", "rename it"),
            review(2, "mallory", "REQUEST_CHANGES", "rename it"),
            review(3, "alice", "APPROVED", ""),
            review(4, "alice", "REQUEST_CHANGES", "add a test"),
        ];
        assert_eq!(
            the_review(&reviews, "alice", "rename it").map(|r| r.id),
            Some(1)
        );
        assert_eq!(
            the_review(&reviews, "alice", "other").map(|r| r.id),
            Some(4)
        );
        assert_eq!(the_review(&reviews, "bob", "rename it"), None);
    }
}
