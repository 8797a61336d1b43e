//! A run's likely cost and duration, from the finished runs the director keeps. The method,
//! stated so a maintainer can judge it (also in `docs/forecast.md`):
//!
//! - the sample: finished runs that started a container (succeeded, failed, timed out, over
//!   budget, declined), newest first, at most [`MAX_SAMPLES`]; a cost only where every call
//!   was metered and priced;
//! - rows that cannot be right are left out and counted: a negative or absurd cost (over
//!   [`MAX_COST_USD`]), a negative duration or one over [`MAX_SECS`];
//! - the same kind of run (a first run, or a follow-up), of the same agent when at least
//!   [`MIN_RUNS`] of those exist, in this repository when it has at least [`MIN_RUNS`],
//!   else across this and the public repositories (and saying so: no comment rests on
//!   the runs of a private repository its readers cannot see);
//! - the range: the median and the 90th percentile (nearest rank), of cost and of wall time
//!   apart.

use serde::{Deserialize, Serialize};

/// The fewest runs a forecast rests on.
pub const MIN_RUNS: usize = 5;
/// The most runs read, newest first.
pub const MAX_SAMPLES: usize = 500;
/// A run's cost above this is taken for a corrupt row.
pub const MAX_COST_USD: f64 = 1_000.0;
/// A run's wall time above this (a week) is taken for a corrupt row.
pub const MAX_SECS: i64 = 7 * 24 * 3_600;

/// One finished run, as the store keeps it.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub repo: String,
    pub followup: bool,
    pub agent: Option<String>,
    /// Metered and priced, every call; `None`: not known.
    pub cost_usd: Option<f64>,
    pub secs: i64,
}

/// Where a forecast's runs came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Basis {
    /// This repository's own runs.
    Repository,
    /// Too few here: every repository's.
    AllRepositories,
    /// No finished run yet.
    NoHistory,
    /// The finished runs could not be read: no forecast, and the GO goes on.
    Unavailable,
}

/// A forecast: a range of cost (micro-dollars, so records stay comparable) and of wall time.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Forecast {
    pub basis: Basis,
    /// Runs the wall time rests on.
    pub runs: usize,
    /// Runs the cost rests on (metered ones).
    pub costed_runs: usize,
    /// Runs of this repository, when the forecast had to look wider.
    #[serde(default)]
    pub repo_runs: usize,
    /// A follow-up's forecast, or a first run's.
    pub followup: bool,
    /// The agent whose runs it rests on alone, when there were enough.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_median_micros: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_high_micros: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secs_median: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secs_high: Option<i64>,
    /// Rows left out as impossible (negative or absurd cost or duration).
    #[serde(default)]
    pub ignored: usize,
}

fn sane(s: &Sample) -> bool {
    s.secs >= 0
        && s.secs <= MAX_SECS
        && s.cost_usd
            .is_none_or(|c| c.is_finite() && (0.0..=MAX_COST_USD).contains(&c))
}

/// The value at quantile `q` (0..=1) of sorted `values`, by nearest rank.
fn nearest_rank<T: Copy>(sorted: &[T], q: f64) -> Option<T> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// `pool` narrowed to `agent`'s runs, when there are enough of them.
fn narrow<'a>(pool: Vec<&'a Sample>, agent: Option<&str>) -> (Vec<&'a Sample>, Option<String>) {
    if let Some(agent) = agent {
        let same: Vec<&Sample> = pool
            .iter()
            .copied()
            .filter(|s| s.agent.as_deref() == Some(agent))
            .collect();
        if same.len() >= MIN_RUNS {
            return (same, Some(agent.to_owned()));
        }
    }
    (pool, None)
}

