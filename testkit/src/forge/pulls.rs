//! Pull requests in the fake: merge, close and reopen, reviews with inline comments, and the
//! webhooks Forgejo sends for each (see `FACTS-PULLS.md`: a review's payload carries its kind
//! and body, never its id or inline comments).

use serde_json::{Value, json};

use super::server::{self, pull_json, review_of, reviews_of};
use super::{FReview, FReviewComment, FakeForge, Outgoing, Refusal, State, rfc3339};
use director::domain::{CommitSha, IssueRef, RepoName};
use director::forge::{Permission, PullRequest, Review, ReviewComment};

/// A review as a test submits it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReviewEvent {
    Approve,
    RequestChanges,
    Comment,
}

impl ReviewEvent {
    fn state(self) -> &'static str {
        match self {
            Self::Approve => "APPROVED",
            Self::RequestChanges => "REQUEST_CHANGES",
            Self::Comment => "COMMENT",
        }
    }

    /// `X-Forgejo-Event-Type` of its webhook.
    fn event_type(self) -> &'static str {
        match self {
            Self::Approve => "pull_request_review_approved",
            Self::RequestChanges => "pull_request_review_rejected",
            Self::Comment => "pull_request_review_comment",
        }
    }
}

impl State {
    pub(crate) fn pull_index(&self, repo: &RepoName, number: u64) -> Result<usize, Refusal> {
        self.repo(repo)?
            .pulls
            .iter()
            .position(|p| p.number == number)
            .ok_or(Refusal::NotFound)
    }

    /// Queues a `PullRequestPayload` webhook.
    pub(crate) fn emit_pull(
        &mut self,
        event_type: &str,
        action: &str,
        sender: &str,
        repo: &RepoName,
        number: u64,
        review: Option<(&str, &str)>,
    ) {
        if self.webhook.is_none() {
            return;
        }
        let Ok(pull) = pull_json(self, repo, number) else {
            return;
        };
        let body = json!({
            "action": action,
            "number": number,
            "pull_request": pull,
            "requested_reviewer": if review.is_some() { server::user_json(self, sender) } else { Value::Null },
            "repository": server::repo_json(self, repo),
            "sender": server::user_json(self, sender),
            "commit_id": "",
            "review": review.map(|(kind, content)| json!({ "type": kind, "content": content })),
        });
        let body = serde_json::to_string_pretty(&body).unwrap_or_default();
        self.outbox.push(Outgoing {
            event_type: event_type.to_owned(),
            body,
        });
    }

    /// Merges as `login`: the head's commits land on the base, the pull request closes as
    /// merged, and the issues its body closes (`Closes #N`) are closed by the merger.
    pub(crate) fn merge_pull(
        &mut self,
        login: &str,
        repo: &RepoName,
        number: u64,
    ) -> Result<(), Refusal> {
        let at = self.pull_index(repo, number)?;
        let (head_commits, base, open) = {
            let r = self.repo(repo)?;
            let p = &r.pulls[at];
            (r.pull_commits(p), p.base.clone(), p.state == "open")
        };
        if !open {
            return Err(Refusal::Conflict("pull request is closed".into()));
        }
        if self.permission_of(repo, login) < Permission::Write {
            return Err(Refusal::Forbidden);
        }
        let now = self.tick();
        let r = self.repo_mut(repo)?;
        let base_commits = r.branches.entry(base).or_default();
        for c in head_commits {
            if !base_commits.contains(&c) {
                base_commits.push(c);
            }
        }
        r.pulls[at].state = "closed".into();
        r.pulls[at].merged = true;
        let body = r.issues.get(&number).map(|i| i.body.clone());
        if let Some(i) = r.issues.get_mut(&number) {
            i.state = "closed".into();
            i.updated = now;
        }
        self.emit_pull("pull_request", "closed", login, repo, number, None);
        for closed in closing_references(body.as_deref().unwrap_or("")) {
            let issue = IssueRef::new(repo.clone(), closed);
            if let Ok(i) = self.issue_mut(&issue)
                && i.state == "open"
            {
                i.state = "closed".into();
                i.updated = now;
                self.emit("issues", "closed", login, &issue, None);
            }
        }
        Ok(())
    }

