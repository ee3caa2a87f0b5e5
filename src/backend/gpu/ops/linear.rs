//! Linear layers with weights in their stored type (`shaders/linear.wgsl`, decoding from
//! `shaders/lib/quant.wgsl`): `y = W·x (+ bias)`, optionally added to `y`.
//!
//! Two kernels: decode (one token: matrix × vector, memory-bound, weights read once) and prefill
//! (many tokens, weights read once per tile of tokens). [`LinearBinding::record`] picks by the
//! step's token count. Each comes in the variants its table in
//! [`crate::backend::gpu::variants::linear`] declares (the
//! workgroup shape: a shared-memory reduction per row group, 64 × 32 tiles through shared
//! memory; the rows shape: each invocation owns 4 whole rows, and for prefill 4 tokens, no
//! barriers), each a define of the one shader with its geometry as defines. A layer is built
//! with the variants the plan asks for and records the one the plan chose.

mod binding;
mod kv_checks;
mod options;

use crate::backend::gpu::host_struct::host_struct;
use std::sync::Arc;

use bytemuck::{Pod, Zeroable};

pub(crate) use super::weight_checks::{check_words, matrix_shape, weight_flag};
use super::{
    check_f16_activations, check_step, dispatch_grid, load, optional_input, positive,
    pow2_invocations, reduce_defines, Grid, KernelBinding, Reduction, WeightRead,
};
use crate::backend::gpu::counters::AliveBuffers;
use crate::backend::gpu::device::GpuContext;
use crate::backend::gpu::kernels::{self, Defines, KernelCache};
use crate::backend::gpu::precision::MatmulPrecision;
use crate::backend::gpu::tensor::GpuTensor;
use crate::backend::gpu::variants::linear::{self as variants, Invocations, LinearVariant};
use crate::backend::gpu::variants::Variant;
use crate::dtype::kv::KV_BLOCK;
use crate::dtype::DType;
use crate::error::{Error, Result};
pub use binding::{LinearBinding, LinearChoice, LinearKernel};
use kv_checks::check_kv;
pub use options::{Epilogue, InputNorm, KvWriteBinding, LinearOptions, NormBinding};

host_struct! {
    #[repr(C)]
    #[derive(Debug, Clone, Copy, Pod, Zeroable)]
    pub(crate) struct LinearParams {
        rows: u32,
        cols: u32,
        max_tokens: u32,
        eps: f32,
        q_rows: u32,
        kv_rows: u32,
        head_dim: u32,
        max_positions: u32,
        /// Floats between two tokens' rows of `y` (the whole matrix's output rows).
        y_stride: u32,
        /// The output row this binding's first weight row writes (a split matrix's part).
        y_offset: u32,
        /// Rows per sequence of a local layer's ring (0: none).
        ring: u32,
        _pad: u32,
    }
}

/// One variant of one kernel, built: its row of the table, its workgroup's invocations on this
/// device, and the pipeline.
#[derive(Debug, Clone)]
struct Built {
    variant: &'static LinearVariant,
    invocations: u32,
    pipeline: Arc<wgpu::ComputePipeline>,
}

impl Built {
    /// Output rows one workgroup computes.
    fn rows_per_group(&self) -> u32 {
        self.variant.rows_per_group(self.invocations)
    }
}

/// `y[t, r] (+)= Σ_c W[r, c]·x[t, c] (+ bias[r])` for `t < n_tokens`, with `W: [rows, cols]`
/// kept in its stored type, `x: [max_tokens, cols]`, `y: [max_tokens, rows]` and
/// `bias: [rows]` f32. Built for one (dtype, reduction, options) combination, in the decode and
/// prefill variants asked for.
#[derive(Debug, Clone)]
pub struct Linear {
    decode: Vec<Built>,
    prefill: Vec<Built>,
    dtype: DType,
    options: LinearOptions,
}

