//! What a run may push by ref name: its own branch only, never a tag, another ref or a
//! delete. (What its commits may change is [`crate::domain::protected`].)

use super::pkt::Command;

/// Why each ref update of a push is refused by its name alone (`None`: it may go on to the
/// content checks). `branch` is the run's `DIRECTOR_BRANCH`.
pub fn check_refs(commands: &[Command], branch: &str, follow_up: bool) -> Vec<Option<String>> {
    let own = format!("refs/heads/{branch}");
    commands
        .iter()
        .enumerate()
        .map(|(i, c)| {
            if commands[..i].iter().any(|o| o.refname == c.refname) {
                Some("the same ref is named twice in one push".to_owned())
            } else if c.refname.starts_with("refs/tags/") {
                Some("tags are not pushed by runs".to_owned())
            } else if c.refname != own {
                Some(format!("a run pushes only {own}"))
            } else if c.deletes() {
                Some("deleting is not allowed".to_owned())
            } else if follow_up && c.creates() {
                Some(
                    "a follow-up adds commits to the pull request's branch, which exists"
                        .to_owned(),
                )
            } else {
                None
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd(old: &str, new: &str, r: &str) -> Command {
        Command {
            old: old.repeat(40),
            new: new.repeat(40),
            refname: r.into(),
        }
    }

    #[test]
    fn only_the_runs_own_branch_may_be_created_or_updated() {
        let cmds = [
            cmd("0", "1", "refs/heads/director-issue-1-abc"),
            cmd("0", "1", "refs/heads/main"),
            cmd("0", "1", "refs/tags/v1"),
            cmd("1", "0", "refs/heads/other"),
            cmd("1", "2", "refs/heads/director-issue-1-abc"),
            cmd("0", "1", "refs/notes/commits"),
        ];
        let got = check_refs(&cmds, "director-issue-1-abc", false);
        assert_eq!(got[0], None);
        assert!(got[1].as_deref().is_some_and(|w| w.contains("pushes only")));
        assert!(got[2].as_deref().is_some_and(|w| w.contains("tags")));
        assert!(got[3].is_some());
        assert!(got[4].as_deref().is_some_and(|w| w.contains("twice")));
        assert!(got[5].is_some());
        let delete = check_refs(&[cmd("1", "0", "refs/heads/b")], "b", false);
        assert_eq!(delete[0].as_deref(), Some("deleting is not allowed"));
        let create = check_refs(&[cmd("0", "1", "refs/heads/b")], "b", true);
        assert!(create[0].is_some(), "a follow-up does not create");
    }
}
