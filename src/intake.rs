//! Durable intake with group commit. Webhook handlers hand a delivery to one writer and wait;
//! the writer stores everything that queued up meanwhile in one transaction (one fsync),
//! answers each handler, and wakes the consumer. SQLite has a single writer anyway, so this
//! turns lock contention into batching. On SQLite the writer is a thread with a connection
//! of its own ([`DeliveryWriter`]), so that a batch waits neither for the consumer's work on
//! the runtime nor for a round trip per statement; on PostgreSQL it is a task on the pool.

use std::sync::Arc;

use tokio::sync::{Notify, mpsc, oneshot};

use crate::store::{DeliveryWriter, ReadyDelivery, Store};

/// The largest batch one transaction takes.
const MAX_BATCH: usize = 512;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    New,
    Duplicate,
}

#[derive(Debug, thiserror::Error)]
pub enum IntakeError {
    #[error("the intake writer has stopped")]
    Closed,
    #[error("storing the delivery failed")]
    Store,
}

struct Pending {
    delivery: ReadyDelivery,
    reply: oneshot::Sender<Result<Stored, IntakeError>>,
}

#[derive(Clone)]
pub struct Intake {
    tx: mpsc::Sender<Pending>,
}

impl Intake {
    /// Starts the writer. `stored` is notified after every commit that stored something.
    /// Fails only if the store's intake connection cannot be opened.
    pub fn spawn(store: Store, stored: Arc<Notify>) -> anyhow::Result<Self> {
        let (tx, rx) = mpsc::channel(4 * MAX_BATCH);
        match store.delivery_writer()? {
            Some(own) => {
                std::thread::Builder::new()
                    .name("director-intake".to_owned())
                    .spawn(move || write_on_thread(own, rx, &stored))?;
            }
            None => {
                tokio::spawn(writer(store, rx, stored));
            }
        }
        Ok(Self { tx })
    }

    /// Returns once the delivery is durably stored (or known already).
    pub async fn store(&self, delivery: ReadyDelivery) -> Result<Stored, IntakeError> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Pending { delivery, reply })
            .await
            .map_err(|_| IntakeError::Closed)?;
        answer.await.map_err(|_| IntakeError::Closed)?
    }
}

async fn writer(store: Store, mut rx: mpsc::Receiver<Pending>, stored: Arc<Notify>) {
    let mut batch: Vec<Pending> = Vec::with_capacity(MAX_BATCH);
    while rx.recv_many(&mut batch, MAX_BATCH).await > 0 {
        let (deliveries, replies): (Vec<_>, Vec<_>) =
            batch.drain(..).map(|p| (p.delivery, p.reply)).unzip();
        let stored_now = store.insert_ready(&deliveries).await;
        answer(replies, stored_now, &stored);
    }
}

/// The writer on SQLite: blocks on the queue, takes what waits behind the first delivery
/// (up to [`MAX_BATCH`]), stores it, answers. Ends when every [`Intake`] is gone.
fn write_on_thread(mut own: DeliveryWriter, mut rx: mpsc::Receiver<Pending>, stored: &Notify) {
    let mut batch: Vec<Pending> = Vec::with_capacity(MAX_BATCH);
    while let Some(first) = rx.blocking_recv() {
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        let (deliveries, replies): (Vec<_>, Vec<_>) =
            batch.drain(..).map(|p| (p.delivery, p.reply)).unzip();
        let stored_now = own.insert(deliveries);
        answer(replies, stored_now, stored);
    }
}

/// Answers each waiting handler with what became of its delivery; wakes the consumer if
/// anything was new.
fn answer(
    replies: Vec<oneshot::Sender<Result<Stored, IntakeError>>>,
    outcome: anyhow::Result<Vec<bool>>,
    stored: &Notify,
) {
    match outcome {
        Ok(fresh) => {
            let any_new = fresh.iter().any(|f| *f);
            for (reply, is_new) in replies.into_iter().zip(fresh) {
                let answer = if is_new {
                    Stored::New
                } else {
                    Stored::Duplicate
                };
                let _ = reply.send(Ok(answer));
            }
            if any_new {
                stored.notify_one();
            }
        }
        Err(error) => {
            tracing::error!(error = %format!("{error:#}"), batch = replies.len(), "storing deliveries failed");
            for reply in replies {
                let _ = reply.send(Err(IntakeError::Store));
            }
        }
    }
}
