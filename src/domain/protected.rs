//! Paths no commit a run pushes may change: what a forge's CI reads from a pushed branch and
//! runs with the repository's secrets, and the repository's own director settings
//! (`runner.protected_paths`).

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
}
