-- Each active run's forge token, sealed (ChaCha20-Poly1305 under a key derived from a
-- credential in the director's configuration, never from the database): the git gateway of
-- any replica, or of a restarted director, forwards the run's fetches and pushes with it.
-- `minted_at_ms`: when it was minted, so one that expires (GitHub's, after an hour) is
-- replaced before it does.
CREATE TABLE run_tokens (
    run_id       TEXT PRIMARY KEY,
    sealed       TEXT NOT NULL,
    minted_at_ms BIGINT NOT NULL
);
