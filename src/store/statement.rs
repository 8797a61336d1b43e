//! A statement written once, with its values, and run by either driver: sqlx (both
//! databases, through the pools) or rusqlite (SQLite, on the consumer's connection of its own,
//! see `pass`). What a consumer pass writes is made as a list of these
//! ([`super::commit_statements`]), so that both ways of committing it write the same.

use anyhow::Context;
use rusqlite::types::{ToSqlOutput, ValueRef};

use super::Tx;
use super::backend::Cols;

/// One value bound to a statement, of the three types the tables hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Value {
    Text(Option<String>),
    Int(Option<i64>),
    Flag(Option<bool>),
}

impl From<String> for Value {
    fn from(v: String) -> Self {
        Self::Text(Some(v))
    }
}

impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Self::Text(Some(v.to_owned()))
    }
}

impl From<&String> for Value {
    fn from(v: &String) -> Self {
        Self::Text(Some(v.clone()))
    }
}

impl From<Option<String>> for Value {
    fn from(v: Option<String>) -> Self {
        Self::Text(v)
    }
}

impl From<&Option<String>> for Value {
    fn from(v: &Option<String>) -> Self {
        Self::Text(v.clone())
    }
}

impl From<Option<&str>> for Value {
    fn from(v: Option<&str>) -> Self {
        Self::Text(v.map(str::to_owned))
    }
}

impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Self::Int(Some(v))
    }
}

impl From<Option<i64>> for Value {
    fn from(v: Option<i64>) -> Self {
        Self::Int(v)
    }
}

impl From<bool> for Value {
    fn from(v: bool) -> Self {
        Self::Flag(Some(v))
    }
}

impl From<Option<bool>> for Value {
    fn from(v: Option<bool>) -> Self {
        Self::Flag(v)
    }
}

/// As sqlx's SQLite driver stores them: a flag as the integer 0 or 1.
impl rusqlite::ToSql for Value {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match self {
            Self::Text(Some(t)) => ValueRef::Text(t.as_bytes()),
            Self::Int(Some(i)) => ValueRef::Integer(*i),
            Self::Flag(Some(b)) => ValueRef::Integer(i64::from(*b)),
            Self::Text(None) | Self::Int(None) | Self::Flag(None) => ValueRef::Null,
        }))
    }
}

/// Binds `values` in order to a sqlx query of either database.
macro_rules! bound {
    ($query:expr, $values:expr) => {{
        let mut query = $query;
        for value in $values {
            query = match value {
                $crate::store::statement::Value::Text(t) => query.bind(t.as_deref()),
                $crate::store::statement::Value::Int(i) => query.bind(*i),
                $crate::store::statement::Value::Flag(b) => query.bind(*b),
            };
        }
        query
    }};
}

/// A statement's text (parameters `$1, $2, ...` or `?`, bound in order) and values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Statement {
    pub(super) sql: String,
    pub(super) values: Vec<Value>,
    /// The error when the statement must change a row and changes none.
    pub(super) must_change: Option<String>,
}

impl Statement {
    pub(super) fn new(sql: impl Into<String>) -> Self {
        Self {
            sql: sql.into(),
            values: Vec::new(),
            must_change: None,
        }
    }

    pub(super) fn bind(mut self, value: impl Into<Value>) -> Self {
        self.values.push(value.into());
        self
    }

    pub(super) fn push(&mut self, value: impl Into<Value>) {
        self.values.push(value.into());
    }

    /// Fails with `why` when it changes no row.
    pub(super) fn or_fail(mut self, why: String) -> Self {
        self.must_change = Some(why);
        self
    }

    fn check(must_change: Option<&str>, changed: u64) -> anyhow::Result<()> {
        match must_change {
            Some(why) if changed == 0 => Err(anyhow::anyhow!("{why}")),
            _ => Ok(()),
        }
    }

    /// Runs it in `tx` through sqlx.
    pub(super) async fn execute(self, tx: &mut Tx<'_>) -> anyhow::Result<()> {
        let Self {
            sql,
            values,
            must_change,
        } = self;
        let changed = on_tx!(tx, t => {
            bound!(sqlx::query(sqlx::AssertSqlSafe(sql)), &values)
                .execute(&mut **t)
                .await?
                .rows_affected()
        });
        Self::check(must_change.as_deref(), changed)
    }

