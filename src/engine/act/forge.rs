//! Actions on the forge: who applied the trigger, whether a command's author may write, the
//! notices and the sticky pre-flight comment, the routed issue, the state labels.

use anyhow::Context;

use super::Acts;
use crate::domain::{Command, IssueRef, RepoName, same_login};
use crate::engine::decide::{all_state_labels, state_label};
use crate::event::{Event, StickyDraft};
use crate::forge::{Forge, ForgeError, Permission};
use crate::preflight::comment;

/// Finds who added the trigger label and whether they may write. Always from the timeline:
/// a webhook's sender changed *some* label, and a lost or late delivery can make a writer's
/// unrelated change look like the one that added a reader's trigger.
pub(super) async fn resolve_trigger(
    acts: &Acts,
    issue: &IssueRef,
) -> anyhow::Result<Option<Event>> {
    let forge = acts.forge.as_ref();
    let added = latest_label_added(forge, issue, &acts.labels.trigger)
        .await
        .context("reading the timeline")?;
    let (actor, labelled_at) = match added {
        Some((actor, at)) => (Some(actor), Some(at)),
        None => (None, None),
    };
    let permission = match &actor {
        Some(a) => acts
            .permission(&issue.repo, a)
            .await
            .context("checking the permission")?,
        None => Permission::None,
    };
    tracing::info!(
        actor = actor.as_deref().unwrap_or(""),
        permission = permission.as_str(),
        "trigger judged"
    );
    Ok(Some(Event::TriggerJudged {
        trusted: permission.can_write(),
        permission: permission.as_str().to_owned(),
        actor,
        labelled_at,
    }))
}

pub(super) async fn authorize_command(
    acts: &Acts,
    issue: &IssueRef,
    command: Command,
    actor: &str,
    said: Option<crate::domain::command::Said>,
) -> anyhow::Result<Option<Event>> {
    let allowed = acts
        .permission(&issue.repo, actor)
        .await
        .context("checking the command author's permission")?
        .can_write();
    if !allowed {
        tracing::info!(
            actor,
            command = command.as_str(),
            "command from an account without write access ignored"
        );
    }
    Ok(Some(Event::CommandJudged {
        command,
        actor: actor.to_owned(),
        allowed,
        said,
    }))
}

/// Posts `body` unless the director's own comment holding `marker` is already there (anyone
/// can write a marker into a comment; only the bot's count).
pub(super) async fn post_once(
    acts: &Acts,
    issue: &IssueRef,
    marker: &str,
    body: &str,
) -> Result<(), ForgeError> {
    let bot = acts.bot();
    let existing = acts.forge.comments(issue).await?;
    if existing
        .iter()
        .any(|c| c.body.contains(marker) && bot.as_deref().is_none_or(|b| same_login(b, &c.author)))
    {
        return Ok(());
    }
    acts.forge.create_comment(issue, body).await.map(|_| ())
}

/// Edits the issue's one pre-flight comment in place, or posts it if there is none.
pub(super) async fn upsert_sticky(
    acts: &Acts,
    issue: &IssueRef,
    body: &str,
) -> Result<(), ForgeError> {
    let bot = acts.bot();
    let comments = acts.forge.comments(issue).await?;
    let mine = comments.iter().find(|c| {
        c.body.starts_with(comment::MARKER)
            && bot.as_deref().is_none_or(|b| same_login(b, &c.author))
    });
    match mine {
        Some(c) if c.body == body => Ok(()),
        Some(c) => acts
            .forge
            .edit_comment(&issue.repo, c.id, body)
            .await
            .map(|_| ()),
        None => acts.forge.create_comment(issue, body).await.map(|_| ()),
    }
}

