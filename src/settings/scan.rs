//! `[scan]` and `[labels]`: what is watched, when, and the labels the director reads and keeps.

use super::*;

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ScanSettings {
    #[serde(deserialize_with = "repo_list")]
    pub repos: Vec<RepoName>,
    #[serde(deserialize_with = "lenient::list")]
    pub orgs: Vec<String>,
    /// When the incremental pass runs: a cron expression with a seconds field.
    #[serde(deserialize_with = "lenient::string")]
    pub schedule: String,
    /// When the full pass over every watched repository runs (it also runs at start-up).
    #[serde(deserialize_with = "lenient::string")]
    pub full_schedule: String,
    /// When the checks of the director's open pull requests are read again, those still
    /// pending or not reported yet, and those waiting in the merge lane: Forgejo sends no
    /// webhook for a commit status.
    #[serde(deserialize_with = "lenient::string")]
    pub checks_schedule: String,
    /// Scan on the schedules while serving.
    pub enabled: bool,
}

impl Default for ScanSettings {
    fn default() -> Self {
        Self {
            repos: Vec::new(),
            orgs: Vec::new(),
            schedule: "0 */5 * * * *".into(),
            full_schedule: "0 0 * * * *".into(),
            checks_schedule: "0 * * * * *".into(),
            enabled: true,
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LabelSettings {
    #[serde(deserialize_with = "lenient::string")]
    pub trigger: String,
    /// Applied by a writer, skips the pre-flight gate.
    #[serde(deserialize_with = "lenient::string")]
    pub skip_preflight: String,
    /// State labels the director keeps on issues (created when missing).
    #[serde(deserialize_with = "lenient::string")]
    pub queued: String,
    #[serde(deserialize_with = "lenient::string")]
    pub running: String,
    #[serde(deserialize_with = "lenient::string")]
    pub pr_open: String,
    #[serde(deserialize_with = "lenient::string")]
    pub failed: String,
    #[serde(deserialize_with = "lenient::string")]
    pub no_go: String,
    /// On an issue whose pre-flight asked questions in the thread.
    #[serde(deserialize_with = "lenient::string")]
    pub needs_info: String,
    /// Put on the issue when its pull request was merged (`pr_open` comes off).
    #[serde(deserialize_with = "lenient::string")]
    pub merged: String,
    /// On an issue whose pre-flight waits: for an hourly cap's queue, or to retry.
    #[serde(deserialize_with = "lenient::string")]
    pub waiting: String,
    /// On an issue whose GO waits for a writer's `/director go` (`preflight.approval`).
    #[serde(deserialize_with = "lenient::string")]
    pub awaiting_approval: String,
    /// A writer's label `<prefix><name>` gives the run the agent `<name>` of
    /// `[agents]` (empty: no label chooses an agent).
    #[serde(deserialize_with = "lenient::string")]
    pub agent_prefix: String,
    /// Priority labels, highest first: queued issues start in this order, then queue order.
    #[serde(deserialize_with = "lenient::list")]
    pub priority: Vec<String>,
}

impl Default for LabelSettings {
    fn default() -> Self {
        Self {
            trigger: "headless".into(),
            skip_preflight: "headless:skip-preflight".into(),
            queued: "headless:queued".into(),
            running: "headless:running".into(),
            pr_open: "headless:pr-open".into(),
            failed: "headless:failed".into(),
            no_go: "headless:no-go".into(),
            needs_info: "headless:needs-info".into(),
            merged: "headless:merged".into(),
            waiting: "headless:waiting".into(),
            awaiting_approval: "headless:awaiting-approval".into(),
            agent_prefix: "agent:".into(),
            priority: Vec::new(),
        }
    }
}

fn cron(expr: &str) -> Result<croner::Cron, String> {
    croner::parser::CronParser::builder()
        .seconds(croner::parser::Seconds::Required)
        .dom_and_dow(true)
        .build()
        .parse(expr)
        .map_err(|e| format!("`{expr}`: {e} (six fields, seconds first, e.g. `0 */5 * * * *`)"))
}

/// A cron expression with a seconds field, parsed the way the scheduler parses it.
fn croner_check(expr: &str) -> Result<(), String> {
    cron(expr).map(|_| ())
}

/// The time (ms) `expr` fires at that lies nearest `now_ms`: what names one scheduled period
/// alike on replicas whose schedules fired moments apart.
pub fn nearest_occurrence_ms(expr: &str, now_ms: i64) -> Option<i64> {
    let cron = cron(expr).ok()?;
    // Occurrences are whole seconds: search from the whole second, measure from `now`.
    let second = chrono::DateTime::from_timestamp(now_ms.div_euclid(1000), 0)?;
    let before = cron
        .find_previous_occurrence(&second, true)
        .ok()
        .map(|t| t.timestamp_millis());
    let after = cron
        .find_next_occurrence(&second, false)
        .ok()
        .map(|t| t.timestamp_millis());
    match (before, after) {
        (Some(b), Some(a)) => Some(if now_ms - b <= a - now_ms { b } else { a }),
        (Some(t), None) | (None, Some(t)) => Some(t),
        (None, None) => None,
    }
}

impl LabelSettings {
    /// The trigger is one label name.
    pub(super) fn validate(&self) -> Result<(), SettingsError> {
        let trigger = self.trigger.trim();
        if trigger.is_empty() || trigger.contains(',') {
            return Err(invalid(
                "labels.trigger",
                "must be one non-empty label name without commas",
            ));
        }
        Ok(())
    }
}

impl ScanSettings {
    /// The schedules parse, the organisations are names.
    pub(super) fn validate(&self) -> Result<(), SettingsError> {
        if let Err(e) = croner_check(&self.schedule) {
            return Err(invalid("scan.schedule", e));
        }
        if let Err(e) = croner_check(&self.checks_schedule) {
            return Err(invalid("scan.checks_schedule", e));
        }
        if let Err(e) = croner_check(&self.full_schedule) {
            return Err(invalid("scan.full_schedule", e));
        }
        for org in &self.orgs {
            if RepoName::new(org, "x").is_err() {
                return Err(invalid(
                    "scan.orgs",
                    format!("`{org}` is not an organisation name"),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod schedule_tests {
    #[test]
    fn a_scheduled_period_is_named_alike_by_replicas_firing_moments_apart() {
        // An even second, on a schedule every 2 s: replicas firing around it name it alike.
        let tick = 1_796_000_002_000;
        for now in [tick - 400, tick - 1, tick, tick + 3, tick + 900] {
            assert_eq!(
                super::nearest_occurrence_ms("*/2 * * * * *", now),
                Some(tick),
                "{now}"
            );
        }
        assert_eq!(
            super::nearest_occurrence_ms("0 */5 * * * *", 1_796_000_299_500),
            Some(1_796_000_400_000)
        );
        assert_eq!(super::nearest_occurrence_ms("not cron", tick), None);
    }
}
