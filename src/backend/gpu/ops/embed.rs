//! Embedding lookups with tables in their stored type (`shaders/embed.wgsl`, decoding from
//! `shaders/lib/quant.wgsl`): a dequantizing row gather, bit-exact with the CPU dequantization.

use crate::backend::gpu::host_struct::host_struct;
use std::sync::Arc;

use bytemuck::{Pod, Zeroable};

use super::check_step;
use super::linear::{check_words, matrix_shape, weight_flag};
use super::{load, positive, Grid, KernelBinding, WeightRead};
use crate::backend::gpu::device::GpuContext;
use crate::backend::gpu::kernels::{self, Defines, KernelCache};
use crate::backend::gpu::tensor::GpuTensor;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// Invocations of an embedding workgroup (must match `EMBED_WG` in `shaders/embed.wgsl`); each
/// writes one part of 8 values.
const EMBED_WG: u32 = 64;

host_struct! {
    #[repr(C)]
    #[derive(Debug, Clone, Copy, Pod, Zeroable)]
    pub(crate) struct EmbedParams {
        rows: u32,
        dim: u32,
        max_tokens: u32,
        /// Always 0: an operand the shader compiler cannot fold (see `put` in the shader).
        zero: u32,
        /// The first table row this binding's buffer holds (a split table's part).
        first_row: u32,
        /// Rows this binding's buffer holds.
        part_rows: u32,
        /// Every gathered value is multiplied by it (1: the row as stored).
        scale: f32,
        _pad: u32,
    }
}

/// Where the row of each token comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EmbedSource {
    /// `id_t = ids[t]`: token embeddings, from a u32 `[max_tokens]` buffer.
    Tokens,
    /// `id_t = pos0 + t` (from the step uniform): learned position embeddings (GPT-2).
    Positions,
    /// `id_t = 0` for every token: BERT's token-type embedding (one segment).
    First,
}

/// `out[t, :] (+)= table[id_t, :]` for `t < n_tokens`, with `table: [rows, dim]` kept in its
/// stored type and `out: [max_tokens, dim]` f32. Ids past the table are clamped to its last
/// row (never an out-of-bounds read); the engine validates ids on the CPU before upload.
#[derive(Debug, Clone)]
pub struct Embedding {
    pipeline: Arc<wgpu::ComputePipeline>,
    dtype: DType,
    source: EmbedSource,
}

impl Embedding {
    /// Builds (or fetches from `cache`) the kernel for tables of `dtype` read by `source`;
    /// with `accumulate` the rows are added to `out` (positions onto token embeddings).
    pub async fn new(
        ctx: &GpuContext,
        cache: &KernelCache,
        dtype: DType,
        source: EmbedSource,
        accumulate: bool,
    ) -> Result<Self> {
        let defines = Defines::new()
            .flag(weight_flag(dtype))
            .flag_if("FROM_IDS", source == EmbedSource::Tokens)
            .flag_if("FIRST_ROW", source == EmbedSource::First)
            .flag_if("ACCUMULATE", accumulate);
        let pipeline = load(ctx, cache, &kernels::EMBED, "embed", defines).await?;
        Ok(Self {
            pipeline,
            dtype,
            source,
        })
    }

    /// Binds one lookup: `step` is the shared [`super::StepParams`] uniform, `table: [rows, dim]`
    /// (from `table.shape`, in one binding), `ids: u32 [max_tokens]` (given exactly for
    /// [`EmbedSource::Tokens`]), `out: [max_tokens, dim]` f32. Errors name the argument.
    /// Record the binding with the step's token count (at most `max_tokens`).
    pub fn bind(
        &self,
        ctx: &GpuContext,
        step: &wgpu::Buffer,
        table: &GpuTensor,
        ids: Option<&wgpu::Buffer>,
        out: &wgpu::Buffer,
        max_tokens: u32,
    ) -> Result<KernelBinding> {
        table.whole("table")?;
        let mut parts = self.bind_scaled(ctx, step, table, ids, out, max_tokens, 1.0)?;
        parts
            .pop()
            .ok_or_else(|| Error::invalid("table", "no rows to bind"))
    }

    /// [`Self::bind`] for a table of any number of row parts (one binding per part, to record
    /// in order), each value multiplied by `scale` (Gemma's √d; 1 keeps rows as stored).
    #[allow(clippy::too_many_arguments)]
    pub fn bind_scaled(
        &self,
        ctx: &GpuContext,
        step: &wgpu::Buffer,
        table: &GpuTensor,
        ids: Option<&wgpu::Buffer>,
        out: &wgpu::Buffer,
        max_tokens: u32,
        scale: f32,
    ) -> Result<Vec<KernelBinding>> {
        if !scale.is_finite() {
            return Err(Error::invalid("scale", format!("{scale} is not finite")));
        }
        positive("max_tokens", max_tokens)?;
        check_step(step)?;
        let (rows, dim) = matrix_shape(table, self.dtype, "table")?;
        check_words(
            "out",
            out,
            u64::from(max_tokens) * u64::from(dim),
            &format!("[{max_tokens}, {dim}] f32"),
        )?;
        let parts = table.parts();
        if parts.iter().any(|(_, _, b)| *b == out) || ids.is_some_and(|i| i == out) {
            return Err(Error::invalid(
                "out",
                "the output buffer is also an input of the lookup",
            ));
        }
        let mut storage = Vec::new();
        match (self.source, ids) {
            (EmbedSource::Tokens, Some(ids)) => {
                check_words(
                    "ids",
                    ids,
                    u64::from(max_tokens),
                    &format!("[{max_tokens}] u32"),
                )?;
                storage.push(ids);
            }
            (EmbedSource::Positions | EmbedSource::First, None) => {}
            (EmbedSource::Tokens, None) => {
                return Err(Error::invalid("ids", "token embeddings need an ids buffer"))
            }
            (EmbedSource::Positions | EmbedSource::First, Some(_)) => {
                return Err(Error::invalid(
                    "ids",
                    "position and token-type embeddings read no ids buffer",
                ))
            }
        }
        storage.push(out);
        let x = dim.div_ceil(8).div_ceil(EMBED_WG);
        let max_groups = ctx.limits().max_compute_workgroups_per_dimension;
        for (what, needed) in [("embed parts", x), ("embed tokens", max_tokens)] {
            if needed > max_groups {
                return Err(Error::Limit {
                    what: what.into(),
                    limit: "maxComputeWorkgroupsPerDimension",
                    needed: u64::from(needed),
                    allowed: u64::from(max_groups),
                });
            }
        }
        let label = format!("embed {} [{rows}, {dim}]", self.dtype);
        let per_token = self.dtype.bytes_for(u64::from(dim), "table")?;
        Ok(parts
            .into_iter()
            .map(|(first_row, part_rows, buffer)| {
                let params = EmbedParams {
                    rows,
                    dim,
                    max_tokens,
                    zero: 0,
                    first_row,
                    part_rows,
                    scale,
                    _pad: 0,
                };
                let bound: Vec<&wgpu::Buffer> = std::iter::once(buffer)
                    .chain(storage.iter().copied())
                    .collect();
                KernelBinding::new(
                    ctx,
                    &self.pipeline,
                    &label,
                    &params,
                    Some(step),
                    &bound,
                    Grid::PerToken(x),
                )
                // every token reads one row, from whichever part holds it
                .with_weights(WeightRead::PerToken(if first_row == 0 {
                    per_token
                } else {
                    0
                }))
            })
            .collect())
    }
}
