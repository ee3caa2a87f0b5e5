//! OpenAI response shapes: a whole `chat.completion` / `text_completion` object from a
//! [`Generation`], or the stream of chunks from token events ([`ChunkWriter`]).

use serde_json::{json, Value};

use crate::session::{Generation, TokenEvent};

/// Which endpoint: `chat.completions` or the plain `completions`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompletionKind {
    /// `POST /v1/chat/completions`: messages in, an assistant message out.
    Chat,
    /// `POST /v1/completions`: text in, its continuation out.
    Text,
}

impl CompletionKind {
    /// The endpoint's name in messages.
    pub fn endpoint(self) -> &'static str {
        match self {
            Self::Chat => "chat.completions",
            Self::Text => "completions",
        }
    }

    fn object(self) -> &'static str {
        match self {
            Self::Chat => "chat.completion",
            Self::Text => "text_completion",
        }
    }

    fn chunk_object(self) -> &'static str {
        match self {
            Self::Chat => "chat.completion.chunk",
            Self::Text => "text_completion",
        }
    }

    /// A fresh response id: `chatcmpl-…` or `cmpl-…` and 16 random hex digits.
    pub fn new_id(self) -> String {
        let prefix = match self {
            Self::Chat => "chatcmpl",
            Self::Text => "cmpl",
        };
        let random = crate::sampling::draw_seed().unwrap_or(0);
        format!("{prefix}-{random:016x}")
    }
}

/// Seconds since the Unix epoch (the `created` field).
pub fn now_seconds() -> u64 {
    web_time::SystemTime::now()
        .duration_since(web_time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// One generated token for `logprobs`: its text and log-probability, and the most likely
/// tokens at its step when `top_logprobs` asked for them.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    /// The token's text (its bytes, lossily decoded when they are part of a character).
    pub token: String,
    /// Its log-probability under the model's raw distribution.
    pub logprob: f32,
    /// The most likely tokens at this step (text, log-probability), most likely first; empty
    /// unless asked for.
    pub top: Vec<(String, f32)>,
}

fn chat_logprobs(tokens: &[TokenLogprob]) -> Value {
    let content: Vec<Value> = tokens
        .iter()
        .map(|t| {
            let top: Vec<Value> = t
                .top
                .iter()
                .map(|(token, logprob)| {
                    json!({ "token": token, "logprob": logprob, "bytes": token.as_bytes() })
                })
                .collect();
            json!({
                "token": t.token,
                "logprob": t.logprob,
                "bytes": t.token.as_bytes(),
                "top_logprobs": top,
            })
        })
        .collect();
    json!({ "content": content, "refusal": null })
}

fn text_logprobs(tokens: &[TokenLogprob], start: usize) -> Value {
    let mut offset = start;
    let mut offsets = Vec::with_capacity(tokens.len());
    for t in tokens {
        offsets.push(offset);
        offset += t.token.len();
    }
    json!({
        "tokens": tokens.iter().map(|t| t.token.clone()).collect::<Vec<_>>(),
        "token_logprobs": tokens.iter().map(|t| t.logprob).collect::<Vec<_>>(),
        // one object per position, token text to log-probability (two ids with the same text
        // keep the likelier), when alternatives were asked for
        "top_logprobs": if tokens.iter().any(|t| !t.top.is_empty()) {
            Value::Array(
                tokens
                    .iter()
                    .map(|t| {
                        let mut m = serde_json::Map::new();
                        for (token, logprob) in &t.top {
                            m.entry(token.clone()).or_insert_with(|| json!(logprob));
                        }
                        Value::Object(m)
                    })
                    .collect(),
            )
        } else {
            Value::Null
        },
        "text_offset": offsets,
    })
}

fn usage(g: &Generation) -> Value {
    let prompt = g.prompt_tokens.len();
    let completion = g.stats.generated_tokens;
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    })
}

/// The whole response to a request: `id`, `object`, `created`, `model`, `choices` (one per
/// sequence, with `message` or `text`, `finish_reason` and `logprobs`), `usage`, and
/// `warnings` when the generation had any (a cut prompt, an unfinished response format).
/// `logprobs[i]` are sequence `i`'s tokens when they were asked for.
pub fn response(
    kind: CompletionKind,
    id: &str,
    model: &str,
    g: &Generation,
    logprobs: Option<&[Vec<TokenLogprob>]>,
) -> Value {
    let choices: Vec<Value> = g
        .sequences
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let lp = logprobs.and_then(|l| l.get(i)).map(|t| match kind {
                CompletionKind::Chat => chat_logprobs(t),
                CompletionKind::Text => {
                    // the tokens' text ends the choice's text (an echo comes before it)
                    let generated: usize = t.iter().map(|x| x.token.len()).sum();
                    text_logprobs(t, s.text.len().saturating_sub(generated))
                }
            });
            match kind {
                CompletionKind::Chat => json!({
                    "index": i,
                    "message": { "role": "assistant", "content": s.text, "refusal": null },
                    "logprobs": lp,
                    "finish_reason": s.finish_reason.as_str(),
                }),
                CompletionKind::Text => json!({
                    "index": i,
                    "text": s.text,
                    "logprobs": lp,
                    "finish_reason": s.finish_reason.as_str(),
                }),
            }
        })
        .collect();
    let mut out = json!({
        "id": id,
        "object": kind.object(),
        "created": now_seconds(),
        "model": model,
        "system_fingerprint": null,
        "choices": choices,
        "usage": usage(g),
    });
    if !g.warnings.is_empty() {
        out["warnings"] = json!(g.warnings);
    }
    out
}

