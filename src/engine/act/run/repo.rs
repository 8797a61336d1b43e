//! A repository's `.director.toml`, read at its default branch's head as a run starts.

use anyhow::Context;

use crate::domain::RunSettings;
use crate::forge::FileAt;

/// Why a repository's `.director.toml` cannot be used: each problem names its key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unusable {
    /// The default branch's head the file was read at.
    pub commit: String,
    pub problems: Vec<String>,
}

impl Unusable {
    /// In one sentence, for the issue.
    pub fn describe(&self) -> String {
        format!(
            "the repository's `{}` (at {}) cannot be used: {}",
            crate::settings::repo::FILE,
            self.commit.chars().take(12).collect::<String>(),
            self.problems.join("; ")
        )
    }
}

/// Reads `repo`'s `.director.toml` at the head of `default_branch` now (the contents API at
/// that commit, never a run's branch or a pull request) and resolves it within `operator`'s
/// ceiling. `Err` from the forge: nothing can be said now, and no run starts on the
/// operator's defaults by mistake.
pub async fn read_repo_settings(
    forge: &dyn crate::forge::Forge,
    operator: &crate::settings::repo::Operator,
    repo: &crate::domain::RepoName,
    default_branch: &str,
) -> anyhow::Result<Result<RunSettings, Unusable>> {
    use crate::settings::repo;
    let head = forge
        .branch(repo, default_branch)
        .await
        .context("reading the default branch's head")?
        .map(|b| b.commit)
        .filter(|c| !c.is_empty())
        .with_context(|| format!("the default branch `{default_branch}` has no head"))?;
    let found = forge
        .file_at(repo, repo::FILE, &head, repo::MAX_BYTES)
        .await
        .with_context(|| format!("reading `{}`", repo::FILE))?;
    let resolved = match found {
        FileAt::Missing => repo::resolve(operator, &head, None),
        FileAt::File(bytes) => repo::resolve(operator, &head, Some(&bytes)),
        FileAt::Unusable(why) => Err(vec![why]),
    }
    .and_then(|settings| {
        let problems = operator.setup_problems(repo, &settings);
        if problems.is_empty() {
            Ok(settings)
        } else {
            Err(problems)
        }
    });
    Ok(resolved.map_err(|problems| Unusable {
        commit: head,
        problems,
    }))
}
