//! Split attention's policy (flash-decoding): when a step's keys are spread over several
//! workgroups, how many keys each takes, and the scratch its partials need.

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

/// Loop iterations one shader invocation may run in all. llvmpipe (lavapipe) stops a shader's
/// loops after 65,535 iterations in all, counting every loop it has not unrolled (a guard
/// against runaway shaders), and the attention kernel's per-head loops stay loops once a
/// head's body is large (a cache kind's decoding, heads of 128): past a couple of thousand
/// keys, attention would silently stop short. Every binding therefore splits a token's keys
/// so that no invocation runs more than this many iterations (with room for the setup
/// loops), on every adapter: the split is exact, and it costs one merge dispatch.
pub const SHADER_LOOP_BUDGET: u32 = 60_000;

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
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AttentionKeys {
    /// Latest keys a token reads (`None`: all of them).
    pub window: Option<u32>,
    /// Rows per sequence of the layer's ring, where position `p` lives in row `p mod ring`
    /// (`None`: the cache keeps every position). At least the window.
    pub ring: Option<u32>,
    /// A factor on the scores `q·k / √head_dim` beyond the usual (YaRN's attention factor,
    /// squared: the rotated queries and keys both carry it); `None`: 1.
    pub score_scale: Option<f32>,
    /// Every token reads every key its sequence holds after the step, later positions too (an
    /// encoder's bidirectional attention); `false`: keys up to its own position.
    pub bidirectional: bool,
    tiers: Vec<KeySplit>,
    /// The split every step longer than an invocation's key limit takes when no tier applies
    /// (see [`AttentionKeys::limited`]).
    bound: Option<KeySplit>,
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
            ring: None,
            score_scale: None,
            bidirectional: false,
            tiers,
            bound: None,
        }
    }

    /// The same keys with the scores multiplied by `scale` beyond `1 / √head_dim` (`1`:
    /// none).
    pub fn with_score_scale(mut self, scale: f32) -> Self {
        self.score_scale = (scale != 1.0).then_some(scale);
        self
    }

    /// The same splits over a local window of `window` keys (`None`: every key).
    pub fn with_window(mut self, window: Option<u32>) -> Self {
        self.window = window;
        self
    }

    /// The same keys read by every token whole (`true`: bidirectional attention, every key the
    /// sequence holds after the step) or up to its own position (`false`).
    pub fn with_bidirectional(mut self, bidirectional: bool) -> Self {
        self.bidirectional = bidirectional;
        self
    }

    /// The same keys read from a ring of `ring` rows per sequence (`None`: a cache that keeps
    /// every position).
    pub fn with_ring(mut self, ring: Option<u32>) -> Self {
        self.ring = ring;
        self
    }

    /// The split tiers, by `min_keys`.
    pub fn tiers(&self) -> &[KeySplit] {
        &self.tiers
    }

    /// These keys with no invocation walking more than `limit` keys, for steps of up to
    /// `max_tokens` tokens: tiers get splits of at most `limit` keys, and a step over more
    /// keys than `limit` that no tier takes splits in splits of `limit` keys
    /// ([`AttentionKeys::bound`]). See [`SHADER_LOOP_BUDGET`].
    pub fn limited(mut self, limit: u32, max_tokens: u32) -> Self {
        let limit = limit.max(1);
        for t in &mut self.tiers {
            t.keys_per_split = t.keys_per_split.min(limit);
        }
        self.bound = Some(KeySplit {
            keys_per_split: limit,
            min_keys: limit.saturating_add(1),
            max_tokens,
        });
        self
    }

    /// The split of steps no tier takes that are longer than an invocation may walk (set by
    /// [`AttentionKeys::limited`]).
    pub fn bound(&self) -> Option<KeySplit> {
        self.bound
    }

    /// The split a step of `n_tokens` tokens over `kv_len` cached positions runs with
    /// (`None`: whole, in one dispatch): the last tier that takes it, else the bound when
    /// its keys exceed it.
    pub fn split_for(&self, n_tokens: u32, kv_len: u32) -> Option<KeySplit> {
        let read = self.keys_read(kv_len);
        let tier = self
            .tiers
            .iter()
            .rev()
            .find(|t| n_tokens <= t.max_tokens && read >= t.min_keys)
            .copied();
        tier.or(self
            .bound
            .filter(|b| n_tokens <= b.max_tokens && read >= b.min_keys))
    }

    /// Keys a step of `kv_len` cached positions reads per token at most.
    pub fn keys_read(&self, kv_len: u32) -> u32 {
        self.window.map_or(kv_len, |w| kv_len.min(w))
    }

    /// f32 values of the shared partials buffer: the largest of the tiers' and the bound's (0
    /// without either).
    pub fn scratch_len(&self, heads: Heads, max_positions: u32) -> u64 {
        self.tiers
            .iter()
            .chain(self.bound.iter())
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

/// The attention geometry shared by RoPE and attention: `n_heads` query heads and
/// `n_kv_heads` key/value heads of `head_dim` values each (grouped-query attention when
/// `n_kv_heads < n_heads`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heads {
    /// Query heads.
    pub n_heads: u32,
    /// Key/value heads; must divide `n_heads`.
    pub n_kv_heads: u32,
    /// Values per head.
    pub head_dim: u32,
}

impl Heads {
    /// Width of a token's queries: `n_heads · head_dim`.
    pub fn q_dim(&self) -> u64 {
        u64::from(self.n_heads) * u64::from(self.head_dim)
    }

    /// Width of a token's keys (and values): `n_kv_heads · head_dim`.
    pub fn kv_dim(&self) -> u64 {
        u64::from(self.n_kv_heads) * u64::from(self.head_dim)
    }
}
