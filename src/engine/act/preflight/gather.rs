//! Gathering an issue for the pre-flight: the issue and its thread read from the forge, and
//! only what is trusted kept for the prompt (a writer's text, or text a writer vouched for);
//! what was left out is listed for the comment.

use crate::domain::{Command, IssueRef, LeftOut, Vouched, command::is_only_commands, same_login};
use crate::engine::act::Acts;
use crate::event::ReadContext;
use crate::forge::{Comment, Forge, ForgeError, Issue};
use crate::preflight::comment;
use crate::preflight::prompt::{self, Prompt, PromptComment};

/// What the pre-flight gathered from the forge for one issue.
pub struct Gathered {
    pub issue: Issue,
    pub prompt: Prompt,
    pub left_out: Vec<LeftOut>,
    /// A writer's `/director go` not yet acted on: (who, comment id).
    pub go_command: Option<(String, u64)>,
    /// The newest comment id seen.
    pub newest_comment_id: u64,
    /// The trusted title and body: what the prompt and the run's task hold.
    pub title: String,
    pub body: String,
    /// The text vouched for anew by this reading, if it was.
    pub vouched: Option<Vouched>,
    /// What the read left out as hidden from a reader, one line per place.
    pub hidden: Vec<String>,
    /// The comments the prompt holds that came after the pre-flight's last questions: their
    /// answers, for the run's task.
    pub answers: Vec<PromptComment>,
}

impl Gathered {
    pub(super) fn context(&self) -> ReadContext {
        ReadContext {
            hash: self.prompt.sha256.clone(),
            left_out: self.left_out.clone(),
            newest_comment_id: self.newest_comment_id,
            title: self.title.clone(),
            body: self.body.clone(),
            vouched: self.vouched.clone(),
            hidden: self.hidden.clone(),
            agent: None,
            forecast: None,
            repo_approval: None,
            approved_by: None,
            text_sha: crate::domain::approval::text_sha(&self.issue.title, &self.issue.body),
        }
    }
}

/// What gathering reads with: the forge (through `acts` when there, for its role cache), the
/// template, the automation accounts, and the bot's login (its own comments are left out).
#[derive(Clone, Copy)]
pub struct Gatherer<'a> {
    pub forge: &'a dyn Forge,
    pub acts: Option<&'a Acts>,
    pub template: &'a str,
    pub automation_accounts: &'a [String],
    pub bot: Option<&'a str>,
    /// Text no writer vouched for is read as it is (the operator's dry run, which acts on
    /// nothing) rather than left out.
    pub read_unvouched: bool,
}

/// Roles asked while gathering: each account once.
struct Roles<'a> {
    forge: &'a dyn Forge,
    acts: Option<&'a Acts>,
    repo: &'a crate::domain::RepoName,
    automation: &'a [String],
    known: std::collections::HashMap<String, crate::forge::Permission>,
}

impl Roles<'_> {
    async fn of(&mut self, user: &str) -> Result<crate::forge::Permission, ForgeError> {
        if let Some(p) = self.known.get(user) {
            return Ok(*p);
        }
        let p = match self.acts {
            Some(acts) => acts.permission(self.repo, user).await?,
            None => self.forge.permission(self.repo, user).await?,
        };
        self.known.insert(user.to_owned(), p);
        Ok(p)
    }

    /// A writer or a configured automation account: their text is read.
    async fn trusted(&mut self, user: &str) -> Result<bool, ForgeError> {
        let automation = self.automation.iter().any(|a| a.eq_ignore_ascii_case(user));
        Ok(automation || (!user.is_empty() && self.of(user).await?.can_write()))
    }
}

/// Reads the issue and its comments and builds the prompt from trusted text: comments by
/// writers and automation accounts, oldest first; the director's own left out silently;
/// everyone else's left out and listed. The issue's own title and body are read as they are
/// when their author may write, or when a writer vouches for exactly this text (the edit was
/// theirs, or they said `/director go`); otherwise as they were when a writer last vouched
/// (`state.vouched`), and a later edit is listed as left out.
pub async fn gather_with(
    with: &Gatherer<'_>,
    issue_ref: &IssueRef,
    handled_command_id: u64,
    state: Option<&crate::domain::PreflightState>,
) -> Result<Gathered, ForgeError> {
    // Independent reads, at once: one round trip fewer on every read.
    let (issue, comments) =
        tokio::join!(with.forge.issue(issue_ref), with.forge.comments(issue_ref));
    let (issue, comments) = (issue?, comments?);
    let mut roles = Roles {
        forge: with.forge,
        acts: with.acts,
        repo: &issue_ref.repo,
        automation: with.automation_accounts,
        known: std::collections::HashMap::new(),
    };
    let Thread {
        trusted,
        answers,
        mut left_out,
        go_command,
        newest_comment_id,
    } = read_thread(&mut roles, with.bot, &comments, handled_command_id, state).await?;
    let (text, vouched) = issue_text(
        &mut roles,
        &issue,
        state,
        with.read_unvouched,
        &mut left_out,
    )
    .await?;
    let prompt = prompt::build(with.template, issue_ref, &text.title, &text.body, &trusted);
    let hidden = hidden_parts(&text, &trusted);
    Ok(Gathered {
        issue,
        prompt,
        left_out,
        go_command,
        newest_comment_id,
        title: text.title,
        body: text.body,
        vouched,
        hidden,
        answers,
    })
}

