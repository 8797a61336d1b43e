-- The pre-flight's state per issue (revision, verdict, hash of the text read, attempts...).
ALTER TABLE issues ADD COLUMN preflight TEXT NOT NULL DEFAULT '{}';
-- When a waiting pre-flight may run (retry backoff, hourly caps).
ALTER TABLE issues ADD COLUMN preflight_not_before_ms INTEGER;
CREATE INDEX issues_by_lifecycle ON issues (lifecycle, preflight_not_before_ms);

-- Reads by hash of the exact prompt: the same text is never sent twice.
CREATE TABLE preflight_reads (
    sha256        TEXT PRIMARY KEY,
    reading       TEXT NOT NULL,
    model         TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL
);

-- Every call to the provider, for the hourly caps.
CREATE TABLE preflight_calls (
    id    INTEGER PRIMARY KEY AUTOINCREMENT,
    repo  TEXT    NOT NULL,
    at_ms INTEGER NOT NULL
);
CREATE INDEX preflight_calls_by_time ON preflight_calls (at_ms);
