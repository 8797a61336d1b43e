//! The director's loop. Events (webhooks, scan observations, executor outcomes) are stored;
//! the `consumer` feeds each to `decide` (pure: the one place that chooses a state) and commits
//! the new state with the `action`s it calls for; the `executor` performs those actions
//! through `act` and reports their outcomes as events; the `watcher` reports when a run's
//! container ends; the `scanner` finds what webhooks missed; `comments` holds the texts.

pub mod act;
pub mod action;
pub mod checks_poll;
pub mod comments;
pub mod consumer;
pub mod decide;
pub mod executor;
pub mod reverts;
pub mod scanner;
pub mod settled;
pub mod transcript;
pub mod undo;
pub mod watcher;