    /// Runs it on `conn` through rusqlite (its prepared form is cached there).
    pub(super) fn run(&self, conn: &rusqlite::Connection) -> anyhow::Result<()> {
        let mut prepared = conn.prepare_cached(&self.sql)?;
        self.bind_to(&mut prepared)?;
        let changed = prepared.raw_execute()?;
        Self::check(
            self.must_change.as_deref(),
            u64::try_from(changed).unwrap_or(u64::MAX),
        )
    }

    /// Its rows on `conn` through rusqlite, each made by `row`.
    pub(super) fn rows<T>(
        &self,
        conn: &rusqlite::Connection,
        mut row: impl FnMut(&dyn Cols) -> anyhow::Result<T>,
    ) -> anyhow::Result<Vec<T>> {
        let mut prepared = conn.prepare_cached(&self.sql)?;
        self.bind_to(&mut prepared)?;
        let mut rows = prepared.raw_query();
        let mut out = Vec::new();
        while let Some(r) = rows.next()? {
            out.push(row(r)?);
        }
        Ok(out)
    }

    /// Binds each parameter: `$n` to the n-th value, `?` to the value in its place.
    fn bind_to(&self, prepared: &mut rusqlite::Statement<'_>) -> anyhow::Result<()> {
        for at in 1..=prepared.parameter_count() {
            let index = match prepared.parameter_name(at) {
                None => at,
                Some(name) => name
                    .strip_prefix('$')
                    .and_then(|n| n.parse().ok())
                    .with_context(|| format!("parameter `{name}` is neither `$n` nor `?`"))?,
            };
            let value = self.values.get(index.wrapping_sub(1)).with_context(|| {
                format!("no value for parameter {index} of {}", self.values.len())
            })?;
            prepared.raw_bind_parameter(at, value)?;
        }
        Ok(())
    }
}

impl super::Store {
    /// The rows of `statement` through sqlx, each made by `row`.
    pub(super) async fn fetch<T>(
        &self,
        statement: Statement,
        row: impl Fn(&dyn Cols) -> anyhow::Result<T>,
    ) -> anyhow::Result<Vec<T>> {
        on_pool!(&self.db, p => {
            let rows = bound!(sqlx::query(sqlx::AssertSqlSafe(statement.sql)), &statement.values)
                .fetch_all(p)
                .await?;
            rows.iter().map(|r| row(r)).collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memory() -> rusqlite::Connection {
        let conn = rusqlite::Connection::open_in_memory().expect("open");
        conn.execute_batch("CREATE TABLE t (a TEXT, b INTEGER, c INTEGER)")
            .expect("table");
        conn
    }

    #[test]
    fn numbered_parameters_take_their_own_value_wherever_they_stand() {
        let conn = memory();
        Statement::new("INSERT INTO t (c, a, b) VALUES ($3, $1, $2)")
            .bind("x")
            .bind(7)
            .bind(Some(true))
            .run(&conn)
            .expect("insert");
        let rows = Statement::new("SELECT a, b, c FROM t WHERE b = $2 AND a = $1")
            .bind("x")
            .bind(7)
            .rows(&conn, |r| Ok((r.text("a")?, r.int("b")?, r.flag("c")?)))
            .expect("select");
        assert_eq!(rows, vec![("x".to_owned(), 7, true)]);
    }

    #[test]
    fn a_statement_that_must_change_a_row_fails_when_it_changes_none() {
        let conn = memory();
        let err = Statement::new("UPDATE t SET b = ? WHERE a = ?")
            .bind(1)
            .bind(None::<String>)
            .or_fail("nothing to update".to_owned())
            .run(&conn)
            .expect_err("no row");
        assert_eq!(err.to_string(), "nothing to update");
    }

    #[test]
    fn a_missing_value_is_an_error_not_a_null() {
        let conn = memory();
        let err = Statement::new("INSERT INTO t (a, b) VALUES (?, ?)")
            .bind("only one")
            .run(&conn)
            .expect_err("one value short");
        assert!(
            err.to_string().contains("no value for parameter 2"),
            "{err}"
        );
    }
}
