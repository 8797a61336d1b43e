//! The director's loop: one consumer turns stored deliveries and scan observations into
//! decisions. `decide` is pure; `consumer` performs the side effects; `scanner` finds what
//! webhooks missed; `comments` holds every text the director posts.

pub mod comments;
pub mod consumer;
pub mod decide;
pub mod runs;
pub mod scanner;
