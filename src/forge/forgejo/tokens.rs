//! The runner account's per-run tokens: minted restricted to one repository with one scope,
//! listed and deleted by name, all with the runner's password (Basic), as Forgejo asks of
//! `/users/{username}/tokens`.

use reqwest::Method;
use serde_json::json;

use super::wire::*;
use super::{ForgejoClient, PAGE_SIZE, basic, decode, seg};
use crate::domain::RepoName;
use crate::forge::{ForgeError, MintedToken, RUN_TOKEN_SCOPE, RunnerAccount};
use crate::settings::Secret;

impl ForgejoClient {
    pub(super) async fn mint_run_token(
        &self,
        runner: &RunnerAccount,
        repo: &RepoName,
        name: &str,
    ) -> Result<MintedToken, ForgeError> {
        let path = format!("/users/{}/tokens", seg(&runner.login));
        let body = json!({
            "name": name,
            "scopes": [RUN_TOKEN_SCOPE],
            "repositories": [{ "owner": repo.owner(), "name": repo.name() }],
        });
        let resp = self
            .send_as(
                Some(&basic(runner)?),
                Method::POST,
                "/users/{username}/tokens",
                &path,
                &[],
                Some(&body),
            )
            .await?;
        let wire: WireToken = decode(&Method::POST, &path, resp).await?;
        if wire.sha1.is_empty() {
            return Err(ForgeError::Decode {
                method: "POST".into(),
                path,
                reason: "no token in the answer".into(),
            });
        }
        Ok(MintedToken {
            id: wire.id,
            name: wire.name,
            token: Secret::new(wire.sha1),
            repositories: wire
                .repositories
                .map(|list| list.iter().filter_map(WireRepoMeta::repo).collect()),
            scopes: wire.scopes,
        })
    }

    pub(super) async fn runner_tokens(
        &self,
        runner: &RunnerAccount,
    ) -> Result<Vec<(u64, String)>, ForgeError> {
        let path = format!("/users/{}/tokens", seg(&runner.login));
        let auth = basic(runner)?;
        let mut out = Vec::new();
        for page in 1..=100 {
            let q = [("limit", PAGE_SIZE.to_string()), ("page", page.to_string())];
            let resp = self
                .send_as(
                    Some(&auth),
                    Method::GET,
                    "/users/{username}/tokens",
                    &path,
                    &q,
                    None,
                )
                .await?;
            let items: Vec<WireToken> = decode(&Method::GET, &path, resp).await?;
            let n = items.len();
            out.extend(items.into_iter().map(|t| (t.id, t.name)));
            if n < PAGE_SIZE {
                break;
            }
        }
        Ok(out)
    }

    pub(super) async fn delete_run_token(
        &self,
        runner: &RunnerAccount,
        name: &str,
    ) -> Result<(), ForgeError> {
        let path = format!("/users/{}/tokens/{}", seg(&runner.login), seg(name));
        self.delete_idempotent(
            Some(&basic(runner)?),
            "/users/{username}/tokens/{token}",
            &path,
        )
        .await
    }
}
