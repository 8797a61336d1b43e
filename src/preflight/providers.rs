//! The three providers. Each is configured from `[preflight]`; each turns its failures into
//! [`PreflightError`] messages that never carry the API key.

use std::process::Stdio;
use std::time::Duration;

use async_trait::async_trait;
use reqwest::header::{HeaderMap, HeaderValue};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{Preflight, PreflightError, Reading};
use crate::models::usage::Api;
use crate::settings::{PreflightSettings, Provider, Secret};

/// Builds the provider named by `preflight.provider`.
pub fn from_settings(settings: &PreflightSettings) -> anyhow::Result<Box<dyn Preflight>> {
    Ok(match settings.provider {
        Provider::Anthropic => Box::new(Anthropic::new(settings)?),
        Provider::Openai => Box::new(OpenAi::new(settings)?),
        Provider::Command => Box::new(CommandProvider::new(settings)?),
    })
}

fn http_client(
    settings: &PreflightSettings,
    headers: HeaderMap,
) -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .default_headers(headers)
        .timeout(Duration::from_secs(settings.timeout_secs))
        .connect_timeout(Duration::from_secs(settings.timeout_secs.min(10)))
        .user_agent(concat!("director/", env!("CARGO_PKG_VERSION")))
        .build()?)
}

fn secret_header(value: String) -> anyhow::Result<HeaderValue> {
    let mut v = HeaderValue::from_str(&value).map_err(|_| {
        anyhow::anyhow!("preflight.api_key contains characters not allowed in a header")
    })?;
    v.set_sensitive(true);
    Ok(v)
}

/// `text` with every one of `keys` replaced.
fn redact_keys(text: &str, keys: &[String]) -> String {
    keys.iter()
        .filter(|k| k.len() >= 4)
        .fold(text.to_owned(), |t, k| t.replace(k.as_str(), "[redacted]"))
}

async fn post_json(
    client: &reqwest::Client,
    url: &str,
    body: &Value,
    timeout_secs: u64,
    keys: &[String],
) -> Result<Value, PreflightError> {
    let resp = client.post(url).json(body).send().await.map_err(|e| {
        if e.is_timeout() {
            PreflightError::Timeout(timeout_secs)
        } else {
            PreflightError::Transport(if e.is_connect() {
                "connection failed".into()
            } else {
                "request failed".into()
            })
        }
    })?;
    let status = resp.status();
    let bytes = crate::limits::read_capped(resp, crate::limits::PROVIDER_BODY_BYTES)
        .await
        .map_err(|e| match e {
            crate::limits::ReadError::Read(why) if why == "timed out" => {
                PreflightError::Timeout(timeout_secs)
            }
            e => PreflightError::Decode(e.to_string()),
        })?;
    let text = String::from_utf8_lossy(&bytes).into_owned();
    if !status.is_success() {
        let message = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| {
                v.pointer("/error/message")
                    .or_else(|| v.get("error"))
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            })
            .unwrap_or_else(|| text.clone());
        return Err(PreflightError::Status {
            status: status.as_u16(),
            // Shown on the issue: short, and never a key a proxy echoed back.
            message: crate::limits::shorten(
                &redact_keys(&message, keys),
                crate::limits::ERROR_TEXT_CHARS,
            ),
        });
    }
    serde_json::from_str(&text).map_err(|e| PreflightError::Decode(e.to_string()))
}

/// What the two HTTP providers share: a client with their headers, an endpoint, the model,
/// and one user message per read.
struct Endpoint {
    client: reqwest::Client,
    url: String,
    model: String,
    max_tokens: u32,
    timeout_secs: u64,
    /// Redacted from anything the provider says back.
    keys: Vec<String>,
}

impl Endpoint {
    fn new(s: &PreflightSettings, headers: HeaderMap, url: String) -> anyhow::Result<Self> {
        Ok(Self {
            client: http_client(s, headers)?,
            url,
            model: s.model.clone(),
            max_tokens: s.max_tokens,
            timeout_secs: s.timeout_secs,
            keys: vec![s.api_key.expose().to_owned()],
        })
    }

