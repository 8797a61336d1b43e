-- The agent a run was given (`[agents.<name>]`) and why (a writer's label, the repository's
-- `.director.toml`, the operator's `runner.agent`), as JSON, written by its start before its
-- container exists. The consumer's writes of the run never touch it.
ALTER TABLE runs ADD COLUMN agent TEXT;
