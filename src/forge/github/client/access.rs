//! Who the App acts as, and the runs' own tokens: the installation that covers a repository
//! (kept once asked), the per-run installation tokens (minted for one repository with
//! `contents: write`, held in this process, revoked by showing them), and whether a branch's
//! rules bind the one asking.

use super::*;

impl GithubClient {
    /// The installation that covers `repo`: `github.installation_id`, else GitHub's answer
    /// (kept).
    pub(super) async fn installation(&self, repo: &RepoName) -> Result<u64, ForgeError> {
        if let Some(id) = self.fixed_installation {
            return Ok(id);
        }
        let key = repo.to_string().to_ascii_lowercase();
        if let Some(id) = self.cached_installation(&key) {
            return Ok(id);
        }
        let path = format!("{}/installation", repo_path(repo));
        let found: Result<RawInstallation, _> = self
            .json(
                As::App,
                Method::GET,
                "/repos/{o}/{r}/installation",
                &path,
                None,
            )
            .await;
        let id = match found {
            Ok(i) => i.id,
            Err(e) if e.is_not_found() => {
                return Err(ForgeError::Status {
                    method: "GET".into(),
                    path,
                    status: 404,
                    message: format!("the GitHub App is not installed on {repo}"),
                });
            }
            Err(e) => return Err(e),
        };
        self.installations
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, id);
        Ok(id)
    }

    /// The installation on an account (organisation, else user).
    pub(super) async fn owner_installation(&self, owner: &str) -> Result<u64, ForgeError> {
        if let Some(id) = self.fixed_installation {
            return Ok(id);
        }
        let key = format!("owner:{}", owner.to_ascii_lowercase());
        if let Some(id) = self.cached_installation(&key) {
            return Ok(id);
        }
        let org = format!("/orgs/{}/installation", enc(owner));
        let id = match self
            .json::<RawInstallation>(As::App, Method::GET, "/orgs/{org}/installation", &org, None)
            .await
        {
            Ok(i) => i.id,
            Err(e) if e.is_not_found() => {
                let user = format!("/users/{}/installation", enc(owner));
                match self
                    .json::<RawInstallation>(
                        As::App,
                        Method::GET,
                        "/users/{username}/installation",
                        &user,
                        None,
                    )
                    .await
                {
                    Ok(i) => i.id,
                    Err(e) if e.is_not_found() => {
                        return Err(ForgeError::Status {
                            method: "GET".into(),
                            path: user,
                            status: 404,
                            message: format!(
                                "the GitHub App is not installed on the account {owner}"
                            ),
                        });
                    }
                    Err(e) => return Err(e),
                }
            }
            Err(e) => return Err(e),
        };
        self.installations
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, id);
        Ok(id)
    }

    pub(super) fn cached_installation(&self, key: &str) -> Option<u64> {
        self.installations
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .copied()
    }

    pub(super) async fn on(&self, repo: &RepoName) -> Result<As<'static>, ForgeError> {
        Ok(As::Installation(self.installation(repo).await?))
    }

    /// An installation token for `repo` alone with `contents: write` (GitHub adds
    /// `metadata: read`): never `administration`, `workflows` or `secrets`. The runner
    /// account is not used on GitHub: the App is the run's identity.
    pub(super) async fn mint_installation_token(
        &self,
        repo: &RepoName,
        name: &str,
    ) -> Result<MintedToken, ForgeError> {
        let installation = self.installation(repo).await?;
        let body = json!({
            "repositories": [repo.name()],
            "permissions": { "contents": "write" },
        });
        let raw: RawToken = self
            .json(
                As::App,
                Method::POST,
                "/app/installations/{installation_id}/access_tokens",
                &format!("/app/installations/{installation}/access_tokens"),
                Some(&body),
            )
            .await?;
        let token = Secret::new(raw.token);
        self.run_tokens
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_owned(), token.clone());
        let mut scopes: Vec<String> = raw
            .permissions
            .iter()
            .map(|(k, v)| format!("{k}:{v}"))
            .collect();
        scopes.sort();
        Ok(MintedToken {
            id: 0,
            name: name.to_owned(),
            token,
            repositories: raw.repositories.map(|list| {
                list.iter()
                    .filter_map(|r| r.full_name.parse().ok())
                    .collect()
            }),
            scopes,
        })
    }

    /// The run tokens this process minted and has not revoked (GitHub cannot list them).
    pub(super) fn held_tokens(&self) -> Vec<(u64, String)> {
        self.run_tokens
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .map(|n| (0, n.clone()))
            .collect()
    }

    /// Revokes the token (`DELETE /installation/token`, with the token itself). A token this
    /// process neither minted nor was given back ([`Forge::hold_run_token`]: a run adopted
    /// after a restart) cannot be shown to GitHub: it expires by itself within the hour,
    /// which is also the longest a run may last here.
    pub(super) async fn revoke_held_token(&self, name: &str) -> Result<(), ForgeError> {
        let token = self
            .run_tokens
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .cloned();
        let Some(token) = token else {
            return Err(ForgeError::TokenNotHeld {
                name: name.to_owned(),
            });
        };
        match self
            .send(
                As::Token(&token),
                Method::DELETE,
                "/installation/token",
                "/installation/token",
                None,
            )
            .await
        {
            // 401: revoked or expired already.
            Ok(_) | Err(ForgeError::Status { status: 401, .. }) => {}
            Err(e) => return Err(e),
        }
        self.run_tokens
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
        Ok(())
    }

    /// Whether a ruleset's `pull_request` rule (with an approving review) binds the token's
    /// holder: GitHub says per ruleset whether the one asking may bypass it.
    pub(super) async fn ruleset_binds(
        &self,
        token: &Secret,
        repo: &RepoName,
        branch: &str,
    ) -> Result<bool, ForgeError> {
        let path = format!("{}/rules/branches/{}", repo_path(repo), enc(branch));
        let rules: Vec<RawRule> = self
            .all_pages(
                As::Token(token),
                "/repos/{o}/{r}/rules/branches/{branch}",
                &path,
                &[],
            )
            .await?;
        for rule in rules.iter().filter(|r| {
            r.kind == "pull_request"
                && r.parameters
                    .as_ref()
                    .and_then(|p| p.get("required_approving_review_count"))
                    .and_then(Value::as_u64)
                    .is_some_and(|n| n >= 1)
        }) {
            let Some(id) = rule.ruleset_id else { continue };
            let set: RawRuleset = self
                .json(
                    As::Token(token),
                    Method::GET,
                    "/repos/{o}/{r}/rulesets/{ruleset_id}",
                    &format!("{}/rulesets/{id}", repo_path(repo)),
                    None,
                )
                .await?;
            if set.enforcement == "active"
                && set.current_user_can_bypass.as_deref() == Some("never")
            {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Whether a classic branch protection requires a pull request with an approving review
    /// and lets no App bypass it (read with the director's installation token: it needs the
    /// `administration: read` permission the run token never has).
    pub(super) async fn protection_binds(
        &self,
        repo: &RepoName,
        branch: &str,
    ) -> Result<bool, ForgeError> {
        let path = format!("{}/branches/{}/protection", repo_path(repo), enc(branch));
        let found = self
            .get::<RawProtection>(
                self.on(repo).await?,
                "/repos/{o}/{r}/branches/{branch}/protection",
                &path,
            )
            .await;
        let p = match found {
            Ok(Some(p)) => p,
            // Not protected (404), or the App may not read the protection (403, without
            // Administration: read): it does not count.
            Ok(None) | Err(ForgeError::Status { status: 403, .. }) => return Ok(false),
            Err(e) => return Err(e),
        };
        let Some(reviews) = p.required_pull_request_reviews else {
            return Ok(false);
        };
        if reviews.required_approving_review_count < 1 {
            return Ok(false);
        }
        let bot = self.bot_login().await?;
        let slug = bot.trim_end_matches("[bot]");
        let bypass = reviews
            .bypass_pull_request_allowances
            .is_some_and(|b| b.apps.iter().any(|a| a.slug.eq_ignore_ascii_case(slug)));
        Ok(!bypass)
    }
}
