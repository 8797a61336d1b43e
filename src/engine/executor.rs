//! The executor: claims due actions from the outbox (a lease each, an issue's actions one at a
//! time), performs them, and records each outcome as an event in the same transaction that
//! marks the action done. A failed attempt is retried with backoff; one that fails on every
//! attempt becomes an event too, so the state machine can leave the issue visibly waiting.
//! What finished meanwhile is recorded together, in one transaction (a group commit).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::domain::{ActionKind, RunId};
use crate::engine::act::Acts;
use crate::engine::action::Action;
use crate::engine::settled::Settled;
use crate::event::Event;
use crate::metrics::Metrics;
use crate::store::{ClaimedAction, Finished, Lane, NewDelivery, Store};
use crate::telemetry::Traces;

const READ: &str = "read_preflight";
/// What became of one performed action, and the slot it frees once recorded.
type Record = (Finished, Arc<AtomicUsize>);

/// A backstop for wake-ups that never come (another process added work).
const IDLE_POLL: Duration = Duration::from_secs(30);
/// The first retry of a failed action; doubling after that.
const RETRY_BASE_MS: u64 = 500;
/// With several replicas, a claim lasts this long and is renewed every [`RENEW_EVERY`] while
/// the action is performed: a replica that dies has its actions taken over within it.
const SHARED_LEASE_MS: i64 = 20_000;
const RENEW_EVERY: Duration = Duration::from_secs(5);

pub struct Executor {
    acts: Arc<Acts>,
    clock: SharedClock,
    /// Woken when actions are added or one finishes.
    wake: Arc<Notify>,
    /// The consumer, woken when an outcome is stored.
    consumer: Arc<Notify>,
    owner: String,
    read_slots: usize,
    other_slots: usize,
    reads: Arc<AtomicUsize>,
    others: Arc<AtomicUsize>,
    read_lease_ms: i64,
    metrics: Option<Metrics>,
    traces: Traces,
    /// Where it says whether it has anything in hand (for whoever waits on the engine).
    settled: Settled,
}

impl Executor {
    pub fn new(
        acts: Arc<Acts>,
        clock: SharedClock,
        wake: Arc<Notify>,
        consumer: Arc<Notify>,
        read_slots: usize,
        preflight_timeout_secs: u64,
    ) -> Self {
        let read_lease_ms = Action::ReadPreflight {
            rev: 0,
            handled_command_id: 0,
        }
        .lease_ms(preflight_timeout_secs);
        Self {
            acts,
            clock,
            wake,
            consumer,
            owner: format!("director-{:08x}", rand::random::<u32>()),
            read_slots: read_slots.max(1),
            other_slots: 32,
            reads: Arc::default(),
            others: Arc::default(),
            read_lease_ms,
            metrics: None,
            traces: Traces::default(),
            settled: Settled::default(),
        }
    }

    /// Says on `settled` after each round whether anything is due or in flight.
    pub fn with_settled(mut self, settled: Settled) -> Self {
        self.settled = settled;
        self
    }

    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Sends a span for each attempt at an action.
    pub fn with_traces(mut self, traces: Traces) -> Self {
        self.traces = traces;
        self
    }

