//! Filing an issue with its labels in one request, as a broker that files for agents does
//! (`POST /repos/{owner}/{repo}/issues` with `labels`), the way Forgejo 15 does it (read in
//! its source: `routers/api/v1/repo/issue.go` `CreateIssue`, `services/issue/issue.go`
//! `NewIssue`, `models/issues/issue_update.go` `NewIssueWithIndex`,
//! `models/issues/issue_label.go` `newIssueLabel`, `services/webhook/notifier.go`):
//!
//! - The labels are set only when the poster may write the repository's issues
//!   (`ctx.Repo.CanWrite(unit.TypeIssues)`); otherwise they are dropped silently and the
//!   issue is created without them. Ids of labels that are not the repository's are dropped
//!   silently too.
//! - Each label set gets a timeline entry of type `label` (`CommentTypeLabel`), by the
//!   poster, body `"1"`, made in the same transaction as the issue (the same second).
//! - Then the webhooks: `issues` `opened` by the poster, whose issue already carries the
//!   labels, and, when any label was set, `issue_label` `label_updated` by the poster.

use director::domain::{IssueRef, RepoName};
use director::forge::Permission;

use super::{FTimeline, Refusal, State};

impl State {
    /// `author` files an issue with `labels` (ids) in one request.
    pub(crate) fn file_issue(
        &mut self,
        author: &str,
        repo: &RepoName,
        title: &str,
        body: &str,
        labels: &[u64],
    ) -> Result<u64, Refusal> {
        let number = self.insert_issue(author, repo, title, body)?;
        let issue = IssueRef::new(repo.clone(), number);
        let may_label = self.unit_mode(repo, author, "repo.issues") >= Permission::Write;
        let known: Vec<u64> = self
            .repo(repo)?
            .labels
            .iter()
            .map(|l| l.id)
            .filter(|id| labels.contains(id))
            .collect();
        let set: Vec<u64> = if may_label { known } else { Vec::new() };
        let ids: Vec<u64> = set.iter().map(|_| self.id()).collect();
        let i = self.issue_mut(&issue)?;
        let at = i.created;
        for (label, id) in set.iter().zip(ids) {
            i.labels.push(*label);
            i.timeline.push(FTimeline {
                id,
                kind: "label".into(),
                actor: author.to_owned(),
                label_id: Some(*label),
                body: "1".into(),
                created: at,
            });
        }
        self.emit("issues", "opened", author, &issue, None);
        if !set.is_empty() {
            self.emit("issue_label", "label_updated", author, &issue, None);
        }
        Ok(number)
    }
}
