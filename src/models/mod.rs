//! The metering model gateway: a run calls the model providers of `[models]` through the
//! director with a per-run key (`ANTHROPIC_API_KEY` / `OPENAI_API_KEY` in its environment),
//! which only this gateway takes and only while the run is active. The gateway forwards
//! with the provider's real key, passes streamed answers through as they arrive, reads the
//! usage of every answer from the answer itself, prices it, records it (per run, repository
//! and day, in the store every replica shares) and refuses, in the provider's own error
//! shape, a request of a run whose budget is spent.

mod ledger;
mod meter;
mod model_gateway;
pub mod policy;
pub mod usage;

pub use model_gateway::ModelGateway;

use std::collections::BTreeMap;
use std::sync::Arc;

use actix_web::HttpResponse;
use actix_web::http::StatusCode;
use serde_json::json;

use crate::domain::{RepoName, RunId};
use crate::settings::{BudgetSettings, Price, Secret};
use usage::{Api, Usage};

/// The providers runs may call, as named in their gateway path (`/<provider>/...`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Provider {
    Anthropic,
    Openai,
}

impl Provider {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Anthropic => "anthropic",
            Self::Openai => "openai",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "anthropic" => Some(Self::Anthropic),
            "openai" => Some(Self::Openai),
            _ => None,
        }
    }

    /// The API a route of this provider meters, or `None` for a route it cannot meter.
    fn metered(self, route: &str) -> Option<Api> {
        match (self, route) {
            (Self::Anthropic, "v1/messages") => Some(Api::AnthropicMessages),
            (Self::Openai, "chat/completions") => Some(Api::OpenaiChat),
            (Self::Openai, "responses") => Some(Api::OpenaiResponses),
            _ => None,
        }
    }

    /// Routes that cost nothing and are forwarded without metering.
    fn free(self, route: &str) -> bool {
        matches!((self, route), (Self::Anthropic, "v1/messages/count_tokens"))
    }

    /// An error in this provider's own shape, so an agent's SDK reads it as the provider's.
    fn error(self, status: StatusCode, kind: &str, message: &str) -> HttpResponse {
        let body = match self {
            Self::Anthropic => json!({
                "type": "error",
                "error": { "type": kind, "message": message },
            }),
            Self::Openai => json!({
                "error": { "message": message, "type": kind, "param": null, "code": kind },
            }),
        };
        HttpResponse::build(status)
            .content_type("application/json")
            // The SDKs retry 429s unless told not to: a spent budget does not come back.
            .insert_header(("x-should-retry", "false"))
            .body(body.to_string())
    }
}

/// One provider as the gateway forwards to it.
#[derive(Clone, Debug)]
pub struct Upstream {
    pub base_url: String,
    pub api_key: Secret,
}

/// What one call used, as the gateway records it.
#[derive(Clone, Debug, PartialEq)]
pub struct Metered {
    /// `None` for the director's own calls (the pre-flight).
    pub run_id: Option<RunId>,
    pub repo: RepoName,
    /// The issue a pre-flight read (a run's issue is its run's).
    pub issue: Option<u64>,
    pub provider: Provider,
    pub model: String,
    pub usage: Usage,
    /// In dollars; `None` when the model has no price.
    pub cost_usd: Option<f64>,
    pub at_ms: i64,
}

/// What has been spent, in dollars, against each budget.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Spent {
    pub run: f64,
    pub repo_day: f64,
    pub day: f64,
}

pub use crate::domain::units::dollars;

/// Which budget a request would cross, and the message the agent reads.
pub fn over_budget(budget: &BudgetSettings, spent: &Spent) -> Option<(&'static str, String)> {
    let checks = [
        ("budget.run_usd", "this run's", budget.run_usd, spent.run),
        (
            "budget.repo_daily_usd",
            "this repository's daily",
            budget.repo_daily_usd,
            spent.repo_day,
        ),
        ("budget.daily_usd", "the daily", budget.daily_usd, spent.day),
    ];
    checks
        .into_iter()
        .find(|(_, _, limit, used)| *limit > 0.0 && used >= limit)
        .map(|(key, whose, limit, used)| {
            (
                key,
                format!(
                    "the director's budget is spent: {whose} budget of {} ({key}) has {} spent; no more model calls",
                    dollars(limit, 2),
                    dollars(used, 4)
                ),
            )
        })
}

/// Whether the day's budgets leave `repo` nothing today (the run's own budget aside): what
/// waits, and why, in words for the status.
pub fn day_spent(budget: &BudgetSettings, spent: &Spent, repo: &RepoName) -> Option<String> {
    let daily = BudgetSettings {
        run_usd: 0.0,
        ..budget.clone()
    };
    over_budget(&daily, spent).map(|(key, _)| match key {
        "budget.repo_daily_usd" => format!(
            "the day's model budget for {repo} ({}, budget.repo_daily_usd) is spent",
            dollars(budget.repo_daily_usd, 2)
        ),
        _ => format!(
            "the day's model budget ({}, budget.daily_usd) is spent",
            dollars(budget.daily_usd, 2)
        ),
    })
}

/// The next UTC midnight after `at_ms`, when the day's budgets start over.
pub fn next_day_ms(at_ms: i64) -> i64 {
    const DAY_MS: i64 = 24 * 60 * 60 * 1000;
    (at_ms.div_euclid(DAY_MS) + 1) * DAY_MS
}

