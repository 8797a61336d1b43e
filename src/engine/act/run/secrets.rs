//! Every secret value given to a run, remembered per run so that whatever the run printed is
//! redacted of each of them, in every encoding a tool may print it in, before it is stored or
//! posted; and each active run's forge token, for the forges that revoke a token only when
//! shown it.

use std::collections::HashMap;
use std::sync::{PoisonError, RwLock};

use base64::Engine as _;

use crate::domain::RunId;
use crate::settings::Secret;

/// Every secret value given to a run, to redact from what it printed.
#[derive(Default)]
pub struct Secrets {
    by_run: RwLock<HashMap<RunId, Vec<String>>>,
    /// Each active run's forge token (GitHub revokes a token only when shown it).
    tokens: RwLock<HashMap<RunId, Secret>>,
    /// `runner.env_passthrough`, from the director's own environment.
    pub passthrough: Vec<(String, String)>,
    /// The values of every agent profile's `env`: an operator puts keys there as readily as
    /// in a pass-through, and a run may be given any profile, so each run's output is
    /// redacted of all of them.
    profile_values: Vec<String>,
}

/// A profile value shorter than this is no secret (`"1"`, `"true"`): redacting it would
/// blank ordinary words all through a transcript.
const PROFILE_VALUE_MIN: usize = 8;

impl Secrets {
    pub fn new(passthrough: Vec<(String, String)>) -> Self {
        Self {
            by_run: RwLock::default(),
            tokens: RwLock::default(),
            passthrough,
            profile_values: Vec::new(),
        }
    }

    /// Also redacts these values (the agent profiles' `env`) from every run's output.
    pub fn with_profile_values(mut self, values: impl IntoIterator<Item = String>) -> Self {
        self.profile_values = values
            .into_iter()
            .filter(|v| v.chars().count() >= PROFILE_VALUE_MIN)
            .collect();
        self
    }

    pub fn remember(&self, run_id: &RunId, value: &str) {
        if value.is_empty() {
            return;
        }
        // A lock poisoned by a panic elsewhere still holds good data: remembering a secret
        // must never be skipped, or the run's output would go out unredacted.
        let mut s = self.by_run.write().unwrap_or_else(PoisonError::into_inner);
        let values = s.entry(run_id.clone()).or_default();
        if !values.iter().any(|v| v == value) {
            values.push(value.to_owned());
        }
    }

    /// The run's forge token: redacted like every secret, and kept to revoke it.
    pub fn remember_token(&self, run_id: &RunId, token: &Secret) {
        self.remember(run_id, token.expose());
        self.tokens
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(run_id.clone(), token.clone());
    }

    pub fn token(&self, run_id: &RunId) -> Option<Secret> {
        self.tokens
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(run_id)
            .cloned()
    }

    pub fn forget(&self, run_id: &RunId) {
        self.by_run
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(run_id);
        self.tokens
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(run_id);
    }

    pub fn knows(&self, run_id: &RunId) -> bool {
        self.by_run
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(run_id)
            .is_some_and(|v| !v.is_empty())
    }

    /// Replaces every secret value given to the run, and the forms an agent may print it in:
    /// base64 at any alignment (as inside a Basic-auth header, `user:token`) and URL-encoded.
    pub fn redact(&self, run_id: &RunId, text: &str) -> String {
        let mut values: Vec<String> = self
            .by_run
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(run_id)
            .cloned()
            .unwrap_or_default();
        values.extend(
            self.passthrough
                .iter()
                .filter(|(_, v)| v.len() >= 4)
                .map(|(_, v)| v.clone()),
        );
        values.extend(self.profile_values.iter().cloned());
        let mut forms: Vec<String> = values.iter().flat_map(|v| encodings(v)).collect();
        // Longest first, so a form that contains another is replaced whole.
        forms.sort_by_key(|f| std::cmp::Reverse(f.len()));
        forms.dedup();
        let mut out = text.to_owned();
        for form in forms {
            if form.len() >= 4 {
                out = out.replace(&form, "[redacted]");
            }
        }
        out
    }
}