impl Linear {
    /// Builds (or fetches from `cache`) both kernels for weights of `dtype`, in the workgroup
    /// shape. `reduction` applies to the decode kernel; with `accumulate` the result is added
    /// to `y` (a residual connection fused into the layer that produces it).
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
        let wg = [Variant::WORKGROUP];
        Self::with_variants(ctx, cache, dtype, reduction, options, &wg, &wg).await
    }

    /// [`Linear::with_options`] in the given decode and prefill variants (at least one each;
    /// the first is what [`LinearBinding::record`] runs unless a plan says otherwise).
    pub async fn with_variants(
        ctx: &GpuContext,
        cache: &KernelCache,
        dtype: DType,
        reduction: Reduction,
        options: LinearOptions,
        decode_variants: &[Variant],
        prefill_variants: &[Variant],
    ) -> Result<Self> {
        if decode_variants.is_empty() || prefill_variants.is_empty() {
            return Err(Error::invalid(
                "variants",
                "at least one variant per kernel",
            ));
        }
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
        if options.kv_deferred && !options.kv_write {
            return Err(Error::invalid(
                "options",
                "a deferred KV-cache write needs kv_write",
            ));
        }
        if options.kv_f16 && (!options.kv_write || options.kv_deferred) {
            return Err(Error::invalid(
                "options",
                "an f16 KV-cache write needs kv_write, not deferred",
            ));
        }
        if options.kv_blocks.is_some()
            && (!options.kv_write || options.kv_deferred || options.kv_f16)
        {
            return Err(Error::invalid(
                "options",
                "a KV-cache write of block kinds needs kv_write, not deferred and not f16",
            ));
        }
        if options.x_f16 || options.y_f16 {
            check_f16_activations(ctx, "options")?;
        }
        if options.y_f16 && (options.accumulate || options.kv_write) {
            return Err(Error::invalid(
                "options",
                "an f16 output cannot accumulate or feed the KV cache",
            ));
        }
        if options.rope && !options.kv_write {
            return Err(Error::invalid(
                "options",
                "RoPE is applied with kv_write only",
            ));
        }
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
                .flag_if("GLU", options.epilogue.is_glu())
                .flag_if(
                    "GELU",
                    matches!(options.epilogue, Epilogue::Gelu | Epilogue::GeGlu),
                )
                .flag_if("GELU_ERF", options.epilogue == Epilogue::GeluErf)
                .flag_if("LAST_ROW", options.last_row)
                .flag_if("KV_WRITE", options.kv_write)
                .flag_if("ROPE", options.rope)
                .flag_if("KV_DEFER", options.kv_deferred)
                .flag_if("KV_F16", options.kv_f16)
                .flag_if("KV_BLOCKS", options.kv_blocks.is_some())
                .value_if(
                    "K_KIND",
                    options.kv_blocks.map(|k| format!("{}u", k.k.code())),
                )
                .value_if(
                    "V_KIND",
                    options.kv_blocks.map(|k| format!("{}u", k.v.code())),
                )
                .flag_if("MM_F16", ctx.precision() == MatmulPrecision::F16)
                .flag_if("X_F16", options.x_f16)
                .flag_if("Y_F16", options.y_f16)
        };
        let mut decode = Vec::new();
        for &v in decode_variants {
            let kernel = (variants::DECODE, "linear_decode", Defines::new());
            decode.push(build(ctx, cache, kernel, v, &options, reduction, &common).await?);
        }
        let mut prefill = Vec::new();
        for &v in prefill_variants {
            let kernel = (
                variants::PREFILL,
                "linear_prefill",
                Defines::new().flag("PREFILL"),
            );
            prefill.push(build(ctx, cache, kernel, v, &options, reduction, &common).await?);
        }
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
        let out_rows = if opts.epilogue.is_glu() {
            if !rows.is_multiple_of(2) {
                return Err(Error::invalid(
                    "w",
                    format!("a gated unit needs (gate, up) row pairs, got {rows} rows"),
                ));
            }
            rows / 2
        } else {
            rows
        };
        let out_tokens = if opts.last_row { 1 } else { max_tokens };
        // f16 activations take half a word each
        let check_act = |name: &'static str, b: &wgpu::Buffer, t: u32, n: u32, f16: bool| {
            let values = u64::from(t) * u64::from(n);
            let (words, ty) = match f16 {
                true => (values.div_ceil(2), "f16"),
                false => (values, "f32"),
            };
            check_words(name, b, words, &format!("[{t}, {n}] {ty}"))
        };
        check_act("x", x, max_tokens, cols, opts.x_f16)?;
        check_act("y", y, out_tokens, out_rows, opts.y_f16)?;
        let parts = w.parts();
        if parts.iter().any(|(_, _, b)| *b == y) || y == x || bias.is_some_and(|b| b == y) {
            return Err(Error::invalid(
                "y",
                "the output buffer is also an input of the same layer",
            ));
        }
        if parts.len() > 1 && (opts.kv_write || opts.has_bias) {
            return Err(Error::invalid(
                "w",
                format!(
                    "a [{rows}, {cols}] matrix split across {} bindings cannot have a bias \
                     or a KV write",
                    parts.len()
                ),
            ));
        }
        let mut storage = vec![(3, x), (4, y)];
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
        let (kv_params, freqs) = check_kv(ctx, opts, kv, rows, &storage)?;
        if let Some((k_cache, v_cache)) = kv.and_then(|kv| kv.caches) {
            storage.push((8, k_cache));
            storage.push((9, v_cache));
        }
        if let Some(f) = &freqs {
            storage.push((10, f));
        }
        let max_groups = ctx.limits().max_compute_workgroups_per_dimension;
        let unbound = |built: &[Built]| -> Vec<(Variant, Vec<KernelBinding>)> {
            built
                .iter()
                .map(|b| (b.variant.spec.variant, Vec::new()))
                .collect()
        };
        let mut decode = unbound(&self.decode);
        let mut prefill = unbound(&self.prefill);
        for &(first_row, part_rows, buffer) in &parts {
            if opts.epilogue.is_glu() && !part_rows.is_multiple_of(2) {
                return Err(Error::invalid(
                    "w",
                    format!("a part of {part_rows} rows splits a (gate, up) pair"),
                ));
            }
            let params = LinearParams {
                rows: part_rows,
                cols,
                max_tokens,
                eps,
                q_rows: kv_params[0],
                kv_rows: kv_params[1],
                head_dim: kv_params[2],
                max_positions: kv_params[3],
                y_stride: out_rows,
                // gated units write one output per (gate, up) pair of rows
                y_offset: if opts.epilogue.is_glu() {
                    first_row / 2
                } else {
                    first_row
                },
                ring: kv_params[4],
                _pad: 0,
            };
            let label = format!("linear {} [{part_rows}, {cols}]", self.dtype);
            let weights = WeightRead::Whole(
                self.dtype
                    .bytes_for(u64::from(part_rows) * u64::from(cols), "w")?,
            );
            let mut bound = storage.clone();
            bound.push((2, buffer));
            let bind = |pipeline: &Arc<wgpu::ComputePipeline>, grid: Grid| {
                KernelBinding::new_at(ctx, pipeline, &label, &params, Some(step), &bound, grid)
                    .with_weights(weights)
            };
            for (built, (_, out)) in self.decode.iter().zip(decode.iter_mut()) {
                let groups = match (opts.kv_blocks, built.variant.block_groups) {
                    // encoding KV blocks, the workgroups past the query rows compute a whole
                    // block each (q_rows and kv_rows are multiples of the block, checked
                    // above)
                    (Some(_), true) => {
                        let q_rows = kv_params[0];
                        q_rows / built.rows_per_group()
                            + part_rows.saturating_sub(q_rows) / KV_BLOCK as u32
                    }
                    _ => part_rows.div_ceil(built.rows_per_group()),
                };
                let (x, y) = dispatch_grid(ctx, "linear_decode", groups)?;
                out.push(bind(&built.pipeline, Grid::Fixed(x, y)));
            }
            for (built, (_, out)) in self.prefill.iter().zip(prefill.iter_mut()) {
                let row_groups = part_rows.div_ceil(built.rows_per_group());
                let tile = built.variant.tokens;
                for (what, needed) in [
                    ("linear_prefill row groups", row_groups),
                    ("linear_prefill token tiles", max_tokens.div_ceil(tile)),
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
                let grid = Grid::TokenTiles {
                    x: row_groups,
                    tile,
                };
                out.push(bind(&built.pipeline, grid));
            }
        }
        Ok(LinearBinding {
            decode,
            prefill,
            rows,
            cols,
            last_row: opts.last_row,
            options: opts,
            weight_bytes: self
                .dtype
                .bytes_for(u64::from(rows) * u64::from(cols), "w")?,
            _alive: AliveBuffers::new(ctx.counter_cells(), freqs.iter().map(|f| f.size())),
            _freqs: freqs,
        })
    }
}

