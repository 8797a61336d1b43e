-- What writers granted an issue in its thread (issue 62): the hosts approved for its runs
-- (`/director allow host:port`), the refused run an approval retried, and a `/director
-- continue` waiting for its run (JSON). A run continuing one stopped on its budget says so
-- (JSON: the run it continues, its budget).
ALTER TABLE issues ADD COLUMN thread TEXT;
ALTER TABLE runs ADD COLUMN continued TEXT;
