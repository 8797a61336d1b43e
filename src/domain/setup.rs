//! A prepared environment: the setup a repository declares (`[setup]` of `.director.toml`),
//! as allowed by the operator, and what became of it for one run (cold or warm, the key, the
//! time and exit), kept with the run.

use serde::{Deserialize, Serialize};

/// The setup a run gets, already checked against the operator's ceiling.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetupDecl {
    /// A shell line, run by `sh -c` in the checkout.
    pub command: String,
    /// `host:port` entries the setup may reach beyond the run's own allow-list.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress_allow: Vec<String>,
    /// Names of the operator's `[setup_secrets]` the setup is given.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<String>,
    /// Paths in the repository whose contents key the snapshot (lock files).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cache_key: Vec<String>,
    pub timeout_secs: u64,
}

/// Whether a run's workspace was prepared by its setup now, or restored from a snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SetupMode {
    Cold,
    Warm,
}

impl SetupMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cold => "cold",
            Self::Warm => "warm",
        }
    }
}

/// What became of a run's setup, recorded before its agent starts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetupOutcome {
    pub mode: SetupMode,
    /// The snapshot key (hex), from the image, the command and the cache-key files.
    pub key: String,
    /// The setup's wall time, or the restore's, in milliseconds.
    pub millis: u64,
    /// The setup's exit code (`None` when warm, or when it was stopped at its time limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit: Option<i64>,
    /// What happened to the snapshot, in words: kept, skipped and why, or why a warm start
    /// fell back to a cold one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
}

impl SetupOutcome {
    /// One line for the run's report and the pull request.
    pub fn line(&self) -> String {
        let secs = self.millis as f64 / 1000.0;
        let mut line = match self.mode {
            SetupMode::Warm => format!(
                "Environment: warm, restored from snapshot `{}` in {secs:.1} s",
                short(&self.key)
            ),
            SetupMode::Cold => format!(
                "Environment: cold, the setup ran in {secs:.1} s (exit {})",
                self.exit
                    .map_or_else(|| "none".to_owned(), |c| c.to_string())
            ),
        };
        if let Some(s) = &self.snapshot {
            line.push_str("; ");
            line.push_str(s);
        }
        line
    }
}

/// The first 12 characters of a key, as shown.
pub fn short(key: &str) -> &str {
    key.get(..12).unwrap_or(key)
}