/// Files the routed issue, unless an earlier attempt did (found by its marker among the
/// bot's own issues in the target repository).
pub(super) async fn file_routed(
    acts: &Acts,
    rev: i64,
    target: &RepoName,
    title: &str,
    body: &str,
    marker: &str,
    sticky: &StickyDraft,
) -> anyhow::Result<Option<Event>> {
    let bot = match acts.bot() {
        Some(b) => b,
        None => acts.forge.current_user().await?,
    };
    let filed = acts
        .forge
        .issues_created_by(target, &bot)
        .await
        .with_context(|| format!("looking for an earlier filing in {target}"))?
        .into_iter()
        .find(|i| i.body.contains(marker))
        .map(|i| i.number);
    let number = match filed {
        Some(n) => {
            tracing::info!(%target, number = n, "the routed issue was filed before");
            n
        }
        None => {
            let n = acts
                .forge
                .create_issue(target, title, body)
                .await
                .with_context(|| format!("filing the issue in {target}"))?;
            crate::failpoint::hit("after_routed_issue_created").await;
            n
        }
    };
    Ok(Some(Event::RoutedFiled {
        rev,
        filed: IssueRef::new(target.clone(), number),
        sticky: Box::new(sticky.clone()),
    }))
}

/// Puts the state label of the issue's state as it is now on, and the other state labels
/// off. Reading the state when it runs makes a late or repeated sync converge.
pub(super) async fn sync_labels(acts: &Acts, issue: &IssueRef) -> anyhow::Result<()> {
    let Some(record) = acts.store.issue(issue).await? else {
        return Ok(());
    };
    let wanted = state_label(&acts.labels, &record);
    let all = all_state_labels(&acts.labels);
    let current = acts.forge.issue(issue).await?;
    for l in current
        .labels
        .iter()
        .filter(|l| all.contains(&l.name.as_str()) && Some(l.name.as_str()) != wanted)
    {
        acts.forge.remove_label(issue, l.id).await?;
    }
    if let Some(name) = wanted
        && !current.has_label(name)
    {
        let label = acts
            .forge
            .ensure_label(&issue.repo, name, "#5319e7", "Set by the director")
            .await?;
        acts.forge.add_label(issue, label.id).await?;
    }
    Ok(())
}

/// The account on the latest "label added" timeline entry for `label`.
pub async fn latest_label_actor(
    forge: &dyn Forge,
    issue: &IssueRef,
    label: &str,
) -> Result<Option<String>, ForgeError> {
    Ok(latest_label_added(forge, issue, label)
        .await?
        .map(|(actor, _)| actor))
}

/// Who last added `label`, and when (the timeline entry's `created_at`).
pub async fn latest_label_added(
    forge: &dyn Forge,
    issue: &IssueRef,
    label: &str,
) -> Result<Option<(String, String)>, ForgeError> {
    let timeline = forge.timeline(issue).await?;
    Ok(last_added(&timeline, label).map(|t| (t.actor.clone(), t.created_at.clone())))
}

/// The timeline's last entry adding `label`.
pub(super) fn last_added<'a>(
    timeline: &'a [crate::forge::TimelineEntry],
    label: &str,
) -> Option<&'a crate::forge::TimelineEntry> {
    timeline
        .iter()
        .rev()
        .find(|t| t.kind == "label" && t.added && t.label.as_deref() == Some(label))
}

/// Posts the run's checks' result as commit status `director/checks` on `sha` of the
/// issue's repository (statuses append, and the latest per context is the one shown: posting
/// again after a crash shows the same).
pub(super) async fn post_checks_status(
    acts: &Acts,
    issue: &IssueRef,
    run_id: &crate::domain::RunId,
    sha: &str,
    state: crate::domain::checks::StatusState,
    description: &str,
    target_url: &str,
) -> anyhow::Result<()> {
    let sha = crate::domain::CommitSha::parse(sha).context("the checked head")?;
    let status = crate::forge::NewStatus {
        state,
        context: crate::domain::checks::CONTEXT.to_owned(),
        description: description.to_owned(),
        target_url: target_url.to_owned(),
    };
    acts.forge
        .post_status(&issue.repo, &sha, &status)
        .await
        .context("posting the checks' status")?;
    tracing::info!(run_id = %run_id, state = state.as_str(), "the checks' status was posted");
    Ok(())
}