/// The director's own comment: by its bot account, or a pre-flight comment.
fn is_own(bot: Option<&str>, c: &Comment) -> bool {
    bot.is_some_and(|b| same_login(b, &c.author)) || c.body.starts_with(comment::MARKER)
}

/// Where the answers to the pre-flight's open questions stand in the thread.
struct AnswerWindow {
    /// The comment the questions came after, while they are open. Kept once asked (until
    /// the trigger is applied anew), so that the launch's read of the thread is the one the
    /// verdict was given for.
    asked_after: Option<u64>,
    /// The newest writer's comment after the questions: its id, author and time.
    vouched_until: Option<(u64, String, String)>,
    /// The first answer after the questions by an account without write access.
    first_reader_answer: Option<u64>,
}

/// While the pre-flight's questions are open, a writer's comment after them (any text, or
/// `/director go`) vouches for the thread up to it: an answer by someone without write access
/// before it is read, one after it waits. A `/director go` then asks for a read with the
/// answers, not a skip of the gate.
async fn answer_window(
    roles: &mut Roles<'_>,
    bot: Option<&str>,
    comments: &[Comment],
    state: Option<&crate::domain::PreflightState>,
) -> Result<AnswerWindow, ForgeError> {
    let asked_after = state
        .filter(|s| !s.questions.is_empty())
        .map(|s| s.asked_after);
    let mut window = AnswerWindow {
        asked_after,
        vouched_until: None,
        first_reader_answer: None,
    };
    let Some(after) = asked_after else {
        return Ok(window);
    };
    for c in comments.iter().filter(|c| c.id > after && !is_own(bot, c)) {
        if roles.of(&c.author).await?.can_write() {
            window.vouched_until = Some((c.id, c.author.clone(), c.created_at.clone()));
        } else if !is_only_commands(&c.body) && !roles.trusted(&c.author).await? {
            window.first_reader_answer = window.first_reader_answer.or(Some(c.id));
        }
    }
    Ok(window)
}

/// What the thread gave the read.
#[derive(Default)]
struct Thread {
    /// The comments read, oldest first.
    trusted: Vec<PromptComment>,
    /// Those of them after the pre-flight's questions.
    answers: Vec<PromptComment>,
    left_out: Vec<LeftOut>,
    /// A writer's `/director go` not yet acted on: (who, comment id).
    go_command: Option<(String, u64)>,
    newest_comment_id: u64,
}

/// Sorts the thread's comments into read and left out, and finds a writer's `/director go`
/// newer than `handled_command_id`.
async fn read_thread(
    roles: &mut Roles<'_>,
    bot: Option<&str>,
    comments: &[Comment],
    handled_command_id: u64,
    state: Option<&crate::domain::PreflightState>,
) -> Result<Thread, ForgeError> {
    let AnswerWindow {
        asked_after,
        vouched_until,
        first_reader_answer,
    } = answer_window(roles, bot, comments, state).await?;
    let mut thread = Thread {
        newest_comment_id: handled_command_id,
        ..Thread::default()
    };
    for c in comments {
        thread.newest_comment_id = thread.newest_comment_id.max(c.id);
        if is_own(bot, c) {
            continue;
        }
        let writer = roles.of(&c.author).await?.can_write();
        // With an answer waiting before it, `/director go` vouches for it (a read follows);
        // otherwise it skips the gate, as always.
        let vouches = asked_after.is_some() && first_reader_answer.is_some_and(|a| a < c.id);
        if writer
            && c.id > handled_command_id
            && !vouches
            && Command::find(&c.body, &[Command::Go]).is_some()
        {
            thread.go_command = Some((c.author.clone(), c.id));
        }
        if is_only_commands(&c.body) {
            continue;
        }
        let is_answer = asked_after.is_some_and(|after| c.id > after);
        let vouching = vouched_until
            .as_ref()
            .filter(|(until, _, _)| is_answer && c.id < *until);
        // A writer vouches for an answer as it was when they replied: one edited since is
        // not the text they read.
        let edited_since = vouching.is_some_and(|(_, _, at)| edited_since(c, at));
        let vouched_by = vouching
            .filter(|_| !edited_since)
            .map(|(_, by, _)| by.clone());
        if roles.trusted(&c.author).await? {
            thread.trusted.push(prompt_comment(c));
            if is_answer {
                thread.answers.push(prompt_comment(c));
            }
        } else if let Some(by) = vouched_by {
            let mut answer = prompt_comment(c);
            answer.author = format!("{} (no write access; vouched for by @{by})", c.author);
            thread.trusted.push(answer.clone());
            thread.answers.push(answer);
        } else {
            thread.left_out.push(LeftOut {
                author: c.author.clone(),
                comment_id: c.id,
                issue_text: false,
                never_vouched: false,
                edited_after_vouched: edited_since,
            });
        }
    }
    Ok(thread)
}

