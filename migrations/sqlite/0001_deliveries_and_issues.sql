-- Webhook deliveries, stored before the 202 and consumed in arrival order.
CREATE TABLE deliveries (
    seq            INTEGER PRIMARY KEY AUTOINCREMENT,
    delivery_id    TEXT    NOT NULL UNIQUE,
    -- SHA-256 of the raw body: Forgejo's "Replay" sends the same body under a new id.
    content_sha256 TEXT    NOT NULL UNIQUE,
    event_type     TEXT    NOT NULL,
    repo           TEXT    NOT NULL,
    number         INTEGER NOT NULL,
    event          TEXT    NOT NULL,
    received_at_ms INTEGER NOT NULL,
    processed_at_ms INTEGER
);
CREATE INDEX deliveries_unprocessed ON deliveries (seq) WHERE processed_at_ms IS NULL;

-- What the director last saw of each issue.
CREATE TABLE issues (
    repo             TEXT    NOT NULL,
    number           INTEGER NOT NULL,
    title            TEXT    NOT NULL,
    state            TEXT    NOT NULL,
    labels           TEXT    NOT NULL,
    forge_updated_at TEXT,
    last_change_ms   INTEGER NOT NULL,
    PRIMARY KEY (repo, number)
);
