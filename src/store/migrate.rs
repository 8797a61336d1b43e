//! A minimal migrator: each file runs once, in order, inside a transaction, and is recorded in
//! `schema_migrations`. Each backend keeps its own files, the same in meaning
//! (`migrations/sqlite/`, `migrations/postgres/`). On PostgreSQL several replicas may start at
//! once: the whole run holds an advisory lock, so one migrates and the others wait and find
//! it done.

use sqlx::{PgPool, SqlitePool};

const SQLITE: &[(i64, &str)] = &[
    (
        1,
        include_str!("../../migrations/sqlite/0001_deliveries_and_issues.sql"),
    ),
    (
        2,
        include_str!("../../migrations/sqlite/0002_issue_tracking.sql"),
    ),
    (
        3,
        include_str!("../../migrations/sqlite/0003_preflight.sql"),
    ),
    (4, include_str!("../../migrations/sqlite/0004_runs.sql")),
    (5, include_str!("../../migrations/sqlite/0005_outbox.sql")),
    (
        6,
        include_str!("../../migrations/sqlite/0006_director_id.sql"),
    ),
    (
        7,
        include_str!("../../migrations/sqlite/0007_pull_follow_through.sql"),
    ),
    (8, include_str!("../../migrations/sqlite/0008_leases.sql")),
    (
        9,
        include_str!("../../migrations/sqlite/0009_egress_refusals.sql"),
    ),
    (
        10,
        include_str!("../../migrations/sqlite/0010_consumer_mark.sql"),
    ),
    (
        11,
        include_str!("../../migrations/sqlite/0011_one_dedupe_key.sql"),
    ),
    (
        12,
        include_str!("../../migrations/sqlite/0012_run_tokens.sql"),
    ),
    (
        13,
        include_str!("../../migrations/sqlite/0013_model_usage.sql"),
    ),
    (
        14,
        include_str!("../../migrations/sqlite/0014_run_settings.sql"),
    ),
    (
        15,
        include_str!("../../migrations/sqlite/0015_transcripts.sql"),
    ),
    (
        16,
        include_str!("../../migrations/sqlite/0016_run_base_commit.sql"),
    ),
    (
        17,
        include_str!("../../migrations/sqlite/0017_run_agent.sql"),
    ),
    (
        18,
        include_str!("../../migrations/sqlite/0018_run_branch_home.sql"),
    ),
    (
        19,
        include_str!("../../migrations/sqlite/0019_issue_outcomes.sql"),
    ),
    (20, include_str!("../../migrations/sqlite/0020_filers.sql")),
    (
        21,
        include_str!("../../migrations/sqlite/0021_thread_grants.sql"),
    ),
    (
        22,
        include_str!("../../migrations/sqlite/0022_run_setup.sql"),
    ),
    (23, include_str!("../../migrations/sqlite/0023_checks.sql")),
];

const POSTGRES: &[(i64, &str)] = &[
    (1, include_str!("../../migrations/postgres/0001_schema.sql")),
    (
        2,
        include_str!("../../migrations/postgres/0002_egress_refusals.sql"),
    ),
    (
        3,
        include_str!("../../migrations/postgres/0003_one_dedupe_key.sql"),
    ),
    (
        4,
        include_str!("../../migrations/postgres/0004_run_tokens.sql"),
    ),
    (
        5,
        include_str!("../../migrations/postgres/0005_model_usage.sql"),
    ),
    (
        6,
        include_str!("../../migrations/postgres/0006_run_settings.sql"),
    ),
    (
        7,
        include_str!("../../migrations/postgres/0007_transcripts.sql"),
    ),
    (
        8,
        include_str!("../../migrations/postgres/0008_run_base_commit.sql"),
    ),
    (
        9,
        include_str!("../../migrations/postgres/0009_run_agent.sql"),
    ),
    (
        10,
        include_str!("../../migrations/postgres/0010_run_branch_home.sql"),
    ),
    (
        11,
        include_str!("../../migrations/postgres/0011_issue_outcomes.sql"),
    ),
    (
        12,
        include_str!("../../migrations/postgres/0012_filers.sql"),
    ),
    (
        13,
        include_str!("../../migrations/postgres/0013_thread_grants.sql"),
    ),
    (
        14,
        include_str!("../../migrations/postgres/0014_run_setup.sql"),
    ),
    (
        15,
        include_str!("../../migrations/postgres/0015_checks.sql"),
    ),
];

/// The advisory lock key the migration run holds on PostgreSQL ("director" in ASCII).
const MIGRATION_LOCK: i64 = 0x6469_7265_6374_6f72;

const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS schema_migrations \
     (version BIGINT PRIMARY KEY, applied_at_ms BIGINT NOT NULL)";

pub async fn run_sqlite(pool: &SqlitePool) -> anyhow::Result<()> {
    sqlx::raw_sql(CREATE_TABLE).execute(pool).await?;
    for (version, sql) in SQLITE {
        let mut tx = pool.begin().await?;
        let done: Option<i64> =
            sqlx::query_scalar("SELECT version FROM schema_migrations WHERE version = $1")
                .bind(version)
                .fetch_optional(&mut *tx)
                .await?;
        if done.is_some() {
            continue;
        }
        sqlx::raw_sql(*sql).execute(&mut *tx).await?;
        sqlx::query("INSERT INTO schema_migrations (version, applied_at_ms) VALUES ($1, $2)")
            .bind(version)
            .bind(crate::clock::now_ms())
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
    }
    Ok(())
}

pub async fn run_postgres(pool: &PgPool) -> anyhow::Result<()> {
    // One connection holds the session lock for the whole run.
    let mut conn = pool.acquire().await?;
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(MIGRATION_LOCK)
        .execute(&mut *conn)
        .await?;
    let outcome = async {
        sqlx::raw_sql(CREATE_TABLE).execute(&mut *conn).await?;
        for (version, sql) in POSTGRES {
            let done: Option<i64> =
                sqlx::query_scalar("SELECT version FROM schema_migrations WHERE version = $1")
                    .bind(version)
                    .fetch_optional(&mut *conn)
                    .await?;
            if done.is_some() {
                continue;
            }
            let mut tx = sqlx::Connection::begin(&mut *conn).await?;
            sqlx::raw_sql(*sql).execute(&mut *tx).await?;
            sqlx::query("INSERT INTO schema_migrations (version, applied_at_ms) VALUES ($1, $2)")
                .bind(version)
                .bind(crate::clock::now_ms())
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
        }
        anyhow::Ok(())
    }
    .await;
    let unlocked = sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(MIGRATION_LOCK)
        .execute(&mut *conn)
        .await;
    outcome?;
    unlocked?;
    Ok(())
}
