//! Runs a [`Request`] on an [`Engine`]: the whole response, or its chunks as they come. The
//! response of one request is built by a [`Responder`] from its token events, whoever runs
//! the request (alone, or in a batch with others: `emberlm serve-api --parallel`).

use std::sync::Arc;

use serde_json::Value;

use super::response::{response, ChunkWriter, TokenLogprob};
use super::tool_reply::ToolReply;
use super::{CompletionKind, Request};
use crate::chat::tools::ToolSyntax;
use crate::engine::{Cancel, Engine};
use crate::session::{Generation, TokenEvent};
use crate::tokenizer::Tokenizer;
use crate::Result;

/// Builds one request's response from its token events: the chunks of a streaming answer as
/// the tokens come, and the whole response at the end.
#[derive(Debug)]
pub struct Responder {
    kind: CompletionKind,
    id: String,
    model: String,
    stream: bool,
    include_usage: bool,
    logprobs: bool,
    tokenizer: Arc<Tokenizer>,
    /// Each sequence's tokens with their log-probabilities (with `logprobs`).
    token_logprobs: Vec<Vec<TokenLogprob>>,
    writer: ChunkWriter,
    /// The calls of a request whose model may call tools.
    tools: Option<ToolReply>,
}

impl Responder {
    /// The responder of `request` on the model named `model` (used when the request names
    /// none), decoding token texts with `tokenizer`; calls are read in `syntax` (the loaded
    /// template's, [`crate::session::Session::tool_format`]).
    pub fn new(
        request: &Request,
        model: &str,
        tokenizer: Arc<Tokenizer>,
        syntax: ToolSyntax,
    ) -> Self {
        let kind = request.kind;
        let id = kind.new_id();
        let model = request.model.clone().unwrap_or_else(|| model.to_string());
        let n = request.options.sampling.num_return_sequences;
        let writer = ChunkWriter::new(kind, &id, &model, request.logprobs);
        let tools = request
            .options
            .tools
            .as_ref()
            .filter(|t| !t.callable().is_empty())
            .map(|_| ToolReply::new(syntax, &id, n));
        Self {
            tools,
            kind,
            id,
            model,
            stream: request.stream,
            include_usage: request.include_usage,
            logprobs: request.logprobs,
            tokenizer,
            token_logprobs: vec![Vec::new(); n],
            writer,
        }
    }

    /// Takes a token event: the chunks to send when the request streams (none, or the
    /// token's, and one of calls completed with it).
    pub fn on_token(&mut self, e: &TokenEvent) -> Vec<Value> {
        let token = match (self.logprobs, e.id, e.logprob) {
            (true, Some(id), Some(logprob)) => Some(TokenLogprob {
                token: self.tokenizer.decode(&[id], false).unwrap_or_default(),
                logprob,
                top: e
                    .top_logprobs
                    .iter()
                    .flatten()
                    .map(|t| {
                        let text = self.tokenizer.decode(&[t.id], false).unwrap_or_default();
                        (text, t.logprob)
                    })
                    .collect(),
            }),
            _ => None,
        };
        if let (Some(t), Some(list)) = (&token, self.token_logprobs.get_mut(e.sequence)) {
            list.push(t.clone());
        }
        if !self.stream {
            return Vec::new();
        }
        let Some(tools) = &mut self.tools else {
            return self.writer.event(e, token).into_iter().collect();
        };
        let (content, items) = tools.push(e.sequence, &e.text);
        let shown = TokenEvent {
            text: content,
            ..e.clone()
        };
        let mut out: Vec<Value> = self.writer.event(&shown, token).into_iter().collect();
        if !items.is_empty() {
            out.push(
                self.writer
                    .delta(e.sequence, serde_json::json!({ "tool_calls": items })),
            );
        }
        out
    }

    /// The closing chunks of a streaming answer (none otherwise) and the whole response.
    pub fn finish(mut self, g: &Generation) -> (Vec<Value>, Value) {
        let mut chunks = Vec::new();
        if self.stream {
            if let Some(tools) = &mut self.tools {
                for i in 0..g.sequences.len() {
                    let (content, items) = tools.finish(i);
                    if !content.is_empty() {
                        chunks.push(
                            self.writer
                                .delta(i, serde_json::json!({ "content": content })),
                        );
                    }
                    if !items.is_empty() {
                        chunks.push(
                            self.writer
                                .delta(i, serde_json::json!({ "tool_calls": items })),
                        );
                    }
                }
            }
            let mut closing = self.writer.finish(g, self.include_usage);
            if let Some(tools) = &self.tools {
                for chunk in &mut closing {
                    let Some(choice) = chunk["choices"].get_mut(0) else {
                        continue;
                    };
                    let i = choice["index"].as_u64().unwrap_or(0) as usize;
                    if tools.called(i) && choice["finish_reason"] == "stop" {
                        choice["finish_reason"] = "tool_calls".into();
                    }
                }
            }
            chunks.extend(closing);
        }
        let lp = self.logprobs.then_some(self.token_logprobs.as_slice());
        let mut whole = response(self.kind, &self.id, &self.model, g, lp);
        if let Some(tools) = &self.tools {
            tools.rewrite(&mut whole, g);
        }
        (chunks, whole)
    }
}

/// Answers `request` on `engine` (in its turn, stopped by `cancel` if given). Streaming
/// requests hand every chunk to `on_chunk` as it is made (the closing ones last) and return
/// the whole response too; others return it and never call `on_chunk`.
pub async fn complete(
    engine: &Engine,
    request: &Request,
    cancel: Option<&Cancel>,
    on_chunk: &mut dyn FnMut(Value),
) -> Result<Value> {
    let (tokenizer, format) = engine
        .with_session(|s| Ok((s.shared_tokenizer(), s.tool_format())))
        .await?;
    let name = model_name(engine.files().name());
    let mut responder = Responder::new(request, &name, tokenizer, format.syntax);
    let mut on_token = |e: &TokenEvent| {
        for chunk in responder.on_token(e) {
            on_chunk(chunk);
        }
    };
    let g = match cancel {
        Some(c) => {
            engine
                .generate_cancellable(c, &request.prompt, &request.options, &mut on_token)
                .await?
        }
        None => {
            engine
                .generate(&request.prompt, &request.options, &mut on_token)
                .await?
        }
    };
    let (chunks, whole) = responder.finish(&g);
    for chunk in chunks {
        on_chunk(chunk);
    }
    Ok(whole)
}

/// The name responses give a model: its file's stem (`SmolLM2-135M-Instruct.Q4_1` for
/// `models/SmolLM2-135M-Instruct.Q4_1.gguf`).
pub fn model_name(file: &str) -> String {
    let base = file.rsplit(['/', '\\']).next().unwrap_or(file);
    base.strip_suffix(".gguf").unwrap_or(base).to_string()
}
