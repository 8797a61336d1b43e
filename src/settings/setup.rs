//! `[setup_secrets.<NAME>]`: values the operator holds for repositories' setup phases (a
//! private registry's token, say). A repository's `[setup]` names which it needs; each reaches
//! the setup phase as the environment variable `NAME` and nothing after it (not the agent,
//! not a snapshot: the workspace is scanned for it first).

use serde::{Deserialize, Serialize};

use super::{Secret, SettingsError, invalid, lenient, repo::glob};
use crate::domain::RepoName;

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SetupSecret {
    pub value: Secret,
    #[serde(deserialize_with = "lenient::opt_string")]
    pub value_file: Option<String>,
    /// Globs of `owner/name` of the repositories whose setup may ask for it. Empty: none.
    #[serde(deserialize_with = "lenient::list")]
    pub repos: Vec<String>,
}

/// The shortest value kept: a shorter one could not be found again in the workspace without
/// matching ordinary text.
pub const MIN_VALUE: usize = 8;

impl SetupSecret {
    /// Whether `repo`'s setup may ask for it.
    pub fn allows(&self, repo: &RepoName) -> bool {
        let name = repo.to_string();
        self.repos.iter().any(|g| glob(g, &name))
    }
}

/// Whether `name` can be an environment variable the setup reads, and not one the director
/// or git sets itself.
fn usable_name(name: &str) -> Result<(), String> {
    let mut bytes = name.bytes();
    let first_ok = bytes
        .next()
        .is_some_and(|b| b.is_ascii_uppercase() || b == b'_');
    if !first_ok
        || !name
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
    {
        return Err(format!(
            "`{name}` is not an environment variable name (upper case letters, digits and `_`)"
        ));
    }
    let reserved = name.starts_with("DIRECTOR_")
        || name.starts_with("GIT_")
        || crate::domain::run::sets_git_credentials(name)
        || matches!(
            name,
            "PATH" | "TMPDIR" | "HTTP_PROXY" | "HTTPS_PROXY" | "ALL_PROXY" | "NO_PROXY"
        );
    if reserved {
        return Err(format!("`{name}` is a variable the director sets itself"));
    }
    Ok(())
}

/// Reads each `value_file` and checks every entry.
pub(super) fn load(
    secrets: &mut std::collections::BTreeMap<String, SetupSecret>,
) -> Result<(), SettingsError> {
    for (name, s) in secrets.iter_mut() {
        usable_name(name).map_err(|why| invalid("setup_secrets", why))?;
        if let Some(file) = &s.value_file {
            if !s.value.is_empty() {
                return Err(invalid(
                    "setup_secrets",
                    format!("`{name}` sets both `value` and `value_file`; keep one"),
                ));
            }
            let text = std::fs::read_to_string(file).map_err(|e| {
                invalid(
                    "setup_secrets",
                    format!("`{name}`: cannot read {file}: {e}"),
                )
            })?;
            s.value = Secret::new(text.trim_end_matches(['\n', '\r']));
        }
        if s.value.expose().chars().count() < MIN_VALUE {
            return Err(invalid(
                "setup_secrets",
                format!(
                    "`{name}` has no value, or one shorter than {MIN_VALUE} characters (set `value` or `value_file`)"
                ),
            ));
        }
        if s.repos.iter().any(|g| g.trim().is_empty()) {
            return Err(invalid(
                "setup_secrets",
                format!("`{name}`: an empty glob in `repos` matches nothing; remove it"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(name: &str, value: &str) -> std::collections::BTreeMap<String, SetupSecret> {
        std::collections::BTreeMap::from([(
            name.to_owned(),
            SetupSecret {
                value: Secret::new(value),
                value_file: None,
                repos: vec!["acme/*".into()],
            },
        )])
    }

    #[test]
    fn names_the_director_sets_and_short_values_are_refused_by_name() {
        assert!(load(&mut one("NPM_TOKEN", "npm_0123456789")).is_ok());
        for bad in [
            "npm_token",
            "1TOKEN",
            "DIRECTOR_X",
            "GIT_ASKPASS",
            "HOME",
            "HTTPS_PROXY",
            "",
        ] {
            let e = load(&mut one(bad, "npm_0123456789"))
                .expect_err(bad)
                .to_string();
            assert!(e.contains("setup_secrets"), "{e}");
        }
        let e = load(&mut one("NPM_TOKEN", "short"))
            .expect_err("short")
            .to_string();
        assert!(e.contains("`NPM_TOKEN`") && e.contains("shorter"), "{e}");
        assert!(!e.contains("short\""), "the value is never echoed: {e}");
    }

    #[test]
    fn a_secret_is_offered_only_to_the_repositories_its_globs_name() {
        let s = one("NPM_TOKEN", "npm_0123456789")
            .remove("NPM_TOKEN")
            .expect("one");
        assert!(s.allows(&"acme/web".parse().expect("repo")));
        assert!(!s.allows(&"evil/web".parse().expect("repo")));
    }
}
