//! What a run may push: its own branch only, never a tag, another ref or a delete, and no
//! commit that changes a protected path (CI definitions, the repository's director
//! settings).

use super::pkt::Command;

/// `runner.protected_paths`' default: what a forge's CI reads from a pushed branch and runs
/// with the repository's secrets, and the repository's own director settings.
pub fn default_protected_paths() -> Vec<String> {
    [
        ".forgejo/**",
        ".gitea/**",
        ".github/workflows/**",
        ".github/actions/**",
        ".woodpecker/**",
        ".woodpecker.yml",
        ".woodpecker.yaml",
        ".drone.yml",
        ".drone.yaml",
        ".director.toml",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect()
}

/// Globs over repository paths: `*` and `?` within one segment, `**` any number of
/// segments.
#[derive(Clone, Debug, Default)]
pub struct Protected {
    globs: Vec<Vec<String>>,
}

impl Protected {
    pub fn new(globs: &[String]) -> Result<Self, String> {
        let mut out = Vec::new();
        for g in globs {
            let g = g.trim().trim_start_matches('/');
            if g.is_empty() {
                return Err("an empty pattern".into());
            }
            let segs: Vec<String> = g.split('/').map(str::to_owned).collect();
            if segs.iter().any(|s| s.is_empty() || s == "." || s == "..") {
                return Err(format!("`{g}`: empty, `.` or `..` segments"));
            }
            out.push(segs);
        }
        Ok(Self { globs: out })
    }

    /// The pattern a changed path falls under, if any. A path that is a directory on the way
    /// to a protected one counts too: replacing `.forgejo` by a symbolic link or a file
    /// changes what the forge finds under `.forgejo/workflows`.
    pub fn covering(&self, path: &str) -> Option<String> {
        let segs: Vec<&str> = path.split('/').collect();
        self.globs
            .iter()
            .find(|g| matches(g, &segs) || leads_to(g, &segs))
            .map(|g| g.join("/"))
    }
}

fn matches(glob: &[String], path: &[&str]) -> bool {
    match glob.split_first() {
        None => path.is_empty(),
        Some((g, rest)) if g == "**" => (0..=path.len()).any(|i| matches(rest, &path[i..])),
        Some((g, rest)) => match path.split_first() {
            Some((p, prest)) => segment(g.as_bytes(), p.as_bytes()) && matches(rest, prest),
            None => false,
        },
    }
}

/// Whether `path` names a directory above what `glob` protects.
fn leads_to(glob: &[String], path: &[&str]) -> bool {
    path.len() < glob.len()
        && path
            .iter()
            .zip(glob)
            .all(|(p, g)| g != "**" && segment(g.as_bytes(), p.as_bytes()))
}

fn segment(glob: &[u8], name: &[u8]) -> bool {
    match glob.split_first() {
        None => name.is_empty(),
        Some((b'*', rest)) => (0..=name.len()).any(|i| segment(rest, &name[i..])),
        Some((b'?', rest)) => !name.is_empty() && segment(rest, &name[1..]),
        Some((c, rest)) => name.first() == Some(c) && segment(rest, &name[1..]),
    }
}

/// Why each ref update of a push is refused by its name alone (`None`: it may go on to the
/// content checks). `branch` is the run's `DIRECTOR_BRANCH`.
pub fn check_refs(commands: &[Command], branch: &str, follow_up: bool) -> Vec<Option<String>> {
    let own = format!("refs/heads/{branch}");
    commands
        .iter()
        .enumerate()
        .map(|(i, c)| {
            if commands[..i].iter().any(|o| o.refname == c.refname) {
                Some("the same ref is named twice in one push".to_owned())
            } else if c.refname.starts_with("refs/tags/") {
                Some("tags are not pushed by runs".to_owned())
            } else if c.refname != own {
                Some(format!("a run pushes only {own}"))
            } else if c.deletes() {
                Some("deleting is not allowed".to_owned())
            } else if follow_up && c.creates() {
                Some(
                    "a follow-up adds commits to the pull request's branch, which exists"
                        .to_owned(),
                )
            } else {
                None
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn protected() -> Protected {
        Protected::new(&default_protected_paths()).expect("valid")
    }

    #[test]
    fn the_default_covers_ci_definitions_and_director_settings() {
        let p = protected();
        for path in [
            ".forgejo/workflows/x.yml",
            ".gitea/workflows/deep/x.yaml",
            ".github/workflows/ci.yml",
            ".github/actions/setup/action.yml",
            ".woodpecker/build.yml",
            ".woodpecker.yml",
            ".drone.yml",
            ".director.toml",
            // A file or link where a protected directory belongs.
            ".forgejo",
            ".github",
            ".github/workflows",
        ] {
            assert!(p.covering(path).is_some(), "{path} is protected");
        }
        for path in [
            "src/main.rs",
            "README.md",
            ".github/ISSUE_TEMPLATE/bug.md",
            "docs/.forgejo/workflows/x.yml",
            ".forgejo.yml",
            "x/.director.toml",
        ] {
            assert_eq!(p.covering(path), None, "{path} is not protected");
        }
    }

    #[test]
    fn globs_match_within_and_across_segments() {
        let p = Protected::new(&["ci/*.yml".into(), "deploy/**/secret?".into()]).expect("valid");
        assert!(p.covering("ci/a.yml").is_some());
        assert!(p.covering("ci/a/b.yml").is_none());
        assert!(p.covering("deploy/secret1").is_some());
        assert!(p.covering("deploy/a/b/secretX").is_some());
        assert!(p.covering("deploy/a/b/secret").is_none());
        assert!(Protected::new(&["a/../b".into()]).is_err());
        assert!(Protected::new(&[" ".into()]).is_err());
    }

    fn cmd(old: &str, new: &str, r: &str) -> Command {
        Command {
            old: old.repeat(40),
            new: new.repeat(40),
            refname: r.into(),
        }
    }

    #[test]
    fn only_the_runs_own_branch_may_be_created_or_updated() {
        let cmds = [
            cmd("0", "1", "refs/heads/director-issue-1-abc"),
            cmd("0", "1", "refs/heads/main"),
            cmd("0", "1", "refs/tags/v1"),
            cmd("1", "0", "refs/heads/other"),
            cmd("1", "2", "refs/heads/director-issue-1-abc"),
            cmd("0", "1", "refs/notes/commits"),
        ];
        let got = check_refs(&cmds, "director-issue-1-abc", false);
        assert_eq!(got[0], None);
        assert!(got[1].as_deref().is_some_and(|w| w.contains("pushes only")));
        assert!(got[2].as_deref().is_some_and(|w| w.contains("tags")));
        assert!(got[3].is_some());
        assert!(got[4].as_deref().is_some_and(|w| w.contains("twice")));
        assert!(got[5].is_some());
        let delete = check_refs(&[cmd("1", "0", "refs/heads/b")], "b", false);
        assert_eq!(delete[0].as_deref(), Some("deleting is not allowed"));
        let create = check_refs(&[cmd("0", "1", "refs/heads/b")], "b", true);
        assert!(create[0].is_some(), "a follow-up does not create");
    }
}
