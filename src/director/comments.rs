//! The text of every comment the director posts, each with a hidden marker so the director
//! can find its own comment again instead of posting a second one.

/// Marks the comment that explains an untrusted trigger.
pub const UNTRUSTED_MARKER: &str = "<!-- director:untrusted-trigger -->";

/// Said once on an issue whose trigger label was applied by someone without write access.
pub fn untrusted_trigger(trigger: &str, actor: Option<&str>) -> String {
    let who = match actor {
        Some(actor) => format!("@{actor}, who does not have write access to this repository"),
        None => "an account the director could not identify from the issue timeline".to_owned(),
    };
    format!(
        "{UNTRUSTED_MARKER}\n\
         🔒 **director:** the `{trigger}` label was applied by {who}, so this issue was **not** \
         handed to a coding agent.\n\n\
         A maintainer with write access can remove the label and apply it again to hand it over."
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn untrusted_trigger_comment() {
        insta::assert_snapshot!(untrusted_trigger("headless", Some("mallory")));
    }

    #[test]
    fn untrusted_trigger_comment_without_an_actor() {
        insta::assert_snapshot!(untrusted_trigger("headless", None));
    }
}
