//! `[forge]` and `[github]`: which forge, how the director reaches it, and its web links.

use super::*;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ForgeKind {
    #[default]
    Forgejo,
    /// GitHub or GitHub Enterprise Server, as a GitHub App (`[github]`).
    Github,
}

impl ForgeKind {
    /// The forge's name in messages.
    pub fn display_name(self) -> &'static str {
        match self {
            Self::Forgejo => "Forgejo",
            Self::Github => "GitHub",
        }
    }
}

/// The GitHub App the director acts as with `forge.kind = "github"`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GithubSettings {
    /// The App's numeric id (its settings page shows it).
    pub app_id: u64,
    /// The App's private key (PEM, as GitHub hands it out); never shown.
    pub private_key: Secret,
    #[serde(deserialize_with = "lenient::opt_string")]
    pub private_key_file: Option<String>,
    /// The installation to act through; 0: looked up per repository
    /// (`GET /repos/{owner}/{repo}/installation`).
    pub installation_id: u64,
}

/// Whether `key` is an RSA private key in PEM form (what GitHub hands out for an App),
/// without ever showing any of it.
#[cfg(feature = "github")]
pub fn check_private_key(key: &Secret) -> Result<(), String> {
    jsonwebtoken::EncodingKey::from_rsa_pem(key.expose().trim().as_bytes())
        .map(|_| ())
        .map_err(|_| {
            "is not an RSA private key in PEM form (the .pem file GitHub gives for the App)"
                .to_owned()
        })
}

/// How long a GitHub installation token lives, and so the longest run GitHub allows here
/// (less a margin for the director's own checks before and after the run).
pub const GITHUB_TOKEN_LIFETIME_SECS: u64 = 3600;
pub const GITHUB_MAX_RUN_SECS: u64 = 3300;

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ForgeSettings {
    pub kind: ForgeKind,
    /// Base URL of the Forgejo instance, without `/api/v1`.
    #[serde(deserialize_with = "lenient::string")]
    pub url: String,
    /// The bot account's token (admin of the watched repositories).
    pub token: Secret,
    #[serde(deserialize_with = "lenient::opt_string")]
    pub token_file: Option<String>,
    /// The bot's login. Learned from `GET /user` when a token is set; this names it otherwise.
    #[serde(deserialize_with = "lenient::opt_string")]
    pub bot_login: Option<String>,
    /// The write-only account whose tokens runs get.
    #[serde(deserialize_with = "lenient::string")]
    pub runner_login: String,
    pub runner_password: Secret,
    #[serde(deserialize_with = "lenient::opt_string")]
    pub runner_password_file: Option<String>,
    /// Per-request timeout, in seconds.
    pub timeout_secs: u64,
    /// Attempts per request on connection errors, 5xx and 429.
    pub max_attempts: u32,
}

/// Links to the forge's web pages, as each forge spells them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WebLinks {
    /// The site, without a trailing `/`.
    pub base: String,
    pub kind: ForgeKind,
}

impl WebLinks {
    pub fn issue(&self, repo: &RepoName, number: u64) -> String {
        format!("{}/{repo}/issues/{number}", self.base)
    }

    pub fn pull(&self, repo: &RepoName, number: u64) -> String {
        match self.kind {
            ForgeKind::Forgejo => format!("{}/{repo}/pulls/{number}", self.base),
            ForgeKind::Github => format!("{}/{repo}/pull/{number}", self.base),
        }
    }

    pub fn branch(&self, repo: &RepoName, branch: &str) -> String {
        match self.kind {
            ForgeKind::Forgejo => format!("{}/{repo}/src/branch/{branch}", self.base),
            ForgeKind::Github => format!("{}/{repo}/tree/{branch}", self.base),
        }
    }

    pub fn compare(&self, repo: &RepoName, base: &str, head: &str) -> String {
        format!("{}/{repo}/compare/{base}...{head}", self.base)
    }
}

impl ForgeSettings {
    /// Links to the forge's pages; `None` without a forge.
    pub fn links(&self) -> Option<WebLinks> {
        let base = self.web_url();
        (!base.is_empty()).then_some(WebLinks {
            base,
            kind: self.kind,
        })
    }

    /// The forge's web address (for links): `forge.url` on Forgejo; on GitHub the site
    /// matching the API base (`https://api.github.com` is `https://github.com`, GitHub
    /// Enterprise Server's `https://HOST/api/v3` is `https://HOST`).
    pub fn web_url(&self) -> String {
        let url = self.url.trim_end_matches('/');
        if self.kind != ForgeKind::Github {
            return url.to_owned();
        }
        match reqwest::Url::parse(url) {
            Ok(u) if u.host_str() == Some("api.github.com") => "https://github.com".to_owned(),
            _ => url.strip_suffix("/api/v3").unwrap_or(url).to_owned(),
        }
    }
}

