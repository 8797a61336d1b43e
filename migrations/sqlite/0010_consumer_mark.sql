-- Where the consumer stands: every event at or below `seq` is consumed. SQLite has one writer
-- at a time, so events are numbered in the order they commit and the consumed ones are always
-- a prefix: consuming a batch moves this one row instead of rewriting every delivery row
-- (each about a kilobyte and a half) and two partial indexes. PostgreSQL, where transactions
-- of several replicas commit out of order, keeps marking rows (`processed_at_ms`).
CREATE TABLE consumer_mark (
    id  INTEGER PRIMARY KEY CHECK (id = 1),
    seq INTEGER NOT NULL
);
-- The consumed prefix so far: below the first row not yet processed, or everything.
INSERT INTO consumer_mark (id, seq) VALUES (1, COALESCE(
    (SELECT MIN(seq) - 1 FROM deliveries WHERE processed_at_ms IS NULL),
    (SELECT MAX(seq) FROM deliveries),
    0
));
-- Only set-aside rows get `processed_at_ms` from now on; unconsumed ones are found by `seq`.
DROP INDEX deliveries_unprocessed;
