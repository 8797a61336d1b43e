//! `director` hands labelled Forgejo issues to coding agents, safely: webhook intake and a
//! periodic scan bring issues in, one consumer decides what to do with each.
//!
//! # Layout
//!
//! The layers, each using only those below it (`farm-studio look` keeps it so):
//!
//! - [`domain`], [`clock`], [`limits`], [`failpoint`]: valid-by-construction types and the
//!   records kept of issues and runs; time as an input. No I/O.
//! - [`settings`]: the configuration, checked at start; a repository's `.director.toml`.
//! - [`event`]: what happened (a webhook, a scan, an action's outcome), the consumer's input.
//! - [`egress`], [`git_gateway`], [`models`]: what confined runs reach the outside through
//!   (the egress proxy, the git gateway, the metering model gateway).
//! - [`forge`]: Forgejo and GitHub behind one `Forge` trait; webhook payloads and signatures.
//! - [`runtime`], [`prepared`]: where runs execute (Docker, Kubernetes Jobs); prepared
//!   workspaces, their search for secrets and their snapshots.
//! - [`store`]: SQLite or PostgreSQL: deliveries, events, records, the outbox, leases.
//! - [`preflight`]: the model's read of an issue, its prompt and its comment.
//! - [`engine`]: `decide` (pure: event and record in, record and actions out), the consumer
//!   that runs it, the executor that performs actions, `act` (the effects).
//! - [`intake`], [`http`], [`hooks`], [`status`], [`metrics`], [`telemetry`]: the edges.
//! - [`startup`], [`cli`]: wiring the parts, and the `director` command line.
//!
//! One webhook delivery, from request to effect (a writer adds `headless`):
//!
//! 1. `http/webhook.rs` `receive`: the body read within its limits;
//! 2. `forge/signature.rs` `verify`: the signature checked;
//! 3. `forge/payload.rs` `parse_event`: the payload parsed into an `event::Event`;
//! 4. `intake.rs` `Intake::store`: the delivery and its event written in one transaction,
//!    200 only after the commit, the consumer woken;
//! 5. `engine/consumer.rs` `Consumer::drain`: the next event taken, the record and
//!    runs loaded;
//! 6. `engine/decide/mod.rs` `decide`: the new record and the actions to take;
//! 7. `store/mod.rs` `Store::commit` (`store/outbox.rs`): record and actions written in one
//!    transaction, under idempotency keys, the executor woken;
//! 8. `engine/executor.rs` `perform`: a due action claimed with a lease;
//! 9. `engine/act/mod.rs` `Acts::perform` (here `act/forge.rs` `resolve_trigger`): the effect
//!    on the forge or the runtime, its outcome an event stored as the action is marked done,
//!    and the consumer decides again until the issue rests.

pub mod cli;
pub mod clock;
pub mod domain;
pub mod egress;
pub mod engine;
pub mod event;
pub mod failpoint;
pub mod forge;
pub mod git_gateway;
pub mod hooks;
pub mod http;
pub mod intake;
pub mod limits;
pub mod metrics;
pub mod models;
pub mod preflight;
pub mod prepared;
pub mod runtime;
pub mod settings;
pub mod startup;
pub mod status;
pub mod store;
pub mod telemetry;
