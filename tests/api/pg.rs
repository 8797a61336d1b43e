//! A real PostgreSQL for the tests. With `DIRECTOR_TEST_PG_URL` set (`.ci/run` starts one
//! cluster for the whole run with `tests/pg-cluster.sh`), each caller gets a fresh database on
//! it; without it, a private cluster is started for the test and stopped when it ends.

use std::process::Command;

use sqlx::Connection as _;

pub struct Pg {
    base: String,
    /// The cluster this test started (stopped on drop).
    owned: Option<String>,
}

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/pg-cluster.sh");

impl Pg {
    pub fn start() -> Self {
        match std::env::var("DIRECTOR_TEST_PG_URL") {
            Ok(url) if !url.is_empty() => Self {
                base: url,
                owned: None,
            },
            _ => Self::start_private(),
        }
    }

    /// A cluster of the caller's own, whatever the environment says (to stop and start).
    pub fn start_private() -> Self {
        let out = Command::new("bash")
            .args([SCRIPT, "start"])
            .output()
            .expect("tests/pg-cluster.sh runs");
        assert!(
            out.status.success(),
            "starting PostgreSQL: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        let var = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("export {name}=")))
                .map(str::to_owned)
                .unwrap_or_else(|| panic!("{name} in {text}"))
        };
        Self {
            base: var("DIRECTOR_TEST_PG_URL"),
            owned: Some(var("DIRECTOR_TEST_PG_DIR")),
        }
    }

    /// A new, empty database; its URL.
    pub async fn database(&self) -> String {
        let name = format!("t_{:016x}", rand::random::<u64>());
        let mut conn = sqlx::PgConnection::connect(&self.base)
            .await
            .expect("the test cluster answers");
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut conn)
            .await
            .expect("CREATE DATABASE");
        let (server, _) = self.base.rsplit_once('/').expect("a database in the URL");
        format!("{server}/{name}")
    }
}

impl Pg {
    fn script(&self, verb: &str) {
        let dir = self.owned.as_deref().expect("a cluster of this test's own");
        let status = Command::new("bash")
            .args([SCRIPT, verb, dir])
            .status()
            .expect("tests/pg-cluster.sh runs");
        assert!(status.success(), "pg-cluster.sh {verb}");
    }

    /// The server goes away (an outage); its data stays.
    pub fn stop(&self) {
        self.script("pause");
    }

    /// The server comes back on the same port.
    pub fn restart(&self) {
        self.script("resume");
    }
}

impl Drop for Pg {
    fn drop(&mut self) {
        if let Some(dir) = self.owned.take() {
            let _ = Command::new("bash").args([SCRIPT, "stop", &dir]).status();
        }
    }
}
