//! A metered call's answer, read as it passes on its way back to the run: its usage from the
//! provider's own answer, recorded when it ends. The answer is read by a task of its own, not
//! by the run's connection: a run that hangs up does not end the call at the provider, which
//! goes on generating (and billing reasoning no text shows), so the task reads on, for
//! `models.drain_secs`, until the usage arrives. A call whose usage never arrives (cut by
//! the provider, or still running at that bound) is charged its reservation, the worst case
//! its request allowed, or what passed when that was more: a budget is a ceiling on what the
//! provider bills, never on what the run chose to read.

use std::sync::Arc;

use actix_web::http::StatusCode;

use super::ledger::Reservation;
use super::usage::{self, Api, StreamMeter, Usage};
use super::{Counters, Metered, Provider, Runs};
use crate::domain::RepoName;
use crate::settings::Price;

/// Who to tell what a call used, once its answer has passed.
pub(super) struct Record {
    pub(super) runs: Arc<dyn Runs>,
    pub(super) counters: Option<Counters>,
    pub(super) reservation: Reservation,
    pub(super) run_id: crate::domain::RunId,
    pub(super) repo: RepoName,
    pub(super) provider: Provider,
    pub(super) model: String,
    pub(super) price: Option<Price>,
    /// What was reserved: the request's output limit and its estimated input.
    pub(super) worst: Usage,
}

/// Reads an answer as it passes: a stream event by event, a whole answer kept (bounded; past
/// the bound only its end, where the usage is) and read at its end.
pub(super) struct Meter {
    pub(super) api: Api,
    pub(super) streamed: bool,
    pub(super) sse: StreamMeter,
    pub(super) whole: Vec<u8>,
    /// `whole` holds only the answer's last bytes.
    pub(super) tail: bool,
    /// Bytes of the answer that passed.
    pub(super) bytes: u64,
    pub(super) request_bytes: usize,
    /// The provider's status, once it answered.
    pub(super) answered: Option<StatusCode>,
    pub(super) record: Option<Record>,
}

/// A whole answer is read for its usage up to this size...
const MAX_WHOLE: usize = 16 * 1024 * 1024;
/// ...and past it, from its last bytes.
const MAX_TAIL: usize = 1024 * 1024;

/// Attempts at storing a metered call before it is left counted in this process alone.
const STORE_ATTEMPTS: u32 = 5;

impl Meter {
    pub(super) fn feed(&mut self, chunk: &[u8]) {
        self.bytes += chunk.len() as u64;
        if self.streamed {
            self.sse.feed(chunk);
            return;
        }
        self.whole.extend_from_slice(chunk);
        if self.whole.len() > MAX_WHOLE || (self.tail && self.whole.len() > 2 * MAX_TAIL) {
            let cut = self.whole.len() - MAX_TAIL;
            self.whole.drain(..cut);
            self.tail = true;
        }
    }

    /// What the call used, and why it is an estimate when it is one: at the answer's end,
    /// or when it was cut (the provider failed, the client went away).
    fn usage(&mut self, worst: Usage) -> (Usage, Option<&'static str>) {
        if self.streamed {
            let reported = self.sse.finish();
            let passed = Usage::estimate(self.request_bytes, self.sse.text_bytes());
            return match reported {
                Some(u) if self.sse.ended() => (u, None),
                // Ended before its usage: the provider may have generated (and billed) up to
                // the request's limit, whatever passed (Anthropic reports the output whole
                // only at the end, OpenAI only in the last chunk).
                Some(u) => (
                    Usage {
                        output: u.output.max(passed.output),
                        ..u
                    }
                    .at_least(worst),
                    Some("cut"),
                ),
                None => (passed.at_least(worst), Some("cut")),
            };
        }
        let read = if self.tail {
            usage::from_tail(self.api, &self.whole)
        } else {
            usage::from_body(self.api, &self.whole)
        };
        match read {
            Some(u) => (u, None),
            None => (
                Usage::estimate(self.request_bytes, self.bytes).at_least(worst),
                Some("unreadable"),
            ),
        }
    }

