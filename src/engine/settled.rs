//! Sync points for whoever waits on the engine (the tests, the demo): the consumer says when
//! it has consumed every stored event, the executor when nothing is due and nothing is in
//! flight. A waiter looks again each time one of them says something, never on a timer.

use std::sync::Arc;

use tokio::sync::watch;

/// What the engine has in hand, as its two loops last said.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Activity {
    /// Consumer passes finished (each drain of the stored events).
    pub consumer_passes: u64,
    /// The consumer's last pass left no stored event unconsumed.
    pub consumer_idle: bool,
    /// Executor rounds finished (a claim round, or a batch of outcomes recorded).
    pub executor_rounds: u64,
    /// The executor's last round found nothing due and nothing in flight.
    pub executor_idle: bool,
}

impl Activity {
    /// Both loops said they have nothing in hand.
    pub fn is_settled(&self) -> bool {
        self.consumer_idle && self.executor_idle
    }
}

/// Where the consumer and the executor publish their [`Activity`]. Cloned into both; any
/// number of waiters [`Settled::watch`] it. Publishing costs a lock and nothing else: with no
/// one watching, nothing waits.
#[derive(Clone, Debug)]
pub struct Settled(Arc<watch::Sender<Activity>>);

impl Default for Settled {
    fn default() -> Self {
        Self(Arc::new(watch::Sender::new(Activity::default())))
    }
}

impl Settled {
    /// The consumer finished a pass; `idle`: nothing stored is left to consume.
    pub fn consumer_passed(&self, idle: bool) {
        self.0.send_modify(|a| {
            a.consumer_passes = a.consumer_passes.wrapping_add(1);
            a.consumer_idle = idle;
        });
    }

    /// The executor finished a round; `idle`: nothing was due and nothing is in flight.
    pub fn executor_round(&self, idle: bool) {
        self.0.send_modify(|a| {
            a.executor_rounds = a.executor_rounds.wrapping_add(1);
            a.executor_idle = idle;
        });
    }

    /// The activity as it is now, and each change after.
    pub fn watch(&self) -> watch::Receiver<Activity> {
        self.0.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_waiter_is_woken_by_each_loop_and_sees_settled_only_when_both_are_idle() {
        let settled = Settled::default();
        let mut seen = settled.watch();
        assert!(!seen.borrow_and_update().is_settled());
        settled.consumer_passed(true);
        seen.changed().await.expect("the sender lives");
        assert!(
            !seen.borrow_and_update().is_settled(),
            "the executor has not said"
        );
        settled.executor_round(true);
        seen.changed().await.expect("the sender lives");
        let now = *seen.borrow_and_update();
        assert!(now.is_settled());
        assert_eq!((now.consumer_passes, now.executor_rounds), (1, 1));
        settled.executor_round(false);
        seen.changed().await.expect("the sender lives");
        assert!(
            !seen.borrow_and_update().is_settled(),
            "an action is in flight"
        );
    }
}
