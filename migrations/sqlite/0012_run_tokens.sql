-- Each active run's forge token, sealed (ChaCha20-Poly1305 under a key derived from a
-- credential in the director's configuration, never from the database): the git gateway of
-- any replica, or of a restarted director, forwards the run's fetches and pushes with it.
CREATE TABLE run_tokens (
    run_id TEXT PRIMARY KEY,
    sealed TEXT NOT NULL
);
