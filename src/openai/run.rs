//! Runs a [`Request`] on an [`Engine`]: the whole response, or its chunks as they come.

use serde_json::Value;

use super::response::{response, ChunkWriter, TokenLogprob};
use super::Request;
use crate::engine::{Cancel, Engine};
use crate::session::TokenEvent;
use crate::Result;

/// Answers `request` on `engine` (in its turn, stopped by `cancel` if given). Streaming
/// requests hand every chunk to `on_chunk` as it is made (the closing ones last) and return
/// the whole response too; others return it and never call `on_chunk`.
pub async fn complete(
    engine: &Engine,
    request: &Request,
    cancel: Option<&Cancel>,
    on_chunk: &mut dyn FnMut(Value),
) -> Result<Value> {
    let tokenizer = engine.with_session(|s| Ok(s.shared_tokenizer())).await?;
    let kind = request.kind;
    let id = kind.new_id();
    let model = request
        .model
        .clone()
        .unwrap_or_else(|| model_name(engine.files().name()));
    let n = request.options.sampling.num_return_sequences;
    let mut logprobs: Vec<Vec<TokenLogprob>> = vec![Vec::new(); n];
    let mut writer = ChunkWriter::new(kind, &id, &model, request.logprobs);
    let mut on_token = |e: &TokenEvent| {
        let token = match (request.logprobs, e.id, e.logprob) {
            (true, Some(id), Some(logprob)) => Some(TokenLogprob {
                token: tokenizer.decode(&[id], false).unwrap_or_default(),
                logprob,
                top: e
                    .top_logprobs
                    .iter()
                    .flatten()
                    .map(|t| {
                        let text = tokenizer.decode(&[t.id], false).unwrap_or_default();
                        (text, t.logprob)
                    })
                    .collect(),
            }),
            _ => None,
        };
        if let (Some(t), Some(list)) = (&token, logprobs.get_mut(e.sequence)) {
            list.push(t.clone());
        }
        if request.stream {
            if let Some(chunk) = writer.event(e, token) {
                on_chunk(chunk);
            }
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
    if request.stream {
        for chunk in writer.finish(&g, request.include_usage) {
            on_chunk(chunk);
        }
    }
    let lp = request.logprobs.then_some(logprobs.as_slice());
    Ok(response(kind, &id, &model, &g, lp))
}

/// The name responses give a model: its file's stem (`SmolLM2-135M-Instruct.Q4_1` for
/// `models/SmolLM2-135M-Instruct.Q4_1.gguf`).
pub fn model_name(file: &str) -> String {
    let base = file.rsplit(['/', '\\']).next().unwrap_or(file);
    base.strip_suffix(".gguf").unwrap_or(base).to_string()
}
