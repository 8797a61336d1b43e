//! The director's test kit: stateful fakes of everything outside the process, used by the
//! service's tests, the benchmarks and the demo. Never linked into the service.
//!
//! - [`forge`]: `FakeForge`, a Forgejo held in memory and served over HTTP (API and git),
//!   every request checked against Forgejo's own API description (`forge::contract`).
//! - [`runtime`]: `FakeRuntime`, a container runtime in memory whose "containers" run scripted
//!   behaviours.

pub mod forge;
pub mod runtime;