/// Turns a generation's token events into stream chunks: the first chunk of each choice
/// carries `role: "assistant"` (chat), every token its text (`delta.content` or `text`), and
/// [`Self::finish`] the finish reasons and, if asked, a last chunk with `usage`.
#[derive(Clone, Debug)]
pub struct ChunkWriter {
    kind: CompletionKind,
    id: String,
    model: String,
    created: u64,
    logprobs: bool,
    /// Choices that already sent their first chunk.
    started: Vec<bool>,
}

impl ChunkWriter {
    /// A writer for one response `id` of `model`; `logprobs`: chunks carry each token's.
    pub fn new(kind: CompletionKind, id: &str, model: &str, logprobs: bool) -> Self {
        Self {
            kind,
            id: id.to_string(),
            model: model.to_string(),
            created: now_seconds(),
            logprobs,
            started: Vec::new(),
        }
    }

    fn chunk(&self, choices: Vec<Value>) -> Value {
        json!({
            "id": self.id,
            "object": self.kind.chunk_object(),
            "created": self.created,
            "model": self.model,
            "system_fingerprint": null,
            "choices": choices,
        })
    }

    /// The chunk for event `e` (`token`: the token's text and log-probability when
    /// `logprobs` was asked for), or `None` for an event with nothing to send.
    pub fn event(&mut self, e: &TokenEvent, token: Option<TokenLogprob>) -> Option<Value> {
        let i = e.sequence;
        if self.started.len() <= i {
            self.started.resize(i + 1, false);
        }
        let first = !self.started[i];
        if e.text.is_empty() && !first && token.is_none() {
            return None;
        }
        self.started[i] = true;
        let lp = match (self.logprobs, &token) {
            (true, Some(t)) => match self.kind {
                CompletionKind::Chat => chat_logprobs(std::slice::from_ref(t)),
                CompletionKind::Text => text_logprobs(std::slice::from_ref(t), 0),
            },
            _ => Value::Null,
        };
        let choice = match self.kind {
            CompletionKind::Chat => {
                let mut delta = json!({ "content": e.text });
                if first {
                    delta["role"] = json!("assistant");
                }
                json!({ "index": i, "delta": delta, "logprobs": lp, "finish_reason": null })
            }
            CompletionKind::Text => {
                json!({ "index": i, "text": e.text, "logprobs": lp, "finish_reason": null })
            }
        };
        Some(self.chunk(vec![choice]))
    }

    /// A chat chunk whose delta is `delta` for choice `i` (with `role` when the choice had no
    /// chunk yet).
    pub fn delta(&mut self, i: usize, mut delta: Value) -> Value {
        if self.started.len() <= i {
            self.started.resize(i + 1, false);
        }
        if !self.started[i] {
            delta["role"] = json!("assistant");
            self.started[i] = true;
        }
        let choice = json!({ "index": i, "delta": delta, "logprobs": null, "finish_reason": null });
        self.chunk(vec![choice])
    }

    /// The closing chunks: one per choice with its `finish_reason` (and the generation's
    /// `warnings`), then, with `include_usage`, one with empty `choices` and the `usage`.
    pub fn finish(&mut self, g: &Generation, include_usage: bool) -> Vec<Value> {
        let mut out = Vec::new();
        for (i, s) in g.sequences.iter().enumerate() {
            let choice = match self.kind {
                CompletionKind::Chat => {
                    let mut delta = json!({});
                    if !self.started.get(i).copied().unwrap_or(false) {
                        delta = json!({ "role": "assistant", "content": "" });
                    }
                    json!({ "index": i, "delta": delta, "logprobs": null, "finish_reason": s.finish_reason.as_str() })
                }
                CompletionKind::Text => {
                    json!({ "index": i, "text": "", "logprobs": null, "finish_reason": s.finish_reason.as_str() })
                }
            };
            let mut chunk = self.chunk(vec![choice]);
            if !g.warnings.is_empty() {
                chunk["warnings"] = json!(g.warnings);
            }
            out.push(chunk);
        }
        if include_usage {
            let mut chunk = self.chunk(Vec::new());
            chunk["usage"] = usage(g);
            out.push(chunk);
        }
        out
    }
}
