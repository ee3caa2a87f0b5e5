//! Linear layers with weights in their stored type (`shaders/linear.wgsl`, decoding from
//! `shaders/quant.wgsl`): `y = W·x (+ bias)`, optionally added to `y`.
//!
//! Two kernels: decode (one token: matrix × vector, memory-bound, weights read once) and prefill
//! (many tokens: tiles of 64 rows × 32 tokens through shared memory, weights read once per tile
//! of tokens). [`LinearBinding::record`] picks by the step's token count.

use std::sync::Arc;

use bytemuck::{Pod, Zeroable};

use super::{
    dispatch_grid, load, optional_input, positive, reduce_defines, Grid, KernelBinding, Reduction,
    StepParams, WeightRead,
};
use crate::error::{Error, Result};
use crate::gpu::counters::AliveBuffers;
use crate::gpu::device::GpuContext;
use crate::gpu::kernels::{self, Defines, KernelCache};
use crate::gpu::tensor::GpuTensor;
use crate::model::weights::DType;

/// Rows one decode workgroup computes (must match `ROWS` in `shaders/linear.wgsl`).
pub const LINEAR_DECODE_ROWS: u32 = 4;
/// Rows of one prefill tile (must match `TILE_R` in `shaders/linear.wgsl`).
pub const LINEAR_PREFILL_ROWS: u32 = 64;
/// Tokens of one prefill tile (must match `TILE_T` in `shaders/linear.wgsl`).
pub const LINEAR_PREFILL_TOKENS: u32 = 32;
/// Invocations of a prefill workgroup (must match `PREFILL_WG` in `shaders/linear.wgsl`).
const PREFILL_WG: u32 = 256;
/// Largest decode workgroup. Rows are short in small models (576 columns = 72 parts of 8), so
/// a bigger workgroup would leave most invocations idle; 64 is two warps, one wave on AMD.
const DECODE_WG: u32 = 64;
/// Shared memory of the prefill kernel: the weight and activation tiles (8 KiB + 4 KiB), the
/// norm statistics (1 KiB + 256 B) plus the reduction snippet's arrays, which the compiler may
/// count even though prefill does not use them.
const PREFILL_SHARED_BYTES: u32 = 8192 + 4096 + 1024 + 256 + 16 * DECODE_WG;

#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
struct LinearParams {
    rows: u32,
    cols: u32,
    max_tokens: u32,
    eps: f32,
    q_rows: u32,
    kv_rows: u32,
    head_dim: u32,
    max_positions: u32,
}

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
}

/// What a [`Linear`] fuses around its product. The default is the plain layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct LinearOptions {
    /// A bias `[rows]` is added.
    pub has_bias: bool,
    /// The result is added to `y` (a residual connection fused into its producer).
    pub accumulate: bool,
    /// The input is normalised per token first (the norm's weight, and bias for
    /// [`InputNorm::Layer`], are bound with [`Linear::bind_with_norm`]).
    pub norm: Option<InputNorm>,
    /// The activation applied to the output.
    pub epilogue: Epilogue,
    /// Only the step's last token is computed and written to row 0 of `y` (an LM head of
    /// which only the last row is read). The decode kernel runs whatever the token count.
    pub last_row: bool,
    /// The layer is a stacked `q | k | v` projection whose k and v rows also go to the KV
    /// cache at the step's positions (bound with [`Linear::bind_qkv`]).
    pub kv_write: bool,
    /// With `kv_write`: q and k are rotated first (RoPE over adjacent row pairs `(2i, 2i+1)`
    /// within each head).
    pub rope: bool,
}

/// The KV cache of a [`Linear`] built with [`LinearOptions::kv_write`].
#[derive(Debug, Clone, Copy)]
pub struct KvWriteBinding<'a> {
    /// One layer's caches, `[max_positions, kv_rows]` f32 each.
    pub k_cache: &'a wgpu::Buffer,
    pub v_cache: &'a wgpu::Buffer,
    /// Query rows (`n_heads · head_dim`) and key/value rows each (`n_kv_heads · head_dim`);
    /// the weight has `q_rows + 2 · kv_rows` rows.
    pub q_rows: u32,
    pub kv_rows: u32,
    /// Values per head (even with RoPE, at most [`super::MAX_HEAD_DIM`]).
    pub head_dim: u32,
    /// RoPE base (finite, ≥ 1; ignored without RoPE).
    pub theta: f32,
    /// Rows of each cache.
    pub max_positions: u32,
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

