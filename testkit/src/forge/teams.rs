//! Organisation teams in the fake, as Forgejo 15 has them (read in its source, see
//! `docs/forks.md`): a team holds repositories of its organisation (all of them with
//! `includes_all_repositories`) and gives its members an access mode per repository unit.
//!
//! - A team made with `units_map` and a permission below admin gets the least of its units'
//!   modes as its own (`MinUnitAccessMode`); that mode is what the repository permission
//!   (`GET .../collaborators/{user}/permission`) reports, whatever its units say.
//! - A unit's mode (`GetUserRepoPermission`): the owner owns everything; a member of an
//!   admin team owns the repository; else a collaborator's mode on every unit, raised by
//!   each team's mode for that unit; a unit no team names, on a public repository, reads.
//! - Forgejo's approval gate trusts whoever may write to the `repo.actions` unit.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};

use super::{FakeForge, State};
use director::domain::RepoName;
use director::forge::Permission;

/// One team (`organization.Team`).
#[derive(Clone, Debug)]
pub(crate) struct FTeam {
    pub id: u64,
    pub org: String,
    pub name: String,
    /// The team's own mode (`authorize`).
    pub mode: Permission,
    /// Unit key (`repo.code`, `repo.actions`, ...) → mode.
    pub units: BTreeMap<String, Permission>,
    pub all_repos: bool,
    pub repos: BTreeSet<RepoName>,
    pub members: BTreeSet<String>,
}

impl FTeam {
    fn holds(&self, repo: &RepoName) -> bool {
        self.repos.contains(repo) || (self.all_repos && repo.owner() == self.org)
    }

    /// The mode the team gives on `unit` (an admin team gives its own on every unit).
    fn unit_mode(&self, unit: &str) -> Permission {
        if self.mode >= Permission::Admin {
            return self.mode;
        }
        self.units.get(unit).copied().unwrap_or(Permission::None)
    }

    pub(crate) fn json(&self, s: &State) -> Value {
        let units_map: BTreeMap<&str, &str> = self
            .units
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        json!({
            "id": self.id,
            "name": self.name,
            "description": "",
            "includes_all_repositories": self.all_repos,
            "can_create_org_repo": false,
            "permission": self.mode.as_str(),
            "units": self.units.keys().collect::<Vec<_>>(),
            "units_map": units_map,
            "organization": {
                "id": s.users.get(&self.org).copied().unwrap_or(0),
                "name": self.org,
                "username": self.org,
            },
        })
    }
}

impl State {
    /// The teams of `repo`'s organisation that hold it.
    pub(crate) fn teams_of(&self, repo: &RepoName) -> Vec<&FTeam> {
        self.teams.iter().filter(|t| t.holds(repo)).collect()
    }

    /// The mode `login`'s teams give on `repo` (the `access` table's share of them).
    pub(crate) fn team_mode(&self, repo: &RepoName, login: &str) -> Permission {
        self.teams_of(repo)
            .into_iter()
            .filter(|t| t.members.contains(login))
            .map(|t| {
                if t.mode >= Permission::Admin {
                    Permission::Owner
                } else {
                    t.mode
                }
            })
            .max()
            .unwrap_or(Permission::None)
    }

    /// `login`'s mode on `unit` of `repo`, as Forgejo's `GetUserRepoPermission` reads it.
    pub(crate) fn unit_mode(&self, repo: &RepoName, login: &str, unit: &str) -> Permission {
        let whole = self.permission_of(repo, login);
        if !self.orgs.contains_key(repo.owner()) || whole == Permission::Owner {
            return whole;
        }
        let Ok(r) = self.repo(repo) else {
            return Permission::None;
        };
        let teams: Vec<&FTeam> = self
            .teams_of(repo)
            .into_iter()
            .filter(|t| t.members.contains(login))
            .collect();
        if teams.iter().any(|t| t.mode >= Permission::Admin) {
            return Permission::Owner;
        }
        let collaborator = r.permissions.get(login).copied();
        let from_teams = teams.iter().map(|t| t.unit_mode(unit)).max();
        let named = from_teams.is_some_and(|m| m > Permission::None);
        let default =
            (!named && !r.private && self.users.contains_key(login)).then_some(Permission::Read);
        [collaborator, from_teams, default]
            .into_iter()
            .flatten()
            .max()
            .unwrap_or(Permission::None)
    }

    /// `GET /user/teams`: every team `login` is in.
    pub(crate) fn user_teams_json(&self, login: &str) -> Vec<Value> {
        self.teams
            .iter()
            .filter(|t| t.members.contains(login))
            .map(|t| t.json(self))
            .collect()
    }
}

impl FakeForge {
    /// A team of organisation `org` made through the API with `units_map` (Forgejo's
    /// `CreateTeam`): its own mode is `permission` when admin or more, else the least of
    /// its units' modes. Returns its id.
    pub fn add_team(
        &self,
        org: &str,
        name: &str,
        permission: Permission,
        units: &[(&str, Permission)],
    ) -> u64 {
        let mut s = self.state();
        s.ensure_user(org);
        // An owner with teams is an organisation.
        s.orgs.entry(org.to_owned()).or_default();
        let units: BTreeMap<String, Permission> =
            units.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect();
        let mode = if permission >= Permission::Admin || units.is_empty() {
            permission
        } else {
            units
                .values()
                .copied()
                .filter(|m| *m > Permission::None)
                .min()
                .unwrap_or(Permission::None)
        };
        let id = s.id();
        s.teams.push(FTeam {
            id,
            org: org.to_owned(),
            name: name.to_owned(),
            mode,
            units,
            all_repos: false,
            repos: BTreeSet::new(),
            members: BTreeSet::new(),
        });
        id
    }

    /// Gives team `id` repository `repo` and member `login`.
    pub fn team_add(&self, id: u64, repo: &RepoName, login: &str) {
        let mut s = self.state();
        s.ensure_user(login);
        if let Some(t) = s.teams.iter_mut().find(|t| t.id == id) {
            t.repos.insert(repo.clone());
            t.members.insert(login.to_owned());
        }
    }
}
