-- Facts about this director itself. `director_id` names it in the runner tokens it mints, so
-- that two directors sharing one runner account never revoke each other's live tokens.
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
