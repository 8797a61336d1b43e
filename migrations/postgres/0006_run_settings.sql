-- What a run got from its repository's `.director.toml` (JSON), written by its start before
-- its container exists; the consumer's writes of the run never touch it (nor the branch a
-- repository's template renamed).
ALTER TABLE runs ADD COLUMN settings TEXT;