/// The issue's title and body the read may use, and the text vouched for anew by this read
/// (if it was); an edit no writer vouched for goes first in `left_out`.
async fn issue_text(
    roles: &mut Roles<'_>,
    issue: &Issue,
    state: Option<&crate::domain::PreflightState>,
    read_unvouched: bool,
    left_out: &mut Vec<LeftOut>,
) -> Result<(Vouched, Option<Vouched>), ForgeError> {
    let current = Vouched {
        title: issue.title.clone(),
        body: issue.body.clone(),
        by: String::new(),
    };
    let same_text = |v: &Vouched| v.title == current.title && v.body == current.body;
    let by = |who: &str| Vouched {
        by: who.to_owned(),
        ..current.clone()
    };
    let proposed = state
        .and_then(|s| s.proposed.as_ref())
        .filter(|p| same_text(p));
    Ok(if roles.trusted(&issue.author).await? {
        (current.clone(), Some(by(&issue.author)))
    } else if let Some(p) = proposed
        && roles.trusted(&p.by).await?
    {
        (current.clone(), Some(by(&p.by)))
    } else if let Some(v) = state.and_then(|s| s.vouched.as_ref()) {
        if !same_text(v) {
            left_out.insert(0, issue_text_left_out(&issue.author, false));
        }
        (v.clone(), None)
    } else if read_unvouched {
        (current.clone(), None)
    } else {
        // No writer vouched for any version of this text (the trigger was seen only after an
        // edit, or its timeline could not be read): none of it is read. A writer's edit or
        // `/director go` vouches for it; a `/director go` counts for the text its delivery
        // carried (the proposed text above), never for the text as it is when read.
        left_out.insert(0, issue_text_left_out(&issue.author, true));
        (
            Vouched {
                title: String::new(),
                body: String::new(),
                by: String::new(),
            },
            None,
        )
    })
}

/// What the read's text held that a reader of the rendered page does not see, one line per
/// place.
fn hidden_parts(text: &Vouched, trusted: &[PromptComment]) -> Vec<String> {
    let mut hidden = Vec::new();
    for (place, t) in [("the title", &text.title), ("the body", &text.body)] {
        note_hidden(&mut hidden, place, t);
    }
    for c in trusted {
        note_hidden(
            &mut hidden,
            &format!("the comment by `{}` of {}", c.author, c.created_at),
            &c.body,
        );
    }
    hidden
}

/// One line naming what `text` (at `place`) held that a reader of the rendered page does not
/// see, if anything.
fn note_hidden(out: &mut Vec<String>, place: &str, text: &str) {
    let mut kinds = crate::preflight::visible::visible(text).hidden;
    kinds.sort();
    kinds.dedup();
    if !kinds.is_empty() {
        let what: Vec<&str> = kinds.iter().map(|k| k.describe()).collect();
        out.push(format!("{place}: {}", what.join(", ")));
    }
}

fn issue_text_left_out(author: &str, never_vouched: bool) -> LeftOut {
    LeftOut {
        author: author.to_owned(),
        comment_id: 0,
        issue_text: true,
        never_vouched,
        edited_after_vouched: false,
    }
}

/// Whether comment `c` was edited at or after `reply` (a writer's comment's `created_at`).
/// The forges give seconds: an edit in the reply's own second counts as after it, and a time
/// that does not read counts as an edit (the answer is left out, never taken unseen).
fn edited_since(c: &Comment, reply: &str) -> bool {
    let at = |t: &str| chrono::DateTime::parse_from_rfc3339(t).ok();
    match (at(&c.created_at), at(&c.updated_at), at(reply)) {
        (Some(created), Some(updated), Some(reply)) => updated > created && updated >= reply,
        _ => c.updated_at != c.created_at,
    }
}

fn prompt_comment(c: &Comment) -> PromptComment {
    PromptComment {
        author: c.author.clone(),
        created_at: c.created_at.clone(),
        body: c.body.clone(),
    }
}
