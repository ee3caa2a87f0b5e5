//! A conversation saved and restored ([`Session::save_state`], [`Session::restore_state`]):
//! the tokens the KV cache holds and its rows, so that a conversation picks up where it was
//! without a forward pass over what it already read.

use super::saved_state::{SavedHeader, SavedState};
use super::Session;
use crate::error::{Error, Result};

/// What [`Session::restore_state`] brought back.
#[derive(Debug, Clone, PartialEq)]
pub struct Restored {
    /// Positions of the conversation now in the KV cache.
    pub positions: usize,
    /// What the application saved with it.
    pub note: Option<serde_json::Value>,
}

/// What a refused restore says, before the reason.
const REFUSED: &str = "this saved conversation cannot be restored here";

impl Session {
    /// The conversation as bytes ([`SavedState`]'s layout): the tokens the KV cache holds,
    /// its rows in the cache's kinds, the model's fingerprint, the engine's version and `note`
    /// (what the application keeps with it: a chat's messages). The session is unchanged.
    pub async fn save_state(&self, note: Option<serde_json::Value>) -> Result<Vec<u8>> {
        let mark = self.forward.kv_mark();
        let layout = self.forward.kv_layout().clone();
        let kinds = self.forward.kv_kinds();
        let pos = self.cached.len().min(mark.pos());
        let header = SavedHeader {
            engine: env!("CARGO_PKG_VERSION").into(),
            model: self.model_id.clone(),
            kv_dim: self.config().kv_dim(),
            k_kind: kinds.k.name().into(),
            v_kind: kinds.v.name().into(),
            layer_rows: (0..layout.layers()).map(|l| layout.rows(l)).collect(),
            pos,
            high: mark.high().max(pos),
            tokens: self.cached[..pos].to_vec(),
            note,
        };
        let rows: Vec<usize> = (0..layout.layers()).map(|l| header.rows_of(l)).collect();
        let (k, v) = self.forward.kv_prefix(&rows).await?.into_iter().unzip();
        SavedState { header, k, v }.to_bytes()
    }

    /// Restores a conversation [`Session::save_state`] wrote (named `file` in errors): its KV
    /// rows are written back and its tokens become the conversation, with no forward pass;
    /// the next call continues as if it had never stopped. Returns the positions restored and
    /// the note saved with them.
    ///
    /// Refused, with the session unchanged, when the bytes are not a whole saved conversation,
    /// or it comes from another model, engine version or KV-cache kind, or does not fit this
    /// session's context.
    pub async fn restore_state(&mut self, bytes: &[u8], file: &str) -> Result<Restored> {
        let state = SavedState::from_bytes(bytes, file)?;
        let h = &state.header;
        let refuse = |why: String| Error::format(file, format!("{REFUSED}: {why}"));
        if h.engine != env!("CARGO_PKG_VERSION") {
            return Err(refuse(format!(
                "it was saved by emberlm {}, and this is {}",
                h.engine,
                env!("CARGO_PKG_VERSION")
            )));
        }
        if h.model != self.model_id || h.kv_dim != self.config().kv_dim() {
            return Err(refuse(format!(
                "it was saved from another model (fingerprint {}…; this model's is {}…)",
                h.model.get(..12).unwrap_or(&h.model),
                self.model_id.get(..12).unwrap_or(&self.model_id)
            )));
        }
        let kinds = h.kinds()?;
        if kinds != self.forward.kv_kinds() {
            return Err(refuse(format!(
                "its KV cache is {kinds}, and this session's is {} (load with that kind to restore it)",
                self.forward.kv_kinds()
            )));
        }
        let layout = self.forward.kv_layout().clone();
        if h.layer_rows.len() != layout.layers() {
            return Err(refuse(format!(
                "it has {} layers, this model {}",
                h.layer_rows.len(),
                layout.layers()
            )));
        }
        if h.pos > layout.context() {
            return Err(refuse(format!(
                "it holds {} positions, over this session's context of {}",
                h.pos,
                layout.context()
            )));
        }
        for layer in 0..layout.layers() {
            let (saved, here) = (h.layer_rows[layer], layout.rows(layer));
            // a wrapped ring must be a ring of the same length; other rows must fit
            let wrapped = h.pos > saved;
            if (wrapped && saved != here) || h.rows_of(layer) > here {
                return Err(refuse(format!(
                    "layer {layer} kept {saved} rows per sequence, and this session keeps {here}"
                )));
            }
        }
        // from here the session's conversation is replaced
        self.reset();
        let written: Result<()> = (|| {
            for layer in 0..layout.layers() {
                self.forward
                    .write_kv_rows(layer, &state.k[layer], &state.v[layer])?;
            }
            self.forward.restore_mark(h.pos, h.high)
        })();
        if let Err(e) = written {
            self.reset();
            return Err(e);
        }
        self.cached = h.tokens.clone();
        Ok(Restored {
            positions: h.pos,
            note: state.header.note,
        })
    }
}
