//! Who may do what, beyond a repository's one permission: the runner's access to a
//! repository's Actions unit through its teams, which Forgejo's approval gate reads
//! (`services/actions/trust.go`, `userCanWriteActionsOnRepo`), and what `docs/forks.md`
//! says of it. `GET .../collaborators/{user}/permission` reports the repository's access
//! mode only; a team made with `units_map` has the least of its units' modes as that, so a
//! team giving read on the code and write on Actions reports `read`.

use std::collections::BTreeMap;

use reqwest::Method;
use serde::Deserialize;

use super::{ForgejoClient, PAGE_SIZE, basic, decode, repo_path, seg};
use crate::domain::RepoName;
use crate::forge::{ForgeError, Permission, RunnerAccount};

/// The most pages of the runner's own teams read.
const TEAM_PAGES: usize = 20;

/// A team as `GET /user/teams` and `GET /repos/{o}/{r}/teams` show it.
#[derive(Debug, Deserialize)]
struct WireTeam {
    id: u64,
    #[serde(default)]
    permission: String,
    #[serde(default)]
    units_map: BTreeMap<String, String>,
}

impl WireTeam {
    /// The mode the team gives on unit `unit` (Forgejo's `UnitAccessMode`; an admin team
    /// gives its own on every unit).
    fn unit(&self, unit: &str) -> Permission {
        let own = Permission::parse(&self.permission);
        if own >= Permission::Admin {
            return Permission::Owner;
        }
        self.units_map
            .get(unit)
            .map_or(Permission::None, |m| Permission::parse(m))
    }
}

impl ForgejoClient {
    /// The most the runner's teams give it on `repo`'s Actions unit, read as the runner:
    /// the teams that hold the repository (none when no organisation owns it: 405), met
    /// with the teams the runner is in.
    pub(super) async fn runner_actions_access(
        &self,
        runner: &RunnerAccount,
        repo: &RepoName,
    ) -> Result<Permission, ForgeError> {
        let auth = basic(runner)?;
        let path = format!("{}/teams", repo_path(repo));
        let resp = self
            .send_as(
                Some(&auth),
                Method::GET,
                "/repos/{owner}/{repo}/teams",
                &path,
                &[],
                None,
            )
            .await;
        let held: Vec<WireTeam> = match resp {
            Ok(resp) => decode(&Method::GET, &path, resp).await?,
            Err(ForgeError::Status { status: 405, .. }) => return Ok(Permission::None),
            Err(e) => return Err(e),
        };
        let held: Vec<WireTeam> = held
            .into_iter()
            .filter(|t| t.unit("repo.actions") > Permission::None)
            .collect();
        if held.is_empty() {
            return Ok(Permission::None);
        }
        let mut best = Permission::None;
        for page in 1..=TEAM_PAGES {
            let q = [("limit", PAGE_SIZE.to_string()), ("page", page.to_string())];
            let resp = self
                .send_as(
                    Some(&auth),
                    Method::GET,
                    "/user/teams",
                    "/user/teams",
                    &q,
                    None,
                )
                .await?;
            let mine: Vec<WireTeam> = decode(&Method::GET, "/user/teams", resp).await?;
            for t in held.iter().filter(|h| mine.iter().any(|m| m.id == h.id)) {
                best = best.max(t.unit("repo.actions"));
            }
            if mine.len() < PAGE_SIZE {
                return Ok(best);
            }
        }
        Err(ForgeError::Decode {
            method: "GET".into(),
            path: "/user/teams".into(),
            reason: format!(
                "the runner is in more than {} teams; its access cannot be read",
                TEAM_PAGES * PAGE_SIZE
            ),
        })
    }
}

/// A user as lists of them show it.
#[derive(Debug, Deserialize)]
struct WireLogin {
    login: String,
}

/// `{permission}` of `GET .../collaborators/{user}/permission`.
#[derive(Debug, Deserialize)]
struct WirePermission {
    #[serde(default)]
    permission: String,
}

