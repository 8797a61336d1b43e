//! The pre-flight: before anything runs unattended, a language model reads the issue and
//! answers GO, NO-GO or WRONG-REPO. [`Preflight`] is the one trait over the three providers:
//! Anthropic's Messages API, an OpenAI-compatible Chat Completions endpoint (also Ollama,
//! vLLM, llama.cpp's server), or a local command that reads the prompt on stdin.

pub mod comment;
pub mod inert;
pub mod prompt;
pub mod providers;
pub mod visible;
pub use crate::domain::verdict;

use async_trait::async_trait;

/// What the model said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reading {
    pub text: String,
    /// The model that answered, for the comment's footer.
    pub model: String,
    /// What the call used, as the provider's answer says (a command says nothing).
    pub usage: Option<(crate::models::Provider, crate::models::usage::Usage)>,
}

#[derive(Debug, thiserror::Error)]
pub enum PreflightError {
    #[error("the provider did not answer within {0} s")]
    Timeout(u64),
    #[error("the provider answered HTTP {status}: {message}")]
    Status { status: u16, message: String },
    #[error("the provider could not be reached: {0}")]
    Transport(String),
    #[error("the provider's answer could not be read: {0}")]
    Decode(String),
    #[error("the command failed: {0}")]
    Command(String),
}

#[async_trait]
pub trait Preflight: Send + Sync {
    /// Sends `prompt` and returns the model's answer.
    async fn read(&self, prompt: &str) -> Result<Reading, PreflightError>;
    /// The model's name, as configured.
    fn model(&self) -> &str;
}
