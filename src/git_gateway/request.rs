//! What a run's request to a gateway (git or model) may hold while the director reads it:
//! room in a memory budget shared by every gateway request, reserved before a byte is read;
//! a deadline for the whole body; and a cap on one run's requests at once. A run can then
//! neither exhaust the director's memory with parallel pushes or calls nor hold a body open.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::web;
use futures_util::StreamExt as _;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::domain::RunId;

/// The memory the bodies of gateway requests may take at once, in KiB, and how long a
/// request waits for room and for its body.
#[derive(Clone)]
pub struct Budget {
    kib: Arc<Semaphore>,
    total_kib: u32,
    /// How long a request waits for room before it is answered 503.
    pub wait: Duration,
    /// How long its whole body may take to arrive.
    pub body_timeout: Duration,
    per_run: Arc<PerRun>,
    /// `director_gateway_body_memory_bytes`: what the bodies being read hold.
    in_use: Option<prometheus::IntGauge>,
}

/// Room for one body, held until it is dropped.
pub struct Room {
    _permit: OwnedSemaphorePermit,
    bytes: i64,
    in_use: Option<prometheus::IntGauge>,
}

impl Drop for Room {
    fn drop(&mut self) {
        if let Some(g) = &self.in_use {
            g.sub(self.bytes);
        }
    }
}

/// Why a body was not taken.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// No room came in time (503).
    NoRoom,
    /// The body did not arrive in time (408).
    TooSlow,
    /// The connection failed while it was read (400).
    Unreadable,
    /// The run has as many requests open as it may (429).
    Busy,
}

impl Refused {
    /// The HTTP status and the words for the run.
    pub fn answer(&self, max_per_run: usize) -> (u16, String) {
        match self {
            Self::NoRoom => (
                503,
                "the director is reading as many requests as it can hold: retry shortly".into(),
            ),
            Self::TooSlow => (408, "the request body did not arrive in time".into()),
            Self::Unreadable => (400, "the request body could not be read".into()),
            Self::Busy => (
                429,
                format!("the run has {max_per_run} requests open at once, as many as it may"),
            ),
        }
    }
}

/// Requests each run has open, capped.
#[derive(Default)]
struct PerRun {
    max: usize,
    open: Mutex<HashMap<RunId, usize>>,
}

/// One run's open request, counted until it is dropped.
pub struct Slot {
    per_run: Arc<PerRun>,
    run_id: RunId,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self
            .per_run
            .open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = open.get_mut(&self.run_id) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.run_id);
            }
        }
    }
}

impl Budget {
    /// `memory_mb` shared by all bodies, `per_run` requests of one run at once; a request
    /// waits at most five seconds for room (less when `body_timeout` is shorter), and
    /// `body_timeout` for its body.
    pub fn new(memory_mb: u64, per_run: usize, body_timeout: Duration) -> Self {
        let total_kib = u32::try_from(memory_mb.saturating_mul(1024)).unwrap_or(u32::MAX);
        Self {
            kib: Arc::new(Semaphore::new(total_kib as usize)),
            total_kib,
            // Shorter than a body's time: a request that finds no room is told soon, while
            // one that holds room has its whole time.
            wait: body_timeout.min(Duration::from_secs(5)),
            body_timeout,
            per_run: Arc::new(PerRun {
                max: per_run.max(1),
                open: Mutex::default(),
            }),
            in_use: None,
        }
    }

    /// Counts the memory the bodies hold in `gauge`, in bytes.
    pub fn with_gauge(mut self, gauge: prometheus::IntGauge) -> Self {
        self.in_use = Some(gauge);
        self
    }

    /// KiB in use now.
    pub fn in_use_kib(&self) -> u32 {
        let free = u32::try_from(self.kib.available_permits()).unwrap_or(u32::MAX);
        self.total_kib.saturating_sub(free)
    }

    /// The most requests one run may have open.
    pub fn max_per_run(&self) -> usize {
        self.per_run.max
    }

    /// A slot for one more request of `run_id`, unless it has as many open as it may.
    pub fn slot(&self, run_id: &RunId) -> Result<Slot, Refused> {
        let mut open = self
            .per_run
            .open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = open.entry(run_id.clone()).or_default();
        if *n >= self.per_run.max {
            return Err(Refused::Busy);
        }
        *n += 1;
        Ok(Slot {
            per_run: self.per_run.clone(),
            run_id: run_id.clone(),
        })
    }

    /// Reads a body of at most `max` bytes: room for its declared length (or `max` when it
    /// declares none) is reserved first, and the whole body must arrive within
    /// `body_timeout`. Returns the body (cut at `max`), whether there was more (read and
    /// dropped, so the client can read the answer), and the room it holds.
    pub async fn read(
        &self,
        payload: web::Payload,
        declared: Option<usize>,
        max: usize,
    ) -> Result<(Vec<u8>, bool, Room), Refused> {
        // A body that declares more than the cap is read only up to it.
        let reserve = declared.map_or(max, |d| d.min(max));
        let kib = u32::try_from(reserve.div_ceil(1024).max(1))
            .unwrap_or(u32::MAX)
            .min(self.total_kib.max(1));
        let permit = tokio::time::timeout(self.wait, self.kib.clone().acquire_many_owned(kib))
            .await
            .map_err(|_| Refused::NoRoom)?
            .map_err(|_| Refused::NoRoom)?;
        // Counted from here, and given back however the read ends.
        let room = Room {
            _permit: permit,
            bytes: i64::from(kib) * 1024,
            in_use: self.in_use.clone(),
        };
        if let Some(g) = &room.in_use {
            g.add(room.bytes);
        }
        let (body, over) = tokio::time::timeout(self.body_timeout, capped(payload, reserve))
            .await
            .map_err(|_| Refused::TooSlow)?
            .map_err(|()| Refused::Unreadable)?;
        Ok((body, over || declared.is_some_and(|d| d > max), room))
    }
}

/// The request's body, at most `max` bytes of it, and whether there was more (the rest is
/// read and dropped).
async fn capped(mut payload: web::Payload, max: usize) -> Result<(Vec<u8>, bool), ()> {
    let mut out = Vec::new();
    let mut over = false;
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|_| ())?;
        if over || out.len() + chunk.len() > max {
            if !over {
                let room = max.saturating_sub(out.len());
                out.extend_from_slice(&chunk[..room.min(chunk.len())]);
            }
            over = true;
            continue;
        }
        out.extend_from_slice(&chunk);
    }
    Ok((out, over))
}

/// The `Content-Length` a request declares.
pub fn declared(req: &actix_web::HttpRequest) -> Option<usize> {
    req.headers()
        .get("content-length")?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::run::test_id;

    #[test]
    fn a_run_gets_its_cap_of_slots_and_each_returns_when_dropped() {
        let budget = Budget::new(1, 2, Duration::from_secs(1));
        let a = budget.slot(&test_id("r1")).expect("first");
        let _b = budget.slot(&test_id("r1")).expect("second");
        assert_eq!(budget.slot(&test_id("r1")).err(), Some(Refused::Busy));
        let _other = budget
            .slot(&test_id("r2"))
            .expect("another run is not held up");
        drop(a);
        let _c = budget.slot(&test_id("r1")).expect("a slot came back");
    }
}
