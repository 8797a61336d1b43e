-- Work one replica at a time may do (the consumer), and claims made once (a scan period).
-- With SQLite there is one process, which always holds them; the table keeps one store
-- interface for both backends.
CREATE TABLE leases (
    name     TEXT    PRIMARY KEY,
    owner    TEXT    NOT NULL,
    until_ms INTEGER NOT NULL
);
