-- What the outcomes view and `director report` count by, kept beside the record (which
-- holds them too, in its JSON) so a window of 100,000 issues is read without decoding it:
-- the pre-flight's verdict, and when a writer first handed the issue over. The model usage
-- of a pre-flight names its issue (`number`), so its cost counts toward that issue's.
ALTER TABLE issues ADD COLUMN verdict TEXT;
ALTER TABLE issues ADD COLUMN picked_at_ms BIGINT;
CREATE INDEX issues_picked ON issues (picked_at_ms);
ALTER TABLE model_usage ADD COLUMN number BIGINT;
CREATE INDEX model_usage_issue ON model_usage (repo, number);
