-- Where a run's branch lives when it is not the repository itself (the runner's fork,
-- `owner/name`), written by its start before its container exists: the git gateway forwards
-- the run's git there, and its pull request comes from there. The consumer's writes of the
-- run never touch it.
ALTER TABLE runs ADD COLUMN branch_home TEXT;
