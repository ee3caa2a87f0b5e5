//! `POST /v1/embeddings` on the engine's thread: the texts embedded in one turn of the
//! engine ([`Engine::embed`]) and answered in OpenAI's shape
//! ([`emberlm::openai::embeddings`]). With `--parallel` above 1 the batch drains first and
//! serving resumes after (see [`crate::serve_batch`]).

use emberlm::engine::Engine;
use emberlm::openai::embeddings::{embedding_response, EmbeddingRequest};

use crate::serve_http::{Connection, HttpRequest};
use crate::serve_shared::{error_reply, reply};

/// Answers an embeddings request; `model` names the model when the request did not. The
/// connection for the next request, if it stays open.
pub fn embedding(
    engine: &Engine,
    request: HttpRequest,
    parsed: &EmbeddingRequest,
    model: &str,
) -> Option<Connection> {
    let width = engine.inspect(|s| s.config().hidden_size);
    if let Some(Err(e)) = width.map(|d| parsed.check_dimensions(d)) {
        return error_reply(request, &e);
    }
    match pollster::block_on(engine.embed(&parsed.input, &parsed.options)) {
        Ok(embeddings) => {
            // the width, should the engine have had no session to ask before
            let d = embeddings.vectors.first().map_or(0, Vec::len);
            if let Err(e) = parsed.check_dimensions(d) {
                return error_reply(request, &e);
            }
            let name = parsed.model.as_deref().unwrap_or(model);
            reply(
                request,
                200,
                &embedding_response(name, &embeddings, parsed.base64),
            )
        }
        Err(e) => error_reply(request, &e),
    }
}
