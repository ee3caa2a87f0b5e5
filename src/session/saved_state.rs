//! A conversation saved as bytes, to be restored later into a session of the same model without
//! a forward pass: its tokens, and the K and V rows the cache holds for them in the cache's own
//! kinds.
//!
//! The layout, integers little-endian:
//!
//! | bytes | what |
//! |---|---|
//! | 8 | [`MAGIC`] |
//! | 4 | format [`VERSION`] |
//! | 4 | header length `h` |
//! | `h` | the [`SavedHeader`] as JSON |
//! | … | per layer, its K rows then its V rows (`u32` words as the cache stores them) |
//! | 32 | SHA-256 of everything before it |
//!
//! Layer `l` holds `min(pos, layer_rows[l])` rows: every position, or a local layer's whole
//! ring once it has wrapped. Reading checks every length against the header before it
//! allocates, and the digest before it trusts a byte, so a truncated, edited or foreign file is
//! refused with what is wrong.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::dtype::kv::{KvKind, KvKinds};
use crate::error::{Error, Result};

/// The first bytes of every saved conversation.
pub const MAGIC: &[u8; 8] = b"EMBERKV\0";

/// The layout's version; another is refused.
pub const VERSION: u32 = 1;

/// Longest header read, bytes (a million tokens of JSON fit well within it).
const MAX_HEADER: usize = 64 << 20;

/// Most layers read (models have at most a few hundred).
const MAX_LAYERS: usize = 4096;

/// What a saved conversation says about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedHeader {
    /// The engine version that wrote it (`CARGO_PKG_VERSION`); another version is refused.
    pub engine: String,
    /// The model's fingerprint ([`crate::model::weights::ModelWeights::fingerprint`]).
    pub model: String,
    /// Width of a K or V row, values.
    pub kv_dim: usize,
    /// Kind of the K rows (`f32`, `f16`, `q8_0`, `q4_0`, `nf4`).
    pub k_kind: String,
    /// Kind of the V rows.
    pub v_kind: String,
    /// Rows per sequence of each layer when saved: the context, or a local layer's ring.
    pub layer_rows: Vec<usize>,
    /// Positions held.
    pub pos: usize,
    /// One past the highest position written since the cache was last emptied.
    pub high: usize,
    /// The tokens at positions `0..pos`.
    pub tokens: Vec<u32>,
    /// What the application keeps with the conversation (a chat's messages and system
    /// prompt), returned as given on restore.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<serde_json::Value>,
}

impl SavedHeader {
    /// The K and V kinds it names.
    pub fn kinds(&self) -> Result<KvKinds> {
        Ok(KvKinds {
            k: KvKind::parse("k_kind", &self.k_kind)?,
            v: KvKind::parse("v_kind", &self.v_kind)?,
        })
    }

    /// Rows kept of `layer`: every position, or a wrapped ring's rows.
    pub fn rows_of(&self, layer: usize) -> usize {
        self.layer_rows.get(layer).map_or(0, |&r| self.pos.min(r))
    }
}

/// A saved conversation: its header and, per layer, its K and V rows as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedState {
    /// What it says about itself.
    pub header: SavedHeader,
    /// Per layer, `[rows_of(layer), row words of k_kind]`.
    pub k: Vec<Vec<u32>>,
    /// Per layer, `[rows_of(layer), row words of v_kind]`.
    pub v: Vec<Vec<u32>>,
}

/// An error about a saved conversation named `file`.
fn bad(file: &str, message: impl Into<String>) -> Error {
    Error::format(file, message.into())
}

/// The words a layer's K and V take, checked against overflow.
fn layer_words(header: &SavedHeader, kinds: KvKinds, layer: usize) -> Option<(usize, usize)> {
    let rows = header.rows_of(layer);
    Some((
        rows.checked_mul(kinds.k.row_words(header.kv_dim))?,
        rows.checked_mul(kinds.v.row_words(header.kv_dim))?,
    ))
}