    /// Closes (or reopens) without merging, as `login`.
    pub(crate) fn set_pull_state(
        &mut self,
        login: &str,
        repo: &RepoName,
        number: u64,
        state: &str,
    ) -> Result<(), Refusal> {
        let at = self.pull_index(repo, number)?;
        let now = self.tick();
        let r = self.repo_mut(repo)?;
        if r.pulls[at].merged {
            return Err(Refusal::Conflict("pull request is merged".into()));
        }
        r.pulls[at].state = state.to_owned();
        if let Some(i) = r.issues.get_mut(&number) {
            i.state = state.to_owned();
            i.updated = now;
        }
        let action = if state == "closed" {
            "closed"
        } else {
            "reopened"
        };
        self.emit_pull("pull_request", action, login, repo, number, None);
        Ok(())
    }

    /// Submits a review as `login`. As Forgejo: the poster may not approve or reject their
    /// own pull request, and a request for changes needs a body (422 otherwise).
    pub(crate) fn submit_review(
        &mut self,
        login: &str,
        repo: &RepoName,
        number: u64,
        event: ReviewEvent,
        body: &str,
        comments: &[(&str, u64, &str)],
    ) -> Result<u64, Refusal> {
        let at = self.pull_index(repo, number)?;
        let poster = self
            .issue(&IssueRef::new(repo.clone(), number))?
            .author
            .clone();
        if poster == login && event != ReviewEvent::Comment {
            return Err(Refusal::Unprocessable(
                "approve/reject your own pull is not allowed".into(),
            ));
        }
        if event == ReviewEvent::RequestChanges && body.trim().is_empty() {
            return Err(Refusal::Unprocessable(
                "review event REQUEST_CHANGES requires a body".into(),
            ));
        }
        let now = self.tick();
        let id = self.id();
        let commit = server::pull_json(self, repo, number)?["head"]["sha"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let mut inline = Vec::new();
        for (path, line, text) in comments {
            inline.push(FReviewComment {
                id: self.id(),
                path: (*path).to_owned(),
                body: (*text).to_owned(),
                line: *line,
            });
        }
        let r = self.repo_mut(repo)?;
        if event != ReviewEvent::Comment {
            // As Forgejo's CreateReview: a newer verdict dismisses the user's earlier ones.
            for earlier in r.pulls[at]
                .reviews
                .iter_mut()
                .filter(|v| v.user == login && v.state != "COMMENT")
            {
                earlier.dismissed = true;
            }
        }
        r.pulls[at].reviews.push(FReview {
            id,
            user: login.to_owned(),
            state: event.state().to_owned(),
            body: body.to_owned(),
            submitted: now,
            comments: inline,
            commit,
            dismissed: false,
        });
        if let Some(i) = r.issues.get_mut(&number) {
            i.updated = now;
        }
        self.emit_pull(
            event.event_type(),
            "reviewed",
            login,
            repo,
            number,
            Some((event.event_type(), body)),
        );
        Ok(id)
    }
}

/// The issue numbers a pull request body closes (`Closes #3`, `fixes #4`, ...).
fn closing_references(body: &str) -> Vec<u64> {
    const WORDS: [&str; 9] = [
        "close", "closes", "closed", "fix", "fixes", "fixed", "resolve", "resolves", "resolved",
    ];
    let words: Vec<&str> = body.split_whitespace().collect();
    words
        .windows(2)
        .filter(|w| WORDS.contains(&w[0].to_ascii_lowercase().trim_end_matches(':')))
        .filter_map(|w| {
            w[1].strip_prefix('#')?
                .trim_end_matches([',', '.'])
                .parse()
                .ok()
        })
        .collect()
}

impl State {
    /// `login` retitles pull request `number` (it must write to the repository).
    pub(crate) fn edit_pull_title(
        &mut self,
        login: &str,
        repo: &RepoName,
        number: u64,
        title: &str,
    ) -> Result<(), Refusal> {
        if self.permission_of(repo, login) < Permission::Write {
            return Err(Refusal::Forbidden);
        }
        let r = self.repo_mut(repo)?;
        if !r.pulls.iter().any(|p| p.number == number) {
            return Err(Refusal::NotFound);
        }
        let issue = r.issues.get_mut(&number).ok_or(Refusal::NotFound)?;
        issue.title = title.to_owned();
        Ok(())
    }
}

/// The in-process answers, for the fake's `Forge` implementation.
pub(super) fn pull(s: &State, repo: &RepoName, number: u64) -> Result<PullRequest, Refusal> {
    let v = pull_json(s, repo, number)?;
    Ok(PullRequest {
        number,
        state: v["state"].as_str().unwrap_or_default().to_owned(),
        merged: v["merged"].as_bool().unwrap_or(false),
        updated_at: v["updated_at"].as_str().map(str::to_owned),
        head_sha: v["head"]["sha"].as_str().and_then(CommitSha::read),
        head_ref: v["head"]["ref"].as_str().unwrap_or_default().to_owned(),
        base_ref: v["base"]["ref"].as_str().unwrap_or_default().to_owned(),
        merge_base: v["merge_base"].as_str().unwrap_or_default().to_owned(),
        mergeable: v["mergeable"].as_bool(),
        behind: None,
        head_repo: v["head"]["repo"]["full_name"]
            .as_str()
            .and_then(|n| n.parse().ok()),
        merge_commit: v["merge_commit_sha"].as_str().map(str::to_owned),
    })
}

pub(super) fn reviews(s: &State, repo: &RepoName, number: u64) -> Result<Vec<Review>, Refusal> {
    Ok(reviews_of(s, repo, number)?
        .iter()
        .map(|v| Review {
            id: v.id,
            user: v.user.clone(),
            state: v.state.clone(),
            body: v.body.clone(),
            submitted_at: Some(rfc3339(v.submitted)),
            commit_id: CommitSha::read(&v.commit),
            dismissed: v.dismissed,
        })
        .collect())
}

pub(super) fn review_comments(
    s: &State,
    repo: &RepoName,
    number: u64,
    id: u64,
) -> Result<Vec<ReviewComment>, Refusal> {
    let review = review_of(s, repo, number, id)?;
    Ok(review
        .comments
        .iter()
        .map(|c| ReviewComment {
            path: c.path.clone(),
            body: c.body.clone(),
            line: Some(c.line),
            old_line: None,
        })
        .collect())
}

impl FakeForge {
    /// `by` merges pull request `number` in the web UI.
    pub async fn merge_pull(&self, by: &str, repo: &RepoName, number: u64) {
        {
            let mut s = self.state();
            s.ensure_user(by);
            s.merge_pull(by, repo, number)
                .unwrap_or_else(|e| panic!("merging #{number}: {e:?}"));
        }
        self.deliver_webhooks().await;
    }

