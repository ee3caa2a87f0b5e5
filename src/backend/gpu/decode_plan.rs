//! Decode planning for long contexts: how attention reads a step's keys at each context
//! length. A decode step has few query heads, so past a few hundred keys one workgroup per head
//! leaves a device idle; splitting the keys (flash-decoding, see [`KeySplit`]) spreads them.
//! The plan says from which length a step splits and into blocks of how many keys
//! (`decode_q_chunk`), and, for models trained with local attention, how many latest keys a
//! local layer reads (`decode_local_window`).
//!
//! Splitting never changes results beyond float rounding: the splits' partial softmaxes are
//! merged exactly (see `attention_merge.wgsl`).

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

use super::key_split::{AttentionKeys, KeySplit, SPLIT_MAX_SPLITS, SPLIT_MAX_TOKENS};
use crate::error::{Error, Result};

/// How the plan is made (`decode_plan`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DecodePlanMode {
    /// Block sizes by context bucket: whole up to `decode_bucket_short` keys, short blocks up
    /// to `decode_bucket_mid`, longer blocks (at most [`SPLIT_MAX_SPLITS`] of them) past it;
    /// the local window the model was trained with.
    #[default]
    Auto,
    /// `decode_q_chunk` keys per block at every length from two blocks on, and
    /// `decode_local_window` as given.
    Fixed,
    /// One block (every key in one dispatch) at every length.
    None,
}

impl DecodePlanMode {
    /// The name users write.
    pub fn as_str(self) -> &'static str {
        match self {
            DecodePlanMode::Auto => "auto",
            DecodePlanMode::Fixed => "fixed",
            DecodePlanMode::None => "none",
        }
    }
}

impl fmt::Display for DecodePlanMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for DecodePlanMode {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(DecodePlanMode::Auto),
            "fixed" => Ok(DecodePlanMode::Fixed),
            "none" => Ok(DecodePlanMode::None),
            other => Err(Error::invalid(
                "decode_plan",
                format!("`{other}` is not a decode plan (auto, fixed or none)"),
            )),
        }
    }
}

/// Default of `decode_bucket_short`: contexts up to this many keys run whole.
pub const DECODE_BUCKET_SHORT: u32 = 512;
/// Default of `decode_bucket_mid`: contexts up to this many keys use short blocks.
pub const DECODE_BUCKET_MID: u32 = 2048;
/// Blocks of a context at the end of the middle bucket under `auto` (keys per block:
/// `decode_bucket_mid / 8`, 256 by default, so a mid context splits into 3 to 8 blocks).
pub const AUTO_MID_BLOCKS: u32 = 8;
/// Past the middle bucket, `auto` uses blocks of at least `decode_bucket_mid / 4` keys (512 by
/// default), longer where a cache would need more than [`SPLIT_MAX_SPLITS`] of them.
pub const AUTO_LONG_BLOCKS: u32 = 4;
/// Largest `decode_q_chunk` and `decode_local_window` accepted (far past any context).
const MAX_KEYS: u32 = 1 << 24;

/// The decode plan's settings (names as users write them, with their defaults).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DecodePlan {
    /// `decode_plan`: auto (default), fixed or none.
    pub mode: DecodePlanMode,
    /// `decode_q_chunk`: keys per attention block under `fixed` (required there).
    pub q_chunk: Option<u32>,
    /// `decode_local_window`: latest keys a local-attention layer reads under `fixed` (only
    /// for models trained with local attention; `auto` uses the trained window).
    pub local_window: Option<u32>,
    /// `decode_bucket_short` (512): the end of the short bucket.
    pub bucket_short: u32,
    /// `decode_bucket_mid` (2048): the end of the middle bucket.
    pub bucket_mid: u32,
}

impl Default for DecodePlan {
    fn default() -> Self {
        Self {
            mode: DecodePlanMode::Auto,
            q_chunk: None,
            local_window: None,
            bucket_short: DECODE_BUCKET_SHORT,
            bucket_mid: DECODE_BUCKET_MID,
        }
    }
}

impl DecodePlan {
    /// Checks the settings against each other: `fixed` needs `decode_q_chunk`; the values are
    /// only meaningful under `fixed`; the buckets are ordered and positive.
    pub fn validate(&self) -> Result<()> {
        for (name, v) in [
            ("decode_q_chunk", self.q_chunk),
            ("decode_local_window", self.local_window),
        ] {
            if let Some(v) = v {
                if v == 0 || v > MAX_KEYS {
                    return Err(Error::invalid(
                        name,
                        format!("must be between 1 and {MAX_KEYS} keys, got {v}"),
                    ));
                }
                if self.mode != DecodePlanMode::Fixed {
                    return Err(Error::invalid(
                        name,
                        format!(
                            "is used with decode_plan fixed (decode_plan is {}); {}",
                            self.mode,
                            match self.mode {
                                DecodePlanMode::Auto => "auto chooses it",
                                _ => "none reads every key in one block",
                            }
                        ),
                    ));
                }
            }
        }
        if self.mode == DecodePlanMode::Fixed && self.q_chunk.is_none() {
            return Err(Error::invalid(
                "decode_q_chunk",
                "decode_plan fixed needs decode_q_chunk (keys per attention block)",
            ));
        }
        if self.bucket_short == 0 || self.bucket_mid <= self.bucket_short {
            return Err(Error::invalid(
                "decode_bucket_mid",
                format!(
                    "the buckets must satisfy 0 < decode_bucket_short < decode_bucket_mid, got {} and {}",
                    self.bucket_short, self.bucket_mid
                ),
            ));
        }
        Ok(())
    }

