//! Everything about the forge: webhook payloads now; the API client joins later.

pub mod payload;
