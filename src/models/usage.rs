//! What a model call used, read from the provider's own answer: Anthropic's Messages
//! (`usage`, or `message_start` then cumulative `message_delta`s in a stream), OpenAI's chat
//! completions (`usage`, or the last chunk with `stream_options.include_usage`) and
//! responses (`usage` of the response, or of `response.completed`/`incomplete`/`failed`).
//! Both providers' counts are normalised to disjoint parts: fresh input, cache reads, cache
//! writes, output (Anthropic's cache counts come on top of `input_tokens`; OpenAI's are
//! inside `prompt_tokens`/`input_tokens`).

use serde_json::Value;

use crate::settings::Price;

/// Which API an answer came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    AnthropicMessages,
    OpenaiChat,
    OpenaiResponses,
}

/// Tokens of one call, in disjoint parts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Input neither read from nor written to a cache.
    pub input: u64,
    pub cache_read: u64,
    /// Cache writes at the short (Anthropic: 5-minute) rate.
    pub cache_write: u64,
    /// Anthropic's 1-hour cache writes.
    pub cache_write_1h: u64,
    /// Output, reasoning and thinking included (both providers bill them as output).
    pub output: u64,
    /// Web searches the provider ran for the call (Anthropic's `server_tool_use`, OpenAI's
    /// `web_search_call` items), billed per search besides the tokens.
    pub web_searches: u64,
}

/// Both providers' published price of one web search ($10 per thousand), when
/// `models.prices` gives none.
pub const WEB_SEARCH_USD: f64 = 0.01;

impl Usage {
    pub fn input_total(&self) -> u64 {
        self.input + self.cache_read + self.cache_write + self.cache_write_1h
    }

    /// Its cost in dollars at `price`.
    pub fn cost(&self, price: &Price) -> f64 {
        let per = |tokens: u64, usd_per_mtok: f64| tokens as f64 * usd_per_mtok / 1_000_000.0;
        let read = price.cache_read_per_mtok.unwrap_or(price.input_per_mtok);
        let write = price.cache_write_per_mtok.unwrap_or(price.input_per_mtok);
        let write_1h = price
            .cache_write_per_mtok
            .map_or(2.0 * price.input_per_mtok, |w| w * 1.6);
        per(self.input, price.input_per_mtok)
            + per(self.cache_read, read)
            + per(self.cache_write, write)
            + per(self.cache_write_1h, write_1h)
            + per(self.output, price.output_per_mtok)
            + self.web_searches as f64 * price.web_search_usd.unwrap_or(WEB_SEARCH_USD)
    }

    /// Each part the larger of the two: what a call is charged when its usage did not
    /// arrive, its reservation (`worst`) beside what passed.
    pub fn at_least(self, worst: Usage) -> Usage {
        Usage {
            input: self.input.max(worst.input),
            cache_read: self.cache_read.max(worst.cache_read),
            cache_write: self.cache_write.max(worst.cache_write),
            cache_write_1h: self.cache_write_1h.max(worst.cache_write_1h),
            output: self.output.max(worst.output),
            web_searches: self.web_searches.max(worst.web_searches),
        }
    }
}

impl Usage {
    /// What a call whose answer did not say (or said only in part) is charged: its input
    /// from the request's size (four bytes a token), its output from the text that passed
    /// (three bytes a token: code and non-English text run denser than prose).
    pub fn estimate(request_bytes: usize, output_bytes: u64) -> Self {
        Self {
            input: (request_bytes as u64).div_ceil(4),
            output: output_bytes.div_ceil(3),
            ..Self::default()
        }
    }
}

fn n(v: &Value) -> Option<u64> {
    v.as_u64()
}

