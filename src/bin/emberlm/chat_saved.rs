//! `/save FILE` and `/load FILE` in `emberlm chat`: the conversation (its messages, and the KV
//! cache that holds them) written to a file and read back, so that it goes on in a later run
//! without the model reading its history again.

use std::path::Path;

use emberlm::chat::ChatMessage;
use emberlm::engine::Engine;
use serde_json::json;

/// What a chat keeps with its saved KV cache.
pub struct Saved {
    /// The system message.
    pub system: Option<String>,
    /// The messages after it.
    pub history: Vec<ChatMessage>,
}

/// Writes the conversation to `path` (through a temporary file beside it, so that a failed
/// write leaves an older file whole); says what was written.
pub fn save(engine: &Engine, saved: &Saved, path: &str) -> Result<String, String> {
    if path.is_empty() {
        return Err("/save needs a file name".into());
    }
    let note = json!({ "system": saved.system, "messages": saved.history });
    let bytes = pollster::block_on(engine.save_state(Some(note))).map_err(|e| e.to_string())?;
    let target = Path::new(path);
    let partial = target.with_extension("partial");
    std::fs::write(&partial, &bytes)
        .and_then(|()| std::fs::rename(&partial, target))
        .map_err(|e| {
            let _ = std::fs::remove_file(&partial);
            format!("cannot write `{path}`: {e}")
        })?;
    let positions = engine.cached_tokens().len();
    Ok(format!(
        "saved {} messages ({positions} positions, {} bytes) to {path}",
        saved.history.len(),
        bytes.len()
    ))
}

/// Reads a conversation [`save`] wrote from `path` into the engine; returns its messages and
/// what was restored. On any error the conversation in progress stays as it was.
pub fn load(engine: &Engine, path: &str) -> Result<(Saved, String), String> {
    if path.is_empty() {
        return Err("/load needs a file name".into());
    }
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read `{path}`: {e}"))?;
    let restored =
        pollster::block_on(engine.restore_state(&bytes, path)).map_err(|e| e.to_string())?;
    let note = restored.note.unwrap_or_default();
    let system = note["system"].as_str().map(str::to_string);
    let history: Vec<ChatMessage> =
        serde_json::from_value(note["messages"].clone()).unwrap_or_default();
    let line = format!(
        "loaded {} messages ({} positions) from {path}",
        history.len(),
        restored.positions
    );
    Ok((Saved { system, history }, line))
}
