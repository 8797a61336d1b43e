//! Time as an input. Production code reads a [`Clock`]; pure code takes `now` as an argument;
//! tests use a [`ManualClock`] they move by hand.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use tokio::sync::Notify;

/// Milliseconds since the Unix epoch, from the system clock.
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

pub trait Clock: Send + Sync {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> i64;
    /// Notified when time jumps (a manual clock moved): sleepers re-check what is due.
    fn changed(&self) -> Option<Arc<Notify>> {
        None
    }
}

pub type SharedClock = Arc<dyn Clock>;

/// The system clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        now_ms()
    }
}

pub fn system() -> SharedClock {
    Arc::new(SystemClock)
}

/// A clock that moves only when told to.
#[derive(Debug)]
pub struct ManualClock {
    now: AtomicI64,
    changed: Arc<Notify>,
}

impl ManualClock {
    pub fn new(start_ms: i64) -> Arc<Self> {
        Arc::new(Self {
            now: AtomicI64::new(start_ms),
            changed: Arc::new(Notify::new()),
        })
    }

    pub fn advance(&self, ms: i64) {
        self.now.fetch_add(ms, Ordering::SeqCst);
        self.changed.notify_waiters();
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.now.load(Ordering::SeqCst)
    }

    fn changed(&self) -> Option<Arc<Notify>> {
        Some(self.changed.clone())
    }
}
