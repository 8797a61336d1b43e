//! What a run's request to a gateway (git or model) may hold while the director reads it:
//! room in a memory budget shared by every gateway request, of which one run may hold at
//! most its share, reserved as the body arrives (its declared length at once, a chunked body
//! in steps as it grows); a deadline for the whole body; and a cap on one run's requests at
//! once. A run can then neither exhaust the director's memory with parallel pushes or calls,
//! nor hold a body open, nor keep another run's request waiting: room is not handed out in
//! the order it was asked for (where one large waiter would hold up every small one behind
//! it) but to any waiter it fits, and a run that holds its share waits on itself alone.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::web;
use futures_util::StreamExt as _;
use tokio::sync::Notify;

use crate::domain::RunId;

/// The memory the bodies of gateway requests may take at once, in KiB, and how long a
/// request waits for room and for its body.
#[derive(Clone)]
pub struct Budget {
    pool: Arc<Pool>,
    /// How long a request waits for room before it is answered 503.
    pub wait: Duration,
    /// How long its whole body may take to arrive.
    pub body_timeout: Duration,
    per_run: Arc<PerRun>,
}

/// The KiB free, and what each run holds.
struct Pool {
    total_kib: u32,
    /// One run's most.
    share_kib: u32,
    held: Mutex<Held>,
    /// Told whenever room is given back.
    freed: Notify,
    /// `director_gateway_body_memory_bytes`: what the bodies being read hold.
    in_use: Option<prometheus::IntGauge>,
}

#[derive(Default)]
struct Held {
    used_kib: u32,
    by_run: HashMap<RunId, u32>,
}

impl Pool {
    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Takes `kib` for `run_id` if it fits both the pool and the run's share.
    fn try_take(&self, run_id: &RunId, kib: u32) -> Result<(), Refused> {
        let mut held = self.held();
        let run = held.by_run.get(run_id).copied().unwrap_or(0);
        if run.saturating_add(kib) > self.share_kib {
            return Err(Refused::OverShare);
        }
        if held.used_kib.saturating_add(kib) > self.total_kib {
            return Err(Refused::NoRoom);
        }
        held.used_kib += kib;
        *held.by_run.entry(run_id.clone()).or_default() += kib;
        if let Some(g) = &self.in_use {
            g.add(i64::from(kib) * 1024);
        }
        Ok(())
    }

    fn give_back(&self, run_id: &RunId, kib: u32) {
        if kib == 0 {
            return;
        }
        {
            let mut held = self.held();
            held.used_kib = held.used_kib.saturating_sub(kib);
            if let Some(n) = held.by_run.get_mut(run_id) {
                *n = n.saturating_sub(kib);
                if *n == 0 {
                    held.by_run.remove(run_id);
                }
            }
        }
        if let Some(g) = &self.in_use {
            g.sub(i64::from(kib) * 1024);
        }
        self.freed.notify_waiters();
    }

    /// Takes `kib` for `run_id`, waiting until `deadline` for room to be given back.
    async fn take(
        &self,
        run_id: &RunId,
        kib: u32,
        deadline: tokio::time::Instant,
    ) -> Result<(), Refused> {
        loop {
            // Registered before the look, so a give-back between the two is not missed.
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            let refused = match self.try_take(run_id, kib) {
                Ok(()) => return Ok(()),
                Err(refused) => refused,
            };
            if tokio::time::timeout_at(deadline, freed).await.is_err() {
                return Err(refused);
            }
        }
    }
}

/// Room for one body, held until it is dropped.
pub struct Room {
    pool: Arc<Pool>,
    run_id: RunId,
    kib: u32,
}

impl Drop for Room {
    fn drop(&mut self) {
        self.pool.give_back(&self.run_id, self.kib);
    }
}