/// The `quant.wgsl` flag selecting `dtype`.
pub(crate) fn weight_flag(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "WEIGHT_F32",
        DType::F16 => "WEIGHT_F16",
        DType::BF16 => "WEIGHT_BF16",
        DType::Q8_0 => "WEIGHT_Q8_0",
        DType::Q4_0 => "WEIGHT_Q4_0",
        DType::Q4_1 => "WEIGHT_Q4_1",
        DType::Q4_K => "WEIGHT_Q4_K",
        DType::Q5_K => "WEIGHT_Q5_K",
        DType::Q6_K => "WEIGHT_Q6_K",
    }
}

/// Checks `w` against the kernel's type and returns `(rows, cols)` from its shape `[rows, cols]`:
/// both at least 1, `cols` a whole number of blocks, the buffer large enough, and every byte
/// offset within u32 (the kernels address the tensor in bytes).
pub(crate) fn matrix_shape(w: &GpuTensor, dtype: DType, name: &'static str) -> Result<(u32, u32)> {
    if w.dtype != dtype {
        return Err(Error::invalid(
            name,
            format!("tensor is {} but the kernel was built for {dtype}", w.dtype),
        ));
    }
    let &[rows, cols] = w.shape.as_slice() else {
        return Err(Error::invalid(
            name,
            format!("expected a matrix [rows, cols], got shape {:?}", w.shape),
        ));
    };
    let to_u32 = |what: &str, v: usize| {
        u32::try_from(v).map_err(|_| Error::invalid(name, format!("{what} {v} exceeds u32")))
    };
    let (rows, cols) = (to_u32("rows", rows)?, to_u32("cols", cols)?);
    if rows == 0 || cols == 0 {
        return Err(Error::invalid(
            name,
            format!("shape {:?} is empty", w.shape),
        ));
    }
    let block = dtype.block_elements();
    if !u64::from(cols).is_multiple_of(block) {
        return Err(Error::invalid(
            name,
            format!("cols {cols} is not a multiple of the {dtype} block size {block}"),
        ));
    }
    let bytes = dtype.bytes_for(u64::from(rows) * u64::from(cols), name)?;
    if w.buffer.size() < bytes {
        return Err(Error::invalid(
            name,
            format!(
                "buffer holds {} bytes but [{rows}, {cols}] {dtype} needs {bytes}",
                w.buffer.size()
            ),
        ));
    }
    // Byte addresses of blocks (and, for F32, element indices) are u32 in the kernels.
    if bytes > u64::from(u32::MAX) {
        return Err(Error::invalid(
            name,
            format!("{bytes} bytes: kernels address at most 4 GiB per tensor"),
        ));
    }
    Ok((rows, cols))
}

/// Fails unless `buffer` holds at least `elements` 4-byte values; `what` names the shape and
/// type for the message (`[8, 576] f32`).
pub(crate) fn check_words(
    name: &'static str,
    buffer: &wgpu::Buffer,
    elements: u64,
    what: &str,
) -> Result<()> {
    let needed = elements * 4;
    if buffer.size() < needed {
        return Err(Error::invalid(
            name,
            format!(
                "buffer holds {} bytes but {what} needs {needed}",
                buffer.size()
            ),
        ));
    }
    Ok(())
}

/// Fails unless `step` can hold the [`StepParams`] uniform.
pub(crate) fn check_step(step: &wgpu::Buffer) -> Result<()> {
    let needed = std::mem::size_of::<StepParams>() as u64;
    if step.size() < needed {
        return Err(Error::invalid(
            "step",
            format!(
                "buffer holds {} bytes but the step parameters take {needed}",
                step.size()
            ),
        ));
    }
    Ok(())
}

/// Which kernel a [`LinearBinding`] records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinearKernel {
    /// Matrix × vector, for one token (correct for more, reading the weights once per token).
    Decode,
    /// Tiled matrix × matrix, for several tokens (correct for one).
    Prefill,
}

impl LinearKernel {
    /// The kernel [`LinearBinding::record`] uses for a step of `n_tokens` tokens.
    pub fn for_tokens(n_tokens: u32) -> Self {
        if n_tokens <= 1 {
            LinearKernel::Decode
        } else {
            LinearKernel::Prefill
        }
    }
}