/// The forecast of a run in `repo` (`followup` or a first run, by `agent` when known).
pub fn forecast(samples: &[Sample], repo: &str, followup: bool, agent: Option<&str>) -> Forecast {
    let ignored = samples.iter().filter(|s| !sane(s)).count();
    let kind: Vec<&Sample> = samples
        .iter()
        .filter(|s| sane(s) && s.followup == followup)
        .collect();
    let here: Vec<&Sample> = kind.iter().copied().filter(|s| s.repo == repo).collect();
    let repo_runs = here.len();
    let (basis, (pool, agent)) = if repo_runs >= MIN_RUNS {
        (Basis::Repository, narrow(here, agent))
    } else if !kind.is_empty() {
        (Basis::AllRepositories, narrow(kind, agent))
    } else {
        (Basis::NoHistory, (Vec::new(), None))
    };
    let mut secs: Vec<i64> = pool.iter().map(|s| s.secs).collect();
    secs.sort_unstable();
    let mut costs: Vec<u64> = pool
        .iter()
        .filter_map(|s| s.cost_usd)
        .map(|c| (c * 1e6).round() as u64)
        .collect();
    costs.sort_unstable();
    Forecast {
        basis,
        runs: secs.len(),
        costed_runs: costs.len(),
        repo_runs: if basis == Basis::Repository {
            0
        } else {
            repo_runs
        },
        followup,
        agent,
        cost_median_micros: nearest_rank(&costs, 0.5),
        cost_high_micros: nearest_rank(&costs, 0.9),
        secs_median: nearest_rank(&secs, 0.5),
        secs_high: nearest_rank(&secs, 0.9),
        ignored,
    }
}

/// Dollars from micro-dollars, as everywhere else the director writes an amount.
pub fn dollars(micros: u64) -> String {
    super::units::dollars(micros as f64 / 1e6, 2)
}

pub use super::units::duration;

impl Forecast {
    /// No forecast this time: the history could not be read.
    pub fn unavailable() -> Self {
        Self {
            basis: Basis::Unavailable,
            runs: 0,
            costed_runs: 0,
            repo_runs: 0,
            followup: false,
            agent: None,
            cost_median_micros: None,
            cost_high_micros: None,
            secs_median: None,
            secs_high: None,
            ignored: 0,
        }
    }

