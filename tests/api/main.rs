//! One integration-test binary: each module spawns the real app against fakes.

mod helpers;

mod config;
mod durability;
mod webhook;
