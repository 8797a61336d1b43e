//! The two databases behind [`Store`](super::Store): SQLite for one process, PostgreSQL for
//! several replicas. Every statement is written once, with `$1`-style parameters that both
//! accept, and expanded for each backend by [`on_pool!`] and [`on_tx!`]: the same text, type
//! checked against each driver. Rows are read through [`Cols`], which both row types implement.

use sqlx::Row;
use sqlx::postgres::PgRow;
use sqlx::sqlite::SqliteRow;

/// Runs `$body` with `$p` bound to the pool that reads (and writes outside a transaction).
macro_rules! on_pool {
    ($db:expr, $p:ident => $body:expr) => {
        match $db {
            $crate::store::Db::Sqlite(s) => {
                let $p = &s.pool;
                $body
            }
            $crate::store::Db::Postgres(pg) => {
                let $p = &pg.pool;
                $body
            }
        }
    };
}

/// Runs `$body` with `$t` bound to the open transaction of `$tx` (a `&mut Tx`).
macro_rules! on_tx {
    ($tx:expr, $t:ident => $body:expr) => {
        match $tx {
            $crate::store::Tx::Sqlite($t, _) => $body,
            $crate::store::Tx::Postgres($t) => $body,
        }
    };
}

/// Reading a column by name, the same for both backends' rows and for rusqlite's (the
/// consumer's own connection, see `pass`).
pub(super) trait Cols {
    fn text(&self, col: &str) -> anyhow::Result<String>;
    fn opt_text(&self, col: &str) -> anyhow::Result<Option<String>>;
    fn int(&self, col: &str) -> anyhow::Result<i64>;
    fn opt_int(&self, col: &str) -> anyhow::Result<Option<i64>>;
    fn flag(&self, col: &str) -> anyhow::Result<bool>;
    fn opt_flag(&self, col: &str) -> anyhow::Result<Option<bool>>;
}

/// `Cols` for a row type whose getter by column name is `$get` (sqlx's `try_get`,
/// rusqlite's `get`).
macro_rules! cols_for {
    ($row:ty, $get:ident) => {
        impl Cols for $row {
            fn text(&self, col: &str) -> anyhow::Result<String> {
                Ok(self.$get(col)?)
            }
            fn opt_text(&self, col: &str) -> anyhow::Result<Option<String>> {
                Ok(self.$get(col)?)
            }
            fn int(&self, col: &str) -> anyhow::Result<i64> {
                Ok(self.$get(col)?)
            }
            fn opt_int(&self, col: &str) -> anyhow::Result<Option<i64>> {
                Ok(self.$get(col)?)
            }
            fn flag(&self, col: &str) -> anyhow::Result<bool> {
                Ok(self.$get(col)?)
            }
            fn opt_flag(&self, col: &str) -> anyhow::Result<Option<bool>> {
                Ok(self.$get(col)?)
            }
        }
    };
}

cols_for!(SqliteRow, try_get);
cols_for!(PgRow, try_get);
cols_for!(rusqlite::Row<'_>, get);

/// Which database a statement is made for, where they differ in more than parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    pub(super) fn of(db: &super::Db) -> Self {
        match db {
            super::Db::Sqlite(_) => Self::Sqlite,
            super::Db::Postgres(_) => Self::Postgres,
        }
    }

    pub(super) fn marks(self) -> Marks {
        match self {
            Self::Sqlite => Marks::InOrder,
            Self::Postgres => Marks::Numbered,
        }
    }
}

/// How a statement names its parameters. PostgreSQL wants `$1, $2, ...`; SQLite takes those
/// too, but resolves each named one by a linear search of the names before it when preparing,
/// which a multi-row statement of hundreds of parameters pays for dearly: it gets plain `?`,
/// bound in order (every multi-row statement binds each parameter once, in order).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Marks {
    Numbered,
    InOrder,
}

impl Marks {
    pub(super) fn of(tx: &super::Tx<'_>) -> Self {
        match tx {
            super::Tx::Sqlite(..) => Self::InOrder,
            super::Tx::Postgres(_) => Self::Numbered,
        }
    }
}

/// `$1, $2, ...` (or `?, ?, ...`) from `first`: the parameters of a multi-row statement.
pub(super) fn params(marks: Marks, first: usize, count: usize) -> String {
    (first..first + count)
        .map(|i| match marks {
            Marks::Numbered => format!("${i}"),
            Marks::InOrder => "?".to_owned(),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `($1, $2, $3), ($4, $5, $6), ...`: `rows` tuples of `width` parameters.
pub(super) fn tuples(marks: Marks, rows: usize, width: usize) -> String {
    (0..rows)
        .map(|r| format!("({})", params(marks, 1 + r * width, width)))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_numbered_in_order() {
        assert_eq!(params(Marks::Numbered, 2, 3), "$2, $3, $4");
        assert_eq!(tuples(Marks::Numbered, 2, 2), "($1, $2), ($3, $4)");
        assert_eq!(tuples(Marks::InOrder, 2, 2), "(?, ?), (?, ?)");
    }
}