    /// The forecast in a sentence, for the GO comment and the report.
    pub fn describe(&self) -> String {
        match self.basis {
            Basis::NoHistory => {
                return "no history yet: no finished run to forecast from".to_owned();
            }
            Basis::Unavailable => {
                return "none this time: the finished runs could not be read (the director's log says why); the GO stands".to_owned();
            }
            Basis::Repository | Basis::AllRepositories => {}
        }
        let cost = match (self.cost_median_micros, self.cost_high_micros) {
            (Some(m), Some(h)) => format!(
                "{} (median) to {} (90th percentile)",
                dollars(m),
                dollars(h)
            ),
            _ => "cost not known (no metered run)".to_owned(),
        };
        let time = match (self.secs_median, self.secs_high) {
            (Some(m), Some(h)) => format!("{} to {}", duration(m), duration(h)),
            _ => "time not known".to_owned(),
        };
        let kind = if self.followup {
            "follow-up runs"
        } else {
            "first runs"
        };
        let agent = self
            .agent
            .as_ref()
            .map(|a| format!(" of `{a}`"))
            .unwrap_or_default();
        let whence = match self.basis {
            Basis::Repository => format!("{} finished {kind}{agent} in this repository", self.runs),
            _ => format!(
                "{} finished {kind}{agent} in this and the public repositories (this one has {}, fewer than {MIN_RUNS})",
                self.runs, self.repo_runs
            ),
        };
        let metered = if self.costed_runs < self.runs && self.costed_runs > 0 {
            format!(", the cost on the {} metered", self.costed_runs)
        } else {
            String::new()
        };
        let ignored = if self.ignored > 0 {
            format!("; {} impossible row(s) left out", self.ignored)
        } else {
            String::new()
        };
        format!("{cost}, {time}; from {whence}{metered}{ignored}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(repo: &str, cost: f64, secs: i64) -> Sample {
        Sample {
            repo: repo.into(),
            followup: false,
            agent: None,
            cost_usd: Some(cost),
            secs,
        }
    }

    #[test]
    fn a_repository_with_history_gets_its_own_median_and_high_end() {
        let samples: Vec<Sample> = (1..=10)
            .map(|n| sample("acme/widgets", n as f64 / 10.0, n * 60))
            .chain((1..=10).map(|_| sample("acme/other", 50.0, 9_000)))
            .collect();
        let f = forecast(&samples, "acme/widgets", false, None);
        assert_eq!(f.basis, Basis::Repository);
        assert_eq!((f.runs, f.costed_runs), (10, 10));
        assert_eq!(f.cost_median_micros, Some(500_000));
        assert_eq!(f.cost_high_micros, Some(900_000));
        assert_eq!((f.secs_median, f.secs_high), (Some(300), Some(540)));
        assert_eq!(
            f.describe(),
            "$0.50 (median) to $0.90 (90th percentile), 5m 00s to 9m 00s; from 10 finished first runs in this repository"
        );
    }

    #[test]
    fn too_few_here_falls_back_to_every_repository_and_says_so() {
        let samples = vec![
            sample("acme/widgets", 1.0, 600),
            sample("acme/other", 2.0, 600),
            sample("acme/other", 3.0, 600),
            sample("acme/other", 4.0, 600),
            sample("acme/other", 5.0, 600),
        ];
        let f = forecast(&samples, "acme/widgets", false, None);
        assert_eq!(f.basis, Basis::AllRepositories);
        assert_eq!((f.runs, f.repo_runs), (5, 1));
        assert!(
            f.describe()
                .contains("in this and the public repositories (this one has 1, fewer than 5)"),
            "{}",
            f.describe()
        );
        assert!(
            Forecast::unavailable()
                .describe()
                .contains("could not be read")
        );
        let none = forecast(&[], "acme/widgets", false, None);
        assert_eq!(none.basis, Basis::NoHistory);
        assert_eq!(
            none.describe(),
            "no history yet: no finished run to forecast from"
        );
    }

    #[test]
    fn corrupt_rows_are_left_out_and_counted_never_averaged() {
        let mut samples: Vec<Sample> = (0..5).map(|_| sample("a/b", 1.0, 600)).collect();
        samples.push(sample("a/b", -5.0, 600));
        samples.push(sample("a/b", f64::NAN, 600));
        samples.push(sample("a/b", 1e9, 600));
        samples.push(sample("a/b", 1.0, -3));
        samples.push(sample("a/b", 1.0, 10 * MAX_SECS));
        let f = forecast(&samples, "a/b", false, None);
        assert_eq!((f.runs, f.ignored), (5, 5));
        assert_eq!(f.cost_high_micros, Some(1_000_000));
        assert!(f.describe().contains("5 impossible row(s) left out"));
    }

    #[test]
    fn the_same_agent_and_kind_when_there_are_enough() {
        let mut samples: Vec<Sample> = (0..6)
            .map(|_| Sample {
                agent: Some("aider".into()),
                ..sample("a/b", 0.1, 60)
            })
            .collect();
        samples.extend((0..6).map(|_| Sample {
            agent: Some("claude-code".into()),
            ..sample("a/b", 2.0, 600)
        }));
        samples.extend((0..6).map(|_| Sample {
            followup: true,
            ..sample("a/b", 9.0, 60)
        }));
        let f = forecast(&samples, "a/b", false, Some("claude-code"));
        assert_eq!(f.agent.as_deref(), Some("claude-code"));
        assert_eq!(f.cost_median_micros, Some(2_000_000));
        let f = forecast(&samples, "a/b", true, Some("claude-code"));
        assert_eq!((f.agent, f.runs), (None, 6), "too few of that agent");
        assert_eq!(f.cost_median_micros, Some(9_000_000));
    }

    #[test]
    fn amounts_and_durations_read_as_people_write_them() {
        assert_eq!(dollars(420_000), "$0.42");
        assert_eq!(dollars(3_100), "$0.0031");
        assert_eq!(dollars(12_500_000), "$12.50");
        assert_eq!(duration(720), "12m 00s");
    }
}