/// `y[t, r] (+)= Σ_c W[r, c]·x[t, c] (+ bias[r])` for `t < n_tokens`, with `W: [rows, cols]`
/// kept in its stored type, `x: [max_tokens, cols]`, `y: [max_tokens, rows]` and
/// `bias: [rows]` f32. Built for one (dtype, reduction, bias, accumulate) combination.
#[derive(Debug, Clone)]
pub struct Linear {
    decode: Arc<wgpu::ComputePipeline>,
    prefill: Arc<wgpu::ComputePipeline>,
    dtype: DType,
    options: LinearOptions,
}

impl Linear {
    /// Builds (or fetches from `cache`) both kernels for weights of `dtype`. `reduction` applies
    /// to the decode kernel; with `accumulate` the result is added to `y` (a residual connection
    /// fused into the layer that produces it).
    pub async fn new(
        ctx: &GpuContext,
        cache: &KernelCache,
        dtype: DType,
        reduction: Reduction,
        has_bias: bool,
        accumulate: bool,
    ) -> Result<Self> {
        let options = LinearOptions {
            has_bias,
            accumulate,
            ..LinearOptions::default()
        };
        Self::with_options(ctx, cache, dtype, reduction, options).await
    }

    /// [`Linear::new`] with fusions: an input norm, an output activation, last-row only.
    /// SwiGLU does not combine with `accumulate` (nothing needs it).
    pub async fn with_options(
        ctx: &GpuContext,
        cache: &KernelCache,
        dtype: DType,
        reduction: Reduction,
        options: LinearOptions,
    ) -> Result<Self> {
        if options.accumulate && options.epilogue != Epilogue::None {
            return Err(Error::invalid(
                "options",
                "an activation epilogue cannot be combined with accumulate",
            ));
        }
        if options.kv_write
            && (options.accumulate || options.epilogue != Epilogue::None || options.last_row)
        {
            return Err(Error::invalid(
                "options",
                "a Q/K/V projection writing the KV cache has no other epilogue",
            ));
        }
        if options.rope && !options.kv_write {
            return Err(Error::invalid(
                "options",
                "RoPE is applied with kv_write only",
            ));
        }
        let limits = ctx.limits();
        for (limit, allowed, needed) in [
            (
                "maxComputeInvocationsPerWorkgroup",
                limits.max_compute_invocations_per_workgroup,
                PREFILL_WG,
            ),
            (
                "maxComputeWorkgroupSizeX",
                limits.max_compute_workgroup_size_x,
                PREFILL_WG,
            ),
            (
                "maxComputeWorkgroupStorageSize",
                limits.max_compute_workgroup_storage_size,
                PREFILL_SHARED_BYTES,
            ),
        ] {
            if allowed < needed {
                return Err(Error::Limit {
                    what: "linear_prefill workgroup".into(),
                    limit,
                    needed: u64::from(needed),
                    allowed: u64::from(allowed),
                });
            }
        }
        // The largest power of two up to DECODE_WG the device allows (as reduce_defines does
        // up to 256); the define below replaces reduce_defines' WG_SIZE.
        let cap = DECODE_WG
            .min(limits.max_compute_invocations_per_workgroup)
            .min(limits.max_compute_workgroup_size_x)
            .max(1);
        let decode_wg = 1u32 << (31 - cap.leading_zeros());
        let common = |d: Defines| {
            d.flag(weight_flag(dtype))
                .flag_if("X_VEC4", dtype.block_elements() > 1)
                .flag_if("HAS_BIAS", options.has_bias)
                .flag_if("ACCUMULATE", options.accumulate)
                .flag_if("NORM", options.norm.is_some())
                .flag_if("NORM_RMS", options.norm == Some(InputNorm::Rms))
                // RMS norms reduce their squares together with the products (decode kernel)
                .flag_if("REDUCE_PAIR", options.norm == Some(InputNorm::Rms))
                .flag_if("NORM_LAYER", options.norm == Some(InputNorm::Layer))
                .flag_if("GLU", options.epilogue == Epilogue::SwiGlu)
                .flag_if("GELU", options.epilogue == Epilogue::Gelu)
                .flag_if("LAST_ROW", options.last_row)
                .flag_if("KV_WRITE", options.kv_write)
                .flag_if("ROPE", options.rope)
                .value("WG_SIZE", format!("{decode_wg}u"))
        };
        let decode_defines = common(reduce_defines(ctx, reduction)?);
        // Prefill does not reduce across the workgroup: the same pipeline serves both reductions.
        let prefill_defines = common(Defines::new());
        let decode = load(
            ctx,
            cache,
            &kernels::LINEAR,
            "linear_decode",
            decode_defines,
        )
        .await?;
        let prefill = load(
            ctx,
            cache,
            &kernels::LINEAR,
            "linear_prefill",
            prefill_defines,
        )
        .await?;
        Ok(Self {
            decode,
            prefill,
            dtype,
            options,
        })
    }