    /// Sends the prompt as one user message; returns the answer's JSON and the model named in
    /// it (or the configured one).
    async fn ask(&self, prompt: &str) -> Result<(Value, String), PreflightError> {
        let body = json!({
            "model": self.model,
            "max_tokens": self.max_tokens,
            "messages": [{ "role": "user", "content": prompt }],
        });
        let v = post_json(
            &self.client,
            &self.url,
            &body,
            self.timeout_secs,
            &self.keys,
        )
        .await?;
        let model = v["model"].as_str().unwrap_or(&self.model).to_owned();
        Ok((v, model))
    }
}

/// Anthropic's Messages API: `POST {base_url}/v1/messages`.
pub struct Anthropic(Endpoint);

impl Anthropic {
    pub fn new(s: &PreflightSettings) -> anyhow::Result<Self> {
        let mut headers = HeaderMap::new();
        headers.insert("x-api-key", secret_header(s.api_key.expose().to_owned())?);
        headers.insert("anthropic-version", HeaderValue::from_static("2023-06-01"));
        let base = if s.base_url.is_empty() {
            "https://api.anthropic.com"
        } else {
            s.base_url.as_str()
        };
        let url = format!(
            "{}/v1/messages",
            base.trim_end_matches('/').trim_end_matches("/v1")
        );
        Ok(Self(Endpoint::new(s, headers, url)?))
    }
}

#[async_trait]
impl Preflight for Anthropic {
    async fn read(&self, prompt: &str) -> Result<Reading, PreflightError> {
        let (v, model) = self.0.ask(prompt).await?;
        let text: String = v["content"]
            .as_array()
            .ok_or_else(|| PreflightError::Decode("no `content` in the answer".into()))?
            .iter()
            .filter(|b| b["type"] == "text")
            .filter_map(|b| b["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n");
        let usage = crate::models::usage::from_value(Api::AnthropicMessages, &v)
            .map(|u| (crate::models::Provider::Anthropic, u));
        Ok(Reading { text, model, usage })
    }

    fn model(&self) -> &str {
        &self.0.model
    }
}

/// OpenAI-compatible Chat Completions: `POST {base_url}/chat/completions`.
pub struct OpenAi(Endpoint);

impl OpenAi {
    pub fn new(s: &PreflightSettings) -> anyhow::Result<Self> {
        let mut headers = HeaderMap::new();
        if !s.api_key.is_empty() {
            headers.insert(
                "authorization",
                secret_header(format!("Bearer {}", s.api_key.expose()))?,
            );
        }
        if s.base_url.is_empty() {
            anyhow::bail!(
                "preflight.base_url is required for the openai provider (e.g. http://127.0.0.1:11434/v1)"
            );
        }
        let url = format!("{}/chat/completions", s.base_url.trim_end_matches('/'));
        Ok(Self(Endpoint::new(s, headers, url)?))
    }
}

#[async_trait]
impl Preflight for OpenAi {
    async fn read(&self, prompt: &str) -> Result<Reading, PreflightError> {
        let (v, model) = self.0.ask(prompt).await?;
        let text = v
            .pointer("/choices/0/message/content")
            .and_then(Value::as_str)
            .ok_or_else(|| {
                PreflightError::Decode("no `choices[0].message.content` in the answer".into())
            })?
            .to_owned();
        let usage = crate::models::usage::from_value(Api::OpenaiChat, &v)
            .map(|u| (crate::models::Provider::Openai, u));
        Ok(Reading { text, model, usage })
    }

