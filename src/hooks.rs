//! `director hooks install` and `director hooks check`: the webhook of every watched
//! repository, created where it is missing and repaired where it drifted. A hook is the
//! director's when its URL is `webhook.public_url`; hooks with other URLs are never touched.

use std::collections::BTreeSet;

use serde::Serialize;

use crate::domain::RepoName;
use crate::forge::{Forge, Hook, HookSpec};
use crate::settings::Secret;

/// The events the director acts on (Forgejo's hook event names).
pub const EVENTS: &[&str] = &[
    "issues",
    "issue_label",
    "issue_comment",
    "pull_request",
    "pull_request_comment",
    "pull_request_review",
    "pull_request_sync",
    // Forgejo Actions runs ending (Forgejo 15): the checks of a pull request changed.
    "action_run_success",
    "action_run_failure",
];

/// What one repository's hook looks like, or what was done to it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "status")]
pub enum Outcome {
    /// The hook is as it should be.
    Ok {
        id: u64,
    },
    /// No hook has the director's URL.
    Missing,
    /// The director's hook differs: inactive, events missing, not JSON, duplicated.
    Drifted {
        id: u64,
        problems: Vec<String>,
    },
    Created {
        id: u64,
    },
    Repaired {
        id: u64,
        fixed: Vec<String>,
    },
    /// Deleted and created again with the current secret (`--rotate-secret`).
    Recreated {
        id: u64,
    },
    /// The forge refused or failed; the other repositories are still done.
    Failed {
        error: String,
    },
}

