//! A minimal migrator: each file in `migrations/` runs once, in order, inside a transaction,
//! and is recorded in `schema_migrations`. Plain SQL that SQLite and PostgreSQL both accept.

use sqlx::SqlitePool;

const MIGRATIONS: &[(i64, &str)] = &[
    (
        1,
        include_str!("../../migrations/0001_deliveries_and_issues.sql"),
    ),
    (2, include_str!("../../migrations/0002_issue_tracking.sql")),
    (3, include_str!("../../migrations/0003_preflight.sql")),
    (4, include_str!("../../migrations/0004_runs.sql")),
    (5, include_str!("../../migrations/0005_outbox.sql")),
    (6, include_str!("../../migrations/0006_director_id.sql")),
    (
        7,
        include_str!("../../migrations/0007_pull_follow_through.sql"),
    ),
];

pub async fn run(pool: &SqlitePool) -> anyhow::Result<()> {
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at_ms INTEGER NOT NULL)",
    )
    .execute(pool)
    .await?;
    for (version, sql) in MIGRATIONS {
        let mut tx = pool.begin().await?;
        let done: Option<i64> =
            sqlx::query_scalar("SELECT version FROM schema_migrations WHERE version = ?")
                .bind(version)
                .fetch_optional(&mut *tx)
                .await?;
        if done.is_some() {
            continue;
        }
        sqlx::raw_sql(*sql).execute(&mut *tx).await?;
        sqlx::query("INSERT INTO schema_migrations (version, applied_at_ms) VALUES (?, ?)")
            .bind(version)
            .bind(crate::clock::now_ms())
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
    }
    Ok(())
}
