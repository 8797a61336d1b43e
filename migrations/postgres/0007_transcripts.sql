-- Each run's whole output, redacted, in the order it arrived: `seq` counts its chunks. What
-- `runner.transcript_max_mb` does not keep is dropped from the start, and counted in
-- `run_transcripts.dropped_bytes`; `mark` is the runtime's position of the last output kept
-- (a timestamp), from which a run adopted after a restart continues.
CREATE TABLE transcript_chunks (
    run_id TEXT    NOT NULL,
    seq    BIGINT  NOT NULL,
    text   TEXT    NOT NULL,
    bytes  BIGINT  NOT NULL,
    at_ms  BIGINT  NOT NULL,
    PRIMARY KEY (run_id, seq)
);
CREATE TABLE run_transcripts (
    run_id        TEXT   PRIMARY KEY,
    bytes         BIGINT NOT NULL,
    dropped_bytes BIGINT NOT NULL,
    next_seq      BIGINT NOT NULL,
    mark          TEXT,
    at_ms         BIGINT NOT NULL
);
