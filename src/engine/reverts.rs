//! Merges that did not last: for [`WINDOW_DAYS`] after one of the director's pull requests
//! was merged, its repository's base branch is read for a later commit that reverts it. At
//! most once a day per repository, with one list call: the commits since the head the last
//! look saw (Forgejo's `not`). A revert is a commit on the base's first-parent line (what
//! was pushed or merged onto the base itself, not a commit of a branch merged into it)
//! that names the merged commit as git does ("This reverts commit <sha>", as `git revert`
//! and the forges' revert buttons write it), itself or, for a merge commit, in a commit of
//! the branch it merged; and whose change, read from the forge's diff, undoes the merged
//! commit's (`super::undo`). Anyone who opens a pull request can write the message; only a
//! real revert has the change. A revert found becomes a `Reverted` event for the issue,
//! which keeps it once and says it once, after a restart too.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use tokio::sync::Notify;

use crate::clock::SharedClock;
use crate::domain::{IssueRecord, RepoName};
use crate::engine::undo::Change;
use crate::event::Event;
use crate::forge::{CommitSummary, Forge};
use crate::store::{NewDelivery, Store};

/// How long after its merge a pull request is watched for a revert.
pub const WINDOW_DAYS: i64 = 30;
/// The shortest commit id a revert message is matched by.
const MIN_SHA: usize = 7;
/// The most of one commit's diff read: a larger one confirms no revert.
pub const DIFF_BYTES: usize = 1024 * 1024;

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
            let mut diffs = Diffs::default();
            for c in first_parent_line(&commits) {
                let named = named_reverts(c, &commits);
                for w in watched
                    .iter()
                    .filter(|w| named.iter().any(|n| same_commit(&w.merge, n)))
                {
                    let issue = w.record.issue_ref();
                    if !diffs.undoes(&*self.forge, &repo, &c.sha, &w.merge).await {
                        tracing::info!(%issue, pr = w.pr, commit = %c.sha, "a commit names the merge as reverted but its change does not undo it: not counted");
                        continue;
                    }
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
            // A diff the forge failed to give now is read again on the next day's pass: the
            // head seen stays where it was.
            let newest = if diffs.retry {
                head
            } else {
                commits.first().map(|c| c.sha.clone()).or(head)
            };
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

/// The commits of the list on the base's first-parent line, newest first: from the newest
/// (the branch's head), each one's first parent while the list holds it.
fn first_parent_line(commits: &[CommitSummary]) -> Vec<&CommitSummary> {
    let by_sha: HashMap<&str, &CommitSummary> =
        commits.iter().map(|c| (c.sha.as_str(), c)).collect();
    let mut line = Vec::new();
    let mut seen = HashSet::new();
    let mut next = commits.first();
    while let Some(c) = next.filter(|c| seen.insert(c.sha.as_str())) {
        line.push(c);
        next = c
            .parents
            .first()
            .and_then(|p| by_sha.get(p.as_str()).copied());
    }
    line
}

/// The commits `c` says it reverts: in its own message, and for a merge commit in the
/// messages of the commits it merged (those of the list its later parents reach that its
/// first parent does not: the merged branch's, as far as the list goes).
fn named_reverts(c: &CommitSummary, commits: &[CommitSummary]) -> Vec<String> {
    let mut named = reverted_commits(&c.message);
    let [first, merged @ ..] = c.parents.as_slice() else {
        return named;
    };
    if merged.is_empty() {
        return named;
    }
    let by_sha: HashMap<&str, &CommitSummary> =
        commits.iter().map(|c| (c.sha.as_str(), c)).collect();
    let reach = |from: &[String]| {
        let mut seen: HashSet<&str> = HashSet::new();
        let mut todo: Vec<&str> = from.iter().map(String::as_str).collect();
        while let Some(sha) = todo.pop() {
            if let Some(c) = by_sha.get(sha)
                && seen.insert(c.sha.as_str())
            {
                todo.extend(c.parents.iter().map(String::as_str));
            }
        }
        seen
    };
    let base = reach(std::slice::from_ref(first));
    for sha in reach(merged).difference(&base) {
        if let Some(side) = by_sha.get(sha) {
            named.extend(reverted_commits(&side.message));
        }
    }
    named
}

/// The diffs read in one pass, each commit's once; `retry` when the forge failed to give
/// one for now (not a refusal, not too large).
#[derive(Default)]
struct Diffs {
    read: HashMap<String, Option<Change>>,
    retry: bool,
}

impl Diffs {
    /// Whether commit `sha`'s change undoes commit `merge`'s. A diff too large or that
    /// cannot be read confirms nothing.
    async fn undoes(&mut self, forge: &dyn Forge, repo: &RepoName, sha: &str, merge: &str) -> bool {
        let (Some(revert), Some(merged)) = (
            self.change(forge, repo, sha).await,
            self.change(forge, repo, merge).await,
        ) else {
            return false;
        };
        revert.undoes(&merged)
    }

    async fn change(&mut self, forge: &dyn Forge, repo: &RepoName, sha: &str) -> Option<Change> {
        if let Some(kept) = self.read.get(sha) {
            return kept.clone();
        }
        let change = match forge.commit_diff(repo, sha, DIFF_BYTES).await {
            Ok(Some(diff)) => Some(Change::parse(&diff)),
            Ok(None) => {
                tracing::info!(%repo, commit = %sha, max_bytes = DIFF_BYTES, "revert check: the commit's diff is too large to read; it confirms no revert");
                None
            }
            Err(e) => {
                tracing::info!(%repo, commit = %sha, error = %e, "revert check: the commit's diff cannot be read; it confirms no revert");
                self.retry |= !e.is_refusal();
                None
            }
        };
        self.read.insert(sha.to_owned(), change.clone());
        change
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
