//! GitHub as a forge: its webhook bodies (always built: `POST /webhooks/github`), and with
//! the `github` feature the client behind [`crate::forge::Forge`], a GitHub App through
//! octocrab.

#[cfg(feature = "github")]
mod client;
pub mod payload;

#[cfg(feature = "github")]
pub use client::*;
