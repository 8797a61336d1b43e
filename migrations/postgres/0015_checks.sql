-- The checks of a run's pushed head (`[checks]`), as JSON: the head and base commits, and,
-- once known, each command's result on both. While the outcome is missing and the run has
-- exited, the checks' own fetch-only git credential (`checks-<run>`) is taken.
ALTER TABLE runs ADD COLUMN checks TEXT;

-- The checks' results on a base commit, kept so they run once per base commit and
-- environment (`env`: a digest of the image, the prepared workspace's snapshot key and the
-- commands).
CREATE TABLE check_baselines (
    repo TEXT NOT NULL,
    base_commit TEXT NOT NULL,
    env TEXT NOT NULL,
    result TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    PRIMARY KEY (repo, base_commit, env)
);
