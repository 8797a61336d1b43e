//! The git a run is given: one credential through a helper (never in a URL, a command line
//! or a log), and what its log says of a push the forge refused.

/// What git needs to clone and push with one credential and nothing else: the password
/// reaches git through a credential helper that reads the variable `password_var` from the
/// environment when git asks, for `origin` only. The password is never in the clone URL, a
/// command line, `.git/config` or the log. Helpers the image configures are switched off, so
/// none can store it. Commits get `name <email>`.
pub fn git_environment(
    origin: &str,
    login: &str,
    password_var: &str,
    name: &str,
    email: &str,
) -> Vec<(String, String)> {
    // `!` runs the rest through the shell; `$<var>` stays unexpanded in the helper's text (so
    // also in any argument list) and is read from the environment when it runs. The name is
    // the director's own constant, never input.
    debug_assert!(
        password_var
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b == b'_')
    );
    let helper = format!(
        "!f() {{ test \"$1\" = get || exit 0; echo username={login}; echo \"password=${password_var}\"; }}; f"
    );
    let config = [
        ("credential.helper".to_owned(), String::new()),
        (format!("credential.{origin}.helper"), helper),
        ("credential.interactive".to_owned(), "false".to_owned()),
        // Tools that read the identity from git's configuration (aider) find it there too.
        ("user.name".to_owned(), name.to_owned()),
        ("user.email".to_owned(), email.to_owned()),
    ];
    let mut env = vec![
        ("GIT_TERMINAL_PROMPT".to_owned(), "0".to_owned()),
        ("GIT_AUTHOR_NAME".to_owned(), name.to_owned()),
        ("GIT_AUTHOR_EMAIL".to_owned(), email.to_owned()),
        ("GIT_COMMITTER_NAME".to_owned(), name.to_owned()),
        ("GIT_COMMITTER_EMAIL".to_owned(), email.to_owned()),
        ("GIT_CONFIG_COUNT".to_owned(), config.len().to_string()),
    ];
    for (i, (key, value)) in config.into_iter().enumerate() {
        env.push((format!("GIT_CONFIG_KEY_{i}"), key));
        env.push((format!("GIT_CONFIG_VALUE_{i}"), value));
    }
    env
}

/// Whether an environment variable passed into a run would change how git gets its
/// credentials or identity (the director sets those).
pub fn sets_git_credentials(name: &str) -> bool {
    let n = name.to_ascii_uppercase();
    n.starts_with("GIT_CONFIG")
        || n.starts_with("GIT_AUTHOR_")
        || n.starts_with("GIT_COMMITTER_")
        || matches!(
            n.as_str(),
            "GIT_ASKPASS" | "SSH_ASKPASS" | "GIT_TERMINAL_PROMPT" | "HOME" | "XDG_CONFIG_HOME"
        )
}

/// Whether a run's log shows the forge refusing a push to `branch` (git's
/// `! [remote rejected] x -> branch` line, or Forgejo's "protected branch" message).
pub fn log_shows_refused_push(log: &str, branch: &str) -> bool {
    let target = format!("-> {branch} ");
    let protected = format!("protected branch {branch}");
    log.lines().any(|line| {
        let line = line.trim_end();
        let rejected = line.contains("[remote rejected]") || line.contains("[rejected]");
        (rejected && format!("{line} ").contains(&target)) || line.contains(&protected)
    })
}

#[cfg(test)]
mod git_tests {
    use super::*;

    #[test]
    fn the_git_environment_never_holds_the_token_and_scopes_the_helper_to_the_forge() {
        let env = git_environment(
            "http://forge.example:3000",
            "runner",
            "DIRECTOR_TOKEN",
            "runner",
            "runner@noreply.forge.example",
        );
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("GIT_CONFIG_COUNT"), Some("5"));
        // The identity in git's configuration too, for tools that read it there.
        assert_eq!(get("GIT_CONFIG_KEY_3"), Some("user.name"));
        assert_eq!(get("GIT_CONFIG_VALUE_3"), Some("runner"));
        assert_eq!(get("GIT_CONFIG_KEY_4"), Some("user.email"));
        assert_eq!(
            get("GIT_CONFIG_VALUE_4"),
            Some("runner@noreply.forge.example")
        );
        assert_eq!(get("GIT_CONFIG_KEY_0"), Some("credential.helper"));
        assert_eq!(get("GIT_CONFIG_VALUE_0"), Some(""));
        assert_eq!(
            get("GIT_CONFIG_KEY_1"),
            Some("credential.http://forge.example:3000.helper")
        );
        assert!(get("GIT_CONFIG_VALUE_1").is_some_and(|h| h.contains("$DIRECTOR_TOKEN")));
        assert_eq!(get("GIT_TERMINAL_PROMPT"), Some("0"));
        assert_eq!(
            get("GIT_AUTHOR_EMAIL"),
            Some("runner@noreply.forge.example")
        );
        for (k, _) in &env {
            assert!(sets_git_credentials(k), "{k} must not be passed through");
        }
    }

    #[test]
    fn a_refused_push_to_the_default_branch_is_seen_in_the_log() {
        let log = "remote: Forgejo: Not allowed to push to protected branch main\nTo http://f/a/b.git\n ! [remote rejected] HEAD -> main (pre-receive hook declined)\nerror: failed to push some refs";
        assert!(log_shows_refused_push(log, "main"));
        assert!(log_shows_refused_push(
            " ! [remote rejected] x -> main (pre-receive hook declined)",
            "main"
        ));
        assert!(!log_shows_refused_push(
            " ! [remote rejected] x -> maintenance (declined)",
            "main"
        ));
        assert!(!log_shows_refused_push(
            "pushed director-issue-7-abc",
            "main"
        ));
        assert!(!log_shows_refused_push(
            " * [new branch] HEAD -> main",
            "main"
        ));
    }
}