    fn model(&self) -> &str {
        &self.0.model
    }
}

/// A local program: the prompt on stdin, the answer on stdout (e.g. an agent CLI in print
/// mode). Killed when it outlives the timeout.
pub struct CommandProvider {
    program: String,
    args: Vec<String>,
    model: String,
    timeout: Duration,
    api_key: Secret,
    /// The environment the program gets: `PATH`, `HOME` and `preflight.command_env`, read from
    /// the director's own; nothing else (the director's secrets stay out).
    env: Vec<(String, String)>,
}

impl CommandProvider {
    pub fn new(s: &PreflightSettings) -> anyhow::Result<Self> {
        let (program, args) = s.command.split_first().ok_or_else(|| {
            anyhow::anyhow!("preflight.command is required for the command provider")
        })?;
        Ok(Self {
            program: program.clone(),
            args: args.to_vec(),
            model: if s.model.is_empty() {
                program.clone()
            } else {
                s.model.clone()
            },
            timeout: Duration::from_secs(s.timeout_secs),
            api_key: s.api_key.clone(),
            env: ["PATH", "HOME"]
                .iter()
                .map(|n| (*n).to_owned())
                .chain(s.command_env.iter().cloned())
                .filter_map(|name| std::env::var(&name).ok().map(|v| (name, v)))
                .collect(),
        })
    }
}

impl CommandProvider {
    /// The command failed: its exit status and the end of what it printed to stderr,
    /// redacted before it is shortened (a cut must not leave half a key behind).
    fn failed(&self, status: std::process::ExitStatus, err: &[u8]) -> PreflightError {
        let keys: Vec<String> = std::iter::once(self.api_key.expose().to_owned())
            .chain(
                self.env
                    .iter()
                    .filter(|(k, _)| k != "PATH" && k != "HOME")
                    .map(|(_, v)| v.clone()),
            )
            .collect();
        let redacted = redact_keys(&String::from_utf8_lossy(err), &keys);
        let tail: String = redacted
            .chars()
            .rev()
            .take(crate::limits::ERROR_TEXT_CHARS)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        PreflightError::Command(format!("exited with {status}: {}", tail.trim()))
    }
}

#[async_trait]
impl Preflight for CommandProvider {
    async fn read(&self, prompt: &str) -> Result<Reading, PreflightError> {
        let mut cmd = tokio::process::Command::new(&self.program);
        cmd.args(&self.args)
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if !self.api_key.is_empty() {
            cmd.env("DIRECTOR_PREFLIGHT_API_KEY", self.api_key.expose());
        }
        let mut child = cmd.spawn().map_err(|e| {
            PreflightError::Command(format!("cannot start `{}`: {e}", self.program))
        })?;
        let mut stdin = child
            .stdin
            .take()
            .ok_or_else(|| PreflightError::Command("no stdin".into()))?;
        let mut stdout = child
            .stdout
            .take()
            .ok_or_else(|| PreflightError::Command("no stdout".into()))?;
        let mut stderr = child
            .stderr
            .take()
            .ok_or_else(|| PreflightError::Command("no stderr".into()))?;
        let prompt = prompt.to_owned();
        let cap = crate::limits::COMMAND_OUTPUT_BYTES;
        // Write and read at once: a program that answers before reading all of a large prompt
        // must not deadlock against a full pipe.
        let write = tokio::spawn(async move {
            let _ = stdin.write_all(prompt.as_bytes()).await;
            drop(stdin);
        });
        let errors = tokio::spawn(async move {
            let mut err = Vec::new();
            let _ = (&mut stderr).take(cap + 1).read_to_end(&mut err).await;
            err
        });
        let mut out = Vec::new();
        let mut limited = (&mut stdout).take(cap + 1);
        match tokio::time::timeout(self.timeout, limited.read_to_end(&mut out)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                let _ = child.kill().await;
                return Err(PreflightError::Command(format!("reading its output: {e}")));
            }
            Err(_) => {
                let _ = child.kill().await;
                return Err(PreflightError::Timeout(self.timeout.as_secs()));
            }
        }
        let limit = usize::try_from(cap).unwrap_or(usize::MAX);
        if out.len() > limit {
            // It would block on a pipe nobody reads any more.
            let _ = child.kill().await;
            return Err(PreflightError::Command(format!(
                "it printed more than {limit} bytes"
            )));
        }
        write.abort();
        let err = tokio::time::timeout(Duration::from_secs(5), errors)
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_default();
        let status = tokio::time::timeout(Duration::from_secs(5), child.wait())
            .await
            .map_err(|_| PreflightError::Timeout(self.timeout.as_secs()))?
            .map_err(|e| PreflightError::Command(e.to_string()))?;
        if !status.success() {
            return Err(self.failed(status, &err));
        }
        Ok(Reading {
            text: String::from_utf8_lossy(&out).into_owned(),
            model: self.model.clone(),
            usage: None,
        })
    }

    fn model(&self) -> &str {
        &self.model
    }
}