impl Outcome {
    /// Whether `hooks check` counts this as needing attention.
    pub fn needs_attention(&self) -> bool {
        matches!(
            self,
            Self::Missing | Self::Drifted { .. } | Self::Failed { .. }
        )
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct RepoHook {
    pub repo: String,
    #[serde(flatten)]
    pub outcome: Outcome,
    /// Why runs from the runner's fork may not start here (fork mode), if they may not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runner: Option<String>,
}

/// Why runs in fork mode (`runner.branch_home = "fork"`) may not start in `repo` with the
/// runner account as it is there (a writer defeats Forgejo's approval gate), if they may
/// not: what `hooks check` and the start-up say per repository, in the words a run's
/// refusal uses.
pub async fn runner_problem(
    forge: &dyn Forge,
    repo: &RepoName,
    runner: &crate::settings::RunnerSettings,
    account: &crate::forge::RunnerAccount,
) -> Option<String> {
    let login = &account.login;
    if runner.branch_home != crate::settings::BranchHome::Fork || login.is_empty() {
        return None;
    }
    let role = match forge.permission(repo, login).await {
        Ok(role) => role,
        Err(e) => return Some(format!("the runner account's role cannot be read: {e}")),
    };
    let actions = match role.can_write() {
        true => crate::forge::Permission::None,
        false => match forge.runner_actions_access(account, repo).await {
            Ok(actions) => actions,
            Err(e) => {
                return Some(format!(
                    "the runner account's access to Actions cannot be read: {e}"
                ));
            }
        },
    };
    crate::engine::decide::runner_role_refusal(&crate::engine::decide::RunnerRole {
        login: login.to_owned(),
        repo: repo.clone(),
        role,
        actions,
        fork: true,
        allow_writer: runner.allow_writer_runner,
    })
}

/// What makes the runner's existing fork of `repo` unfit for runs (fork mode), if anything:
/// Actions on in it, or anyone but the runner able to write to it, in the words a run's
/// refusal uses. No fork yet: nothing to say (the director makes one as it should be).
pub async fn fork_problem(
    forge: &dyn Forge,
    repo: &RepoName,
    runner: &crate::settings::RunnerSettings,
    account: &crate::forge::RunnerAccount,
) -> Option<String> {
    if runner.branch_home != crate::settings::BranchHome::Fork || account.login.is_empty() {
        return None;
    }
    let owner = Some(runner.fork_owner.as_str())
        .filter(|o| !o.is_empty())
        .unwrap_or(&account.login);
    let fork = match forge.fork_of(account, repo, owner).await {
        Ok(fork) => fork?,
        Err(e) => return Some(format!("the runner's fork cannot be read: {e}")),
    };
    match forge.fork_problems(account, &fork).await {
        Ok(problems) if problems.is_empty() => None,
        Ok(problems) => Some(crate::engine::act::run::unfit_fork(&fork, &problems)),
        Err(e) => Some(format!("the runner's fork {fork} cannot be checked: {e}")),
    }
}

/// Every watched repository: `repos`, and every repository of `orgs`. An organisation that
/// cannot be listed is reported as a failure under its name.
pub async fn watched(
    forge: &dyn Forge,
    repos: &[RepoName],
    orgs: &[String],
) -> (BTreeSet<RepoName>, Vec<RepoHook>) {
    let mut all: BTreeSet<RepoName> = repos.iter().cloned().collect();
    let mut failed = Vec::new();
    for org in orgs {
        match forge.org_repos(org).await {
            Ok(list) => all.extend(list),
            Err(e) => failed.push(RepoHook {
                repo: org.clone(),
                outcome: Outcome::Failed {
                    error: format!("cannot list the organisation's repositories: {e}"),
                },
                runner: None,
            }),
        }
    }
    (all, failed)
}

pub use crate::forge::{hook_event_listed_as as listed_as, hook_event_only_listed};

/// Whether the hook has `event`, in Forgejo's terms: named as given, or as Forgejo lists it.
fn has_event(hook: &Hook, event: &str) -> bool {
    let named = |e: &str| hook.events.iter().any(|h| h == e);
    let listed = listed_as(event);
    named(event) || (!listed.is_empty() && listed.iter().all(|e| named(e)))
}

fn same_url(a: &str, b: &str) -> bool {
    a.trim_end_matches('/') == b.trim_end_matches('/')
}

/// What is wrong with the director's hook, if anything.
fn problems(hook: &Hook) -> Vec<String> {
    let mut out = Vec::new();
    if !hook.active {
        out.push("inactive".to_owned());
    }
    let missing: Vec<&str> = EVENTS
        .iter()
        .copied()
        .filter(|e| !has_event(hook, e))
        .collect();
    if !missing.is_empty() {
        out.push(format!("missing events: {}", missing.join(", ")));
    }
    if hook.content_type != "json" {
        out.push(format!("content type `{}`, not json", hook.content_type));
    }
    out
}

/// The state of one repository's hook, changing nothing.
pub async fn check_repo(forge: &dyn Forge, repo: &RepoName, url: &str) -> Outcome {
    let hooks = match forge.hooks(repo).await {
        Ok(h) => h,
        Err(e) => {
            return Outcome::Failed {
                error: e.to_string(),
            };
        }
    };
    let ours: Vec<&Hook> = hooks.iter().filter(|h| same_url(&h.url, url)).collect();
    let Some(first) = ours.first() else {
        return Outcome::Missing;
    };
    let mut problems = problems(first);
    if ours.len() > 1 {
        let extra: Vec<String> = ours[1..].iter().map(|h| h.id.to_string()).collect();
        problems.push(format!("duplicate hooks: {}", extra.join(", ")));
    }
    if problems.is_empty() {
        Outcome::Ok { id: first.id }
    } else {
        Outcome::Drifted {
            id: first.id,
            problems,
        }
    }
}

/// Creates or repairs one repository's hook. Idempotent: a hook as it should be is left
/// alone. With `rotate`, the director's hooks are deleted and created again with `secret`
/// (Forgejo cannot change a secret in place).
pub async fn install_repo(
    forge: &dyn Forge,
    repo: &RepoName,
    url: &str,
    secret: &Secret,
    authorization: Option<&Secret>,
    rotate: bool,
) -> Outcome {
    let spec = HookSpec {
        url: url.to_owned(),
        events: EVENTS.iter().map(|e| (*e).to_owned()).collect(),
        secret: secret.clone(),
        authorization: authorization.cloned(),
    };
    let result = async {
        let hooks = forge.hooks(repo).await?;
        let ours: Vec<&Hook> = hooks.iter().filter(|h| same_url(&h.url, url)).collect();
        if rotate && !ours.is_empty() {
            for h in &ours {
                forge.delete_hook(repo, h.id).await?;
            }
            let h = forge.create_hook(repo, &spec).await?;
            return Ok(Outcome::Recreated { id: h.id });
        }
        let Some(first) = ours.first() else {
            let h = forge.create_hook(repo, &spec).await?;
            return Ok(Outcome::Created { id: h.id });
        };
        let mut fixed = Vec::new();
        for extra in &ours[1..] {
            forge.delete_hook(repo, extra.id).await?;
            fixed.push(format!("removed duplicate hook {}", extra.id));
        }
        let wrong = problems(first);
        if !wrong.is_empty() {
            // Keep the events it has beyond the director's (someone added them on purpose).
            // Names Forgejo only lists (and ignores when given) stay out of the request.
            let mut events = spec.events.clone();
            for e in &first.events {
                if !events.contains(e) && !hook_event_only_listed(e) {
                    events.push(e.clone());
                }
            }
            forge.edit_hook(repo, first.id, &spec, &events).await?;
            fixed.extend(wrong);
        }
        Ok::<_, crate::forge::ForgeError>(if fixed.is_empty() {
            Outcome::Ok { id: first.id }
        } else {
            Outcome::Repaired {
                id: first.id,
                fixed,
            }
        })
    }
    .await;
    result.unwrap_or_else(|e| Outcome::Failed {
        error: e.to_string(),
    })
}

/// What `hooks check` says of the host services a confined run on Docker reaches (the runs'
/// network's gateway is an address of the host: `crate::egress::host`), when runs are
/// confined on Docker. The gateway is read from the engine without changing anything; when
/// the engine or the network is not there, only what listens on every address is named.
pub async fn host_services(settings: &crate::settings::Settings) -> Option<String> {
    let r = &settings.runner;
    if r.kind != crate::settings::RunnerKind::Docker || !settings.egress_confined() {
        return None;
    }
    let gateway = match crate::runtime::docker::DockerRuntime::connect(r.clone()).await {
        Ok(docker) => docker.runs_gateway().await.ok().flatten(),
        Err(_) => None,
    };
    let own = [
        r.egress_proxy_port,
        r.git_gateway_port,
        r.model_gateway_port,
        settings.server.listen.port(),
    ];
    let found = crate::egress::host::read_reachable(gateway, &own);
    let read_in = if crate::runtime::docker::own_container().is_some() {
        crate::egress::host::ReadIn::Container
    } else {
        crate::egress::host::ReadIn::Host
    };
    let mut said = crate::egress::host::describe(&found, read_in, r.host_firewall);
    if gateway.is_none() {
        said.push_str(&format!(
            " (the network `{}` was not found on the engine: its gateway's own services are not counted)",
            r.egress_network
        ));
    }
    Some(said)
}

/// The text `hooks install` and `hooks check` print, one line per repository.
pub fn render(rows: &[RepoHook]) -> String {
    let mut out = String::new();
    for r in rows {
        let line = match &r.outcome {
            Outcome::Ok { id } => format!("ok         hook {id}"),
            Outcome::Missing => "missing    no hook with the director's URL".to_owned(),
            Outcome::Drifted { id, problems } => {
                format!("drifted    hook {id}: {}", problems.join("; "))
            }
            Outcome::Created { id } => format!("created    hook {id}"),
            Outcome::Repaired { id, fixed } => {
                format!("repaired   hook {id}: {}", fixed.join("; "))
            }
            Outcome::Recreated { id } => {
                format!(
                    "recreated  hook {id} with the current secret (Forgejo cannot change a secret in place)"
                )
            }
            Outcome::Failed { error } => format!("failed     {error}"),
        };
        out.push_str(&format!("{:<40} {line}\n", r.repo));
        if let Some(problem) = &r.runner {
            out.push_str(&format!("{:<40} runner     {problem}\n", ""));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hook(active: bool, events: &[&str], ct: &str) -> Hook {
        Hook {
            id: 1,
            kind: "forgejo".into(),
            url: "https://d.example/webhooks/forgejo".into(),
            content_type: ct.into(),
            events: events.iter().map(|e| (*e).to_owned()).collect(),
            active,
        }
    }

    #[test]
    fn a_hook_with_every_event_active_and_json_has_no_problems() {
        assert!(problems(&hook(true, EVENTS, "json")).is_empty());
        let p = problems(&hook(false, &["issues"], "form"));
        assert_eq!(p.len(), 3, "{p:?}");
        assert!(
            p[1].contains("issue_label") && !p[1].contains("issues,"),
            "{p:?}"
        );
    }

    #[test]
    fn urls_match_with_or_without_a_trailing_slash_only() {
        assert!(same_url(
            "https://d.example/webhooks/forgejo/",
            "https://d.example/webhooks/forgejo"
        ));
        assert!(!same_url(
            "https://d.example/webhooks/forgejo2",
            "https://d.example/webhooks/forgejo"
        ));
    }
}
