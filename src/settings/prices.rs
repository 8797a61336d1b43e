//! The prices a model call is counted at: the operator's `[models.prices]`, and beneath it
//! the table of the providers' current models kept in `config/prices.toml` (with the date it
//! was checked and its sources), so a budget works on the first run.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use super::Price;

/// `config/prices.toml`, as built into the binary.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Table {
    /// When the table was checked against the providers' pages (`YYYY-MM-DD`).
    pub checked: String,
    pub sources: Vec<String>,
    pub prices: BTreeMap<String, Price>,
}

/// The built-in table (empty should it not read: a test keeps it readable).
pub fn builtin() -> &'static Table {
    static TABLE: OnceLock<Table> = OnceLock::new();
    TABLE.get_or_init(|| {
        toml::from_str(include_str!("../../config/prices.toml")).unwrap_or_else(|e| {
            tracing::error!(error = %e, "the built-in price table does not read");
            Table {
                checked: String::new(),
                sources: Vec::new(),
                prices: BTreeMap::new(),
            }
        })
    })
}

/// The price of `model`: the operator's, else the built-in table's; each by the name the
/// request gives, then without a date suffix (`-20251001`).
pub fn price_of(operator: &BTreeMap<String, Price>, model: &str) -> Option<Price> {
    let undated = undated(model);
    [operator, &builtin().prices]
        .into_iter()
        .find_map(|table| {
            table
                .get(model)
                .or_else(|| undated.and_then(|m| table.get(m)))
        })
        .cloned()
}

/// `model` without a trailing `-YYYYMMDD`, if it has one.
fn undated(model: &str) -> Option<&str> {
    let (head, tail) = model.rsplit_once('-')?;
    (tail.len() == 8 && tail.bytes().all(|b| b.is_ascii_digit())).then_some(head)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_built_in_table_reads_and_prices_both_providers_current_models() {
        let t = builtin();
        assert!(
            chrono::NaiveDate::parse_from_str(&t.checked, "%Y-%m-%d").is_ok(),
            "{}",
            t.checked
        );
        assert!(!t.sources.is_empty());
        for model in [
            "claude-opus-4-7",
            "claude-sonnet-4-6",
            "claude-haiku-4-5",
            "gpt-5",
            "gpt-5-mini",
        ] {
            let p = t.prices.get(model).unwrap_or_else(|| panic!("{model}"));
            assert!(
                p.input_per_mtok > 0.0 && p.output_per_mtok >= p.input_per_mtok,
                "{model}"
            );
        }
    }

    #[test]
    fn the_operators_price_wins_and_a_dated_name_finds_its_model() {
        let mine = Price {
            input_per_mtok: 1.0,
            output_per_mtok: 2.0,
            ..Price::default()
        };
        let operator = BTreeMap::from([("claude-opus-4-7".to_owned(), mine.clone())]);
        assert_eq!(price_of(&operator, "claude-opus-4-7"), Some(mine));
        let builtin = price_of(&BTreeMap::new(), "claude-opus-4-7").expect("built in");
        assert_eq!(builtin.output_per_mtok, 25.0);
        assert_eq!(
            price_of(&BTreeMap::new(), "claude-haiku-4-5-20251001"),
            price_of(&BTreeMap::new(), "claude-haiku-4-5")
        );
        assert_eq!(
            price_of(&BTreeMap::new(), "claude-opus-4"),
            None,
            "no guessing"
        );
        assert_eq!(price_of(&BTreeMap::new(), "my-local-model"), None);
    }
}
