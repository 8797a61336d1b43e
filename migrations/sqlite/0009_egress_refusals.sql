-- What the egress proxy refused each run: one row per destination, with how many times.
CREATE TABLE egress_refusals (
    run_id      TEXT    NOT NULL,
    destination TEXT    NOT NULL,
    count       INTEGER NOT NULL,
    PRIMARY KEY (run_id, destination)
);

-- What the egress proxy refused a run, as the run ended (its report lists it).
ALTER TABLE runs ADD COLUMN egress_refused TEXT;