/// Anthropic's `usage` object, over what was known before: every field present replaces.
fn anthropic(usage: &Value, into: &mut Usage) {
    if let Some(x) = n(&usage["input_tokens"]) {
        into.input = x;
    }
    if let Some(x) = n(&usage["output_tokens"]) {
        into.output = x;
    }
    if let Some(x) = n(&usage["cache_read_input_tokens"]) {
        into.cache_read = x;
    }
    let split = &usage["cache_creation"];
    let (m5, h1) = (
        n(&split["ephemeral_5m_input_tokens"]),
        n(&split["ephemeral_1h_input_tokens"]),
    );
    if m5.is_some() || h1.is_some() {
        into.cache_write = m5.unwrap_or(0);
        into.cache_write_1h = h1.unwrap_or(0);
    } else if let Some(x) = n(&usage["cache_creation_input_tokens"]) {
        into.cache_write = x;
        into.cache_write_1h = 0;
    }
    if let Some(x) = n(&usage["server_tool_use"]["web_search_requests"]) {
        into.web_searches = x;
    }
}

/// Web searches a Responses answer ran: its `web_search_call` output items.
fn searches(response: &Value) -> u64 {
    response["output"].as_array().map_or(0, |items| {
        items
            .iter()
            .filter(|i| i["type"].as_str() == Some("web_search_call"))
            .count() as u64
    })
}

/// OpenAI's `usage` (chat's `prompt_tokens`/`completion_tokens`, or responses'
/// `input_tokens`/`output_tokens`), its cached parts taken out of the input.
fn openai(usage: &Value) -> Option<Usage> {
    let input = n(&usage["prompt_tokens"]).or_else(|| n(&usage["input_tokens"]))?;
    let output = n(&usage["completion_tokens"])
        .or_else(|| n(&usage["output_tokens"]))
        .unwrap_or(0);
    let details = if usage["prompt_tokens_details"].is_object() {
        &usage["prompt_tokens_details"]
    } else {
        &usage["input_tokens_details"]
    };
    let cache_read = n(&details["cached_tokens"]).unwrap_or(0).min(input);
    let cache_write = n(&details["cache_write_tokens"])
        .unwrap_or(0)
        .min(input - cache_read);
    Some(Usage {
        input: input - cache_read - cache_write,
        cache_read,
        cache_write,
        cache_write_1h: 0,
        output,
        web_searches: 0,
    })
}

/// The usage of a whole (not streamed) JSON answer.
pub fn from_body(api: Api, body: &[u8]) -> Option<Usage> {
    let v: Value = serde_json::from_slice(body).ok()?;
    from_value(api, &v)
}

/// The usage of a whole answer of which only its end was kept (it was too large to keep
/// whole): the last `"usage"` object in it, which both providers put at the end.
pub fn from_tail(api: Api, tail: &[u8]) -> Option<Usage> {
    let key = b"\"usage\"";
    let at = tail.windows(key.len()).rposition(|w| w == key)?;
    let rest = tail[at + key.len()..]
        .trim_ascii_start()
        .strip_prefix(b":")?;
    let usage: Value = serde_json::Deserializer::from_slice(rest)
        .into_iter::<Value>()
        .next()?
        .ok()?;
    from_value(api, &serde_json::json!({ "usage": usage }))
}

/// The usage of a whole answer already read as JSON.
pub fn from_value(api: Api, v: &Value) -> Option<Usage> {
    let usage = &v["usage"];
    if !usage.is_object() {
        return None;
    }
    match api {
        Api::AnthropicMessages => {
            let mut u = Usage::default();
            anthropic(usage, &mut u);
            Some(u)
        }
        Api::OpenaiChat => openai(usage),
        Api::OpenaiResponses => openai(usage).map(|u| Usage {
            web_searches: searches(v),
            ..u
        }),
    }
}

/// Reads a server-sent event stream as it passes, chunk by chunk (a line may be split
/// across chunks), and keeps the usage it reports so far.
#[derive(Debug)]
pub struct StreamMeter {
    api: Api,
    pending: Vec<u8>,
    /// The line being read is over [`MAX_LINE`]: skipped up to its end.
    skipping: bool,
    usage: Option<Usage>,
    /// Bytes of generated text (and tool arguments) that passed, for an estimate.
    text_bytes: u64,
    /// The stream reached its end event: the usage it reported is whole.
    ended: bool,
    /// Lines skipped for their length.
    skipped: u64,
}

