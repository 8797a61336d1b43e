-- Follow-through on the pull request a run opened: its fate, and follow-up runs on its branch.
-- The issue's pull request (JSON: number, branch, state, follow-ups, waiting feedback), and
-- its number and state as columns: a pull-request event finds its issue by them, and
-- admission counts the open ones per repository.
ALTER TABLE issues ADD COLUMN pr TEXT;
ALTER TABLE issues ADD COLUMN pr_number INTEGER;
ALTER TABLE issues ADD COLUMN pr_state TEXT;
CREATE INDEX issues_by_pull ON issues (repo, pr_number);
-- A follow-up run: which pull request it answers, with what feedback, from which head (JSON).
ALTER TABLE runs ADD COLUMN followup TEXT;
-- What the run said of itself in its result file (JSON), when readable.
ALTER TABLE runs ADD COLUMN result TEXT;
-- Why the director stopped it: timeout | idle.
ALTER TABLE runs ADD COLUMN stopped TEXT;
