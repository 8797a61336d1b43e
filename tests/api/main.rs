//! One integration-test binary: each module spawns the real app against fakes.

mod forge_helpers;
mod helpers;

mod agent_choice;
mod agents;
mod approval;
mod chart;
mod checks;
mod config;
mod continues;
mod contract;
mod crash;
mod cut;
mod durability;
mod egress;
mod fake_runs;
mod filers;
mod flood;
mod forecast;
mod forks;
mod git;
mod git_gateway;
#[cfg(feature = "github")]
mod github;
#[cfg(feature = "github")]
mod github_git;
mod hooks;
mod host_firewall;
mod image;
mod incremental;
#[cfg(feature = "kubernetes")]
mod kube;
mod lane;
mod layout;
mod models;
mod outbox;
mod outcomes;
mod pg;
mod preflight;
mod pulls;
mod questions;
mod replicas;
mod repo_settings;
mod runs;
mod sandbox;
mod scenarios;
mod setup;
mod status_page;
mod store;
mod traces;
mod transcripts;
mod webhook;