impl SavedState {
    /// The bytes of the layout above.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let header = serde_json::to_vec(&self.header)
            .map_err(|e| Error::invalid("saved state", e.to_string()))?;
        let words: usize = self.k.iter().chain(&self.v).map(Vec::len).sum();
        let mut out = Vec::with_capacity(48 + header.len() + words * 4);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&(header.len() as u32).to_le_bytes());
        out.extend_from_slice(&header);
        for (k, v) in self.k.iter().zip(&self.v) {
            out.extend_from_slice(bytemuck::cast_slice(k));
            out.extend_from_slice(bytemuck::cast_slice(v));
        }
        let digest = Sha256::digest(&out);
        out.extend_from_slice(&digest);
        Ok(out)
    }

    /// Reads the layout above from `bytes` (named `file` in errors): the magic, the version,
    /// the header's fields and lengths and the digest are checked before anything is kept.
    pub fn from_bytes(bytes: &[u8], file: &str) -> Result<Self> {
        if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
            return Err(bad(
                file,
                "not a saved conversation (its first bytes are not EMBERKV)",
            ));
        }
        let u32_at = |at: usize| -> Result<u32> {
            bytes
                .get(at..at + 4)
                .and_then(|b| b.try_into().ok())
                .map(u32::from_le_bytes)
                .ok_or_else(|| bad(file, "the file ends inside its header"))
        };
        let version = u32_at(8)?;
        if version != VERSION {
            return Err(bad(
                file,
                format!("saved in format version {version}; this engine reads version {VERSION}"),
            ));
        }
        let header_len = u32_at(12)? as usize;
        if header_len > MAX_HEADER {
            return Err(bad(
                file,
                format!("a header of {header_len} bytes is over the {MAX_HEADER} read"),
            ));
        }
        let body = 16usize;
        let header_end = body + header_len;
        let header_bytes = bytes
            .get(body..header_end)
            .ok_or_else(|| bad(file, "the file ends inside its header"))?;
        let header: SavedHeader = serde_json::from_slice(header_bytes)
            .map_err(|e| bad(file, format!("its header is not valid: {e}")))?;
        let kinds = header.kinds().map_err(|e| bad(file, e.to_string()))?;
        if header.tokens.len() != header.pos {
            return Err(bad(
                file,
                format!(
                    "it holds {} tokens for {} positions",
                    header.tokens.len(),
                    header.pos
                ),
            ));
        }
        if header.high < header.pos || header.kv_dim == 0 {
            return Err(bad(
                file,
                format!(
                    "positions {} written up to {} with rows of {} values do not describe a cache",
                    header.pos, header.high, header.kv_dim
                ),
            ));
        }
        if header.layer_rows.len() > MAX_LAYERS {
            return Err(bad(
                file,
                format!(
                    "{} layers is over the {MAX_LAYERS} read",
                    header.layer_rows.len()
                ),
            ));
        }
        let mut expected = header_end;
        for layer in 0..header.layer_rows.len() {
            let layer_bytes = layer_words(&header, kinds, layer)
                .and_then(|(k, v)| k.checked_add(v)?.checked_mul(4))
                .ok_or_else(|| bad(file, "its row counts overflow"))?;
            expected = expected
                .checked_add(layer_bytes)
                .ok_or_else(|| bad(file, "its row counts overflow"))?;
        }
        let total = expected
            .checked_add(32)
            .ok_or_else(|| bad(file, "its row counts overflow"))?;
        if bytes.len() != total {
            return Err(bad(
                file,
                format!(
                    "it is {} bytes, but its header describes {total}: cut short or extended",
                    bytes.len()
                ),
            ));
        }
        let (content, digest) = bytes.split_at(expected);
        if Sha256::digest(content).as_slice() != digest {
            return Err(bad(
                file,
                "its digest does not match its bytes: it was changed or damaged",
            ));
        }
        let mut at = header_end;
        let mut take = |n: usize| -> Vec<u32> {
            let words = bytemuck::pod_collect_to_vec(&bytes[at..at + n * 4]);
            at += n * 4;
            words
        };
        let (mut k, mut v) = (Vec::new(), Vec::new());
        for layer in 0..header.layer_rows.len() {
            // the lengths were summed without overflow above
            let (kw, vw) = layer_words(&header, kinds, layer).unwrap_or_default();
            k.push(take(kw));
            v.push(take(vw));
        }
        Ok(Self { header, k, v })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> SavedState {
        let header = SavedHeader {
            engine: env!("CARGO_PKG_VERSION").into(),
            model: "ab".repeat(32),
            kv_dim: 64,
            k_kind: "q8_0".into(),
            v_kind: "f32".into(),
            layer_rows: vec![16, 4],
            pos: 6,
            high: 7,
            tokens: vec![1, 2, 3, 4, 5, 6],
            note: Some(serde_json::json!({ "messages": [{ "role": "user", "content": "hi" }] })),
        };
        let kinds = header.kinds().unwrap();
        let (k, v): (Vec<_>, Vec<_>) = (0..2)
            .map(|l| {
                let (kw, vw) = layer_words(&header, kinds, l).unwrap();
                (
                    (0..kw as u32).map(|i| i * 3 + l as u32).collect::<Vec<_>>(),
                    (0..vw as u32).map(|i| i ^ 0x5a5a).collect::<Vec<_>>(),
                )
            })
            .unzip();
        SavedState { header, k, v }
    }

    #[test]
    fn a_state_reads_back_as_written() {
        let s = state();
        // a wrapped ring keeps its whole ring, a full layer its positions
        assert_eq!((s.header.rows_of(0), s.header.rows_of(1)), (6, 4));
        let bytes = s.to_bytes().unwrap();
        assert_eq!(SavedState::from_bytes(&bytes, "c.kv").unwrap(), s);
    }

    #[test]
    fn cut_changed_and_foreign_bytes_are_refused_by_name() {
        let bytes = state().to_bytes().unwrap();
        let err = |b: &[u8]| SavedState::from_bytes(b, "c.kv").unwrap_err().to_string();
        assert!(err(&bytes[..bytes.len() - 1]).contains("cut short"));
        assert!(err(&bytes[..20]).contains("ends inside its header"));
        let mut changed = bytes.clone();
        let n = changed.len();
        changed[n - 40] ^= 1;
        assert!(err(&changed).contains("digest does not match"));
        assert!(err(b"GGUF....").contains("not a saved conversation"));
        let mut newer = bytes.clone();
        newer[8] = 2;
        assert!(err(&newer).contains("format version 2"));
        let mut s = state();
        s.header.tokens.pop();
        assert!(err(&s.to_bytes().unwrap()).contains("5 tokens for 6 positions"));
        let mut s = state();
        s.header.k_kind = "q3".into();
        assert!(err(&s.to_bytes().unwrap()).contains("k_kind"));
        for e in [err(&bytes[..bytes.len() - 1]), err(&changed)] {
            assert!(e.starts_with("c.kv"), "{e}");
        }
    }
}
