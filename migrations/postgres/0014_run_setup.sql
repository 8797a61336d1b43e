-- What became of a run's setup phase (`[setup]` of `.director.toml`): cold or warm, the
-- snapshot key, its time and exit, as JSON, written by its start before the agent's container
-- exists. While it is NULL and the run is launching, the setup's own credentials (a fetch-only
-- git credential, the proxy with the setup's allow-list) are taken; once written, never again.
ALTER TABLE runs ADD COLUMN setup TEXT;
