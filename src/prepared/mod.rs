//! Prepared environments: what a run's setup phase leaves in its workspace, checked and kept.
//!
//! - [`scan`] reads the workspace as a tar stream, once, and finds any setup secret in it (its
//!   value and the encodings a tool may write it in), in file contents, names and link
//!   targets, while copying it into a snapshot.
//! - [`store`] keeps snapshots on the director's disk, one directory per repository, keyed by
//!   the image, the setup command and the cache-key files; bounded in size and age, pruned
//!   least recently used first.
//!
//! The engine (`engine::act::run::setup`) runs the setup and decides; nothing here talks to a
//! runtime or the forge.

pub mod scan;
pub mod store;
pub mod stream;

use sha2::Digest as _;

/// The snapshot key of a setup: the repository, the image's id, the command, and each
/// cache-key file's path and contents (`None`: absent), as hex.
pub fn snapshot_key(
    repo: &str,
    image_id: &str,
    command: &str,
    cache_files: &[(String, Option<Vec<u8>>)],
) -> String {
    let mut h = sha2::Sha256::new();
    for part in [repo, image_id, command] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    for (path, contents) in cache_files {
        h.update((path.len() as u64).to_be_bytes());
        h.update(path.as_bytes());
        match contents {
            Some(c) => {
                h.update([1]);
                h.update((c.len() as u64).to_be_bytes());
                h.update(c);
            }
            None => h.update([0]),
        }
    }
    hex::encode(h.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_changes_with_each_part_and_only_with_them() {
        let lock = vec![("Cargo.lock".to_owned(), Some(b"v1".to_vec()))];
        let k = snapshot_key("acme/web", "sha256:aa", "make deps", &lock);
        assert_eq!(k, snapshot_key("acme/web", "sha256:aa", "make deps", &lock));
        assert_ne!(k, snapshot_key("acme/api", "sha256:aa", "make deps", &lock));
        assert_ne!(k, snapshot_key("acme/web", "sha256:bb", "make deps", &lock));
        assert_ne!(k, snapshot_key("acme/web", "sha256:aa", "make dep", &lock));
        let changed = vec![("Cargo.lock".to_owned(), Some(b"v2".to_vec()))];
        assert_ne!(
            k,
            snapshot_key("acme/web", "sha256:aa", "make deps", &changed)
        );
        let gone = vec![("Cargo.lock".to_owned(), None)];
        assert_ne!(k, snapshot_key("acme/web", "sha256:aa", "make deps", &gone));
        // Lengths are part of the key: parts cannot slide into each other.
        assert_ne!(
            snapshot_key("a", "bc", "d", &[]),
            snapshot_key("ab", "c", "d", &[])
        );
    }
}
