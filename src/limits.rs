//! Bounds on what the director reads from outside: a forge, a model provider, a program.
//! Past a cap the read stops with a clear error, so a hostile or broken peer cannot make the
//! director hold an unbounded answer in memory.

/// A forge answer (a page of issues, a timeline, comments).
pub const FORGE_BODY_BYTES: usize = 16 * 1024 * 1024;
/// A model provider's answer.
pub const PROVIDER_BODY_BYTES: usize = 4 * 1024 * 1024;
/// What the `command` pre-flight program prints (stdout and stderr each).
pub const COMMAND_OUTPUT_BYTES: u64 = 4 * 1024 * 1024;
/// Provider error text shown on an issue.
pub const ERROR_TEXT_CHARS: usize = 300;

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("the answer is larger than {0} bytes")]
    TooLarge(usize),
    #[error("the answer could not be read: {0}")]
    Read(String),
}

/// The body of `resp`, at most `cap` bytes.
pub async fn read_capped(mut resp: reqwest::Response, cap: usize) -> Result<Vec<u8>, ReadError> {
    if resp
        .content_length()
        .is_some_and(|n| usize::try_from(n).map_or(true, |n| n > cap))
    {
        return Err(ReadError::TooLarge(cap));
    }
    let mut out = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| {
        ReadError::Read(if e.is_timeout() {
            "timed out".into()
        } else {
            "the connection failed".into()
        })
    })? {
        if out.len() + chunk.len() > cap {
            return Err(ReadError::TooLarge(cap));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// The first `max` characters of `text`, marked when shortened.
pub fn shorten(text: &str, max: usize) -> String {
    let mut chars = text.chars();
    let head: String = chars.by_ref().take(max).collect();
    if chars.next().is_some() {
        format!("{head}…")
    } else {
        head
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shortening_marks_what_it_cut() {
        assert_eq!(shorten("abc", 5), "abc");
        assert_eq!(shorten("abcdef", 3), "abc…");
        assert_eq!(shorten("ééé", 2), "éé…");
    }
}
