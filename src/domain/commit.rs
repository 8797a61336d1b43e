//! A commit's full id. Where the forge takes "a commit or a ref" (a status read, a merge's
//! expected head) and where git is handed a commit as an argument (the gateway's ancestry
//! check), a branch or tag name passed by mistake would be read as whatever it points to
//! now, and an option-like text as an option: only [`CommitSha::parse`] makes one.

use serde::{Deserialize, Serialize};

/// A full commit id as git names it: 40 hexadecimal digits (SHA-1) or 64 (SHA-256), in
/// lower case.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct CommitSha(String);

/// Text that is not a full commit id.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a commit id (40 or 64 hexadecimal digits)")]
pub struct BadCommitSha(String);

impl CommitSha {
    /// `text` as a commit id: 40 or 64 hexadecimal digits, either case (kept in lower case,
    /// as git shows them).
    pub fn parse(text: &str) -> Result<Self, BadCommitSha> {
        if matches!(text.len(), 40 | 64) && text.bytes().all(|b| b.is_ascii_hexdigit()) {
            Ok(Self(text.to_ascii_lowercase()))
        } else {
            Err(BadCommitSha(text.chars().take(70).collect()))
        }
    }

    /// `text` as a commit id, or `None` when it is empty or is not one (a forge that leaves
    /// a field out, or fills it with something else).
    pub fn read(text: &str) -> Option<Self> {
        Self::parse(text).ok()
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for CommitSha {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for CommitSha {
    type Err = BadCommitSha;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl TryFrom<String> for CommitSha {
    type Error = BadCommitSha;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::parse(&s)
    }
}

impl From<CommitSha> for String {
    fn from(c: CommitSha) -> Self {
        c.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHA1: &str = "0123456789abcdef0123456789abcdef01234567";

    #[test]
    fn full_ids_of_either_length_are_commits_and_kept_in_lower_case() {
        assert_eq!(CommitSha::parse(SHA1).expect("sha-1").as_str(), SHA1);
        let sha256 = "ab".repeat(32);
        assert_eq!(CommitSha::parse(&sha256).expect("sha-256").as_str(), sha256);
        let upper = SHA1.to_ascii_uppercase();
        assert_eq!(CommitSha::parse(&upper).expect("upper case").as_str(), SHA1);
    }

    #[test]
    fn branch_names_short_ids_and_option_like_text_are_not_commits() {
        for text in [
            "",
            "main",
            "director/issue-1",
            "HEAD",
            "0123456",
            &SHA1[..39],
            &format!("{SHA1}0"),
            &format!("--upload-pack={}", &SHA1[..26]),
            &format!("{}g", &SHA1[..39]),
            &format!("{}\n", &SHA1[..39]),
            &"٣".repeat(40),
        ] {
            assert!(CommitSha::parse(text).is_err(), "{text:?}");
            assert_eq!(CommitSha::read(text), None, "{text:?}");
        }
    }

    #[test]
    fn serde_goes_through_the_parser() {
        let ok: CommitSha = serde_json::from_str(&format!("\"{SHA1}\"")).expect("a commit");
        assert_eq!(
            serde_json::to_string(&ok).expect("json"),
            format!("\"{SHA1}\"")
        );
        assert!(serde_json::from_str::<CommitSha>("\"refs/heads/main\"").is_err());
    }
}
