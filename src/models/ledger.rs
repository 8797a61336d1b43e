//! What this process's model calls may have spent that the store does not hold yet: each
//! call's worst case while it runs, then its metered cost until the store has it. Budgets are
//! checked against the store plus this ledger, so neither parallel calls nor a store write
//! that fails lets spend escape them; and a cost is stored and leaves the ledger only between
//! budget checks' reads, so each check counts it once (never twice, which would stop a run
//! under its budget).

use std::collections::HashMap;
use std::sync::Arc;

use super::Spent;
use crate::domain::{RepoName, RunId};

/// What this process's calls may have spent that the store does not hold yet: the worst
/// case of each call in flight, reserved before it is forwarded, then its metered cost until
/// the store has it. A run's next call, or a parallel one, sees both.
#[derive(Default)]
pub(super) struct Ledger {
    next: std::sync::atomic::AtomicU64,
    entries: std::sync::Mutex<HashMap<u64, Entry>>,
    /// Budget checks' reads of the store and the writes of metered costs take turns: a cost
    /// is in the store or in the ledger whenever a check reads, never in both or neither.
    turns: tokio::sync::RwLock<()>,
}

struct Entry {
    run_id: RunId,
    repo: RepoName,
    usd: f64,
    /// Still a reservation: the call has not ended.
    in_flight: bool,
}

/// What was spent, settled (stored or metered), and what calls in flight may still spend.
pub(super) struct Seen {
    pub settled: Spent,
    pub in_flight: Spent,
}

impl Ledger {
    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Entry>> {
        // A panic elsewhere never drops what was spent.
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(super) fn reserve(
        self: &Arc<Self>,
        run_id: &RunId,
        repo: &RepoName,
        usd: f64,
    ) -> Reservation {
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.entries().insert(
            id,
            Entry {
                run_id: run_id.clone(),
                repo: repo.clone(),
                usd,
                in_flight: true,
            },
        );
        Reservation {
            ledger: self.clone(),
            id,
            settled: false,
        }
    }

    /// A budget check's turn to read the store: no metered cost is stored (and taken off
    /// the ledger) until it ends.
    pub(super) async fn reading(&self) -> tokio::sync::RwLockReadGuard<'_, ()> {
        self.turns.read().await
    }

    /// A metered cost's turn to be stored and taken off the ledger: no budget check reads
    /// the store meanwhile.
    pub(super) async fn storing(&self) -> tokio::sync::RwLockWriteGuard<'_, ()> {
        self.turns.write().await
    }

    /// `spent` (the store's, read in a [`Ledger::reading`] turn), with this process's entries
    /// added.
    pub(super) fn on_top(&self, spent: Spent, run_id: &RunId, repo: &RepoName) -> Seen {
        let mut seen = Seen {
            settled: spent,
            in_flight: Spent::default(),
        };
        for e in self.entries().values() {
            let into = if e.in_flight {
                &mut seen.in_flight
            } else {
                &mut seen.settled
            };
            into.day += e.usd;
            if e.repo == *repo {
                into.repo_day += e.usd;
            }
            if &e.run_id == run_id {
                into.run += e.usd;
            }
        }
        seen
    }
}

/// A call's place in the ledger: its worst case while it runs; dropped unsettled (the call
/// was never answered), it is released.
pub(super) struct Reservation {
    ledger: Arc<Ledger>,
    id: u64,
    settled: bool,
}

impl Reservation {
    /// The call ended having cost `usd`: kept until the store holds it (then [`Stored`]).
    pub(super) fn settle(mut self, usd: f64) -> Stored {
        if let Some(e) = self.ledger.entries().get_mut(&self.id) {
            e.usd = usd;
            e.in_flight = false;
        }
        self.settled = true;
        Stored {
            ledger: self.ledger.clone(),
            id: self.id,
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if !self.settled {
            self.ledger.entries().remove(&self.id);
        }
    }
}

/// A metered cost waiting for the store; removed from the ledger only once stored.
pub(super) struct Stored {
    ledger: Arc<Ledger>,
    id: u64,
}

impl Stored {
    /// The ledger it waits in, for a [`Ledger::storing`] turn.
    pub(super) fn ledger(&self) -> Arc<Ledger> {
        self.ledger.clone()
    }

    /// Stored: off the ledger (in the same [`Ledger::storing`] turn as the write).
    pub(super) fn done(self) {
        self.ledger.entries().remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::run::test_id;

    fn seen(ledger: &Ledger) -> Seen {
        let repo: RepoName = "acme/widgets".parse().expect("a name");
        ledger.on_top(Spent::default(), &test_id("r1"), &repo)
    }

    #[test]
    fn a_poisoned_ledger_still_counts_and_an_unanswered_call_releases_its_reservation() {
        let ledger = Arc::new(Ledger::default());
        let repo: RepoName = "acme/widgets".parse().expect("a name");
        let held = ledger.reserve(&test_id("r1"), &repo, 2.0);
        let poisoner = ledger.clone();
        let _ = std::thread::spawn(move || {
            let _guard = poisoner.entries();
            panic!("a bug while holding the ledger");
        })
        .join();
        assert_eq!(seen(&ledger).in_flight.run, 2.0);
        drop(held);
        assert_eq!(seen(&ledger).in_flight.run, 0.0);
    }

    #[tokio::test]
    async fn a_cost_is_stored_between_budget_reads_so_each_counts_it_once() {
        let ledger = Arc::new(Ledger::default());
        let repo: RepoName = "acme/widgets".parse().expect("repo");
        let stored = ledger.reserve(&test_id("r1"), &repo, 1.0).settle(0.75);
        // A budget check is reading the store, which does not hold the cost yet.
        let reading = ledger.reading().await;
        let writer = {
            let ledger = stored.ledger();
            tokio::spawn(async move {
                let _turn = ledger.storing().await;
                // The store write would land here, then:
                stored.done();
            })
        };
        tokio::task::yield_now().await;
        assert!(!writer.is_finished(), "the cost was stored during a read");
        // So the read counts it once, from the ledger.
        assert_eq!(seen(&ledger).settled.run, 0.75);
        drop(reading);
        writer.await.expect("stored");
        // The next read finds it in the store (not shown here) and no longer in the ledger.
        let _next = ledger.reading().await;
        assert_eq!(seen(&ledger).settled.run, 0.0);
    }
}
