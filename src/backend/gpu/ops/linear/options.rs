//! What a [`super::Linear`] fuses around its product and the buffers those fusions bind: the
//! input norm, the output activation, the Q/K/V layer's KV-cache write.

/// A normalisation folded into a linear layer's input (see [`LinearOptions::norm`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InputNorm {
    /// `x / sqrt(mean(x²) + eps) · w`.
    Rms,
    /// `(x − mean) / sqrt(var + eps) · w + b`.
    Layer,
}

/// An activation applied to a linear layer's output (see [`LinearOptions::epilogue`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Epilogue {
    /// `y = W·x (+ bias)`.
    #[default]
    None,
    /// Rows are interleaved (gate, up) pairs, `W: [2·n, cols]`, and `y: [tokens, n]` is
    /// `silu(gate + b) · (up + b)`: a SwiGLU feed-forward's first half in one kernel.
    SwiGlu,
    /// `y = gelu_tanh(W·x + bias)`.
    Gelu,
    /// `y = gelu(W·x + bias)` with the exact GELU, `x · Φ(x)` (BERT).
    GeluErf,
    /// As [`Epilogue::SwiGlu`] with `gelu_tanh` for `silu`: a GeGLU feed-forward (Gemma).
    GeGlu,
}

impl Epilogue {
    /// Whether rows are interleaved (gate, up) pairs and the output has half of them.
    pub fn is_glu(self) -> bool {
        matches!(self, Epilogue::SwiGlu | Epilogue::GeGlu)
    }
}

/// What a [`Linear`] fuses around its product. The default is the plain layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct LinearOptions {
    /// A bias `[rows]` is added.
    pub has_bias: bool,
    /// The result is added to `y` (a residual connection fused into its producer).
    pub accumulate: bool,
    /// The input is normalised per token first (the norm's weight, and bias for
    /// [`InputNorm::Layer`], are bound with [`super::Linear::bind_with_norm`]).
    pub norm: Option<InputNorm>,
    /// The activation applied to the output.
    pub epilogue: Epilogue,
    /// Only the step's last token is computed and written to row 0 of `y` (an LM head of
    /// which only the last row is read). The decode kernel runs whatever the token count.
    pub last_row: bool,
    /// The layer is a stacked `q | k | v` projection whose k and v rows also go to the KV
    /// cache at the step's positions (bound with [`super::Linear::bind_qkv`]).
    pub kv_write: bool,
    /// With `kv_write`: q and k are rotated first (RoPE over adjacent row pairs `(2i, 2i+1)`
    /// within each head).
    pub rope: bool,
    /// With `kv_write`: the caches are not written here, only `y` (rotated); a
    /// [`super::KvStore`] dispatch encodes the k and v rows into caches of other kinds than
    /// f32 after.
    pub kv_deferred: bool,
    /// With `kv_write` (not deferred): the caches hold f16, two values per u32 word
    /// (`pack2x16float`, as [`crate::dtype::kv::KvKind::F16`] encodes them), written here:
    /// the even row of each pair writes both.
    pub kv_f16: bool,
    /// With `kv_write` (not deferred, not `kv_f16`): the caches hold these kinds, of which at
    /// least one has 32-value blocks with a shared scale (q8_0, q4_0, nf4), encoded here. Each
    /// workgroup's K and V rows span whole blocks (decode workgroups past the query rows
    /// compute 32 rows), stored to `y` first and encoded after a `storageBarrier`; `q_rows`
    /// and `kv_rows` must be multiples of [`crate::dtype::kv::KV_BLOCK`].
    pub kv_blocks: Option<crate::dtype::kv::KvKinds>,
    /// `x` holds f16 values (`[max_tokens, cols]`, two per word): the previous product's
    /// output under precision f16. Needs [`crate::backend::gpu::MatmulPrecision::F16`].
    pub x_f16: bool,
    /// `y` is written as f16 (`[max_tokens, rows]`, two per word) for a next product that
    /// reads f16; not with `accumulate` or `kv_write`. Needs
    /// [`crate::backend::gpu::MatmulPrecision::F16`].
    pub y_f16: bool,
}

/// The KV cache of a [`Linear`] built with [`LinearOptions::kv_write`].
#[derive(Debug, Clone, Copy)]
pub struct KvWriteBinding<'a> {
    /// One layer's K and V caches, `[max_positions, kv_rows]` f32 each (f16 pairs with
    /// [`LinearOptions::kv_f16`], rows of their kinds' words with
    /// [`LinearOptions::kv_blocks`]); `None` exactly when the layer was built with
    /// [`LinearOptions::kv_deferred`].
    pub caches: Option<(&'a wgpu::Buffer, &'a wgpu::Buffer)>,
    /// Query rows (`n_heads · head_dim`) and key/value rows each (`n_kv_heads · head_dim`);
    /// the weight has `q_rows + 2 · kv_rows` rows.
    pub q_rows: u32,
    pub kv_rows: u32,
    /// Values per head (even with RoPE, at most [`super::MAX_HEAD_DIM`]).
    pub head_dim: u32,
    /// RoPE base and scaling (theta finite, ≥ 1; ignored without RoPE).
    pub rope: &'a crate::config::RopeFreqs,
    /// Positions one sequence of each cache holds.
    pub max_positions: u32,
    /// Rows per sequence of a local layer's ring, where position `p` lives in row
    /// `slot · ring + p mod ring` (`None`: each cache keeps every position, `max_positions`
    /// rows per sequence).
    pub ring: Option<u32>,
}

/// The bound norm of a [`Linear`] built with [`LinearOptions::norm`]: `weight` and, for layer
/// norms, `bias`, both `[cols]` f32.
#[derive(Debug, Clone, Copy)]
pub struct NormBinding<'a> {
    /// `[cols]` f32.
    pub weight: &'a wgpu::Buffer,
    /// `[cols]` f32, exactly for [`InputNorm::Layer`].
    pub bias: Option<&'a wgpu::Buffer>,
    /// Added to the variance.
    pub eps: f32,
}
