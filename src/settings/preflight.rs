//! `[preflight]`: which model reads each issue first, and how.

use super::*;

/// Which model reads each issue first (`preflight.provider`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Provider {
    /// Anthropic's Messages API.
    Anthropic,
    /// OpenAI's Chat Completions, or any compatible endpoint (Ollama, vLLM, llama.cpp).
    #[default]
    Openai,
    /// A local program: the prompt on its stdin, the answer on its stdout.
    Command,
}

impl Provider {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Anthropic => "anthropic",
            Self::Openai => "openai",
            Self::Command => "command",
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnError {
    /// A pre-flight that could not run leaves the issue waiting.
    #[default]
    Wait,
    /// A pre-flight that could not run lets the issue proceed to a run.
    Proceed,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PreflightSettings {
    /// Run pre-flights (needs a forge). Off: picked-up issues wait in `pending`.
    pub enabled: bool,
    /// `anthropic`, `openai` (any compatible endpoint) or `command`.
    pub provider: Provider,
    #[serde(deserialize_with = "lenient::string")]
    pub base_url: String,
    #[serde(deserialize_with = "lenient::string")]
    pub model: String,
    pub api_key: Secret,
    #[serde(deserialize_with = "lenient::opt_string")]
    pub api_key_file: Option<String>,
    /// For `command`: the program and its arguments; the prompt arrives on stdin.
    #[serde(deserialize_with = "lenient::list")]
    pub command: Vec<String>,
    /// For `command`: the environment variables (besides `PATH` and `HOME`) the program
    /// gets; everything else, the director's own secrets included, is cleared.
    #[serde(deserialize_with = "lenient::list")]
    pub command_env: Vec<String>,
    /// Per read, in seconds.
    pub timeout_secs: u64,
    /// Whether a GO waits for a writer's `/director go`: `never`, `over_forecast` (when the
    /// forecast's high end is over `budget.run_usd`) or `always`. A repository's
    /// `.director.toml` may only make it stricter.
    pub approval: crate::domain::approval::Approval,
    /// Cap on the model's answer, in tokens.
    pub max_tokens: u32,
    /// Reads tried (errors, timeouts, answers without a verdict) before giving up.
    pub max_attempts: u32,
    /// First wait between attempts, doubled each time, in milliseconds.
    pub retry_backoff_ms: u64,
    /// Reads in a row that may say NEEDS-INFO; the next one that would is NO-GO with the
    /// open questions.
    pub max_question_rounds: u32,
    /// `wait` (default) or `proceed` when the pre-flight could not run.
    pub on_error: OnError,
    /// Owners (users or organisations) a WRONG-REPO issue may be filed with.
    #[serde(deserialize_with = "lenient::list")]
    pub trusted_owners: Vec<String>,
    /// Accounts whose comments count as trusted without write access (e.g. the broker that
    /// files issues for explore agents).
    #[serde(deserialize_with = "lenient::list")]
    pub automation_accounts: Vec<String>,
    /// A prompt template replacing the built-in one (`config/preflight-prompt.md`).
    #[serde(deserialize_with = "lenient::opt_string")]
    pub template_file: Option<String>,
    /// Reads per hour, over all repositories and per repository.
    pub max_per_hour: u32,
    pub max_per_repo_per_hour: u32,
    /// Reads at once.
    pub concurrency: usize,
}

impl Default for PreflightSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            provider: Provider::Openai,
            base_url: String::new(),
            model: String::new(),
            api_key: Secret::default(),
            api_key_file: None,
            command: Vec::new(),
            command_env: Vec::new(),
            timeout_secs: 180,
            approval: crate::domain::approval::Approval::Never,
            max_tokens: 1024,
            max_attempts: 3,
            retry_backoff_ms: 30_000,
            max_question_rounds: 3,
            on_error: OnError::Wait,
            trusted_owners: Vec::new(),
            automation_accounts: Vec::new(),
            template_file: None,
            max_per_hour: 60,
            max_per_repo_per_hour: 20,
            concurrency: 2,
        }
    }
}

impl PreflightSettings {
    /// Its keys alone.
    pub(super) fn validate(&self) -> Result<(), SettingsError> {
        let p = self;
        if p.enabled && p.provider == Provider::Command && p.command.is_empty() {
            return Err(invalid(
                "preflight.command",
                "required when preflight.provider is `command`",
            ));
        }
        if p.timeout_secs == 0 {
            return Err(invalid("preflight.timeout_secs", "must be greater than 0"));
        }
        if p.max_attempts == 0 {
            return Err(invalid("preflight.max_attempts", "must be at least 1"));
        }
        if p.max_question_rounds == 0 {
            return Err(invalid(
                "preflight.max_question_rounds",
                "must be at least 1",
            ));
        }
        if p.concurrency == 0 {
            return Err(invalid("preflight.concurrency", "must be at least 1"));
        }
        if let Some(file) = &p.template_file
            && !Path::new(file).is_file()
        {
            return Err(invalid(
                "preflight.template_file",
                format!("{file} does not exist"),
            ));
        }
        Ok(())
    }
}
