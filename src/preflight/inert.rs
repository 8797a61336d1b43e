//! Model text shown in a comment as text: what the forge would turn into a link, an image
//! or a reference to another issue, pull request or commit is put in a code span, which
//! neither Forgejo nor GitHub renders or links (both skip `<code>` when they look for
//! references), and square brackets are escaped, so no `[x](url)` or `![x](url)` is made.
//! No zero-width character is used: what is shown reads and copies as the model wrote it.

/// One line of model text with no live link, image or reference: URLs (`https://`, `www.`,
/// `mailto:`), `#12`, `!3`, `owner/repo#7` and commit-like hex in code spans; brackets
/// escaped; the model's own code spans kept, and a backtick that opens none escaped (else
/// it could pair with one added here and turn what follows into live text).
pub fn line(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    let mut plain = String::new();
    let mut rest = text;
    while let Some(start) = rest.find('`') {
        plain.push_str(&rest[..start]);
        let run = rest[start..].chars().take_while(|c| *c == '`').count();
        let after = &rest[start + run..];
        match closing(after, run) {
            Some(end) => {
                out.push_str(&words(&std::mem::take(&mut plain)));
                out.push_str(&rest[start..start + run + end + run]);
                rest = &after[end + run..];
            }
            None => {
                // A run no equal run closes is literal text: escaped, it opens nothing.
                plain.push_str(&"\\`".repeat(run));
                rest = after;
            }
        }
    }
    plain.push_str(rest);
    out.push_str(&words(&plain));
    out
}

/// Where the run of exactly `n` backticks that closes a code span starts in `text`.
fn closing(text: &str, n: usize) -> Option<usize> {
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'`' {
            let run = bytes[i..].iter().take_while(|b| **b == b'`').count();
            if run == n {
                return Some(i);
            }
            i += run;
        } else {
            i += 1;
        }
    }
    None
}

/// Text outside code spans: each word that would be live goes into a code span (trailing
/// punctuation left outside, so `#12,` reads `` `#12`, ``); brackets escaped elsewhere.
fn words(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut word = String::new();
    for c in text.chars() {
        if c.is_whitespace() {
            out.push_str(&word_inert(&std::mem::take(&mut word)));
            out.push(c);
        } else {
            word.push(c);
        }
    }
    out.push_str(&word_inert(&word));
    out
}

fn word_inert(word: &str) -> String {
    let (lead, core, trail) = split_punctuation(word);
    if !live(core) {
        return word.replace('[', "\\[").replace(']', "\\]");
    }
    // Inside a span a backslash is literal: the backticks escaped above are backticks
    // again, and the span's own fence is longer than any run of them.
    let core = core.replace("\\`", "`");
    let longest = core.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat(longest + 1);
    let pad = if longest > 0 { " " } else { "" };
    format!("{lead}{fence}{pad}{core}{pad}{fence}{trail}")
}

/// `lead`, the part of `word` that may be live, and the punctuation after it.
fn split_punctuation(word: &str) -> (&str, &str, &str) {
    let opens = |s: &str| s.matches('(').count();
    let closes = |s: &str| s.matches(')').count();
    let mut core = word;
    while let Some(last) = core.chars().last() {
        let unbalanced_close = last == ')' && closes(core) > opens(core);
        if matches!(last, '.' | ',' | ';' | ':' | '?' | '"' | '\'') || unbalanced_close {
            core = &core[..core.len() - last.len_utf8()];
        } else {
            break;
        }
    }
    let trail = &word[core.len()..];
    let mut start = 0;
    for c in core.chars() {
        let unbalanced_open = c == '(' && opens(&core[start..]) > closes(&core[start..]);
        if matches!(c, '"' | '\'') || unbalanced_open {
            start += c.len_utf8();
        } else {
            break;
        }
    }
    (&word[..start], &core[start..], trail)
}

/// Whether the forge would make `word` a link, an image or a reference.
fn live(word: &str) -> bool {
    let lower = word.to_ascii_lowercase();
    if lower.contains("://") || lower.contains("www.") || lower.contains("mailto:") {
        return true;
    }
    // `#12`, `!3`, `owner/repo#7`, `owner/repo!7`, `owner/repo@sha`, and `](`: a link's or
    // an image's target.
    let refers = |mark: char| {
        word.char_indices().any(|(i, c)| {
            c == mark
                && word[i + 1..]
                    .chars()
                    .next()
                    .is_some_and(|d| d.is_ascii_digit())
        })
    };
    if refers('#') || refers('!') || word.contains("](") {
        return true;
    }
    if word.contains('/') && word.contains('@') {
        return true;
    }
    // A commit: seven to sixty-four hex digits, which the forge links when a commit has
    // them as its prefix.
    (7..=64).contains(&word.len()) && word.chars().all(|c| c.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_words_go_into_code_spans_and_the_rest_reads_as_written() {
        assert_eq!(
            line("See https://x.example/a, then #12 (and acme/b#7)."),
            "See `https://x.example/a`, then `#12` (and `acme/b#7`)."
        );
        assert_eq!(
            line("![i](https://x.example/i.png) [l](/a) [ref]"),
            "`![i](https://x.example/i.png)` `[l](/a)` \\[ref\\]"
        );
        assert_eq!(
            line("as deadbeef1 did, not cafe"),
            "as `deadbeef1` did, not cafe"
        );
        assert_eq!(
            line("mail a@b.example or acme/b@1a2b3c4"),
            "mail a@b.example or `acme/b@1a2b3c4`"
        );
        // The model's code spans are kept; a lone backtick opens nothing.
        assert_eq!(line("in `src/a.rs` see #3"), "in `src/a.rs` see `#3`");
        assert_eq!(
            line("an unclosed ` tick https://x.example"),
            "an unclosed \\` tick `https://x.example`"
        );
        assert_eq!(line("`http://x.example"), "`` `http://x.example ``");
        assert_eq!(line("Add the flag."), "Add the flag.");
    }
}