/// A team as listed for a repository, with its name.
#[derive(Debug, Deserialize)]
struct WireNamedTeam {
    #[serde(default)]
    name: String,
    #[serde(flatten)]
    team: WireTeam,
}

impl ForgejoClient {
    /// GET `path` as the runner, one page of at most [`PAGE_SIZE`].
    async fn read_as<T: serde::de::DeserializeOwned>(
        &self,
        runner: &RunnerAccount,
        endpoint: &'static str,
        path: &str,
        paged: bool,
    ) -> Result<T, ForgeError> {
        let q = [("limit", PAGE_SIZE.to_string())];
        let q: &[(&str, String)] = if paged { &q } else { &[] };
        let resp = self
            .send_as(Some(&basic(runner)?), Method::GET, endpoint, path, q, None)
            .await?;
        decode(&Method::GET, path, resp).await
    }

    /// Who but the runner can write to its fork, in words, and what of that cannot be
    /// read: its collaborators with write or more, and the members of the teams of the
    /// organisation owning it that may write to its code.
    pub(super) async fn fork_writers(
        &self,
        runner: &RunnerAccount,
        fork: &RepoName,
    ) -> Result<Vec<String>, ForgeError> {
        let mut out = Vec::new();
        let me = |l: &str| crate::domain::same_login(l, &runner.login);
        let path = format!("{}/collaborators", repo_path(fork));
        let people: Vec<WireLogin> = self
            .read_as(runner, "/repos/{owner}/{repo}/collaborators", &path, true)
            .await?;
        if people.len() >= PAGE_SIZE {
            out.push(format!(
                "the fork {fork} has {PAGE_SIZE} collaborators or more; not all were read"
            ));
        }
        for p in people.iter().filter(|p| !me(&p.login)) {
            let path = format!(
                "{}/collaborators/{}/permission",
                repo_path(fork),
                seg(&p.login)
            );
            let perm: WirePermission = self
                .read_as(
                    runner,
                    "/repos/{owner}/{repo}/collaborators/{collaborator}/permission",
                    &path,
                    false,
                )
                .await?;
            if Permission::parse(&perm.permission).can_write() {
                out.push(format!(
                    "`{}` can write to the fork {fork} (`{}`)",
                    p.login, perm.permission
                ));
            }
        }
        let path = format!("{}/teams", repo_path(fork));
        let teams: Vec<WireNamedTeam> = match self
            .read_as(runner, "/repos/{owner}/{repo}/teams", &path, false)
            .await
        {
            Ok(teams) => teams,
            // No organisation owns it: no teams.
            Err(ForgeError::Status { status: 405, .. }) => Vec::new(),
            Err(e) => return Err(e),
        };
        for t in teams
            .iter()
            .filter(|t| t.team.unit("repo.code").can_write())
        {
            let path = format!("/teams/{}/members", t.team.id);
            match self
                .read_as::<Vec<WireLogin>>(runner, "/teams/{id}/members", &path, true)
                .await
            {
                Ok(members) => {
                    for m in members.iter().filter(|m| !me(&m.login)) {
                        out.push(format!(
                            "`{}` can write to the fork {fork} (team `{}`)",
                            m.login, t.name
                        ));
                    }
                }
                Err(e) if e.is_refusal() => out.push(format!(
                    "the members of team `{}`, which can write to the fork {fork}, cannot be read as the runner, so it cannot be shown that only the runner writes there",
                    t.name
                )),
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn team(permission: &str, actions: Option<&str>) -> WireTeam {
        WireTeam {
            id: 1,
            permission: permission.into(),
            units_map: actions
                .map(|a| [("repo.actions".to_owned(), a.to_owned())].into())
                .unwrap_or_default(),
        }
    }

    #[test]
    fn a_team_gives_its_actions_unit_mode_and_an_admin_team_owns() {
        assert_eq!(
            team("read", Some("write")).unit("repo.actions"),
            Permission::Write
        );
        assert_eq!(team("write", None).unit("repo.actions"), Permission::None);
        assert_eq!(team("admin", None).unit("repo.actions"), Permission::Owner);
    }
}
