-- The whole schema on PostgreSQL, the same in meaning as SQLite's migrations 0001 to 0008
-- (`migrations/sqlite/`): the same tables, columns, unique and partial indexes. Integers are
-- BIGINT (every time and count is 64-bit), flags BOOLEAN, ids identities.

-- Webhook deliveries, scan observations and executor outcomes, consumed in arrival order.
CREATE TABLE deliveries (
    seq             BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    delivery_id     TEXT   NOT NULL UNIQUE,
    -- SHA-256 of the raw body: Forgejo's "Replay" sends the same body under a new id.
    content_sha256  TEXT   NOT NULL UNIQUE,
    event_type      TEXT   NOT NULL,
    repo            TEXT   NOT NULL,
    number          BIGINT NOT NULL,
    event           TEXT   NOT NULL,
    received_at_ms  BIGINT NOT NULL,
    processed_at_ms BIGINT,
    schema          BIGINT NOT NULL DEFAULT 1,
    dead_reason     TEXT
);
CREATE INDEX deliveries_unprocessed ON deliveries (seq) WHERE processed_at_ms IS NULL;
CREATE INDEX deliveries_by_processed ON deliveries (processed_at_ms) WHERE processed_at_ms IS NOT NULL;

-- What the director knows of each issue.
CREATE TABLE issues (
    repo                    TEXT    NOT NULL,
    number                  BIGINT  NOT NULL,
    title                   TEXT    NOT NULL,
    state                   TEXT    NOT NULL,
    labels                  TEXT    NOT NULL,
    forge_updated_at        TEXT,
    last_change_ms          BIGINT  NOT NULL,
    lifecycle               TEXT    NOT NULL DEFAULT 'untracked',
    trigger_present         BOOLEAN NOT NULL DEFAULT FALSE,
    trigger_actor           TEXT,
    trigger_trusted         BOOLEAN,
    untrusted_notice        BOOLEAN NOT NULL DEFAULT FALSE,
    preflight               TEXT    NOT NULL DEFAULT '{}',
    preflight_not_before_ms BIGINT,
    version                 BIGINT  NOT NULL DEFAULT 0,
    blocked                 TEXT,
    pr                      TEXT,
    pr_number               BIGINT,
    pr_state                TEXT,
    PRIMARY KEY (repo, number)
);
CREATE INDEX issues_by_repo_trigger ON issues (repo, trigger_present);
CREATE INDEX issues_by_lifecycle ON issues (lifecycle, preflight_not_before_ms);
CREATE INDEX issues_by_pull ON issues (repo, pr_number);

-- The pre-flight's cache by hash of the exact prompt, and its calls for the hourly caps.
CREATE TABLE preflight_reads (
    sha256        TEXT   PRIMARY KEY,
    reading       TEXT   NOT NULL,
    model         TEXT   NOT NULL,
    created_at_ms BIGINT NOT NULL
);
CREATE TABLE preflight_calls (
    id    BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    repo  TEXT   NOT NULL,
    at_ms BIGINT NOT NULL
);
CREATE INDEX preflight_calls_by_time ON preflight_calls (at_ms);

-- Coder runs: one container and one token per run id; at most one active run per issue.
CREATE TABLE runs (
    id             TEXT    PRIMARY KEY,
    repo           TEXT    NOT NULL,
    number         BIGINT  NOT NULL,
    state          TEXT    NOT NULL,
    branch         TEXT    NOT NULL,
    base_branch    TEXT    NOT NULL DEFAULT '',
    container_id   TEXT,
    pr_number      BIGINT,
    detail         TEXT,
    created_at_ms  BIGINT  NOT NULL,
    started_at_ms  BIGINT,
    finished_at_ms BIGINT,
    exit_code      BIGINT,
    log_tail       TEXT,
    stop_requested BOOLEAN NOT NULL DEFAULT FALSE,
    followup       TEXT,
    result         TEXT,
    stopped        TEXT
);
CREATE UNIQUE INDEX runs_one_active_per_issue ON runs (repo, number)
    WHERE state IN ('launching', 'running', 'exited');
CREATE INDEX runs_by_issue ON runs (repo, number, created_at_ms);

-- The outbox (see SQLite's 0005 for what each column means).
CREATE TABLE actions (
    id             BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    key            TEXT   NOT NULL UNIQUE,
    repo           TEXT   NOT NULL,
    number         BIGINT NOT NULL,
    kind           TEXT   NOT NULL,
    action         TEXT   NOT NULL,
    schema         BIGINT NOT NULL,
    state          TEXT   NOT NULL DEFAULT 'due',
    attempts       BIGINT NOT NULL DEFAULT 0,
    max_attempts   BIGINT NOT NULL,
    not_before_ms  BIGINT NOT NULL,
    lease_owner    TEXT,
    lease_until_ms BIGINT,
    last_error     TEXT,
    created_at_ms  BIGINT NOT NULL,
    done_at_ms     BIGINT
);
CREATE INDEX actions_due ON actions (not_before_ms) WHERE state = 'due';
CREATE INDEX actions_due_by_issue ON actions (repo, number, id) WHERE state = 'due';
CREATE INDEX actions_finished ON actions (done_at_ms) WHERE state <> 'due';

-- Facts about this director (its id, shared by every replica).
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

-- Work one replica at a time may do, and claims made once.
CREATE TABLE leases (
    name     TEXT   PRIMARY KEY,
    owner    TEXT   NOT NULL,
    until_ms BIGINT NOT NULL
);
