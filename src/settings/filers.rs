//! `[filers.<name>]`: the forge accounts that file work for agents, checked at start. A
//! filer's account is never the director's own (the bot, the runner): a run holds no
//! credential to file with, and the bot's labels are the director's.

use super::{Settings, SettingsError, invalid};
use crate::domain::filer::Filers;
use crate::domain::same_login;

impl Settings {
    /// The filers, for the decisions and the pre-flight.
    pub fn filer_rules(&self) -> Filers {
        Filers(self.filers.clone())
    }

    pub(super) fn validate_filers(&self) -> Result<(), SettingsError> {
        let own = [
            (
                "forge.bot_login",
                self.forge.bot_login.as_deref().unwrap_or(""),
            ),
            ("forge.runner_login", self.forge.runner_login.as_str()),
        ];
        let mut seen: Vec<(&str, &str)> = Vec::new();
        for (name, rule) in &self.filers {
            if !super::agents::valid_name(name) {
                return Err(invalid(
                    "filers",
                    format!(
                        "`{name}` is not a filer name (lower-case letters, digits, `-`, `_`, `.`; at most 40)"
                    ),
                ));
            }
            let logins: Vec<&str> = rule
                .logins
                .iter()
                .map(|l| l.trim())
                .filter(|l| !l.is_empty())
                .collect();
            if logins.is_empty() {
                return Err(invalid(
                    "filers",
                    format!("`filers.{name}.logins` is empty: name the accounts that file for it"),
                ));
            }
            for login in logins {
                if let Some((key, _)) = own.iter().find(|(_, o)| same_login(o, login)) {
                    return Err(invalid(
                        "filers",
                        format!(
                            "`filers.{name}.logins` names `{login}`, the director's own account ({key}): the director's accounts never file work"
                        ),
                    ));
                }
                if let Some((other, _)) = seen.iter().find(|(_, l)| same_login(l, login)) {
                    return Err(invalid(
                        "filers",
                        format!(
                            "`filers.{name}.logins` names `{login}`, already a login of `filers.{other}`"
                        ),
                    ));
                }
                seen.push((name, login));
            }
            if !rule.daily_usd.is_finite() || rule.daily_usd < 0.0 {
                return Err(invalid(
                    "filers",
                    format!("`filers.{name}.daily_usd` must be 0 (no limit) or more"),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::settings::Settings;

    fn load(toml: &str) -> Result<Settings, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let path = dir.path().join("director.toml");
        std::fs::write(&path, toml).map_err(|e| e.to_string())?;
        Settings::load_from(Some(&path), Vec::new()).map_err(|e| e.to_string())
    }

    #[test]
    fn a_filer_with_its_rules_loads() {
        let s = load(
            "[filers.ward]\nlogins = [\"ward-broker\"]\napproval = \"always\"\nmax_per_day = 2\ndaily_usd = 5.0\n",
        )
        .expect("loads");
        let f = s.filer_rules();
        let filed = f.named_by("ward-broker").expect("a filer");
        assert_eq!(filed.name, "ward");
        let rule = f.rule("ward").expect("its rule");
        assert_eq!(rule.max_per_day, 2);
        assert_eq!(rule.approval, crate::domain::approval::Approval::Always);
    }

    #[test]
    fn bad_filers_are_refused_naming_the_key() {
        let cases = [
            ("[filers.ward]\n", "filers.ward.logins"),
            ("[filers.ward]\nlogins = []\n", "filers.ward.logins"),
            (
                "[forge]\nrunner_login = \"runner\"\n[filers.ward]\nlogins = [\"Runner\"]\n",
                "forge.runner_login",
            ),
            (
                "[forge]\nbot_login = \"director\"\n[filers.ward]\nlogins = [\"director\"]\n",
                "forge.bot_login",
            ),
            (
                "[filers.ward]\nlogins = [\"b\"]\nmax_per_hour = 3\n",
                "max_per_hour",
            ),
            (
                "[filers.ward]\nlogins = [\"b\"]\napproval = \"sometimes\"\n",
                "sometimes",
            ),
            (
                "[filers.ward]\nlogins = [\"b\"]\ndaily_usd = -1.0\n",
                "filers.ward.daily_usd",
            ),
            (
                "[filers.a]\nlogins = [\"b\"]\n[filers.c]\nlogins = [\"B\"]\n",
                "filers.a",
            ),
        ];
        for (toml, key) in cases {
            let err = load(toml).expect_err(toml);
            assert!(err.contains(key), "{toml}: {err}");
            assert!(err.contains("filers"), "{toml}: {err}");
        }
    }
}
