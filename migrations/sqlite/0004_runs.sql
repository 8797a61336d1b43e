-- Coder runs. A run id names one container (`director-run-<id>`) and one token
-- (`director-run-<id>`); an issue has at most one active run.
CREATE TABLE runs (
    id             TEXT    PRIMARY KEY,
    repo           TEXT    NOT NULL,
    number         INTEGER NOT NULL,
    -- launching | running | succeeded | failed | timed_out | cancelled | refused
    state          TEXT    NOT NULL,
    branch         TEXT    NOT NULL,
    base_branch    TEXT    NOT NULL DEFAULT '',
    container_id   TEXT,
    pr_number      INTEGER,
    detail         TEXT,
    created_at_ms  INTEGER NOT NULL,
    started_at_ms  INTEGER,
    finished_at_ms INTEGER
);
CREATE UNIQUE INDEX runs_one_active_per_issue ON runs (repo, number)
    WHERE state IN ('launching', 'running');
