//! `director` hands labelled Forgejo issues to coding agents, safely: webhook intake and a
//! periodic scan bring issues in, one consumer decides what to do with each.

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