    /// `by` closes (`closed`) or reopens (`open`) pull request `number` without merging.
    pub async fn set_pull_state(&self, by: &str, repo: &RepoName, number: u64, state: &str) {
        {
            let mut s = self.state();
            s.ensure_user(by);
            s.set_pull_state(by, repo, number, state)
                .unwrap_or_else(|e| panic!("{state} #{number}: {e:?}"));
        }
        self.deliver_webhooks().await;
    }

    /// The same, with webhooks held back (a delivery Forgejo never made; the scan finds it).
    pub fn set_pull_state_quietly(&self, by: &str, repo: &RepoName, number: u64, merge: bool) {
        let mut s = self.state();
        s.ensure_user(by);
        let done = if merge {
            s.merge_pull(by, repo, number)
        } else {
            s.set_pull_state(by, repo, number, "closed")
        };
        done.unwrap_or_else(|e| panic!("#{number}: {e:?}"));
        s.outbox.clear();
    }

    /// `by` submits a review of pull request `number`; `comments` are (path, line, text).
    pub async fn review(
        &self,
        by: &str,
        repo: &RepoName,
        number: u64,
        event: ReviewEvent,
        body: &str,
        comments: &[(&str, u64, &str)],
    ) -> u64 {
        let id = {
            let mut s = self.state();
            s.ensure_user(by);
            s.submit_review(by, repo, number, event, body, comments)
                .unwrap_or_else(|e| panic!("review of #{number}: {e:?}"))
        };
        self.deliver_webhooks().await;
        id
    }

    /// (state, merged) of a pull request.
    pub fn pull_state(&self, repo: &RepoName, number: u64) -> Option<(String, bool)> {
        let s = self.state();
        let r = s.repo(repo).ok()?;
        r.pulls
            .iter()
            .find(|p| p.number == number)
            .map(|p| (p.state.clone(), p.merged))
    }

    /// The head commit of a branch, as the API names it.
    pub fn branch_head(&self, repo: &RepoName, branch: &str) -> Option<String> {
        let s = self.state();
        let r = s.repo(repo).ok()?;
        r.branches.get(branch)?;
        Some(r.head_name(branch))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closing_keywords_name_the_issues_a_merge_closes() {
        assert_eq!(
            closing_references("Closes #7\n\nAlso fixes: #8, resolved #9. See #10"),
            vec![7, 8, 9]
        );
    }
}