    /// Performs actions until `shutdown`.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        // What became of each performed action, and the slot it frees, go to the recorder.
        let (recorder, recorded) = mpsc::unbounded_channel();
        tokio::spawn(record(
            self.acts.store.clone(),
            self.clock.clone(),
            recorded,
            self.consumer.clone(),
            self.wake.clone(),
            self.settled.clone(),
        ));
        let clock_changed = self.clock.changed();
        loop {
            // Made before the claim: a clock that moves while the claim runs (on the old
            // time) still wakes the wait below. `notify_waiters` keeps no permit, but a
            // `Notified` made before it sees it.
            let clock_moved = clock_changed.as_ref().map(|n| n.notified());
            let wait = match self.clone().claim_and_spawn(&recorder).await {
                Ok(wait) => {
                    // Claims are counted before this returns, so nothing claimed and nothing
                    // still performed is both counters at zero.
                    let in_hand =
                        self.reads.load(Ordering::SeqCst) + self.others.load(Ordering::SeqCst);
                    self.settled.executor_round(in_hand == 0);
                    wait
                }
                Err(error) => {
                    self.settled.executor_round(false);
                    if self.acts.store.is_up() {
                        tracing::error!(error = %format!("{error:#}"), "cannot claim actions; retrying");
                    }
                    Duration::from_secs(1)
                }
            };
            let clock = async {
                match clock_moved {
                    Some(moved) => moved.await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = self.wake.notified() => {}
                _ = clock => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Claims what fits in the free slots and starts it; returns how long to sleep at most.
    async fn claim_and_spawn(
        self: Arc<Self>,
        recorder: &mpsc::UnboundedSender<Record>,
    ) -> anyhow::Result<Duration> {
        let now = self.clock.now_ms();
        let store = &self.acts.store;
        let shared = store.is_shared();
        let (read_lease, other_lease) = if shared {
            (SHARED_LEASE_MS, SHARED_LEASE_MS)
        } else {
            (self.read_lease_ms, 300_000)
        };
        // A look first, without the writer's turn: a wake with nothing to take (a freed slot,
        // a pass that made no action) costs one read, and never queues behind a commit.
        let due = store.due_now(READ, now).await?;
        let free_reads = self
            .read_slots
            .saturating_sub(self.reads.load(Ordering::SeqCst));
        let free_others = self
            .other_slots
            .saturating_sub(self.others.load(Ordering::SeqCst));
        let lanes = [
            (
                Lane::Only(READ),
                if due.kind > 0 { free_reads } else { 0 },
                read_lease,
            ),
            (
                Lane::Except(READ),
                if due.others > 0 { free_others } else { 0 },
                other_lease,
            ),
        ];
        let mut claimed = store.claim_lanes(&self.owner, &lanes, now).await?;
        let others = claimed.pop().unwrap_or_default();
        let reads = claimed.pop().unwrap_or_default();
        for (claimed, counter) in reads
            .into_iter()
            .map(|c| (c, self.reads.clone()))
            .chain(others.into_iter().map(|c| (c, self.others.clone())))
        {
            counter.fetch_add(1, Ordering::SeqCst);
            let this = self.clone();
            let recorder = recorder.clone();
            tokio::spawn(async move {
                // Renewed while performed, on every store: a start may wait out a long setup
                // phase, and a claim that ran out would start it a second time.
                let lease = if claimed.kind == READ {
                    read_lease
                } else {
                    other_lease
                };
                let renewal = Some(this.clone().renew(claimed.id, shared, lease));
                let finished = this.perform(claimed).await;
                if let Some(r) = renewal {
                    r.abort();
                }
                // The slot frees once the outcome is recorded, not before.
                if recorder.send((finished, counter.clone())).is_err() {
                    counter.fetch_sub(1, Ordering::SeqCst);
                }
            });
        }
        // What is due now and was not taken waits for a freed slot (the recorder wakes this
        // loop); what is due later, for its time.
        Ok(match due.next_at_ms {
            Some(at) => {
                Duration::from_millis(u64::try_from(at - now).unwrap_or(0).max(1)).min(IDLE_POLL)
            }
            None => IDLE_POLL,
        })
    }

    /// Keeps the claim on action `id` alive while it is performed (several replicas).
    fn renew(self: Arc<Self>, id: i64, shared: bool, lease_ms: i64) -> tokio::task::JoinHandle<()> {
        // Replicas renew often and briefly (a dead one's actions are taken over soon); one
        // process renews its long claims at a quarter of their length, on its own clock.
        let every = if shared {
            RENEW_EVERY
        } else {
            Duration::from_millis(u64::try_from(lease_ms / 4).unwrap_or(60_000).max(1_000))
        };
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let until = if shared {
                    crate::clock::now_ms() + SHARED_LEASE_MS
                } else {
                    self.clock.now_ms() + lease_ms
                };
                match self
                    .acts
                    .store
                    .renew_action_lease(id, &self.owner, until)
                    .await
                {
                    Ok(true) => {}
                    Ok(false) => {
                        tracing::warn!(
                            action = id,
                            "the claim ran out and another replica took the action over"
                        );
                        return;
                    }
                    Err(error) => {
                        tracing::debug!(error = %format!("{error:#}"), "cannot renew a claim yet");
                    }
                }
            }
        })
    }

    /// Performs one action and says what became of it.
    async fn perform(&self, claimed: ClaimedAction) -> Finished {
        let span = tracing::info_span!(
            "act",
            action = %claimed.kind,
            key = %claimed.key,
            repo = %claimed.issue.repo,
            issue = claimed.issue.number,
        );
        let started = self.clock.now_ms();
        let parsed = serde_json::from_str::<Action>(&claimed.payload);
        // What a give-up tells `decide`: the kind, and the run for the actions of one run.
        let (kind, run) = match &parsed {
            Ok(action) => (action.kind(), action.run_id().cloned()),
            Err(_) => {
                let Ok(kind) = claimed.kind.parse::<ActionKind>();
                (kind, None)
            }
        };
        let result = match parsed {
            Ok(action) => self.caught(&claimed, &action, &span).await,
            Err(e) => Err(anyhow::anyhow!("the stored action does not parse: {e}")),
        };
        let now = self.clock.now_ms();
        let times = (started, now);
        let outcome = match result {
            Ok(outcome) => outcome,
            Err(error) => return self.failed(&claimed, error, kind, run, &span, times),
        };
        self.count(&claimed.kind, "done");
        let reported = outcome.as_ref().map(Event::kind_str);
        let run_id = run.as_ref().map(|r| r.as_str());
        self.traces.action(
            &claimed.issue,
            &claimed.kind,
            run_id,
            "done",
            reported,
            None,
            times,
        );
        Finished::Done {
            id: claimed.id,
            event: outcome.map(|e| {
                NewDelivery::internal(
                    format!("outcome:{}", claimed.key),
                    claimed.issue.clone(),
                    e,
                    now,
                )
            }),
        }
    }

