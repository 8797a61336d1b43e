//! Approval when asked: whether a GO waits for a writer's `/director go` before its run
//! starts (`preflight.approval`, made only stricter by a repository's `.director.toml`), and
//! what the waiting issue waits for.

use serde::{Deserialize, Serialize};

use super::forecast::{Forecast, dollars};

/// `preflight.approval`: from the least strict to the strictest.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Approval {
    /// A GO is queued at once.
    #[default]
    Never,
    /// A GO waits when its forecast's high end is over the run budget (`budget.run_usd`).
    OverForecast,
    /// Every GO waits.
    Always,
}

impl Approval {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Never => "never",
            Self::OverForecast => "over_forecast",
            Self::Always => "always",
        }
    }
}

/// A GO waiting for approval: the read's hash it binds, and why it waits.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Awaiting {
    /// The hash of the text (and so the plan) the GO comment showed: a `/director go`
    /// approves exactly that.
    pub hash: String,
    /// Why it waits, in words.
    pub why: String,
    /// SHA-256 of the title and body as the forge showed them when the GO asked
    /// ([`text_sha`]): an edit since (by anyone, read or left out) is not what the ask
    /// showed, and a go then asks again. `None` in a record from before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text_sha: Option<String>,
    /// The text changed after an earlier ask of this GO: who changed it, when the forge
    /// said (`Some(None)`: it did not). Said in the renewed ask.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edited: Option<Option<String>>,
    /// [`text_sha`] of the trusted title and body the GO read and showed: the only text a
    /// go said while it waits vouches for (a reader's edit it listed as left out is not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shown_sha: Option<String>,
}

/// An edit of the title or body as a delivery told it: the text it made, and who.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Edit {
    pub text_sha: String,
    pub by: String,
}

/// SHA-256 of an issue's title and body, to tell one text from another.
pub fn text_sha(title: &str, body: &str) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(title.as_bytes());
    h.update([0]);
    h.update(body.as_bytes());
    hex::encode(h.finalize())
}

/// The sentence a renewed ask adds when the text changed since the last ask.
pub fn edited_sentence(by: Option<&str>) -> String {
    match by {
        Some(login) => format!(
            "The issue's text was changed after this GO last asked for approval, by `{login}` (the forge's login): a `/director go` said before this ask approved nothing"
        ),
        None => "The issue's text was changed after this GO last asked for approval, by an account the forge did not name (Forgejo's timeline records no body edits): a `/director go` said before this ask approved nothing".to_owned(),
    }
}

/// Why a GO must wait for approval, or `None` when it need not. `repository` may only make
/// the operator's setting stricter; `run_usd` is the run budget (0: none).
pub fn needs(
    operator: Approval,
    repository: Option<Approval>,
    forecast: Option<&Forecast>,
    run_usd: f64,
) -> Option<String> {
    let setting = operator.max(repository.unwrap_or_default());
    let whose = if repository.is_some_and(|r| r > operator) {
        "the repository's `.director.toml`"
    } else {
        "the operator's"
    };
    match setting {
        Approval::Never => None,
        Approval::Always => Some(format!(
            "every GO waits for a maintainer's approval (`preflight.approval = \"always\"`, {whose})"
        )),
        Approval::OverForecast => {
            let high = forecast.and_then(|f| f.cost_high_micros)?;
            let budget_micros = (run_usd.max(0.0) * 1e6).round() as u64;
            (run_usd > 0.0 && high > budget_micros).then(|| {
                format!(
                    "the forecast's high end, {}, is over the run budget `budget.run_usd`, {} (`preflight.approval = \"over_forecast\"`, {whose})",
                    dollars(high),
                    dollars(budget_micros)
                )
            })
        }
    }
}

/// [`needs`] for an agent-filed issue: the filer's own rule (`filers.<name>.approval`)
/// joins the operator's and the repository's, and the strictest of the three holds.
pub fn needs_filed(
    filer: (&str, Approval),
    operator: Approval,
    repository: Option<Approval>,
    forecast: Option<&Forecast>,
    run_usd: f64,
) -> Option<String> {
    let (name, own) = filer;
    let others = operator.max(repository.unwrap_or_default());
    if own <= others {
        return needs(operator, repository, forecast, run_usd);
    }
    let key = format!("`filers.{name}.approval = \"{}\"`", own.as_str());
    match own {
        Approval::Never => None,
        Approval::Always => Some(format!(
            "an agent asked for this work, and every GO its filer files waits for a maintainer's approval ({key})"
        )),
        Approval::OverForecast => {
            let high = forecast.and_then(|f| f.cost_high_micros)?;
            let budget_micros = (run_usd.max(0.0) * 1e6).round() as u64;
            (run_usd > 0.0 && high > budget_micros).then(|| {
                format!(
                    "an agent asked for this work, and the forecast's high end, {}, is over the run budget `budget.run_usd`, {} ({key})",
                    dollars(high),
                    dollars(budget_micros)
                )
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::forecast::{Sample, forecast};

    fn costing(high: f64) -> Forecast {
        let samples: Vec<Sample> = (0..10)
            .map(|_| Sample {
                repo: "a/b".into(),
                followup: false,
                agent: None,
                cost_usd: Some(high),
                secs: 60,
            })
            .collect();
        forecast(&samples, "a/b", false, None)
    }

    #[test]
    fn never_always_and_over_the_forecast() {
        let f = costing(2.5);
        assert_eq!(needs(Approval::Never, None, Some(&f), 1.0), None);
        assert!(
            needs(Approval::Always, None, None, 0.0)
                .is_some_and(|w| w.contains("\"always\"") && w.contains("the operator's"))
        );
        let why = needs(Approval::OverForecast, None, Some(&f), 1.0).expect("waits");
        assert!(
            why.contains("$2.50") && why.contains("$1.00"),
            "both figures: {why}"
        );
        // Under the budget, no budget, or no forecast: it need not wait.
        assert_eq!(
            needs(Approval::OverForecast, None, Some(&costing(0.5)), 1.0),
            None
        );
        assert_eq!(needs(Approval::OverForecast, None, Some(&f), 0.0), None);
        assert_eq!(needs(Approval::OverForecast, None, None, 1.0), None);
    }

    #[test]
    fn a_filer_rule_only_makes_it_stricter() {
        let why = needs_filed(("ward", Approval::Always), Approval::Never, None, None, 0.0)
            .expect("waits");
        assert!(why.contains("filers.ward.approval"), "{why}");
        // The operator's stricter setting holds over the filer's looser one.
        assert!(
            needs_filed(("ward", Approval::Never), Approval::Always, None, None, 0.0)
                .is_some_and(|w| w.contains("preflight.approval"))
        );
        let f = costing(2.5);
        assert!(
            needs_filed(
                ("ward", Approval::OverForecast),
                Approval::Never,
                None,
                Some(&f),
                1.0
            )
            .is_some_and(|w| w.contains("an agent asked") && w.contains("$2.50"))
        );
        assert_eq!(
            needs_filed(
                ("ward", Approval::OverForecast),
                Approval::Never,
                None,
                Some(&f),
                0.0
            ),
            None
        );
    }

    #[test]
    fn a_repository_may_only_make_it_stricter() {
        assert!(
            needs(Approval::Never, Some(Approval::Always), None, 0.0)
                .is_some_and(|w| w.contains("the repository's"))
        );
        assert!(needs(Approval::Always, Some(Approval::Never), None, 0.0).is_some());
    }
}
