-- What each model call through the director cost, read from the provider's answer: runs'
-- calls through the model gateway and the pre-flight's own (`run_id` NULL). Budgets sum
-- it per run, per repository and UTC day (`day`, `YYYY-MM-DD`), and per day; every replica
-- shares it. `cost_usd` is NULL for a model without a price.
CREATE TABLE model_usage (
    id                 INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id             TEXT,
    repo               TEXT NOT NULL,
    day                TEXT NOT NULL,
    provider           TEXT NOT NULL,
    model              TEXT NOT NULL,
    input_tokens       BIGINT NOT NULL,
    cache_read_tokens  BIGINT NOT NULL,
    cache_write_tokens BIGINT NOT NULL,
    output_tokens      BIGINT NOT NULL,
    cost_usd           REAL,
    at_ms              BIGINT NOT NULL
);
CREATE INDEX model_usage_run ON model_usage (run_id);
CREATE INDEX model_usage_day ON model_usage (day, repo);
-- Runs the model gateway refused for a spent budget: the watcher stops each with its grace.
CREATE TABLE budget_stops (
    run_id TEXT PRIMARY KEY,
    why    TEXT NOT NULL,
    at_ms  BIGINT NOT NULL
);