/// The UTC day of `at_ms`, as budgets count it: `YYYY-MM-DD`.
pub fn day_of(at_ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(at_ms)
        .unwrap_or_default()
        .format("%Y-%m-%d")
        .to_string()
}

/// Where the gateway learns about runs and leaves what it metered.
#[async_trait::async_trait]
pub trait Runs: Send + Sync {
    /// The run's repository and own budget, if the run exists and has not ended; `Err` when
    /// it cannot be said now.
    async fn active(&self, run_id: &RunId) -> Result<Option<ActiveRun>, String>;
    /// What the run, its repository today and everything today have spent.
    async fn spent(&self, run_id: &RunId, repo: &RepoName, day: &str) -> Result<Spent, String>;
    /// Stores what a call used; `Err` when it could not be stored now (it is tried again).
    async fn record(&self, metered: &Metered) -> Result<(), String>;
    /// The run was refused for its budget: it is to be stopped with its grace.
    async fn over_budget(&self, run_id: &RunId, why: &str);
    fn now_ms(&self) -> i64;
}

/// A run the gateway serves.
#[derive(Clone, Debug, PartialEq)]
pub struct ActiveRun {
    pub repo: RepoName,
    /// Its repository's `budget.run_usd` (`.director.toml`), when it set one.
    pub run_usd: Option<f64>,
    /// Its agent's profile and the providers that profile names (`agents.<name>.providers`),
    /// when it names some: the run's key opens those gateways alone.
    pub providers: Option<(String, Vec<Provider>)>,
    /// The budget of its own a writer's `/director continue` gave it, in place of
    /// `budget.run_usd` (the repository's and the day's still apply).
    pub continued_usd: Option<f64>,
}

/// Counters the gateway keeps.
#[derive(Clone)]
pub struct Counters {
    /// `director_model_tokens_total{provider,kind}`.
    pub tokens: prometheus::IntCounterVec,
    /// `director_model_cost_usd_total{repo}`.
    pub cost: prometheus::CounterVec,
    /// `director_model_requests_refused_total{reason}`.
    pub refused: prometheus::IntCounterVec,
    /// `director_model_usage_estimated_total{provider,reason}`: calls charged an estimate.
    pub estimated: prometheus::IntCounterVec,
    /// The repositories a `repo` label may name (the watched set), so it stays bounded.
    pub repos: Arc<dyn Fn(&RepoName) -> bool + Send + Sync>,
}

impl Counters {
    pub fn count(&self, m: &Metered) {
        let u = &m.usage;
        let p = m.provider.as_str();
        for (kind, n) in [
            ("input", u.input),
            ("cache_read", u.cache_read),
            ("cache_write", u.cache_write + u.cache_write_1h),
            ("output", u.output),
        ] {
            self.tokens.with_label_values(&[p, kind]).inc_by(n);
        }
        if let Some(cost) = m.cost_usd {
            let repo = if (self.repos)(&m.repo) {
                m.repo.to_string()
            } else {
                "other".to_owned()
            };
            self.cost.with_label_values(&[&repo]).inc_by(cost);
        }
    }
}

/// The gateway's settings.
pub struct Config {
    pub upstreams: BTreeMap<Provider, Upstream>,
    pub prices: BTreeMap<String, Price>,
    pub budget: BudgetSettings,
    pub allow_unmetered: bool,
    pub max_request_mb: u64,
    /// Request bodies' memory, time and per-run count, shared with the git gateway.
    pub requests: crate::git_gateway::request::Budget,
    /// What a call that names no output limit is reserved for, in output tokens.
    pub default_max_output_tokens: u64,
    /// What a request may ask the provider to do beyond answering.
    pub policy: policy::Policy,
    /// How long an answer the run hung up on is still read for its usage.
    pub drain: std::time::Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amounts_are_written_to_the_budgets_precision_never_rounded_under_it() {
        assert_eq!(dollars(0.005, 2), "$0.005");
        assert_eq!(dollars(1.0, 2), "$1.00");
        assert_eq!(dollars(2.5, 2), "$2.50");
        assert_eq!(dollars(0.009, 4), "$0.0090");
        assert_eq!(dollars(0.0045, 4), "$0.0045");
        // Just under a $0.005 budget reads as under it, not as $0.01 or $0.005.
        assert_eq!(dollars(0.004_999_9, 2), "$0.004999");
    }

    #[test]
    fn a_budget_is_crossed_once_what_was_spent_reaches_it() {
        let budget = BudgetSettings {
            run_usd: 1.0,
            repo_daily_usd: 5.0,
            daily_usd: 0.0,
            max_continue_usd: 0.0,
        };
        let under = Spent {
            run: 0.99,
            repo_day: 4.0,
            day: 100.0,
        };
        assert_eq!(over_budget(&budget, &under), None, "0 is no limit");
        let run = Spent { run: 1.0, ..under };
        let (key, why) = over_budget(&budget, &run).expect("over");
        assert_eq!(key, "budget.run_usd");
        assert!(
            why.contains("$1.00") && why.contains("budget.run_usd"),
            "{why}"
        );
        let repo = Spent {
            repo_day: 6.0,
            ..under
        };
        assert_eq!(
            over_budget(&budget, &repo).map(|x| x.0),
            Some("budget.repo_daily_usd")
        );
    }
}
