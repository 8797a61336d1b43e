//! The pull request a run opened, what became of it, and the review feedback waiting to be
//! answered by a follow-up run on its branch.

use serde::{Deserialize, Serialize};

/// What became of the pull request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PullState {
    Open,
    Merged,
    Closed,
}

impl PullState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::Merged => "merged",
            Self::Closed => "closed",
        }
    }
}

/// How many answered feedback keys a pull request remembers (older ones are dropped; a
/// review that old is not delivered again).
const HANDLED_KEPT: usize = 64;

/// The pull request of an issue's run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PullRecord {
    pub number: u64,
    /// Its head branch: follow-up runs push here.
    pub branch: String,
    pub state: PullState,
    /// Follow-up runs started since it opened (or since a writer's `/director retry`).
    #[serde(default)]
    pub followups: u32,
    /// Times a writer lifted the cap with `/director retry`: names the cap notice.
    #[serde(default)]
    pub grants: u32,
    /// Feedback waiting for a follow-up run.
    #[serde(default)]
    pub pending: Option<Feedback>,
    /// Feedback that arrived past the cap; a writer's `/director retry` on the PR starts it.
    #[serde(default)]
    pub capped: Option<Feedback>,
    /// Keys of feedback already taken (a review or comment is answered once).
    #[serde(default)]
    pub handled: Vec<String>,
}

impl PullRecord {
    pub fn opened(number: u64, branch: &str) -> Self {
        Self {
            number,
            branch: branch.to_owned(),
            state: PullState::Open,
            followups: 0,
            grants: 0,
            pending: None,
            capped: None,
            handled: Vec::new(),
        }
    }

    pub fn is_open(&self) -> bool {
        self.state == PullState::Open
    }

    /// Remembers `key`; false when it was taken before.
    pub fn take(&mut self, key: &str) -> bool {
        if self.handled.iter().any(|k| k == key) {
            return false;
        }
        self.handled.push(key.to_owned());
        if self.handled.len() > HANDLED_KEPT {
            self.handled.remove(0);
        }
        true
    }
}

/// A writer's review or `/director fix` comment, as the follow-up run's task gets it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Feedback {
    /// Names it once: `review:<id>` or `comment:<id>`.
    pub key: String,
    /// The writer who gave it.
    pub by: String,
    /// The review body with each inline comment (file and line), or the fix instructions.
    pub text: String,
}

impl Feedback {
    /// Two pieces of feedback waiting at once go to one follow-up run.
    pub fn merged_with(self, later: Feedback) -> Feedback {
        Feedback {
            key: later.key,
            by: if self.by == later.by {
                later.by
            } else {
                format!("{}, {}", self.by, later.by)
            },
            text: format!("{}\n\n---\n\n{}", self.text, later.text),
        }
    }
}

/// A follow-up run: which pull request it answers, with what, from which head.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FollowUp {
    pub pr: u64,
    pub feedback: Feedback,
    /// The branch's head commit when the run started: it succeeds once the branch moved past.
    #[serde(default)]
    pub start_head: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn feedback_is_taken_once() {
        let mut pr = PullRecord::opened(3, "director-issue-1-abc");
        assert!(pr.take("review:9"));
        assert!(!pr.take("review:9"));
        for i in 0..100 {
            pr.take(&format!("comment:{i}"));
        }
        assert_eq!(pr.handled.len(), HANDLED_KEPT);
    }

    #[test]
    fn waiting_feedback_is_merged_into_one_task() {
        let a = Feedback {
            key: "review:1".into(),
            by: "alice".into(),
            text: "Rename it.".into(),
        };
        let b = Feedback {
            key: "comment:2".into(),
            by: "bob".into(),
            text: "And add a test.".into(),
        };
        let m = a.merged_with(b);
        assert_eq!(m.key, "comment:2");
        assert_eq!(m.by, "alice, bob");
        assert!(m.text.contains("Rename it.") && m.text.contains("And add a test."));
    }
}
