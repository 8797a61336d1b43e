//! A repository's history as the revert check reads it: each commit's parents (listed with
//! the branch's commits, as Forgejo's `parents`) and its diff against its first parent
//! (`GET .../git/commits/{sha}.diff`, as Forgejo serves it). Where the repository is served
//! over git both come from git itself; otherwise from the fake's own trees, a changed file
//! shown as one hunk that removes all its old lines and adds all its new ones (a valid
//! unified diff, not git's shortest one: what a reader counts per line is the same).
//! Also what a test arranges: branches, commits that change files, and merge commits.

use std::collections::BTreeMap;

use actix_web::http::StatusCode;

use super::server::Answer;
use super::{FRepo, FakeForge, Refusal, State};
use director::domain::RepoName;

impl FRepo {
    /// The parents of commit `id`, first parent first: those recorded when it was made,
    /// else the commit before it on the first branch (the default one first) that holds it.
    pub(crate) fn parents_of(&self, id: u64) -> Vec<u64> {
        if let Some(p) = self.parents.get(&id) {
            return p.clone();
        }
        let default = self.branches.get(&self.default_branch);
        default
            .into_iter()
            .chain(self.branches.values())
            .find_map(|b| {
                let at = b.iter().position(|c| *c == id)?;
                Some(at.checked_sub(1).map(|p| b[p]).into_iter().collect())
            })
            .unwrap_or_default()
    }

    /// The diff of commit `id` against its first parent (against nothing for a root).
    fn diff_of(&self, id: u64) -> Result<String, Refusal> {
        if let Some(g) = &self.git {
            let sha = self.commit_name(id);
            return super::git::git(
                &g.dir,
                &["show", "--format=", "--diff-merges=first-parent", &sha],
                &[],
                None,
            )
            .map(|d| format!("{d}\n"))
            .map_err(|e| Refusal::Internal(e.to_string()));
        }
        let empty = BTreeMap::new();
        let before = self
            .parents_of(id)
            .first()
            .and_then(|p| self.trees.get(p))
            .unwrap_or(&empty);
        let after = self.trees.get(&id).unwrap_or(&empty);
        let mut out = String::new();
        let paths: std::collections::BTreeSet<&String> =
            before.keys().chain(after.keys()).collect();
        for path in paths {
            let (old, new) = (before.get(path), after.get(path));
            if old == new {
                continue;
            }
            out.push_str(&format!("diff --git a/{path} b/{path}\n"));
            match (old, new) {
                (None, _) => out.push_str("new file mode 100644\n"),
                (_, None) => out.push_str("deleted file mode 100644\n"),
                _ => {}
            }
            let name = |side: &str, content: Option<&Vec<u8>>| match content {
                Some(_) => format!("{side}/{path}"),
                None => "/dev/null".to_owned(),
            };
            out.push_str(&format!("--- {}\n+++ {}\n", name("a", old), name("b", new)));
            let lines = |c: Option<&Vec<u8>>| -> Vec<String> {
                c.map(|c| {
                    String::from_utf8_lossy(c)
                        .lines()
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default()
            };
            let (old, new) = (lines(old), lines(new));
            out.push_str(&format!("@@ -1,{} +1,{} @@\n", old.len(), new.len()));
            for l in &old {
                out.push_str(&format!("-{l}\n"));
            }
            for l in &new {
                out.push_str(&format!("+{l}\n"));
            }
        }
        Ok(out)
    }
}

impl State {
    /// `GET .../git/commits/{sha}.diff`: the commit's diff as text.
    pub(crate) fn commit_diff(&self, repo: &RepoName, file: &str) -> Result<Answer, Refusal> {
        let Some(sha) = file.strip_suffix(".diff") else {
            return Err(Refusal::NotFound);
        };
        let r = self.repo(repo)?;
        let id = r.commit_named(sha).ok_or(Refusal::NotFound)?;
        let diff = r.diff_of(id)?;
        Ok((
            StatusCode::OK,
            serde_json::Value::String(diff),
            vec![(
                "content-type".to_owned(),
                "text/plain;charset=utf-8".to_owned(),
            )],
        ))
    }
}

impl FakeForge {
    /// `branch` made at `from`'s head, as `git branch <branch> <from>`.
    pub fn create_branch(&self, repo: &RepoName, branch: &str, from: &str) {
        let mut s = self.state();
        if let Ok(r) = s.repo_mut(repo)
            && let Some(commits) = r.branches.get(from).cloned()
        {
            r.branches.insert(branch.to_owned(), commits);
        }
    }

    /// `by` pushes a commit to `branch` with `message` that sets each file to its content
    /// (`None`: deletes it). Its id.
    pub async fn push_change(
        &self,
        by: &str,
        repo: &RepoName,
        branch: &str,
        message: &str,
        files: &[(&str, Option<&[u8]>)],
    ) -> String {
        let sha = self
            .push_commit_with_message(by, repo, branch, message)
            .await;
        let mut s = self.state();
        if let Ok(r) = s.repo_mut(repo)
            && let Some(id) = r.commit_named(&sha)
            && let Some(tree) = r.trees.get_mut(&id)
        {
            for (path, content) in files {
                match content {
                    Some(c) => tree.insert((*path).to_owned(), c.to_vec()),
                    None => tree.remove(*path),
                };
            }
        }
        sha
    }

    /// `by` merges `side` into `base` with a merge commit (`--no-ff`), its first parent
    /// `base`'s head and its second `side`'s, holding `side`'s files (`side` was made from
    /// `base`, so nothing conflicts). Its id.
    pub fn merge_branch(&self, repo: &RepoName, base: &str, side: &str, message: &str) -> String {
        let mut s = self.state();
        let merge = s.id();
        let Ok(r) = s.repo_mut(repo) else {
            panic!("no repository {repo}");
        };
        let side_commits = r.branches.get(side).cloned().unwrap_or_default();
        let base_commits = r.branches.entry(base.to_owned()).or_default();
        let first = base_commits.last().copied();
        let second = side_commits.last().copied();
        for c in &side_commits {
            if !base_commits.contains(c) {
                base_commits.push(*c);
            }
        }
        base_commits.push(merge);
        r.parents
            .insert(merge, first.into_iter().chain(second).collect());
        let tree = second
            .and_then(|c| r.trees.get(&c).cloned())
            .unwrap_or_default();
        r.trees.insert(merge, tree);
        r.messages.insert(merge, message.to_owned());
        r.commit_name(merge)
    }
}