/// A line longer than this is not an event the meter needs; it is skipped, not kept.
const MAX_LINE: usize = 1 << 20;

impl StreamMeter {
    pub fn new(api: Api) -> Self {
        Self {
            api,
            pending: Vec::new(),
            skipping: false,
            usage: None,
            text_bytes: 0,
            ended: false,
            skipped: 0,
        }
    }

    /// Bytes of generated text that passed.
    pub fn text_bytes(&self) -> u64 {
        self.text_bytes
    }

    /// Whether the stream reached its end event.
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// Lines skipped for being over the length the meter reads.
    pub fn skipped(&self) -> u64 {
        self.skipped
    }

    pub fn feed(&mut self, chunk: &[u8]) {
        let mut rest = chunk;
        while let Some(i) = rest.iter().position(|b| *b == b'\n') {
            if !self.skipping && self.pending.len() + i <= MAX_LINE {
                self.pending.extend_from_slice(&rest[..i]);
                let line = std::mem::take(&mut self.pending);
                self.line(&line);
            }
            self.pending.clear();
            self.skipping = false;
            rest = &rest[i + 1..];
        }
        if self.skipping || self.pending.len() + rest.len() > MAX_LINE {
            if !self.skipping {
                self.skipped += 1;
            }
            self.pending.clear();
            self.skipping = true;
        } else {
            self.pending.extend_from_slice(rest);
        }
    }

    /// What the stream reported, with a last line that had no newline read too.
    pub fn finish(&mut self) -> Option<Usage> {
        let line = std::mem::take(&mut self.pending);
        if !self.skipping {
            self.line(&line);
        }
        self.usage
    }

    fn line(&mut self, line: &[u8]) {
        let Some(data) = line.strip_prefix(b"data:") else {
            return;
        };
        let data = data.trim_ascii();
        if data == b"[DONE]" {
            self.ended = true;
            return;
        }
        let Ok(v) = serde_json::from_slice::<Value>(data) else {
            return;
        };
        self.text_bytes += generated(self.api, &v);
        match self.api {
            Api::AnthropicMessages => match v["type"].as_str() {
                Some("message_start") => {
                    let mut u = Usage::default();
                    anthropic(&v["message"]["usage"], &mut u);
                    self.usage = Some(u);
                }
                Some("message_delta") => {
                    let mut u = self.usage.unwrap_or_default();
                    anthropic(&v["usage"], &mut u);
                    self.usage = Some(u);
                }
                Some("message_stop") => self.ended = true,
                _ => {}
            },
            Api::OpenaiChat => {
                // Its last chunk, asked for with `include_usage`.
                if let Some(u) = openai(&v["usage"]) {
                    self.usage = Some(u);
                    self.ended = true;
                }
            }
            Api::OpenaiResponses => {
                let terminal = matches!(
                    v["type"].as_str(),
                    Some("response.completed" | "response.incomplete" | "response.failed")
                );
                if terminal && let Some(u) = openai(&v["response"]["usage"]) {
                    self.usage = Some(Usage {
                        web_searches: searches(&v["response"]),
                        ..u
                    });
                    self.ended = true;
                }
            }
        }
    }
}

