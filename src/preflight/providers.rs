//! The three providers. Each is configured from `[preflight]`; each turns its failures into
//! [`PreflightError`] messages that never carry the API key.

use std::process::Stdio;
use std::time::Duration;

use async_trait::async_trait;
use reqwest::header::{HeaderMap, HeaderValue};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{Preflight, PreflightError, Reading};
use crate::settings::{PreflightSettings, Secret};

/// Builds the provider named by `preflight.provider`.
pub fn from_settings(settings: &PreflightSettings) -> anyhow::Result<Box<dyn Preflight>> {
    Ok(match settings.provider.as_str() {
        "anthropic" => Box::new(Anthropic::new(settings)?),
        "openai" => Box::new(OpenAi::new(settings)?),
        "command" => Box::new(CommandProvider::new(settings)?),
        other => anyhow::bail!("preflight.provider `{other}`: use anthropic, openai or command"),
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

async fn post_json(
    client: &reqwest::Client,
    url: &str,
    body: &Value,
    timeout_secs: u64,
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
    let text = resp.text().await.map_err(|e| {
        if e.is_timeout() {
            PreflightError::Timeout(timeout_secs)
        } else {
            PreflightError::Decode("body unreadable".into())
        }
    })?;
    if !status.is_success() {
        let message = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| {
                v.pointer("/error/message")
                    .or_else(|| v.get("error"))
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            })
            .unwrap_or_else(|| text.chars().take(200).collect());
        return Err(PreflightError::Status {
            status: status.as_u16(),
            message,
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
}

impl Endpoint {
    fn new(s: &PreflightSettings, headers: HeaderMap, url: String) -> anyhow::Result<Self> {
        Ok(Self {
            client: http_client(s, headers)?,
            url,
            model: s.model.clone(),
            max_tokens: s.max_tokens,
            timeout_secs: s.timeout_secs,
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
        let v = post_json(&self.client, &self.url, &body, self.timeout_secs).await?;
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
        Ok(Reading { text, model })
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
        Ok(Reading { text, model })
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
        })
    }
}

#[async_trait]
impl Preflight for CommandProvider {
    async fn read(&self, prompt: &str) -> Result<Reading, PreflightError> {
        let mut cmd = tokio::process::Command::new(&self.program);
        cmd.args(&self.args)
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
        let work = async move {
            // Write and read at once: a program that answers before reading all of a large
            // prompt must not deadlock against a full pipe.
            let write = async move {
                let _ = stdin.write_all(prompt.as_bytes()).await;
                drop(stdin);
            };
            let mut out = Vec::new();
            let mut err = Vec::new();
            let (_, o, e) = tokio::join!(
                write,
                stdout.read_to_end(&mut out),
                stderr.read_to_end(&mut err)
            );
            o.and(e).map(|_| (out, err))
        };
        let (out, err) = match tokio::time::timeout(self.timeout, work).await {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => return Err(PreflightError::Command(format!("reading its output: {e}"))),
            Err(_) => {
                let _ = child.kill().await;
                return Err(PreflightError::Timeout(self.timeout.as_secs()));
            }
        };
        let status = tokio::time::timeout(Duration::from_secs(5), child.wait())
            .await
            .map_err(|_| PreflightError::Timeout(self.timeout.as_secs()))?
            .map_err(|e| PreflightError::Command(e.to_string()))?;
        if !status.success() {
            let tail: String = String::from_utf8_lossy(&err)
                .chars()
                .rev()
                .take(300)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            let tail = if self.api_key.is_empty() {
                tail
            } else {
                tail.replace(self.api_key.expose(), "[redacted]")
            };
            return Err(PreflightError::Command(format!(
                "exited with {status}: {}",
                tail.trim()
            )));
        }
        Ok(Reading {
            text: String::from_utf8_lossy(&out).into_owned(),
            model: self.model.clone(),
        })
    }

    fn model(&self) -> &str {
        &self.model
    }
}
