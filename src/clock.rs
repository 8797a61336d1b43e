//! Wall-clock time in one place, so pure code can take `now` as an argument instead.

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}
