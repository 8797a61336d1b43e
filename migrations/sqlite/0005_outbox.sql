-- The state machine and its outbox.
-- Stored events carry the version of their format; one that no longer parses is kept aside.
ALTER TABLE deliveries ADD COLUMN schema INTEGER NOT NULL DEFAULT 1;
ALTER TABLE deliveries ADD COLUMN dead_reason TEXT;
CREATE INDEX deliveries_by_processed ON deliveries (processed_at_ms) WHERE processed_at_ms IS NOT NULL;

-- Every decision bumps the issue's version; actions are named after it.
ALTER TABLE issues ADD COLUMN version INTEGER NOT NULL DEFAULT 0;
-- Why the issue waits on an action that failed on every attempt.
ALTER TABLE issues ADD COLUMN blocked TEXT;

ALTER TABLE runs ADD COLUMN exit_code INTEGER;
ALTER TABLE runs ADD COLUMN log_tail TEXT;
ALTER TABLE runs ADD COLUMN stop_requested INTEGER NOT NULL DEFAULT 0;
-- A run that exited is still active until it is judged: one per issue, still.
DROP INDEX runs_one_active_per_issue;
CREATE UNIQUE INDEX runs_one_active_per_issue ON runs (repo, number)
    WHERE state IN ('launching', 'running', 'exited');
CREATE INDEX runs_by_issue ON runs (repo, number, created_at_ms);

-- The outbox: every side effect, written with the state change that caused it. `key` is the
-- idempotency key (the same decision twice writes one row); an executor claims a due row with
-- a lease, performs it, and records its outcome as an event in the same transaction as `done`.
CREATE TABLE actions (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    key            TEXT    NOT NULL UNIQUE,
    repo           TEXT    NOT NULL,
    number         INTEGER NOT NULL,
    kind           TEXT    NOT NULL,
    action         TEXT    NOT NULL,
    schema         INTEGER NOT NULL,
    -- due | done | failed (gave up) | retracted (made pointless before it started)
    state          TEXT    NOT NULL DEFAULT 'due',
    attempts       INTEGER NOT NULL DEFAULT 0,
    max_attempts   INTEGER NOT NULL,
    not_before_ms  INTEGER NOT NULL,
    lease_owner    TEXT,
    lease_until_ms INTEGER,
    last_error     TEXT,
    created_at_ms  INTEGER NOT NULL,
    done_at_ms     INTEGER
);
CREATE INDEX actions_due ON actions (not_before_ms) WHERE state = 'due';
-- An issue's actions run one at a time, oldest first.
CREATE INDEX actions_due_by_issue ON actions (repo, number, id) WHERE state = 'due';
CREATE INDEX actions_finished ON actions (done_at_ms) WHERE state <> 'due';

-- Work a director from before the outbox left in flight: a picked-up issue waiting for its
-- read gets the read action, a run being launched gets its start action (adopting what it
-- may have created). Running runs are picked up by the watcher; queued issues by admission.
INSERT INTO actions (key, repo, number, kind, action, schema, max_attempts, not_before_ms, created_at_ms)
SELECT repo || '#' || number || ':read:rev' || COALESCE(json_extract(preflight, '$.rev'), 0),
       repo, number, 'read_preflight',
       json_object('kind', 'read_preflight',
                   'rev', COALESCE(json_extract(preflight, '$.rev'), 0),
                   'handled_command_id', COALESCE(json_extract(preflight, '$.handled_command_id'), 0)),
       2, 3, COALESCE(preflight_not_before_ms, 0), 0
FROM issues WHERE lifecycle = 'pending' AND trigger_trusted = 1;

INSERT INTO actions (key, repo, number, kind, action, schema, max_attempts, not_before_ms, created_at_ms)
SELECT repo || '#' || number || ':start:' || id, repo, number, 'start_run',
       json_object('kind', 'start_run', 'run_id', id), 2, 3, 0, 0
FROM runs WHERE state = 'launching';