/// Builds `variant` of a kernel, given as (its family's table, its entry point, its own
/// defines), with the layer's defines (`common`): the variant's flag and geometry, the
/// reduction's defines where it reduces. Fails naming the device limit a variant's workgroup
/// exceeds, or the variant a table lacks.
async fn build(
    ctx: &GpuContext,
    cache: &KernelCache,
    (table, entry, defines): (&'static [LinearVariant], &'static str, Defines),
    variant: Variant,
    options: &LinearOptions,
    reduction: Reduction,
    common: &dyn Fn(Defines) -> Defines,
) -> Result<Built> {
    let Some(spec) = LinearVariant::find(table, variant) else {
        return Err(Error::invalid(
            "variant",
            format!("{entry} has no variant `{variant}`"),
        ));
    };
    let limits = ctx.limits();
    let invocations = match spec.invocations {
        Invocations::UpTo(max) => pow2_invocations(ctx, max),
        Invocations::Exactly(n) => n,
    };
    for (limit, allowed, needed) in [
        (
            "maxComputeInvocationsPerWorkgroup",
            limits.max_compute_invocations_per_workgroup,
            invocations,
        ),
        (
            "maxComputeWorkgroupSizeX",
            limits.max_compute_workgroup_size_x,
            invocations,
        ),
        (
            "maxComputeWorkgroupStorageSize",
            limits.max_compute_workgroup_storage_size,
            spec.shared_bytes,
        ),
    ] {
        if allowed < needed {
            return Err(Error::Limit {
                what: format!("{entry} {variant} workgroup"),
                limit,
                needed: u64::from(needed),
                allowed: u64::from(allowed),
            });
        }
    }
    let group_rows = spec.rows_per_group(invocations);
    if options.kv_blocks.is_some()
        && !spec.block_groups
        && !group_rows.is_multiple_of(KV_BLOCK as u32)
    {
        return Err(Error::Limit {
            what: format!("{entry} {variant} workgroup spanning a KV block"),
            limit: "maxComputeInvocationsPerWorkgroup",
            needed: u64::from((KV_BLOCK as u32).div_ceil(spec.rows)),
            allowed: u64::from(invocations),
        });
    }
    let base = match spec.reduces {
        true => reduce_defines(ctx, reduction)?,
        false => Defines::new(),
    };
    // the geometry the host computes with, as the shader's constants, and the variant's flag
    let mut defines = common(base)
        .merged(defines)
        .value("WG_SIZE", format!("{invocations}u"))
        .value("ROWS", format!("{}u", spec.rows))
        .value("TOKENS", format!("{}u", spec.tokens));
    if let Some(flag) = spec.spec.define {
        defines = defines.flag(flag);
    }
    let pipeline = load(ctx, cache, &kernels::LINEAR, entry, defines).await?;
    Ok(Built {
        variant: spec,
        invocations,
        pipeline,
    })
}
