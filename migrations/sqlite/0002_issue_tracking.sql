-- Trigger tracking and the issue lifecycle.
ALTER TABLE issues ADD COLUMN lifecycle TEXT NOT NULL DEFAULT 'untracked';
-- The trigger label is on the issue.
ALTER TABLE issues ADD COLUMN trigger_present INTEGER NOT NULL DEFAULT 0;
-- Who applied it, and whether they may (NULL: not resolved yet; a scan retries).
ALTER TABLE issues ADD COLUMN trigger_actor TEXT;
ALTER TABLE issues ADD COLUMN trigger_trusted INTEGER;
-- The "applied by someone without write access" comment was posted.
ALTER TABLE issues ADD COLUMN untrusted_notice INTEGER NOT NULL DEFAULT 0;
CREATE INDEX issues_by_repo_trigger ON issues (repo, trigger_present);
