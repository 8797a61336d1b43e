//! Run tokens sealed for the database: the git gateway of any replica, or of a restarted
//! director, opens them; the key comes from a credential in the configuration, never from
//! the database.

use std::sync::Arc;

use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};
use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use sha2::Sha256;

use crate::domain::RunId;
use crate::settings::Secret;

/// Seals run tokens for the database: ChaCha20-Poly1305, a random nonce per token, the run
/// id as associated data (a sealed token moved to another run's row does not open).
#[derive(Clone)]
pub struct Seal {
    key: Arc<LessSafeKey>,
}

impl Seal {
    /// The key is derived from `material` (a credential every replica is configured with).
    pub fn new(material: &Secret) -> Self {
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(material.expose().as_bytes())
            .expect("HMAC takes a key of any length");
        mac.update(b"director run-token seal v1");
        let bytes = mac.finalize().into_bytes();
        let key = UnboundKey::new(&CHACHA20_POLY1305, &bytes).expect("a 32-byte key");
        Self {
            key: Arc::new(LessSafeKey::new(key)),
        }
    }

    pub fn seal(&self, run_id: &RunId, token: &Secret) -> String {
        let nonce_bytes: [u8; NONCE_LEN] = rand::random();
        let mut data = token.expose().as_bytes().to_vec();
        let sealed = self.key.seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce_bytes),
            Aad::from(run_id.as_str().as_bytes()),
            &mut data,
        );
        // Sealing a short buffer cannot fail; a failure would keep nothing openable.
        if sealed.is_err() {
            return String::new();
        }
        let mut out = nonce_bytes.to_vec();
        out.extend_from_slice(&data);
        base64::engine::general_purpose::STANDARD.encode(out)
    }

    pub fn open(&self, run_id: &RunId, sealed: &str) -> Option<Secret> {
        let mut raw = base64::engine::general_purpose::STANDARD
            .decode(sealed)
            .ok()?;
        if raw.len() < NONCE_LEN {
            return None;
        }
        let mut data = raw.split_off(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(&raw).ok()?;
        let plain = self
            .key
            .open_in_place(nonce, Aad::from(run_id.as_str().as_bytes()), &mut data)
            .ok()?;
        String::from_utf8(plain.to_vec()).ok().map(Secret::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::run::test_id;

    #[test]
    fn a_sealed_token_opens_for_its_run_only_and_shows_nothing_of_itself() {
        let seal = Seal::new(&Secret::new("runner-password"));
        let token = Secret::new("f00dfeedcafe");
        let sealed = seal.seal(&test_id("run1"), &token);
        assert!(!sealed.contains("f00dfeedcafe"));
        assert_eq!(
            seal.open(&test_id("run1"), &sealed)
                .map(|t| t.expose().to_owned()),
            Some("f00dfeedcafe".to_owned())
        );
        assert!(
            seal.open(&test_id("run2"), &sealed).is_none(),
            "another run's row"
        );
        let other = Seal::new(&Secret::new("another"));
        assert!(
            other.open(&test_id("run1"), &sealed).is_none(),
            "another key"
        );
        assert!(seal.open(&test_id("run1"), "not base64!").is_none());
        assert!(seal.open(&test_id("run1"), "").is_none());
        assert_ne!(
            seal.seal(&test_id("run1"), &token),
            sealed,
            "a fresh nonce each time"
        );
    }
}