/// Bytes of text an event carries that the model generated: text, thinking and tool
/// arguments, in either provider's deltas.
fn generated(api: Api, v: &Value) -> u64 {
    let len = |x: &Value| x.as_str().map_or(0, |s| s.len() as u64);
    match api {
        Api::AnthropicMessages => {
            let d = &v["delta"];
            len(&d["text"]) + len(&d["partial_json"]) + len(&d["thinking"])
        }
        Api::OpenaiChat => v["choices"].as_array().map_or(0, |choices| {
            choices
                .iter()
                .map(|c| {
                    let d = &c["delta"];
                    let tools = d["tool_calls"].as_array().map_or(0, |calls| {
                        calls.iter().map(|t| len(&t["function"]["arguments"])).sum()
                    });
                    len(&d["content"]) + len(&d["reasoning_content"]) + tools
                })
                .sum()
        }),
        Api::OpenaiResponses => {
            let delta = v["type"].as_str().is_some_and(|t| t.ends_with(".delta"));
            if delta { len(&v["delta"]) } else { 0 }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A streamed Messages answer as Anthropic's documentation shows it: the input side in
    /// `message_start`, cumulative counts in `message_delta`, pings and unknown events.
    const ANTHROPIC_STREAM: &str = concat!(
        "event: message_start\n",
        "data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"claude-opus-4-7\",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":25,\"cache_creation_input_tokens\":120,\"cache_read_input_tokens\":2000,\"cache_creation\":{\"ephemeral_5m_input_tokens\":100,\"ephemeral_1h_input_tokens\":20},\"output_tokens\":1}}}\n\n",
        "event: content_block_start\n",
        "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
        "event: ping\n",
        "data: {\"type\": \"ping\"}\n\n",
        "event: content_block_delta\n",
        "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello\"}}\n\n",
        "event: something_new\n",
        "data: {\"type\":\"something_new\",\"usage\":{\"output_tokens\":999999}}\n\n",
        "event: content_block_stop\n",
        "data: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
        "event: message_delta\n",
        "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":15}}\n\n",
        "event: message_delta\n",
        "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":42}}\n\n",
        "event: message_stop\n",
        "data: {\"type\":\"message_stop\"}\n\n",
    );

    /// A chat completion streamed with `stream_options.include_usage`: `usage: null` on every
    /// chunk, then one chunk with empty `choices` and the whole request's usage.
    const OPENAI_CHAT_STREAM: &str = concat!(
        "data: {\"id\":\"chatcmpl-123\",\"object\":\"chat.completion.chunk\",\"created\":1694268190,\"model\":\"gpt-4o-mini\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}],\"usage\":null}\n\n",
        "data: {\"id\":\"chatcmpl-123\",\"object\":\"chat.completion.chunk\",\"created\":1694268190,\"model\":\"gpt-4o-mini\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"},\"finish_reason\":null}],\"usage\":null}\n\n",
        "data: {\"id\":\"chatcmpl-123\",\"object\":\"chat.completion.chunk\",\"created\":1694268190,\"model\":\"gpt-4o-mini\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":null}\n\n",
        "data: {\"id\":\"chatcmpl-123\",\"object\":\"chat.completion.chunk\",\"created\":1694268190,\"model\":\"gpt-4o-mini\",\"choices\":[],\"usage\":{\"prompt_tokens\":1200,\"completion_tokens\":30,\"total_tokens\":1230,\"prompt_tokens_details\":{\"cached_tokens\":1024,\"audio_tokens\":0},\"completion_tokens_details\":{\"reasoning_tokens\":10}}}\n\n",
        "data: [DONE]\n\n",
    );

    const OPENAI_RESPONSES_STREAM: &str = concat!(
        "event: response.created\n",
        "data: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\",\"status\":\"in_progress\",\"usage\":null}}\n\n",
        "event: response.output_text.delta\n",
        "data: {\"type\":\"response.output_text.delta\",\"sequence_number\":1,\"delta\":\"Hi\"}\n\n",
        "event: response.completed\n",
        "data: {\"type\":\"response.completed\",\"sequence_number\":2,\"response\":{\"id\":\"resp_1\",\"status\":\"completed\",\"usage\":{\"input_tokens\":300,\"input_tokens_details\":{\"cached_tokens\":100},\"output_tokens\":50,\"output_tokens_details\":{\"reasoning_tokens\":20},\"total_tokens\":350}}}\n\n",
    );

    /// Feeds `text` in chunks of `size` bytes, splitting lines anywhere.
    fn metered(api: Api, text: &str, size: usize) -> Option<Usage> {
        let mut m = StreamMeter::new(api);
        for chunk in text.as_bytes().chunks(size) {
            m.feed(chunk);
        }
        m.finish()
    }

    #[test]
    fn an_anthropic_stream_counts_its_start_then_replaces_with_each_delta() {
        let want = Usage {
            input: 25,
            cache_read: 2000,
            cache_write: 100,
            cache_write_1h: 20,
            output: 42,
            web_searches: 0,
        };
        for size in [1, 7, 64, 100_000] {
            assert_eq!(
                metered(Api::AnthropicMessages, ANTHROPIC_STREAM, size),
                Some(want)
            );
        }
    }

    #[test]
    fn an_anthropic_stream_cut_before_its_delta_still_counts_the_input() {
        let cut = &ANTHROPIC_STREAM[..ANTHROPIC_STREAM
            .find("event: content_block_delta")
            .unwrap_or(0)];
        let u = metered(Api::AnthropicMessages, cut, 13).expect("the start was read");
        assert_eq!((u.input, u.cache_read, u.output), (25, 2000, 1));
    }

    #[test]
    fn openai_chat_and_responses_streams_count_their_last_usage_with_cache_taken_out() {
        assert_eq!(
            metered(Api::OpenaiChat, OPENAI_CHAT_STREAM, 5),
            Some(Usage {
                input: 176,
                cache_read: 1024,
                output: 30,
                ..Usage::default()
            })
        );
        assert_eq!(
            metered(Api::OpenaiResponses, OPENAI_RESPONSES_STREAM, 9),
            Some(Usage {
                input: 200,
                cache_read: 100,
                output: 50,
                ..Usage::default()
            })
        );
        // Without include_usage a chat stream reports nothing.
        let bare = OPENAI_CHAT_STREAM.replace("\"usage\":{", "\"x\":{");
        assert_eq!(metered(Api::OpenaiChat, &bare, 50), None);
    }

    #[test]
    fn whole_answers_are_read_from_their_usage() {
        let anthropic = br#"{"id":"msg_01","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[{"type":"text","text":"Hi"}],"stop_reason":"end_turn","usage":{"input_tokens":10,"cache_creation_input_tokens":5,"cache_read_input_tokens":0,"output_tokens":7}}"#;
        assert_eq!(
            from_body(Api::AnthropicMessages, anthropic),
            Some(Usage {
                input: 10,
                cache_write: 5,
                output: 7,
                ..Usage::default()
            })
        );
        let chat = br#"{"id":"chatcmpl-1","object":"chat.completion","model":"gpt-4o","choices":[],"usage":{"prompt_tokens":19,"completion_tokens":10,"total_tokens":29}}"#;
        assert_eq!(
            from_body(Api::OpenaiChat, chat),
            Some(Usage {
                input: 19,
                output: 10,
                ..Usage::default()
            })
        );
        assert_eq!(from_body(Api::OpenaiChat, b"not json"), None);
        assert_eq!(from_body(Api::OpenaiChat, br#"{"usage":null}"#), None);
        // Counts that do not add up never underflow.
        let odd = br#"{"usage":{"prompt_tokens":5,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":9,"cache_write_tokens":4}}}"#;
        assert_eq!(
            from_body(Api::OpenaiChat, odd),
            Some(Usage {
                input: 0,
                cache_read: 5,
                output: 1,
                ..Usage::default()
            })
        );
    }

    #[test]
    fn cost_prices_each_part_at_its_rate() {
        let price = Price {
            input_per_mtok: 5.0,
            output_per_mtok: 25.0,
            cache_read_per_mtok: Some(0.5),
            cache_write_per_mtok: Some(6.25),
            web_search_usd: None,
        };
        let u = Usage {
            input: 1_000_000,
            cache_read: 1_000_000,
            cache_write: 1_000_000,
            cache_write_1h: 1_000_000,
            output: 1_000_000,
            web_searches: 0,
        };
        assert!((u.cost(&price) - (5.0 + 0.5 + 6.25 + 10.0 + 25.0)).abs() < 1e-9);
        let plain = Price {
            input_per_mtok: 1.0,
            output_per_mtok: 2.0,
            ..Price::default()
        };
        assert!((u.cost(&plain) - (1.0 + 1.0 + 1.0 + 2.0 + 2.0)).abs() < 1e-9);
    }

    #[test]
    fn reasoning_is_billed_output_and_web_searches_are_billed_each() {
        // Reasoning and thinking are inside the output counts both providers bill.
        let chat = serde_json::json!({"usage": {"prompt_tokens": 10, "completion_tokens": 5000,
            "completion_tokens_details": {"reasoning_tokens": 4990}}});
        assert_eq!(
            from_value(Api::OpenaiChat, &chat).map(|u| u.output),
            Some(5000)
        );
        let anthropic = serde_json::json!({"usage": {"input_tokens": 10, "output_tokens": 3000,
            "output_tokens_details": {"thinking_tokens": 2900},
            "server_tool_use": {"web_search_requests": 3}}});
        let u = from_value(Api::AnthropicMessages, &anthropic).expect("read");
        assert_eq!((u.output, u.web_searches), (3000, 3));
        let responses = serde_json::json!({"output": [
            {"type": "web_search_call", "id": "ws_1", "status": "completed"},
            {"type": "reasoning", "id": "rs_1"},
            {"type": "web_search_call", "id": "ws_2", "status": "completed"},
            {"type": "message", "id": "m"}],
            "usage": {"input_tokens": 10, "output_tokens": 20}});
        let u = from_value(Api::OpenaiResponses, &responses).expect("read");
        assert_eq!(u.web_searches, 2);
        let mut m = StreamMeter::new(Api::OpenaiResponses);
        m.feed(
            format!(
                "data: {}\n\n",
                serde_json::json!({"type": "response.completed", "response": responses})
            )
            .as_bytes(),
        );
        assert_eq!(m.finish().map(|u| u.web_searches), Some(2));
        let price = Price::default();
        let searches = Usage {
            web_searches: 3,
            ..Usage::default()
        };
        assert!((searches.cost(&price) - 0.03).abs() < 1e-12);
        let own = Price {
            web_search_usd: Some(0.025),
            ..Price::default()
        };
        assert!((searches.cost(&own) - 0.075).abs() < 1e-12);
    }

    #[test]
    fn an_endless_line_is_skipped_not_kept() {
        let mut m = StreamMeter::new(Api::OpenaiChat);
        let junk = vec![b'x'; 3 * MAX_LINE];
        m.feed(&junk);
        assert!(m.pending.is_empty());
        m.feed(b"\ndata: {\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}\n");
        assert_eq!(m.finish().map(|u| (u.input, u.output)), Some((3, 4)));
    }

    #[test]
    fn an_answer_too_large_to_keep_is_read_from_its_end() {
        // The kept end of a huge chat answer (logprobs, many choices): its start is gone,
        // its usage is last.
        let tail = br#"9, "token": "\"usage\"" }]}}], "usage": {"prompt_tokens": 1200, "completion_tokens": 300, "prompt_tokens_details": {"cached_tokens": 200}}, "system_fingerprint": null}"#;
        let u = from_tail(Api::OpenaiChat, tail).expect("read");
        assert_eq!((u.input, u.cache_read, u.output), (1000, 200, 300));
        assert_eq!(from_tail(Api::OpenaiChat, b"no usage here"), None);
        assert_eq!(from_tail(Api::OpenaiChat, br#"..."usage": {"prompt"#), None);
    }

    #[test]
    fn a_stream_knows_whether_it_reached_its_end_and_what_text_passed() {
        let mut m = StreamMeter::new(Api::OpenaiChat);
        m.feed(b"data: {\"choices\":[{\"delta\":{\"content\":\"Hello\",\"tool_calls\":[{\"function\":{\"arguments\":\"{}\"}}]}}]}\n\n");
        assert_eq!((m.text_bytes(), m.ended()), (7, false));
        m.feed(b"data: [DONE]\n\n");
        assert!(m.ended());
    }
}