    /// What the kernels fuse.
    pub fn options(&self) -> LinearOptions {
        self.options
    }

    /// The weight type the kernels decode.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Whether the result is added to `y`.
    pub fn accumulates(&self) -> bool {
        self.options.accumulate
    }

    /// Binds one layer: `step` is the shared [`super::StepParams`] uniform, `w: [rows, cols]`
    /// (rows and cols from `w.shape`; cols a multiple of the block size), `x: [max_tokens, cols]`,
    /// `y: [max_tokens, rows]` and `bias: [rows]` f32 buffers (bias given exactly when the kernel
    /// was built with one). Errors name the argument that does not fit.
    #[allow(clippy::too_many_arguments)]
    pub fn bind(
        &self,
        ctx: &GpuContext,
        step: &wgpu::Buffer,
        w: &GpuTensor,
        x: &wgpu::Buffer,
        bias: Option<&wgpu::Buffer>,
        y: &wgpu::Buffer,
        max_tokens: u32,
    ) -> Result<LinearBinding> {
        self.bind_with_norm(ctx, step, w, x, bias, None, y, max_tokens)
    }

    /// [`Linear::bind`] for a layer built with an input norm: `norm` holds its `[cols]` f32
    /// weight (and bias for layer norms). With [`Epilogue::SwiGlu`] `y` is `[max_tokens,
    /// rows / 2]`; with `last_row` it needs only one row.
    #[allow(clippy::too_many_arguments)]
    pub fn bind_with_norm(
        &self,
        ctx: &GpuContext,
        step: &wgpu::Buffer,
        w: &GpuTensor,
        x: &wgpu::Buffer,
        bias: Option<&wgpu::Buffer>,
        norm: Option<NormBinding<'_>>,
        y: &wgpu::Buffer,
        max_tokens: u32,
    ) -> Result<LinearBinding> {
        self.bind_qkv(ctx, step, w, x, bias, norm, None, y, max_tokens)
    }

