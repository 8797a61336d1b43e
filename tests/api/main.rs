//! One integration-test binary: each module spawns the real app against fakes.

mod forge_helpers;
mod helpers;

mod config;
mod contract;
mod durability;
mod scenarios;
mod webhook;