    /// Records what the call used. An answer the provider refused (not 2xx) cost nothing; one
    /// whose usage cannot be read is charged its reservation (or what passed, when more),
    /// logged and counted.
    pub(super) fn done(&mut self) {
        let Some(r) = self.record.take() else {
            return;
        };
        if !self.answered.is_some_and(|s| s.is_success()) {
            return;
        }
        let (usage, estimated) = self.usage(r.worst);
        if self.sse.skipped() > 0 {
            tracing::warn!(run_id = %r.run_id, lines = self.sse.skipped(), "a model stream had lines too long to meter; they were skipped");
        }
        if let Some(reason) = estimated {
            tracing::warn!(run_id = %r.run_id, provider = r.provider.as_str(), reason, input = usage.input, output = usage.output, "a model call's usage was not reported whole; it is charged its reservation");
            if let Some(c) = &r.counters {
                c.estimated
                    .with_label_values(&[r.provider.as_str(), reason])
                    .inc();
            }
        }
        let metered = Metered {
            run_id: Some(r.run_id),
            repo: r.repo,
            issue: None,
            provider: r.provider,
            cost_usd: r.price.as_ref().map(|p| usage.cost(p)),
            model: r.model,
            usage,
            at_ms: r.runs.now_ms(),
        };
        if let Some(c) = &r.counters {
            c.count(&metered);
        }
        let stored = r.reservation.settle(metered.cost_usd.unwrap_or(0.0));
        let runs = r.runs;
        tokio::spawn(async move {
            let ledger = stored.ledger();
            let mut wait = std::time::Duration::from_millis(200);
            for attempt in 1..=STORE_ATTEMPTS {
                // Stored and off the ledger in one turn no budget check reads in.
                let turn = ledger.storing().await;
                let Err(e) = runs.record(&metered).await else {
                    return stored.done();
                };
                drop(turn);
                if attempt == STORE_ATTEMPTS {
                    // Still counted against the budgets by this process, never dropped.
                    tracing::error!(run_id = ?metered.run_id, error = %e, "a model call's usage could not be stored; this process keeps counting it");
                } else {
                    tracing::warn!(run_id = ?metered.run_id, attempt, error = %e, "a model call's usage could not be stored yet");
                    tokio::time::sleep(wait).await;
                    wait *= 2;
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::RunId;
    use crate::domain::run::test_id;
    use crate::models::ledger::{Ledger, Seen};
    use crate::models::{ActiveRun, Spent};
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A store that fails its first `failures` writes.
    struct Flaky {
        failures: u32,
        calls: AtomicU32,
        last: std::sync::Mutex<Option<Metered>>,
    }

    fn flaky(failures: u32) -> Arc<Flaky> {
        Arc::new(Flaky {
            failures,
            calls: AtomicU32::new(0),
            last: std::sync::Mutex::default(),
        })
    }

    #[async_trait::async_trait]
    impl Runs for Flaky {
        async fn active(&self, _: &RunId) -> Result<Option<ActiveRun>, String> {
            Ok(None)
        }
        async fn spent(&self, _: &RunId, _: &RepoName, _: &str) -> Result<Spent, String> {
            Ok(Spent::default())
        }
        async fn record(&self, m: &Metered) -> Result<(), String> {
            *self.last.lock().expect("not poisoned") = Some(m.clone());
            if self.calls.fetch_add(1, Ordering::SeqCst) < self.failures {
                Err("the database is away".into())
            } else {
                Ok(())
            }
        }
        async fn over_budget(&self, _: &RunId, _: &str) {}
        fn now_ms(&self) -> i64 {
            0
        }
    }

    fn meter(ledger: &Arc<Ledger>, runs: Arc<dyn Runs>) -> Meter {
        let repo: RepoName = "acme/widgets".parse().expect("a name");
        Meter {
            api: Api::AnthropicMessages,
            streamed: false,
            sse: StreamMeter::new(Api::AnthropicMessages),
            whole: br#"{"usage":{"input_tokens":1000000,"output_tokens":0}}"#.to_vec(),
            tail: false,
            bytes: 0,
            request_bytes: 10,
            answered: Some(StatusCode::OK),
            record: Some(Record {
                runs,
                counters: None,
                reservation: ledger.reserve(&test_id("r1"), &repo, 5.0),
                run_id: test_id("r1"),
                repo,
                provider: Provider::Anthropic,
                model: "m".into(),
                price: Some(Price {
                    input_per_mtok: 3.0,
                    output_per_mtok: 15.0,
                    ..Price::default()
                }),
                worst: Usage::default(),
            }),
        }
    }

    /// What the store was given, once the meter's write of it reached the store.
    async fn charged(runs: &Flaky) -> Metered {
        while runs.calls.load(Ordering::SeqCst) < 1 {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        runs.last
            .lock()
            .expect("not poisoned")
            .clone()
            .expect("recorded")
    }

    fn seen(ledger: &Ledger) -> Seen {
        let repo: RepoName = "acme/widgets".parse().expect("a name");
        ledger.on_top(Spent::default(), &test_id("r1"), &repo)
    }

    #[tokio::test(start_paused = true)]
    async fn a_metered_cost_leaves_the_ledger_only_once_the_store_holds_it() {
        let ledger = Arc::new(Ledger::default());
        let runs = flaky(2);
        let mut m = meter(&ledger, runs.clone());
        assert_eq!(
            seen(&ledger).in_flight.run,
            5.0,
            "the worst case, while it runs"
        );
        m.done();
        // Metered ($3) and not stored yet: still counted, no longer as a reservation.
        let now = seen(&ledger);
        assert_eq!((now.settled.run, now.in_flight.run), (3.0, 0.0));
        while runs.calls.load(Ordering::SeqCst) < 3 {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        tokio::task::yield_now().await;
        assert_eq!(
            seen(&ledger).settled.run,
            0.0,
            "stored at the third try, then removed"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_cost_the_store_never_takes_stays_counted() {
        let ledger = Arc::new(Ledger::default());
        let runs = flaky(u32::MAX);
        meter(&ledger, runs.clone()).done();
        while runs.calls.load(Ordering::SeqCst) < STORE_ATTEMPTS {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        tokio::time::sleep(std::time::Duration::from_secs(60)).await;
        assert_eq!(seen(&ledger).settled.run, 3.0, "never dropped");
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_that_ends_without_its_usage_is_charged_its_reservation() {
        let ledger = Arc::new(Ledger::default());
        let runs = flaky(0);
        let mut m = meter(&ledger, runs.clone());
        m.streamed = true;
        if let Some(r) = m.record.as_mut() {
            r.worst = Usage {
                input: 1000,
                output: 32_000,
                ..Usage::default()
            };
        }
        // Thinking, then one visible token, then the provider's stream ends: the thinking
        // is billed, and no text showed it.
        m.feed(concat!(
            "event: message_start\n",
            "data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":1000,\"output_tokens\":1}}}\n\n",
            "event: content_block_delta\n",
            "data: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"text_delta\",\"text\":\"ok\"}}\n\n",
        ).as_bytes());
        m.done();
        let charged = charged(&runs).await;
        assert_eq!((charged.usage.input, charged.usage.output), (1000, 32_000));
        let cost = charged.cost_usd.expect("priced");
        assert!((cost - 0.483).abs() < 1e-9, "{cost}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_left_before_its_end_is_charged_the_text_that_passed() {
        let ledger = Arc::new(Ledger::default());
        let runs = flaky(0);
        let mut m = meter(&ledger, runs.clone());
        m.streamed = true;
        m.feed(concat!(
            "event: message_start\n",
            "data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":1000,\"output_tokens\":1}}}\n\n",
            "event: content_block_delta\n",
            "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"fn main() { println!(); }\"}}\n\n",
        ).as_bytes());
        // The agent hangs up here: Anthropic's output count comes only at the end.
        m.done();
        let charged = charged(&runs).await;
        assert_eq!(charged.usage.input, 1000);
        assert_eq!(charged.usage.output, 9, "25 bytes of text, three a token");
    }
}
