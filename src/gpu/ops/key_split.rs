//! Split attention's policy (flash-decoding): when a step's keys are spread over several
//! workgroups, how many keys each takes, and the scratch its partials need.

use super::Heads;

/// Fewest keys per split: below this a split's fixed costs (its query load, its partial write,
/// a share of the merge) outweigh what it parallelises.
pub const SPLIT_MIN_KEYS_PER_SPLIT: u32 = 256;

/// Most splits of one token's keys: contexts longer than this many minimum splits get longer
/// splits, so the scratch buffer stays small.
pub const SPLIT_MAX_SPLITS: u32 = 64;

/// Steps over at least this many keys split (4 splits of the minimum length).
pub const SPLIT_MIN_KEYS: u32 = 4 * SPLIT_MIN_KEYS_PER_SPLIT;

/// Steps of at most this many tokens split (decode, speculative verification); a prefill chunk
/// already has heads × tokens workgroups.
pub const SPLIT_MAX_TOKENS: u32 = 8;

/// How a binding splits a long step's keys over workgroups (flash-decoding). The partials go
/// to a scratch buffer of [`KeySplit::scratch_len`] f32 given beside it when binding, which
/// every layer's binding may share (layers run one after another).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeySplit {
    /// Keys per split (at least 1; the last split of a token may hold fewer).
    pub keys_per_split: u32,
    /// A step splits when its `kv_len` (`pos0 + n_tokens`) reaches this.
    pub min_keys: u32,
    /// ... and it has at most this many tokens.
    pub max_tokens: u32,
}

impl KeySplit {
    /// The engine's policy for a cache of `max_positions` rows: splits of at least
    /// [`SPLIT_MIN_KEYS_PER_SPLIT`] keys, at most [`SPLIT_MAX_SPLITS`] of them, from
    /// [`SPLIT_MIN_KEYS`] keys on, for steps of up to [`SPLIT_MAX_TOKENS`] tokens.
    pub fn policy(max_positions: u32) -> Self {
        Self {
            keys_per_split: SPLIT_MIN_KEYS_PER_SPLIT.max(max_positions.div_ceil(SPLIT_MAX_SPLITS)),
            min_keys: SPLIT_MIN_KEYS,
            max_tokens: SPLIT_MAX_TOKENS,
        }
    }

    /// Splits of `keys_per_split` keys from two splits' worth of keys on, for steps of up to
    /// [`SPLIT_MAX_TOKENS`] tokens (a forced split length).
    pub fn with_keys(keys_per_split: u32) -> Self {
        Self {
            keys_per_split,
            min_keys: keys_per_split.saturating_mul(2),
            max_tokens: SPLIT_MAX_TOKENS,
        }
    }

    /// Splits a token's keys may need in a cache of `max_positions` rows.
    pub fn max_splits(&self, max_positions: u32) -> u32 {
        max_positions.div_ceil(self.keys_per_split.max(1))
    }

    /// f32 values of the partials buffer: `[max_tokens, n_heads, max_splits, head_dim + 2]`
    /// (see `attention_common.wgsl`).
    pub fn scratch_len(&self, heads: Heads, max_positions: u32) -> u64 {
        u64::from(self.max_tokens)
            * u64::from(heads.n_heads)
            * u64::from(self.max_splits(max_positions))
            * (u64::from(heads.head_dim) + 2)
    }
}

/// How a bound attention reads a step's keys: a local window (a token reads only its latest
/// `window` keys; `None`: every key) and the key splits used at each length (decode planning).
///
/// `tiers` are kept ordered by `min_keys`; a step uses the last tier whose `min_keys` its keys
/// (`min(kv_len, window)`) reach and whose `max_tokens` it fits, and runs whole when none
/// applies. Every tier shares one scratch buffer of [`AttentionKeys::scratch_len`] f32.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AttentionKeys {
    /// Latest keys a token reads (`None`: all of them).
    pub window: Option<u32>,
    tiers: Vec<KeySplit>,
}

impl AttentionKeys {
    /// Every key, one dispatch at every length.
    pub fn whole() -> Self {
        Self::default()
    }

    /// Every key, split by the tiers (ordered here by `min_keys`).
    pub fn tiered(mut tiers: Vec<KeySplit>) -> Self {
        tiers.sort_by_key(|t| t.min_keys);
        Self {
            window: None,
            tiers,
        }
    }

    /// The same splits over a local window of `window` keys (`None`: every key).
    pub fn with_window(mut self, window: Option<u32>) -> Self {
        self.window = window;
        self
    }

    /// The split tiers, by `min_keys`.
    pub fn tiers(&self) -> &[KeySplit] {
        &self.tiers
    }

    /// Keys a step of `kv_len` cached positions reads per token at most.
    pub fn keys_read(&self, kv_len: u32) -> u32 {
        self.window.map_or(kv_len, |w| kv_len.min(w))
    }

    /// f32 values of the shared partials buffer: the largest of the tiers' (0 without tiers).
    pub fn scratch_len(&self, heads: Heads, max_positions: u32) -> u64 {
        self.tiers
            .iter()
            .map(|t| t.scratch_len(heads, max_positions))
            .max()
            .unwrap_or(0)
    }
}

impl From<Option<KeySplit>> for AttentionKeys {
    fn from(split: Option<KeySplit>) -> Self {
        Self::tiered(split.into_iter().collect())
    }
}