    /// [`Linear::bind_with_norm`] for a layer built with [`LinearOptions::kv_write`]: `kv`
    /// gives the caches and the head geometry; `y: [max_tokens, q_rows + 2·kv_rows]` still
    /// receives every row (q rotated).
    #[allow(clippy::too_many_arguments)]
    pub fn bind_qkv(
        &self,
        ctx: &GpuContext,
        step: &wgpu::Buffer,
        w: &GpuTensor,
        x: &wgpu::Buffer,
        bias: Option<&wgpu::Buffer>,
        norm: Option<NormBinding<'_>>,
        kv: Option<KvWriteBinding<'_>>,
        y: &wgpu::Buffer,
        max_tokens: u32,
    ) -> Result<LinearBinding> {
        positive("max_tokens", max_tokens)?;
        check_step(step)?;
        let (rows, cols) = matrix_shape(w, self.dtype, "w")?;
        let opts = self.options;
        let out_rows = if opts.epilogue == Epilogue::SwiGlu {
            if !rows.is_multiple_of(2) {
                return Err(Error::invalid(
                    "w",
                    format!("SwiGLU needs (gate, up) row pairs, got {rows} rows"),
                ));
            }
            rows / 2
        } else {
            rows
        };
        let out_tokens = if opts.last_row { 1 } else { max_tokens };
        let shape = |t: u32, n: u32| format!("[{t}, {n}] f32");
        check_words(
            "x",
            x,
            u64::from(max_tokens) * u64::from(cols),
            &shape(max_tokens, cols),
        )?;
        check_words(
            "y",
            y,
            u64::from(out_tokens) * u64::from(out_rows),
            &shape(out_tokens, out_rows),
        )?;
        if y == x || y == &w.buffer || bias.is_some_and(|b| b == y) {
            return Err(Error::invalid(
                "y",
                "the output buffer is also an input of the same layer",
            ));
        }
        let mut storage = vec![(2, &w.buffer), (3, x), (4, y)];
        if let Some(b) = optional_input("bias", "bias", opts.has_bias, bias)? {
            check_words("bias", b, u64::from(rows), &format!("[{rows}] f32"))?;
            storage.push((5, b));
        }
        let mut eps = 0.0;
        let norm = optional_input("norm", "a norm", opts.norm.is_some(), norm)?;
        if let (Some(kind), Some(n)) = (opts.norm, norm) {
            if !(n.eps.is_finite() && n.eps >= 0.0) {
                return Err(Error::invalid(
                    "norm",
                    format!("eps {} must be finite and >= 0", n.eps),
                ));
            }
            eps = n.eps;
            if n.weight == y || n.bias.is_some_and(|b| b == y) {
                return Err(Error::invalid(
                    "y",
                    "the output buffer is also the norm's weight or bias",
                ));
            }
            let words = |b| check_words("norm", b, u64::from(cols), &format!("[{cols}] f32"));
            words(n.weight)?;
            storage.push((6, n.weight));
            match (kind, n.bias) {
                (InputNorm::Rms, None) => {}
                (InputNorm::Layer, Some(b)) => {
                    words(b)?;
                    storage.push((7, b));
                }
                (InputNorm::Rms, Some(_)) => {
                    return Err(Error::invalid("norm", "an RMS norm has no bias"))
                }
                (InputNorm::Layer, None) => {
                    return Err(Error::invalid("norm", "a layer norm needs its bias"))
                }
            }
        }
        let (kv_params, freqs) = self.check_kv(ctx, kv, rows, &storage)?;
        if let Some(kv) = kv {
            storage.push((8, kv.k_cache));
            storage.push((9, kv.v_cache));
        }
        if let Some(f) = &freqs {
            storage.push((10, f));
        }
        let max_groups = ctx.limits().max_compute_workgroups_per_dimension;
        let row_tiles = rows.div_ceil(LINEAR_PREFILL_ROWS);
        let token_tiles = max_tokens.div_ceil(LINEAR_PREFILL_TOKENS);
        for (what, needed) in [
            ("linear_prefill row tiles", row_tiles),
            ("linear_prefill token tiles", token_tiles),
        ] {
            if needed > max_groups {
                return Err(Error::Limit {
                    what: what.into(),
                    limit: "maxComputeWorkgroupsPerDimension",
                    needed: u64::from(needed),
                    allowed: u64::from(max_groups),
                });
            }
        }
        let decode_grid = dispatch_grid(ctx, "linear_decode", rows.div_ceil(LINEAR_DECODE_ROWS))?;
        let params = LinearParams {
            rows,
            cols,
            max_tokens,
            eps,
            q_rows: kv_params[0],
            kv_rows: kv_params[1],
            head_dim: kv_params[2],
            max_positions: kv_params[3],
        };
        let label = format!("linear {} [{rows}, {cols}]", self.dtype);
        let weights = WeightRead::Whole(
            self.dtype
                .bytes_for(u64::from(rows) * u64::from(cols), "w")?,
        );
        Ok(LinearBinding {
            decode: KernelBinding::new_at(
                ctx,
                &self.decode,
                &label,
                &params,
                Some(step),
                &storage,
                Grid::Fixed(decode_grid.0, decode_grid.1),
            )
            .with_weights(weights),
            prefill: KernelBinding::new_at(
                ctx,
                &self.prefill,
                &label,
                &params,
                Some(step),
                &storage,
                Grid::TokenTiles {
                    x: row_tiles,
                    tile: LINEAR_PREFILL_TOKENS,
                },
            )
            .with_weights(weights),
            rows,
            cols,
            last_row: opts.last_row,
            _alive: AliveBuffers::new(ctx.counter_cells(), freqs.iter().map(|f| f.size())),
            _freqs: freqs,
        })
    }
}