    /// The key splits for a cache of `positions` rows (tiers a cache that short never reaches
    /// are left out).
    pub fn splits(&self, positions: u32) -> Vec<KeySplit> {
        let tier = |keys_per_split: u32, min_keys: u32| KeySplit {
            keys_per_split: keys_per_split.max(1),
            min_keys,
            max_tokens: SPLIT_MAX_TOKENS,
        };
        let tiers = match self.mode {
            DecodePlanMode::None => Vec::new(),
            DecodePlanMode::Fixed => {
                let k = self
                    .q_chunk
                    .unwrap_or(self.bucket_mid / AUTO_MID_BLOCKS)
                    .max(1);
                vec![tier(k, k.saturating_mul(2))]
            }
            DecodePlanMode::Auto => {
                let long =
                    (self.bucket_mid / AUTO_LONG_BLOCKS).max(positions.div_ceil(SPLIT_MAX_SPLITS));
                vec![
                    tier(self.bucket_mid / AUTO_MID_BLOCKS, self.bucket_short + 1),
                    tier(long, self.bucket_mid + 1),
                ]
            }
        };
        tiers
            .into_iter()
            .filter(|t| t.min_keys <= positions)
            .collect()
    }

    /// The local window for a layer the model trained with a window of `trained` keys (`None`:
    /// a global layer, or a model without local attention); `local_model` says whether the
    /// model has local layers at all. A window under `fixed` replaces the trained window of
    /// local layers and leaves global layers global; on a model without local attention it is
    /// refused: it would change the model's results.
    pub fn window(
        &self,
        trained: Option<u32>,
        local_model: bool,
        model: &str,
    ) -> Result<Option<u32>> {
        match (self.mode, self.local_window, trained) {
            (DecodePlanMode::Fixed, Some(w), Some(_)) => Ok(Some(w)),
            (DecodePlanMode::Fixed, Some(_), None) if !local_model => Err(Error::invalid(
                "decode_local_window",
                format!(
                    "{model} was not trained with local attention; a window would change its results"
                ),
            )),
            (_, _, trained) => Ok(trained),
        }
    }

    /// How one layer reads its keys in a cache of `positions` rows, with the layer's trained
    /// window `trained` (see [`DecodePlan::window`] for `local_model`).
    pub fn keys(
        &self,
        positions: u32,
        trained: Option<u32>,
        local_model: bool,
        model: &str,
    ) -> Result<AttentionKeys> {
        let window = self.window(trained, local_model, model)?;
        Ok(AttentionKeys::tiered(self.splits(positions)).with_window(window))
    }

    /// One line for reports: `auto (whole ≤ 512 keys, 256-key blocks ≤ 2048, 512-key blocks
    /// past)` and the like, for a cache of `positions` rows.
    pub fn describe(&self, positions: u32) -> String {
        let tiers = self.splits(positions);
        let mut parts = Vec::new();
        let mut whole_to = positions;
        if let Some(first) = tiers.first() {
            whole_to = first.min_keys.saturating_sub(1);
        }
        parts.push(format!("whole up to {whole_to} keys"));
        for t in &tiers {
            parts.push(format!(
                "{}-key blocks from {} keys",
                t.keys_per_split, t.min_keys
            ));
        }
        if let Some(w) = self.local_window {
            parts.push(format!("local window {w}"));
        }
        format!("{} ({})", self.mode, parts.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_buckets() {
        let p = DecodePlan::default();
        assert!(p.splits(512).is_empty());
        let mid = p.splits(2048);
        assert_eq!(mid.len(), 1);
        assert_eq!((mid[0].keys_per_split, mid[0].min_keys), (256, 513));
        let long = p.splits(65536);
        assert_eq!(long.len(), 2);
        assert_eq!((long[1].keys_per_split, long[1].min_keys), (1024, 2049));
        assert_eq!(p.describe(4096).matches("blocks").count(), 2);
    }

    #[test]
    fn fixed_and_none() {
        let fixed = DecodePlan {
            mode: DecodePlanMode::Fixed,
            q_chunk: Some(100),
            ..DecodePlan::default()
        };
        fixed.validate().unwrap();
        let t = fixed.splits(1000);
        assert_eq!((t[0].keys_per_split, t[0].min_keys), (100, 200));
        let none = DecodePlan {
            mode: DecodePlanMode::None,
            ..DecodePlan::default()
        };
        assert!(none.splits(100_000).is_empty());
    }

    #[test]
    fn settings_are_checked_by_name() {
        let no_chunk = DecodePlan {
            mode: DecodePlanMode::Fixed,
            ..DecodePlan::default()
        };
        assert!(no_chunk
            .validate()
            .unwrap_err()
            .to_string()
            .contains("decode_q_chunk"));
        let chunk_on_auto = DecodePlan {
            q_chunk: Some(64),
            ..DecodePlan::default()
        };
        assert!(chunk_on_auto
            .validate()
            .unwrap_err()
            .to_string()
            .contains("decode_q_chunk"));
        let buckets = DecodePlan {
            bucket_mid: 100,
            ..DecodePlan::default()
        };
        assert!(buckets
            .validate()
            .unwrap_err()
            .to_string()
            .contains("decode_bucket"));
        assert!("sometimes".parse::<DecodePlanMode>().is_err());
        let window = DecodePlan {
            mode: DecodePlanMode::Fixed,
            q_chunk: Some(64),
            local_window: Some(128),
            ..DecodePlan::default()
        };
        assert!(window
            .window(None, false, "m")
            .unwrap_err()
            .to_string()
            .contains("local attention"));
        assert_eq!(window.window(Some(512), true, "m").unwrap(), Some(128));
        // a global layer of a model with local layers stays global
        assert_eq!(window.window(None, true, "m").unwrap(), None);
        assert_eq!(
            DecodePlan::default().window(Some(512), true, "m").unwrap(),
            Some(512)
        );
    }
}
