-- The base branch's head commit when a first run started, written by its start before its
-- container exists: the git gateway refuses a branch that does not descend from it (an old
-- base would bring back old CI definitions). The consumer's writes of the run never touch it.
ALTER TABLE runs ADD COLUMN base_commit TEXT;
