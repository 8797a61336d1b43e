//! `/director <word>` commands, parsed once into a typed [`Command`].

use serde::{Deserialize, Serialize};

/// What a writer can tell the director in a comment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Command {
    /// Skip the pre-flight gate: queue the issue as if the verdict were GO.
    Go,
    /// Start a fresh run after a failed, timed-out or cancelled one.
    Retry,
    /// Stop whatever the director is doing with the issue.
    Cancel,
    /// Approve destinations for the runs: `/director allow host:port ...`, within
    /// `runner.egress_approvable`.
    Allow,
    /// Go on after a run stopped on its budget: `/director continue [$N]`.
    Continue,
}

impl Command {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Go => "go",
            Self::Retry => "retry",
            Self::Cancel => "cancel",
            Self::Allow => "allow",
            Self::Continue => "continue",
        }
    }

    fn from_word(word: &str) -> Option<Self> {
        [
            Self::Go,
            Self::Retry,
            Self::Cancel,
            Self::Allow,
            Self::Continue,
        ]
        .into_iter()
        .find(|c| c.as_str().eq_ignore_ascii_case(word))
    }

    /// Whether the command takes words after it on its line (`allow host:port`).
    fn takes_arguments(self) -> bool {
        matches!(self, Self::Allow | Self::Continue)
    }

    /// Every command in a comment body: `/director <word>` alone on a line (with its
    /// arguments, for those that take some), in order, each once.
    pub fn parse_all(body: &str) -> Vec<Self> {
        let mut out = Vec::new();
        for (c, _) in Self::lines(body) {
            if !out.contains(&c) {
                out.push(c);
            }
        }
        out
    }

    /// Each command line of `body`, with the words after the command.
    fn lines(body: &str) -> impl Iterator<Item = (Self, Vec<&str>)> {
        body.lines().filter_map(|line| {
            let mut parts = line.split_whitespace();
            if parts.next() != Some("/director") {
                return None;
            }
            let c = Self::from_word(parts.next()?)?;
            let rest: Vec<&str> = parts.collect();
            (rest.is_empty() || c.takes_arguments()).then_some((c, rest))
        })
    }

    /// The words after every `/director <self>` line of `body`, in order, joined by spaces
    /// (`/director allow a:443 b:443` and a second `allow` line give all three).
    pub fn arguments(self, body: &str) -> String {
        Self::lines(body)
            .filter(|(c, _)| *c == self)
            .flat_map(|(_, rest)| rest)
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// The first of `wanted` that the comment states.
    pub fn find(body: &str, wanted: &[Self]) -> Option<Self> {
        Self::parse_all(body)
            .into_iter()
            .find(|c| wanted.contains(c))
    }

    /// Every one of `wanted` that the comment states, in order, each once.
    pub fn find_all(body: &str, wanted: &[Self]) -> Vec<Self> {
        Self::parse_all(body)
            .into_iter()
            .filter(|c| wanted.contains(c))
            .collect()
    }
}

/// What a command that takes arguments said (`allow`, `continue`), or what else a comment
/// stated beside the command taken, and in which comment: the director answers that comment
/// once.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Said {
    pub comment: u64,
    /// The words after the command, from every line that states it.
    pub args: String,
    /// The other commands the comment stated, not taken: one command per comment (the first),
    /// and the answer names these so none is dropped unsaid.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_taken: Vec<Command>,
}

/// The instructions of a `/director fix` comment on a pull request: whatever follows `fix` on
/// its line and the lines after it (empty when it says only `/director fix`). `None` when the
/// comment asks for no fix.
pub fn fix_request(body: &str) -> Option<String> {
    let mut lines = body.lines();
    while let Some(line) = lines.next() {
        let mut parts = line.trim_start().splitn(3, char::is_whitespace);
        if parts.next() != Some("/director") {
            continue;
        }
        if !parts.next().is_some_and(|w| w.eq_ignore_ascii_case("fix")) {
            continue;
        }
        let mut text = parts.next().unwrap_or("").trim().to_owned();
        let after: Vec<&str> = lines.collect();
        let after = after.join("\n");
        if !after.trim().is_empty() {
            if !text.is_empty() {
                text.push('\n');
            }
            text.push_str(after.trim());
        }
        return Some(text);
    }
    None
}

/// A comment made only of `/director ...` lines: instructions to the director, not issue
/// content, so it never changes the text the pre-flight reads.
pub fn is_only_commands(body: &str) -> bool {
    let mut lines = body
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .peekable();
    lines.peek().is_some() && lines.all(|l| l.starts_with("/director "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_recognised_only_alone_on_a_line() {
        assert_eq!(Command::parse_all("/director go"), vec![Command::Go]);
        assert_eq!(
            Command::parse_all("Looks fine.\n/director GO\n/director cancel\n/director go"),
            vec![Command::Go, Command::Cancel]
        );
        for not in [
            "please /director go now",
            "/director going",
            "/director go now",
            "/director",
            "/directorgo",
        ] {
            assert!(Command::parse_all(not).is_empty(), "{not:?}");
        }
    }

    #[test]
    fn allow_and_continue_take_their_arguments_from_every_line() {
        let body = "Fine by me.\n/director allow pypi.org:443 files.pythonhosted.org:443\n/director allow pkgs.example:443";
        assert_eq!(Command::parse_all(body), vec![Command::Allow]);
        assert_eq!(
            Command::Allow.arguments(body),
            "pypi.org:443 files.pythonhosted.org:443 pkgs.example:443"
        );
        assert_eq!(
            Command::parse_all("/director continue $5"),
            vec![Command::Continue]
        );
        assert_eq!(Command::Continue.arguments("/director continue $5"), "$5");
        assert_eq!(Command::Continue.arguments("/director continue"), "");
        assert!(Command::parse_all("please /director allow x:1").is_empty());
    }

    #[test]
    fn every_wanted_command_of_a_comment_is_found_in_order() {
        let body = "/director continue\n/director go\n/director allow a.example:443\n/director continue $2";
        assert_eq!(
            Command::find_all(body, &[Command::Allow, Command::Continue]),
            vec![Command::Continue, Command::Allow]
        );
        assert_eq!(Command::find(body, &[Command::Allow]), Some(Command::Allow));
        assert!(Command::find_all("/director go", &[Command::Allow]).is_empty());
    }

    #[test]
    fn fix_requests_take_the_rest_of_the_comment() {
        assert_eq!(fix_request("/director fix").as_deref(), Some(""));
        assert_eq!(
            fix_request("Thanks.\n/director fix rename `x` to `count`\nand add a test").as_deref(),
            Some("rename `x` to `count`\nand add a test")
        );
        assert_eq!(
            fix_request("/director FIX\n\nuse TOML").as_deref(),
            Some("use TOML")
        );
        for not in [
            "/director fixes",
            "please /director fix",
            "/director go",
            "fix it",
        ] {
            assert_eq!(fix_request(not), None, "{not:?}");
        }
    }

    #[test]
    fn command_only_comments_are_not_content() {
        assert!(is_only_commands("/director go"));
        assert!(is_only_commands("\n/director retry\n"));
        assert!(!is_only_commands("/director go\nalso, use TOML"));
        assert!(!is_only_commands(""));
    }
}
