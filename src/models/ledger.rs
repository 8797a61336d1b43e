//! What this process's model calls may have spent that the store does not hold yet: each
//! call's worst case while it runs, then its metered cost until the store has it. Budgets are
//! checked against the store plus this ledger, so neither parallel calls nor a store write
//! that fails lets spend escape them.

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

    /// `spent` (the store's), with this process's entries added.
    /// The settled entries now (their ids and amounts), taken before the store is read.
    pub(super) fn settled_now(&self) -> HashMap<u64, (RunId, RepoName, f64)> {
        self.entries()
            .iter()
            .filter(|(_, e)| !e.in_flight)
            .map(|(id, e)| (*id, (e.run_id.clone(), e.repo.clone(), e.usd)))
            .collect()
    }

    /// [`Ledger::on_top`], also counting what was settled `before` the store was read and
    /// has left the ledger since (stored meanwhile: the read may or may not have seen it).
    pub(super) fn on_top_since(
        &self,
        spent: Spent,
        before: &HashMap<u64, (RunId, RepoName, f64)>,
        run_id: &RunId,
        repo: &RepoName,
    ) -> Seen {
        let gone: Vec<(RunId, RepoName, f64)> = {
            let entries = self.entries();
            before
                .iter()
                .filter(|(id, _)| !entries.contains_key(id))
                .map(|(_, e)| e.clone())
                .collect()
        };
        let mut seen = self.on_top(spent, run_id, repo);
        for (run, r, usd) in gone {
            seen.settled.day += usd;
            if r == *repo {
                seen.settled.repo_day += usd;
            }
            if &run == run_id {
                seen.settled.run += usd;
            }
        }
        seen
    }

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

    #[test]
    fn a_cost_stored_while_the_store_is_read_is_still_counted() {
        let ledger = Arc::new(Ledger::default());
        let repo: RepoName = "acme/widgets".parse().expect("repo");
        let stored = ledger.reserve(&test_id("r1"), &repo, 1.0).settle(0.75);
        let before = ledger.settled_now();
        // The store's read began before the write landed: it saw nothing; meanwhile the
        // cost was stored and left the ledger.
        stored.done();
        let seen = ledger.on_top_since(Spent::default(), &before, &test_id("r1"), &repo);
        assert_eq!(seen.settled.run, 0.75);
        // Without the window, nothing is added.
        let seen = ledger.on_top_since(
            Spent::default(),
            &ledger.settled_now(),
            &test_id("r1"),
            &repo,
        );
        assert_eq!(seen.settled.run, 0.0);
    }
}
