//! The director's loop: one consumer turns stored deliveries (and, later, scan results)
//! into decisions. `decide` is pure; `consumer` performs the side effects.

pub mod consumer;
pub mod decide;
