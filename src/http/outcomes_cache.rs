//! `/status/outcomes` from a cache: each window's page (one for the status token, one for
//! everyone else) is computed at most once per [`OUTCOMES_TTL`], and requests that find it
//! stale while it is being computed wait for that one computation instead of starting their
//! own. The page is anyone's to ask for and its queries read the whole window, so without
//! this a flood of anonymous requests would keep the store busy and hold up intake.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a computed page is served before it is computed again.
pub const OUTCOMES_TTL: Duration = Duration::from_secs(15);

/// One page: when it was computed, and its HTML.
type Slot = Arc<tokio::sync::Mutex<Option<(Instant, Arc<String>)>>>;

/// The pages, by (window in days, whether the status token was shown). The windows are the
/// few `/status/outcomes` offers, so the map stays small.
#[derive(Default)]
pub struct OutcomesCache {
    slots: Mutex<HashMap<(u32, bool), Slot>>,
    computed: std::sync::atomic::AtomicU64,
}

impl OutcomesCache {
    /// The page for `key`, computed by `compute` when there is none fresh. Concurrent callers
    /// of one key share one computation; an error is not kept (the next caller tries again).
    pub async fn get<E, F, Fut>(&self, key: (u32, bool), compute: F) -> Result<Arc<String>, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<String, E>>,
    {
        let slot = {
            let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
            slots.entry(key).or_default().clone()
        };
        let mut page = slot.lock().await;
        if let Some((at, html)) = page.as_ref()
            && at.elapsed() < OUTCOMES_TTL
        {
            return Ok(html.clone());
        }
        let html = Arc::new(compute().await?);
        self.computed
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        *page = Some((Instant::now(), html.clone()));
        Ok(html)
    }

    /// How many pages were computed (not served from the cache) since the start.
    pub fn computed(&self) -> u64 {
        self.computed.load(std::sync::atomic::Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test]
    async fn concurrent_misses_share_one_computation_and_an_error_is_not_kept() {
        let cache = Arc::new(OutcomesCache::default());
        let calls = Arc::new(AtomicU32::new(0));
        let gate = Arc::new(tokio::sync::Notify::new());
        let mut waiting = Vec::new();
        for _ in 0..20 {
            let (cache, calls, gate) = (cache.clone(), calls.clone(), gate.clone());
            waiting.push(tokio::spawn(async move {
                cache
                    .get::<(), _, _>((30, false), || async move {
                        calls.fetch_add(1, Ordering::SeqCst);
                        gate.notified().await;
                        Ok("page".to_owned())
                    })
                    .await
            }));
        }
        // The first caller computes while the others queue behind it.
        while calls.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        gate.notify_one();
        for w in waiting {
            assert_eq!(w.await.expect("joined").expect("a page").as_str(), "page");
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(cache.computed(), 1);
        // Another key is computed apart; a failure is retried by the next caller.
        let failed = cache
            .get((7, true), || async { Err::<String, _>("down") })
            .await;
        assert_eq!(failed, Err("down"));
        let page = cache
            .get::<(), _, _>((7, true), || async { Ok("seven".to_owned()) })
            .await
            .expect("a page");
        assert_eq!(page.as_str(), "seven");
    }
}
