-- Fewer pages per stored event. Each intake commit wrote the row's page and three more: the
-- AUTOINCREMENT counter in `sqlite_sequence` and a leaf of each of the two unique indexes,
-- whose random keys (the delivery id and the content hash) put every insert on a different
-- page. The table is rebuilt with:
-- * `seq` as a plain rowid: SQLite gives a new row one more than the largest `seq`, so `seq`
--   still only grows as long as the newest row is never deleted (the pruner keeps it, see
--   `Store::prune`); the consumer's mark relies on no number being used twice.
-- * one dedupe key, the content hash: the same body is the same delivery, whatever id it came
--   under (Forgejo's "Replay" sends it under a new one; a GitHub redelivery, a retrying proxy
--   or a second hook send it again). Internal events are stored under a hash of their id. The
--   delivery id stays, for logs and the operator.
CREATE TABLE deliveries_lean (
    seq             INTEGER PRIMARY KEY,
    delivery_id     TEXT    NOT NULL,
    content_sha256  TEXT    NOT NULL UNIQUE,
    event_type      TEXT    NOT NULL,
    repo            TEXT    NOT NULL,
    number          INTEGER NOT NULL,
    event           TEXT    NOT NULL,
    received_at_ms  INTEGER NOT NULL,
    processed_at_ms INTEGER,
    schema          INTEGER NOT NULL DEFAULT 1,
    dead_reason     TEXT
);
INSERT INTO deliveries_lean (seq, delivery_id, content_sha256, event_type, repo, number, event,
                             received_at_ms, processed_at_ms, schema, dead_reason)
    SELECT seq, delivery_id, content_sha256, event_type, repo, number, event,
           received_at_ms, processed_at_ms, schema, dead_reason
    FROM deliveries;
DROP TABLE deliveries;
ALTER TABLE deliveries_lean RENAME TO deliveries;
CREATE INDEX deliveries_by_processed ON deliveries (processed_at_ms) WHERE processed_at_ms IS NOT NULL;
-- The pruner could delete the newest rows before, when they were consumed and old: the next
-- `seq` would then come after the largest one left, at or below the mark. Every event above
-- the largest `seq` left was consumed (the pruner deletes only consumed ones), so the mark
-- comes down to it, and the next event is numbered above the mark.
UPDATE consumer_mark SET seq = MIN(seq, COALESCE((SELECT MAX(seq) FROM deliveries), 0));