/// `value` as an agent may print it: as is, URL-encoded, and the part of its base64 that is
/// the same wherever it stands in the encoded text (three alignments, two alphabets).
pub(super) fn encodings(value: &str) -> Vec<String> {
    use base64::engine::general_purpose::{STANDARD, URL_SAFE};
    let mut out = vec![value.to_owned(), crate::forge::percent_encode(value)];
    let bytes = value.as_bytes();
    for k in 0..3usize {
        let mut shifted = vec![0u8; k];
        shifted.extend_from_slice(bytes);
        for engine in [&STANDARD, &URL_SAFE] {
            let encoded = engine.encode(&shifted);
            // Drop the characters the prefix bytes or the padding take part in.
            let start = if k > 0 { 4 } else { 0 };
            let end = if shifted.len() % 3 == 0 {
                encoded.len()
            } else {
                encoded.len().saturating_sub(4)
            };
            if end > start + 8 {
                out.push(encoded[start..end].to_owned());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::run::test_id;

    #[test]
    fn a_lock_poisoned_by_a_panic_still_remembers_and_redacts_secrets() {
        let s = std::sync::Arc::new(Secrets::new(Vec::new()));
        let held = s.clone();
        let _ = std::thread::spawn(move || {
            let _guard = held.by_run.write();
            panic!("a panic while the secrets are held");
        })
        .join();
        assert!(s.by_run.is_poisoned());
        s.remember_token(&test_id("r1"), &Secret::new("tok-0123456789"));
        assert!(s.knows(&test_id("r1")));
        assert_eq!(
            s.redact(&test_id("r1"), "it is tok-0123456789"),
            "it is [redacted]"
        );
        assert!(s.token(&test_id("r1")).is_some());
    }

    #[test]
    fn redaction_covers_basic_auth_any_base64_alignment_and_url_encoding() {
        use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
        let token = "0123456789abcdef0123456789abcdef01234567";
        let s = Secrets::new(vec![("AGENT_KEY".into(), "sk/agent+key=1".into())]);
        s.remember(&test_id("r1"), token);
        for prefix in ["", "x", "xy", "runner:", "git:", "director-runner:"] {
            let basic = STANDARD.encode(format!("{prefix}{token}"));
            let out = s.redact(&test_id("r1"), &format!("Authorization: Basic {basic}"));
            assert!(out.contains("[redacted]"), "{prefix:?}: {out}");
            // Left: the prefix's own encoding, and at most a character or two of the token at
            // either end (where its bits share a base64 character with the prefix or padding).
            let left: String = out
                .replace("Authorization: Basic ", "")
                .replace("[redacted]", "");
            let prefix_len = STANDARD.encode(prefix).trim_end_matches('=').len();
            assert!(left.len() <= prefix_len + 8, "{prefix:?}: {out}");
            let url_safe = URL_SAFE_NO_PAD.encode(format!("{prefix}{token}"));
            assert!(
                s.redact(&test_id("r1"), &url_safe).contains("[redacted]"),
                "{prefix:?}"
            );
        }
        let out = s.redact(
            &test_id("r1"),
            "key=sk%2Fagent%2Bkey%3D1 raw=sk/agent+key=1",
        );
        assert_eq!(out, "key=[redacted] raw=[redacted]");
    }

    #[test]
    fn a_profiles_env_values_are_redacted_from_every_run_and_short_ones_left() {
        let s = Secrets::new(Vec::new())
            .with_profile_values(["dsk-live-7f3a9c0e".to_owned(), "true".to_owned()]);
        let b64 = base64::engine::general_purpose::STANDARD.encode("dsk-live-7f3a9c0e");
        let out = s.redact(
            &test_id("any"),
            &format!("key=dsk-live-7f3a9c0e b={b64} verbose=true"),
        );
        // The base64's last characters share bits with its padding: they may stay.
        assert!(
            out.starts_with("key=[redacted] b=[redacted]") && out.ends_with(" verbose=true"),
            "{out}"
        );
    }

    #[test]
    fn redaction_covers_the_value_and_its_base64_forms() {
        let s = Secrets::new(vec![("AGENT_KEY".into(), "sk-agent-123".into())]);
        s.remember(&test_id("r1"), "tok-abcdef-0123");
        let b64 = base64::engine::general_purpose::STANDARD.encode("tok-abcdef-0123");
        let out = s.redact(
            &test_id("r1"),
            &format!("t=tok-abcdef-0123 b={b64} k=sk-agent-123"),
        );
        assert_eq!(out, "t=[redacted] b=[redacted] k=[redacted]");
        s.forget(&test_id("r1"));
        assert!(
            s.redact(&test_id("r1"), "tok-abcdef-0123")
                .contains("tok-abcdef")
        );
    }
}
