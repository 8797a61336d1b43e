//! Merges that did not last: for [`WINDOW_DAYS`] after one of the director's pull requests
//! was merged, its repository's base branch is read for a later commit that reverts it
//! (git's own "This reverts commit <sha>", as `git revert` and the forges' revert buttons
//! write it). At most once a day per repository, with one list call: the commits since the
//! head the last look saw (Forgejo's `not`). A revert found becomes a `Reverted` event for
//! the issue, which keeps it once and says it once, after a restart too.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::Notify;

use crate::clock::SharedClock;
use crate::domain::{IssueRecord, RepoName};
use crate::event::Event;
use crate::forge::Forge;
use crate::store::{NewDelivery, Store};

/// How long after its merge a pull request is watched for a revert.
pub const WINDOW_DAYS: i64 = 30;
/// The shortest commit id a revert message is matched by.
const MIN_SHA: usize = 7;

pub struct RevertCheck {
    pub store: Store,
    pub forge: Arc<dyn Forge>,
    pub clock: SharedClock,
    /// The consumer, woken when events are stored.
    pub wake: Arc<Notify>,
}

/// The commits a message says it reverts (git's "This reverts commit <sha>.").
pub fn reverted_commits(message: &str) -> Vec<String> {
    const SAYS: &str = "This reverts commit ";
    let mut out = Vec::new();
    let mut rest = message;
    while let Some(at) = rest.find(SAYS) {
        rest = &rest[at + SAYS.len()..];
        let sha: String = rest
            .chars()
            .take_while(char::is_ascii_hexdigit)
            .collect::<String>()
            .to_ascii_lowercase();
        if sha.len() >= MIN_SHA {
            out.push(sha);
        }
    }
    out
}

fn same_commit(a: &str, b: &str) -> bool {
    let (a, b) = (a.to_ascii_lowercase(), b.to_ascii_lowercase());
    a.len() >= MIN_SHA && b.len() >= MIN_SHA && (a.starts_with(&b) || b.starts_with(&a))
}

/// A merged pull request being watched: its issue, number and merge commit.
struct Watched {
    record: IssueRecord,
    pr: u64,
    merge: String,
}

impl RevertCheck {
    /// One pass over the repositories due today; returns the reverts found.
    pub async fn check_once(&self) -> anyhow::Result<usize> {
        let now = self.clock.now_ms();
        let today = crate::models::day_of(now);
        let since = now - WINDOW_DAYS * 86_400_000;
        let mut by_base: BTreeMap<(RepoName, String), Vec<Watched>> = BTreeMap::new();
        for record in self.store.recently_merged(since).await? {
            let Some(pr) = record.pr.as_ref() else {
                continue;
            };
            let number = pr.number;
            // The merge commit and base, read once per pull request and kept.
            let key = format!("merge-commit:{}#{number}", record.repo);
            let (merge, base) = match self.store.meta(&key).await? {
                Some(kept) => match kept.split_once(' ') {
                    Some((m, b)) => (m.to_owned(), b.to_owned()),
                    None => continue,
                },
                None => {
                    let pull = match self.forge.pull(&record.repo, number).await {
                        Ok(p) => p,
                        Err(e) => {
                            tracing::debug!(repo = %record.repo, pr = number, error = %e, "revert check: the pull request cannot be read now");
                            continue;
                        }
                    };
                    let Some(merge) = pull.merge_commit.filter(|m| m.len() >= MIN_SHA) else {
                        continue;
                    };
                    self.store
                        .set_meta(&key, &format!("{merge} {}", pull.base_ref))
                        .await?;
                    (merge, pull.base_ref)
                }
            };
            by_base
                .entry((record.repo.clone(), base))
                .or_default()
                .push(Watched {
                    record,
                    pr: number,
                    merge,
                });
        }
        let mut found = Vec::new();
        for ((repo, base), watched) in by_base {
            let key = format!("revert-check:{repo}:{base}");
            let last = self.store.meta(&key).await?;
            let (day, head) = match last.as_deref().and_then(|l| l.split_once(' ')) {
                Some((d, h)) => (d.to_owned(), Some(h.to_owned()).filter(|h| !h.is_empty())),
                None => (String::new(), None),
            };
            if day == today {
                continue;
            }
            let commits = match self
                .forge
                .recent_commits(&repo, &base, head.as_deref())
                .await
            {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(%repo, error = %e, "revert check: the base's commits cannot be listed; tried again on the next pass");
                    continue;
                }
            };
            for c in &commits {
                for reverted in reverted_commits(&c.message) {
                    for w in watched.iter().filter(|w| same_commit(&w.merge, &reverted)) {
                        let issue = w.record.issue_ref();
                        tracing::info!(%issue, pr = w.pr, revert = %c.sha, "a merged pull request was reverted");
                        found.push(NewDelivery::internal(
                            format!("reverted:{issue}:{}:{}", w.pr, c.sha),
                            issue,
                            Event::Reverted {
                                pr: w.pr,
                                sha: c.sha.clone(),
                                url: c.url.clone(),
                            },
                            now,
                        ));
                    }
                }
            }
            let newest = commits.first().map(|c| c.sha.clone()).or(head);
            self.store
                .set_meta(&key, &format!("{today} {}", newest.unwrap_or_default()))
                .await?;
        }
        if found.is_empty() {
            return Ok(0);
        }
        self.store.insert_deliveries(&found).await?;
        self.wake.notify_one();
        Ok(found.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_revert_message_names_the_commits_it_reverts() {
        let message = "Revert \"Add --verbose\"\n\nThis reverts commit 0123abcd4567ef890123abcd4567ef890123abcd.\n";
        assert_eq!(
            reverted_commits(message),
            vec!["0123abcd4567ef890123abcd4567ef890123abcd".to_owned()]
        );
        assert!(
            reverted_commits("This reverts commit abc.").is_empty(),
            "too short"
        );
        assert!(reverted_commits("Reverts nothing").is_empty());
        assert!(same_commit("0123abcd4567", "0123ABCD4567ef89"));
        assert!(!same_commit("0123abc", "0123abd"));
    }
}
