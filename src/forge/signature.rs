//! Webhook signature checks: HMAC-SHA256 of the raw body, compared in constant time against
//! every configured secret (several while rotating). Pure, so it can be fuzzed.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::settings::Secret;

type HmacSha256 = Hmac<Sha256>;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SignatureError {
    #[error(
        "missing signature header (X-Forgejo-Signature, X-Gitea-Signature or X-Hub-Signature-256)"
    )]
    Missing,
    #[error("empty signature: configure the same secret on the Forgejo webhook")]
    Empty,
    #[error("signature is not hex-encoded SHA-256")]
    Malformed,
    #[error("signature does not match any configured secret")]
    Mismatch,
}

/// The signature headers of one request, as sent. Forgejo sends both families; Gitea only
/// `X-Gitea-*`; GitHub-style senders `X-Hub-Signature-256: sha256=<hex>`.
#[derive(Debug, Default, Clone, Copy)]
pub struct SignatureHeaders<'a> {
    pub forgejo: Option<&'a str>,
    pub gitea: Option<&'a str>,
    pub hub_sha256: Option<&'a str>,
}

impl<'a> SignatureHeaders<'a> {
    /// The hex digest to check, taken from the first header family present.
    fn hex(&self) -> Result<&'a str, SignatureError> {
        let value = if let Some(v) = self.forgejo {
            v
        } else if let Some(v) = self.gitea {
            v
        } else if let Some(v) = self.hub_sha256 {
            let v = v.trim();
            if v.is_empty() {
                v
            } else {
                v.strip_prefix("sha256=").ok_or(SignatureError::Malformed)?
            }
        } else {
            return Err(SignatureError::Missing);
        };
        let value = value.trim();
        if value.is_empty() {
            return Err(SignatureError::Empty);
        }
        Ok(value)
    }
}

/// Succeeds when the body was signed with one of `secrets`.
pub fn verify(
    headers: SignatureHeaders<'_>,
    body: &[u8],
    secrets: &[Secret],
) -> Result<(), SignatureError> {
    let hex_digest = headers.hex()?;
    if hex_digest.len() != 64 {
        return Err(SignatureError::Malformed);
    }
    let digest = hex::decode(hex_digest).map_err(|_| SignatureError::Malformed)?;
    let mut matched = false;
    // Check every secret, not just until the first match, so timing says nothing about
    // which secret matched.
    for secret in secrets {
        let Ok(mut mac) = HmacSha256::new_from_slice(secret.expose().as_bytes()) else {
            continue;
        };
        mac.update(body);
        matched |= mac.verify_slice(&digest).is_ok();
    }
    if matched {
        Ok(())
    } else {
        Err(SignatureError::Mismatch)
    }
}

/// Lowercase hex HMAC-SHA256 of `body`, as Forgejo computes it. Used by tests and the load
/// generator.
/// The bearer token a hook installed by the director sends (`Authorization: Bearer <it>`),
/// derived from its webhook secret unless `webhook.authorization` names one: a delivery shows
/// it before its body is read. Derived, it needs no setting of its own and rotates with the
/// secret; it is not the secret, which never leaves the director but in the hook.
pub fn hook_token(secret: &str) -> String {
    let mut mac = HmacSha256::new_from_slice(secret.as_bytes()).expect("HMAC takes any key length");
    mac.update(b"director:webhook-authorization");
    hex::encode(&mac.finalize().into_bytes()[..20])
}

pub fn sign(secret: &str, body: &[u8]) -> String {
    let mut mac = HmacSha256::new_from_slice(secret.as_bytes()).expect("HMAC takes any key length");
    mac.update(body);
    hex::encode(mac.finalize().into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn secrets(list: &[&str]) -> Vec<Secret> {
        list.iter().map(|s| Secret::new(*s)).collect()
    }

    #[test]
    fn accepts_each_header_family() {
        let body = br#"{"action":"opened"}"#;
        let sig = sign("s3cret", body);
        let hub = format!("sha256={sig}");
        let keys = secrets(&["s3cret"]);
        for headers in [
            SignatureHeaders {
                forgejo: Some(&sig),
                ..Default::default()
            },
            SignatureHeaders {
                gitea: Some(&sig),
                ..Default::default()
            },
            SignatureHeaders {
                hub_sha256: Some(&hub),
                ..Default::default()
            },
        ] {
            assert_eq!(verify(headers, body, &keys), Ok(()));
        }
    }

    #[test]
    fn accepts_any_secret_in_rotation_and_rejects_others() {
        let body = b"{}";
        let sig = sign("new", body);
        let h = SignatureHeaders {
            forgejo: Some(&sig),
            ..Default::default()
        };
        assert_eq!(verify(h, body, &secrets(&["old", "new"])), Ok(()));
        assert_eq!(
            verify(h, body, &secrets(&["old"])),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(verify(h, body, &[]), Err(SignatureError::Mismatch));
    }

    #[test]
    fn rejects_missing_empty_and_malformed() {
        let keys = secrets(&["k"]);
        assert_eq!(
            verify(SignatureHeaders::default(), b"{}", &keys),
            Err(SignatureError::Missing)
        );
        let empty = SignatureHeaders {
            forgejo: Some(""),
            gitea: Some(""),
            ..Default::default()
        };
        assert_eq!(verify(empty, b"{}", &keys), Err(SignatureError::Empty));
        let short = SignatureHeaders {
            forgejo: Some("abcd"),
            ..Default::default()
        };
        assert_eq!(verify(short, b"{}", &keys), Err(SignatureError::Malformed));
        let nothex = "z".repeat(64);
        let bad = SignatureHeaders {
            forgejo: Some(&nothex),
            ..Default::default()
        };
        assert_eq!(verify(bad, b"{}", &keys), Err(SignatureError::Malformed));
        let noprefix = SignatureHeaders {
            hub_sha256: Some("abc"),
            ..Default::default()
        };
        assert_eq!(
            verify(noprefix, b"{}", &keys),
            Err(SignatureError::Malformed)
        );
    }

    #[test]
    fn a_changed_body_no_longer_verifies() {
        let sig = sign("k", b"{\"a\":1}");
        let h = SignatureHeaders {
            forgejo: Some(&sig),
            ..Default::default()
        };
        assert_eq!(
            verify(h, b"{\"a\":2}", &secrets(&["k"])),
            Err(SignatureError::Mismatch)
        );
    }

    proptest! {
        #[test]
        fn random_headers_and_bodies_never_verify_or_panic(
            sig in ".{0,80}",
            body in proptest::collection::vec(any::<u8>(), 0..512),
        ) {
            let h = SignatureHeaders { forgejo: Some(&sig), ..Default::default() };
            let keys = secrets(&["k"]);
            // A random string matching the real HMAC is astronomically unlikely.
            prop_assume!(sig != sign("k", &body));
            prop_assert!(verify(h, &body, &keys).is_err());
        }

        #[test]
        fn every_correct_signature_verifies(body in proptest::collection::vec(any::<u8>(), 0..512)) {
            let sig = sign("k", &body);
            let h = SignatureHeaders { gitea: Some(&sig), ..Default::default() };
            prop_assert_eq!(verify(h, &body, &secrets(&["other", "k"])), Ok(()));
        }
    }
}
