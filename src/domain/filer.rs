//! Filers: the forge accounts that file work for agents (`[filers.<name>]`), their rules,
//! and which issues are agent-filed. An explore box holds no credential; a broker outside it
//! files the issue and applies the trigger on its behalf, so the director tells an agent's
//! request from a maintainer's by the account that applied the trigger or authored it.

use serde::{Deserialize, Serialize};

use super::approval::Approval;
use super::same_login;

/// One filer's rules (`[filers.<name>]`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FilerRule {
    /// The forge accounts that file for this filer (a broker's account).
    #[serde(deserialize_with = "logins")]
    pub logins: Vec<String>,
    /// Whether its GOs wait for a maintainer's `/director go`; never looser than
    /// `preflight.approval`.
    pub approval: Approval,
    /// Issues taken to a pre-flight per UTC day (0: no limit).
    pub max_per_day: u32,
    /// Dollars its issues may spend per UTC day, within the day's budget (0: no limit).
    pub daily_usd: f64,
}

impl Default for FilerRule {
    fn default() -> Self {
        Self {
            logins: Vec::new(),
            approval: Approval::OverForecast,
            max_per_day: 0,
            daily_usd: 0.0,
        }
    }
}

fn logins<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    // A comma-separated string from the environment, or a TOML list.
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Either {
        One(String),
        Many(Vec<String>),
    }
    Ok(match Either::deserialize(d)? {
        Either::One(s) => s
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect(),
        Either::Many(v) => v,
    })
}

/// Who filed an agent's issue: the filer's name and the account it used.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Filed {
    /// `[filers.<name>]`.
    pub name: String,
    /// The forge account (the broker's) that applied the trigger or authored the issue.
    pub login: String,
    /// The writer whose `/director go` (or skip label) made the work a maintainer's: the
    /// filer's rules no longer hold it, and the outcomes count it as a maintainer's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub taken_by: Option<String>,
}

impl Filed {
    /// Still an agent's request: no maintainer made it theirs.
    pub fn is_agents(&self) -> bool {
        self.taken_by.is_none()
    }
}

/// What a filer has used of its day, as the pre-flight finds it before a read.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FilerDay {
    /// This issue was taken to a pre-flight already (a later read of it counts no more).
    pub taken_before: bool,
    /// Issues of the filer taken to a pre-flight today.
    pub taken_today: u32,
    /// Dollars its issues' model calls spent today.
    pub spent_usd: f64,
}

/// Every filer, by name.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Filers(pub std::collections::BTreeMap<String, FilerRule>);

impl Filers {
    /// The filer whose account `login` is.
    pub fn named_by(&self, login: &str) -> Option<Filed> {
        self.0.iter().find_map(|(name, rule)| {
            rule.logins
                .iter()
                .any(|l| same_login(l, login))
                .then(|| Filed {
                    name: name.clone(),
                    login: login.to_owned(),
                    taken_by: None,
                })
        })
    }

    /// Whether the issue is agent-filed: a filer's account applied the trigger (`actor`),
    /// else authored it.
    pub fn filed(&self, actor: Option<&str>, author: Option<&str>) -> Option<Filed> {
        actor
            .and_then(|a| self.named_by(a))
            .or_else(|| author.and_then(|a| self.named_by(a)))
    }

    /// Whether `login` files for an agent (its word is never a maintainer's).
    pub fn is_filer(&self, login: &str) -> bool {
        self.named_by(login).is_some()
    }

    pub fn rule(&self, name: &str) -> Option<&FilerRule> {
        self.0.get(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filers() -> Filers {
        let mut map = std::collections::BTreeMap::new();
        map.insert(
            "ward".to_owned(),
            FilerRule {
                logins: vec!["ward-broker".into()],
                ..FilerRule::default()
            },
        );
        Filers(map)
    }

    #[test]
    fn the_labeller_counts_first_then_the_author() {
        let f = filers();
        assert_eq!(
            f.filed(Some("Ward-Broker"), Some("alice")).map(|f| f.name),
            Some("ward".into()),
            "logins compare without case"
        );
        assert_eq!(
            f.filed(Some("alice"), Some("ward-broker")).map(|f| f.login),
            Some("ward-broker".into()),
            "authored by the broker, labelled by a writer: still agent-filed"
        );
        assert_eq!(f.filed(Some("alice"), Some("bob")), None);
        assert_eq!(f.filed(None, None), None);
        assert!(!f.is_filer(""));
    }

    #[test]
    fn the_default_approval_is_over_the_forecast() {
        assert_eq!(FilerRule::default().approval, Approval::OverForecast);
    }
}