impl Linear {
    /// Checks the KV-cache binding against the options and the weight's `rows`, and returns
    /// the kernel's `(q_rows, kv_rows, head_dim, max_positions)` and, with RoPE, the frequency
    /// table buffer (bound by the bind group, which keeps it alive).
    fn check_kv(
        &self,
        ctx: &GpuContext,
        kv: Option<KvWriteBinding<'_>>,
        rows: u32,
        inputs: &[(u32, &wgpu::Buffer)],
    ) -> Result<([u32; 4], Option<wgpu::Buffer>)> {
        let Some(kv) = optional_input("kv", "a KV-cache write", self.options.kv_write, kv)? else {
            return Ok(([0; 4], None));
        };
        positive("max_positions", kv.max_positions)?;
        positive("head_dim", kv.head_dim)?;
        let stacked = u64::from(kv.q_rows) + 2 * u64::from(kv.kv_rows);
        if stacked != u64::from(rows) {
            return Err(Error::invalid(
                "kv",
                format!(
                    "q_rows {} + 2 · kv_rows {} is not the weight's {rows} rows",
                    kv.q_rows, kv.kv_rows
                ),
            ));
        }
        let hd = kv.head_dim;
        if !kv.q_rows.is_multiple_of(hd) || !kv.kv_rows.is_multiple_of(hd) || kv.kv_rows == 0 {
            return Err(Error::invalid(
                "head_dim",
                format!(
                    "{hd} does not divide q_rows {} and kv_rows {}",
                    kv.q_rows, kv.kv_rows
                ),
            ));
        }
        let cache_words = u64::from(kv.max_positions) * u64::from(kv.kv_rows);
        let what = format!("[{}, {}] f32", kv.max_positions, kv.kv_rows);
        check_words("k_cache", kv.k_cache, cache_words, &what)?;
        check_words("v_cache", kv.v_cache, cache_words, &what)?;
        if kv.k_cache == kv.v_cache
            || inputs
                .iter()
                .any(|&(_, b)| b == kv.k_cache || b == kv.v_cache)
        {
            return Err(Error::invalid(
                "kv",
                "the caches must be distinct from each other and from the layer's buffers",
            ));
        }
        let freqs = if self.options.rope {
            if !hd.is_multiple_of(2) || hd > super::MAX_HEAD_DIM {
                return Err(Error::invalid(
                    "head_dim",
                    format!(
                        "must be even and at most {} for RoPE, got {hd}",
                        super::MAX_HEAD_DIM
                    ),
                ));
            }
            if !(kv.theta.is_finite() && kv.theta >= 1.0) {
                return Err(Error::invalid(
                    "theta",
                    format!("must be finite and >= 1, got {}", kv.theta),
                ));
            }
            let pairs = super::rope::freq_pairs(kv.theta, hd);
            Some(ctx.storage_from("rope frequencies", &pairs)?)
        } else {
            None
        };
        Ok(([kv.q_rows, kv.kv_rows, hd, kv.max_positions], freqs))
    }
}

/// A bound linear layer: both kernels over the same buffers. Create once, record every step.
#[derive(Debug)]
pub struct LinearBinding {
    decode: KernelBinding,
    prefill: KernelBinding,
    rows: u32,
    cols: u32,
    last_row: bool,
    /// The RoPE frequency table of a Q/K/V layer (the bind groups use it).
    _freqs: Option<wgpu::Buffer>,
    _alive: AliveBuffers,
}

impl LinearBinding {
    /// Records the layer for a step of `n_tokens` tokens (at most `max_tokens`, and the value
    /// the step uniform will hold when the pass runs): the decode kernel for one token, the
    /// prefill kernel for more.
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, n_tokens: u32) {
        self.record_kernel(pass, n_tokens, LinearKernel::for_tokens(n_tokens));
    }

    /// Records `kernel` for a step of `n_tokens` tokens, whichever is faster (tests use it to
    /// check both kernels at every token count). Last-row layers always record the decode
    /// kernel.
    pub fn record_kernel(
        &self,
        pass: &mut wgpu::ComputePass<'_>,
        n_tokens: u32,
        kernel: LinearKernel,
    ) {
        // Last-row layers compute one token: only the decode kernel does that.
        match kernel {
            LinearKernel::Prefill if !self.last_row => self.prefill.record(pass, n_tokens),
            _ => self.decode.record(pass, n_tokens),
        }
    }

    /// `(rows, cols)` of the weight matrix.
    pub fn shape(&self) -> (u32, u32) {
        (self.rows, self.cols)
    }
}
