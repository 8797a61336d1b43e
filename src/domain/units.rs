//! Amounts and durations as people read them, the same wherever the director writes one:
//! comments, reports, the status page, model gateway refusals.

/// Dollars as a budget is written: every decimal the amount has (up to six), and at least
/// `min` (rounded down past six, so a spent budget never reads as under its limit).
pub fn dollars(usd: f64, min: usize) -> String {
    // The epsilon undoes binary fractions (0.0045 is 0.00449999…), never a real amount.
    let micro = (usd * 1_000_000.0 + 1e-6).floor();
    let mut text = format!("{:.6}", micro / 1_000_000.0);
    let keep = text.find('.').map_or(text.len(), |dot| dot + 1 + min);
    while text.len() > keep && text.ends_with('0') {
        text.pop();
    }
    format!("${text}")
}

/// `1h 02m`, `3m 20s`, `45s`.
pub fn duration(secs: i64) -> String {
    match secs {
        s if s >= 3600 => format!("{}h {:02}m", s / 3600, (s % 3600) / 60),
        s if s >= 60 => format!("{}m {:02}s", s / 60, s % 60),
        s => format!("{s}s"),
    }
}