impl Default for ForgeSettings {
    fn default() -> Self {
        Self {
            kind: ForgeKind::Forgejo,
            url: String::new(),
            token: Secret::default(),
            token_file: None,
            bot_login: None,
            runner_login: String::new(),
            runner_password: Secret::default(),
            runner_password_file: None,
            timeout_secs: 30,
            max_attempts: 4,
        }
    }
}

impl Settings {
    /// `forge.kind = "github"`: the App's id and key, and runs that fit in a token's hour.
    pub(super) fn validate_github(&self) -> Result<(), SettingsError> {
        if !cfg!(feature = "github") {
            return Err(invalid(
                "forge.kind",
                "this build has no GitHub support (built without the `github` feature)",
            ));
        }
        if self.forge.url.is_empty() {
            return Err(invalid(
                "forge.url",
                "required with forge.kind = \"github\": https://api.github.com, or https://HOST/api/v3 for GitHub Enterprise Server",
            ));
        }
        let g = &self.github;
        if g.app_id == 0 {
            return Err(invalid(
                "github.app_id",
                "required with forge.kind = \"github\" (the App's numeric id)",
            ));
        }
        if g.private_key.is_empty() {
            return Err(invalid(
                "github.private_key",
                "required with forge.kind = \"github\" (or use github.private_key_file)",
            ));
        }
        #[cfg(feature = "github")]
        if let Err(why) = check_private_key(&g.private_key) {
            return Err(invalid("github.private_key", why));
        }
        if !self.forge.token.is_empty() {
            return Err(invalid(
                "forge.token",
                "not used with forge.kind = \"github\": the director acts as the App (github.app_id, github.private_key)",
            ));
        }
        let r = &self.runner;
        if self.runs_configured() && !self.egress_confined() && r.timeout_secs > GITHUB_MAX_RUN_SECS
        {
            return Err(invalid(
                "runner.timeout_secs",
                format!(
                    "{} is longer than an open run can push on GitHub: its installation token expires {} minutes after it is minted, so runs with runner.egress = \"open\" are limited to {GITHUB_MAX_RUN_SECS} s (confined runs push through the git gateway, which renews it)",
                    r.timeout_secs,
                    GITHUB_TOKEN_LIFETIME_SECS / 60
                ),
            ));
        }
        Ok(())
    }
}

impl ForgeSettings {
    /// Its keys alone (GitHub's App is checked with the rest: see `validate_github`).
    pub(super) fn validate(&self) -> Result<(), SettingsError> {
        if !self.url.is_empty() {
            let ok = (self.url.starts_with("http://") || self.url.starts_with("https://"))
                && reqwest::Url::parse(&self.url).is_ok();
            if !ok {
                return Err(invalid(
                    "forge.url",
                    format!("`{}` is not an http(s) URL", self.url),
                ));
            }
        }
        if self.kind == ForgeKind::Forgejo && !self.url.is_empty() && self.token.is_empty() {
            return Err(invalid(
                "forge.token",
                "required when forge.url is set (or use forge.token_file)",
            ));
        }
        if self.timeout_secs == 0 {
            return Err(invalid("forge.timeout_secs", "must be greater than 0"));
        }
        if self.max_attempts == 0 {
            return Err(invalid("forge.max_attempts", "must be at least 1"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod links_tests {
    use super::*;

    #[test]
    fn links_follow_each_forge_s_spelling() {
        let repo: RepoName = "acme/widgets".parse().expect("repo");
        let github = ForgeSettings {
            kind: ForgeKind::Github,
            url: "https://api.github.com/".into(),
            ..Default::default()
        }
        .links()
        .expect("links");
        assert_eq!(
            github.pull(&repo, 7),
            "https://github.com/acme/widgets/pull/7"
        );
        assert_eq!(
            github.branch(&repo, "b"),
            "https://github.com/acme/widgets/tree/b"
        );
        let ghes = ForgeSettings {
            kind: ForgeKind::Github,
            url: "https://ghe.example/api/v3".into(),
            ..Default::default()
        };
        assert_eq!(ghes.web_url(), "https://ghe.example");
        let forgejo = ForgeSettings {
            url: "https://forgejo.example/".into(),
            ..Default::default()
        }
        .links()
        .expect("links");
        assert_eq!(
            forgejo.pull(&repo, 7),
            "https://forgejo.example/acme/widgets/pulls/7"
        );
        assert_eq!(
            forgejo.issue(&repo, 3),
            "https://forgejo.example/acme/widgets/issues/3"
        );
        assert!(ForgeSettings::default().links().is_none());
    }
}
