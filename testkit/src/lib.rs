//! The director's test kit: stateful fakes of everything outside the process, used by the
//! service's tests, the benchmarks and the demo. Never linked into the service.
//!
//! - [`forge`]: `FakeForge`, a Forgejo held in memory and served over HTTP (API and git),
//!   every request checked against Forgejo's own API description (`forge::contract`).
//! - [`github`]: `FakeGitHub`, a GitHub (an App, its installations and tokens) on loopback,
//!   every request checked against GitHub's REST description.
//! - [`kube`]: `FakeKube`, a Kubernetes API server on loopback that also plays the Job
//!   controller and the kubelet.
//! - [`llm`]: `FakeLlm`, a model server speaking Anthropic's and OpenAI's APIs, scripted.
//! - [`otlp`]: `FakeOtlp`, an OpenTelemetry collector taking OTLP/HTTP trace exports.
//! - [`runtime`]: `FakeRuntime`, a container runtime in memory whose "containers" run scripted
//!   behaviours.

pub mod forge;
#[cfg(feature = "github")]
pub mod github;
#[cfg(feature = "kube")]
pub mod kube;
pub mod llm;
#[cfg(feature = "otlp")]
pub mod otlp;
pub mod provider;
pub mod runtime;

/// An HTTP client with the process's TLS provider installed: for the fakes' own calls
/// (webhook echoes) and the tests'.
pub fn http_client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}