/// Why a body was not taken.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// No room came in time (503).
    NoRoom,
    /// The run's own requests hold its share of the memory (429), or the body alone is
    /// over it (413).
    OverShare,
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
            Self::OverShare => (
                429,
                "the run's requests being read hold its share of the director's memory (runner.gateway_memory_per_run_mb): retry when one has ended".into(),
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

/// A chunked body's first reservation, doubled as it grows.
const FIRST_STEP_KIB: u32 = 64;

impl Budget {
    /// `memory_mb` shared by all bodies, a quarter of it at most for one run (see
    /// [`Budget::with_run_share`]), `per_run` requests of one run at once; a request waits at
    /// most five seconds for room (less when `body_timeout` is shorter), and `body_timeout`
    /// for its body.
    pub fn new(memory_mb: u64, per_run: usize, body_timeout: Duration) -> Self {
        let total_kib = u32::try_from(memory_mb.saturating_mul(1024)).unwrap_or(u32::MAX);
        Self {
            pool: Arc::new(Pool {
                total_kib,
                share_kib: (total_kib / 4).max(1),
                held: Mutex::default(),
                freed: Notify::new(),
                in_use: None,
            }),
            // Shorter than a body's time: a request that finds no room is told soon, while
            // one that holds room has its whole time.
            wait: body_timeout.min(Duration::from_secs(5)),
            body_timeout,
            per_run: Arc::new(PerRun {
                max: per_run.max(1),
                open: Mutex::default(),
            }),
        }
    }

    fn pool_mut(&mut self) -> &mut Pool {
        // Set up before any request is read: nothing else holds the pool yet.
        Arc::get_mut(&mut self.pool).expect("the budget is set up before it is shared")
    }

    /// One run holds at most `mb` of the bodies' memory at once (never more than all of it).
    pub fn with_run_share(mut self, mb: u64) -> Self {
        let pool = self.pool_mut();
        let kib = u32::try_from(mb.saturating_mul(1024)).unwrap_or(u32::MAX);
        pool.share_kib = kib.clamp(1, pool.total_kib.max(1));
        self
    }

    /// Counts the memory the bodies hold in `gauge`, in bytes.
    pub fn with_gauge(mut self, gauge: prometheus::IntGauge) -> Self {
        self.pool_mut().in_use = Some(gauge);
        self
    }

    /// KiB in use now.
    pub fn in_use_kib(&self) -> u32 {
        self.pool.held().used_kib
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

    /// Reads a body of at most `max` bytes for `run_id`: room for its declared length is
    /// reserved first (a length over the run's whole share is refused at once), a body that
    /// declares none reserves as it arrives; the whole body must arrive within
    /// `body_timeout`. Returns the body (cut at `max`), whether there was more (read and
    /// dropped, so the client can read the answer), and the room it holds.
    pub async fn read(
        &self,
        run_id: &RunId,
        payload: web::Payload,
        declared: Option<usize>,
        max: usize,
    ) -> Result<(Vec<u8>, bool, Room), Refused> {
        let kib_of = |bytes: usize| u32::try_from(bytes.div_ceil(1024).max(1)).unwrap_or(u32::MAX);
        let mut room = Room {
            pool: self.pool.clone(),
            run_id: run_id.clone(),
            kib: 0,
        };
        // A body that declares more than the cap is read only up to it.
        if let Some(d) = declared {
            let kib = kib_of(d.min(max));
            if kib > self.pool.share_kib {
                return Err(Refused::OverShare);
            }
            let deadline = tokio::time::Instant::now() + self.wait;
            self.pool.take(run_id, kib, deadline).await?;
            room.kib = kib;
        }
        let cap = declared.map_or(max, |d| d.min(max));
        let read = self.capped(payload, cap, &mut room);
        let (body, over) = tokio::time::timeout(self.body_timeout, read)
            .await
            .map_err(|_| Refused::TooSlow)??;
        Ok((body, over || declared.is_some_and(|d| d > max), room))
    }

    /// The request's body, at most `max` bytes of it, and whether there was more (the rest
    /// is read and dropped); `room` grows to hold what is kept before it is kept.
    async fn capped(
        &self,
        mut payload: web::Payload,
        max: usize,
        room: &mut Room,
    ) -> Result<(Vec<u8>, bool), Refused> {
        let mut out = Vec::new();
        let mut over = false;
        while let Some(chunk) = payload.next().await {
            let chunk = chunk.map_err(|_| Refused::Unreadable)?;
            if over {
                continue;
            }
            let keep = chunk.len().min(max - out.len());
            self.grow(room, (out.len() + keep).div_ceil(1024)).await?;
            out.extend_from_slice(&chunk[..keep]);
            over = keep < chunk.len();
        }
        Ok((out, over))
    }

    /// Makes `room` hold at least `need` KiB, in doubling steps, waiting as a new request
    /// would.
    async fn grow(&self, room: &mut Room, need_kib: usize) -> Result<(), Refused> {
        let need = u32::try_from(need_kib).unwrap_or(u32::MAX);
        if need <= room.kib {
            return Ok(());
        }
        let target = need
            .max(room.kib.saturating_mul(2))
            .max(FIRST_STEP_KIB)
            .min(self.pool.share_kib.max(need));
        let more = target - room.kib;
        let deadline = tokio::time::Instant::now() + self.wait;
        self.pool.take(&room.run_id, more, deadline).await?;
        room.kib = target;
        Ok(())
    }
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