    /// Performs `action`. A panic (a bug) fails this attempt like any error: it must not end
    /// the task that holds the action's slot, or the executor would run one slot short for
    /// good.
    async fn caught(
        &self,
        claimed: &ClaimedAction,
        action: &Action,
        span: &tracing::Span,
    ) -> anyhow::Result<Option<Event>> {
        use futures_util::FutureExt as _;
        let performed = tracing::Instrument::instrument(
            self.acts.perform(&claimed.issue, action),
            span.clone(),
        );
        match std::panic::AssertUnwindSafe(performed).catch_unwind().await {
            Ok(result) => result,
            Err(panic) => {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "no message".to_owned());
                span.in_scope(|| tracing::error!(panic = what, "the action panicked"));
                Err(anyhow::anyhow!("the action panicked: {what}"))
            }
        }
    }

    /// A failed attempt: retried later with a backoff, or, on the last attempt, given up and
    /// told to `decide` (the kind, and the run for the actions of one run).
    fn failed(
        &self,
        claimed: &ClaimedAction,
        error: anyhow::Error,
        kind: ActionKind,
        run: Option<RunId>,
        span: &tracing::Span,
        (started, now): (i64, i64),
    ) -> Finished {
        let error = format!("{error:#}");
        let attempt = claimed.attempts + 1;
        let run_id = run.as_ref().map(|r| r.as_str());
        if attempt < claimed.max_attempts {
            self.count(&claimed.kind, "retried");
            self.traces.action(
                &claimed.issue,
                &claimed.kind,
                run_id,
                "retried",
                None,
                Some(&error),
                (started, now),
            );
            span.in_scope(|| tracing::warn!(attempt, error, "action failed; retried later"));
            return Finished::Retry {
                id: claimed.id,
                not_before_ms: now
                    .saturating_add(crate::engine::decide::backoff_ms(attempt, RETRY_BASE_MS)),
                error,
            };
        }
        self.count(&claimed.kind, "gave_up");
        self.traces.action(
            &claimed.issue,
            &claimed.kind,
            run_id,
            "gave_up",
            Some("action_gave_up"),
            Some(&error),
            (started, now),
        );
        span.in_scope(|| {
            tracing::error!(
                attempt,
                error,
                "action failed on every attempt; the issue waits"
            )
        });
        Finished::GaveUp {
            id: claimed.id,
            event: NewDelivery::internal(
                format!("gave-up:{}", claimed.key),
                claimed.issue.clone(),
                Event::ActionGaveUp {
                    key: claimed.key.clone(),
                    kind,
                    error: error.clone(),
                    run,
                },
                now,
            ),
            error,
        }
    }

    fn count(&self, kind: &str, outcome: &str) {
        if let Some(m) = &self.metrics {
            m.actions.with_label_values(&[kind, outcome]).inc();
        }
    }
}

/// The recorder: stores what finished meanwhile in one transaction, then frees the slots and
/// wakes the consumer (new outcome events) and the executor (free slots, next actions).
async fn record(
    store: Store,
    clock: SharedClock,
    mut rx: mpsc::UnboundedReceiver<Record>,
    consumer: Arc<Notify>,
    executor: Arc<Notify>,
    settled: Settled,
) {
    let mut batch = Vec::new();
    while rx.recv_many(&mut batch, 256).await > 0 {
        let (finished, slots): (Vec<_>, Vec<_>) = batch.drain(..).unzip();
        if let Err(e) = store.record_outcomes(&finished, clock.now_ms()).await {
            // The leases run out and the actions are performed again: safe by construction.
            tracing::error!(error = %format!("{e:#}"), actions = finished.len(), "could not record what the actions did");
        }
        for slot in slots {
            slot.fetch_sub(1, Ordering::SeqCst);
        }
        consumer.notify_one();
        executor.notify_one();
        // New outcomes for the consumer, free slots for the executor: neither is idle yet.
        settled.executor_round(false);
    }
}
