-- Filers (`[filers.<name>]`): the accounts that file work for agents. `issues.filer` names the
-- filer of an agent-filed issue (it is in the record's JSON too) so the outcomes and a
-- filer's day's spending are counted without decoding records. `filer_takes` holds each
-- agent-filed issue taken to a pre-flight, on its first day: what `max_per_day` counts.
-- `filer_told` holds what a filer was told of its day (its limit reached, its budget spent):
-- once a day in the log, and in the status.
ALTER TABLE issues ADD COLUMN filer TEXT;
CREATE INDEX issues_filer ON issues (filer);
CREATE TABLE filer_takes (
    repo TEXT NOT NULL,
    number BIGINT NOT NULL,
    filer TEXT NOT NULL,
    day TEXT NOT NULL,
    at_ms BIGINT NOT NULL,
    PRIMARY KEY (repo, number)
);
CREATE INDEX filer_takes_day ON filer_takes (filer, day);
CREATE TABLE filer_told (
    filer TEXT NOT NULL,
    day TEXT NOT NULL,
    what TEXT NOT NULL,
    at_ms BIGINT NOT NULL,
    PRIMARY KEY (filer, day, what)
);
