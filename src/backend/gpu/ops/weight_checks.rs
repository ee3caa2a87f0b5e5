//! Argument checks shared by the weight-reading kernels (linear layers, embeddings): the
//! weight type's shader flag, matrix shapes against their buffers, activation sizes and a Q/K/V
//! layer's KV-cache binding (the step uniform is checked by [`super::check_step`]).

use super::linear::{KvWriteBinding, LinearOptions};
use super::{optional_input, positive};
use crate::backend::gpu::device::GpuContext;
use crate::backend::gpu::tensor::GpuTensor;
use crate::dtype::kv::{KvKind, KV_BLOCK};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// The `quant.wgsl` flag selecting `dtype`.
pub(crate) fn weight_flag(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "WEIGHT_F32",
        DType::F16 => "WEIGHT_F16",
        DType::BF16 => "WEIGHT_BF16",
        DType::Q8_0 => "WEIGHT_Q8_0",
        DType::Q4_0 => "WEIGHT_Q4_0",
        DType::Q4_1 => "WEIGHT_Q4_1",
        DType::Q5_0 => "WEIGHT_Q5_0",
        DType::Q5_1 => "WEIGHT_Q5_1",
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
    let mut next_row = 0u32;
    for (first_row, part_rows, buffer) in w.parts() {
        let part = dtype.bytes_for(u64::from(part_rows) * u64::from(cols), name)?;
        if first_row != next_row || buffer.size() < part {
            return Err(Error::invalid(
                name,
                format!(
                    "buffer of rows {first_row}..{} holds {} bytes but [{part_rows}, {cols}] \
                     {dtype} needs {part}",
                    first_row + part_rows,
                    buffer.size()
                ),
            ));
        }
        next_row += part_rows;
    }
    if next_row != rows {
        return Err(Error::invalid(
            name,
            format!("its parts hold {next_row} rows, the shape {rows}"),
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

/// Checks the KV-cache binding against the options and the weight's `rows`, and returns
/// the kernel's `(q_rows, kv_rows, head_dim, max_positions, ring)` (ring 0: none) and, with RoPE, the frequency
/// table buffer (bound by the bind group, which keeps it alive).
pub(crate) fn check_kv(
    ctx: &GpuContext,
    options: LinearOptions,
    kv: Option<KvWriteBinding<'_>>,
    rows: u32,
    inputs: &[(u32, &wgpu::Buffer)],
) -> Result<([u32; 5], Option<wgpu::Buffer>)> {
    let Some(kv) = optional_input("kv", "a KV-cache write", options.kv_write, kv)? else {
        return Ok(([0; 5], None));
    };
    positive("max_positions", kv.max_positions)?;
    if let Some(ring) = kv.ring {
        positive("ring", ring)?;
    }
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
    if options.kv_f16 && (!kv.q_rows.is_multiple_of(2) || !kv.kv_rows.is_multiple_of(2)) {
        return Err(Error::invalid(
            "kv",
            format!(
                "an f16 cache is written in pairs: q_rows {} and kv_rows {} must be even",
                kv.q_rows, kv.kv_rows
            ),
        ));
    }
    let block = KV_BLOCK as u32;
    if options.kv_blocks.is_some()
        && (!kv.q_rows.is_multiple_of(block) || !kv.kv_rows.is_multiple_of(block))
    {
        return Err(Error::invalid(
            "kv",
            format!(
                "a cache of block kinds is encoded a block of {block} rows at a time: q_rows {} \
                 and kv_rows {} must be multiples of {block}",
                kv.q_rows, kv.kv_rows
            ),
        ));
    }
    if !kv.q_rows.is_multiple_of(hd) || !kv.kv_rows.is_multiple_of(hd) || kv.kv_rows == 0 {
        return Err(Error::invalid(
            "head_dim",
            format!(
                "{hd} does not divide q_rows {} and kv_rows {}",
                kv.q_rows, kv.kv_rows
            ),
        ));
    }
    let caches = optional_input(
        "kv",
        "a KV cache written in the epilogue",
        !options.kv_deferred,
        kv.caches,
    )?;
    if let Some((k_cache, v_cache)) = caches {
        let cache_rows = kv.ring.unwrap_or(kv.max_positions);
        let rows = u64::from(cache_rows);
        // (K words, V words, what they hold)
        let (k_words, v_words, what) = match (options.kv_blocks, options.kv_f16) {
            (Some(kinds), _) => {
                let words = |k: KvKind| rows * k.row_words(kv.kv_rows as usize) as u64;
                (
                    words(kinds.k),
                    words(kinds.v),
                    format!(
                        "[{cache_rows}, {}] values as {} (K) and {} (V)",
                        kv.kv_rows,
                        kinds.k.name(),
                        kinds.v.name()
                    ),
                )
            }
            // two f16 values per word (kv_rows is even: head_dim divides it, and RoPE pairs)
            (None, true) => {
                let words = rows * u64::from(kv.kv_rows).div_ceil(2);
                let what = format!("[{cache_rows}, {}] f16 pairs", kv.kv_rows);
                (words, words, what)
            }
            (None, false) => {
                let words = rows * u64::from(kv.kv_rows);
                (words, words, format!("[{cache_rows}, {}] f32", kv.kv_rows))
            }
        };
        check_words("k_cache", k_cache, k_words, &what)?;
        check_words("v_cache", v_cache, v_words, &what)?;
        if k_cache == v_cache || inputs.iter().any(|&(_, b)| b == k_cache || b == v_cache) {
            return Err(Error::invalid(
                "kv",
                "the caches must be distinct from each other and from the layer's buffers",
            ));
        }
    }
    let freqs = if options.rope {
        if !hd.is_multiple_of(2) || hd > super::MAX_HEAD_DIM {
            return Err(Error::invalid(
                "head_dim",
                format!(
                    "must be even and at most {} for RoPE, got {hd}",
                    super::MAX_HEAD_DIM
                ),
            ));
        }
        super::rope::check_freqs(kv.rope, hd)?;
        let pairs = super::rope::freq_pairs(kv.rope, hd);
        Some(ctx.storage_from("rope frequencies", &pairs)?)
    } else {
        None
    };
    Ok((
        [
            kv.q_rows,
            kv.kv_rows,
            hd,
            kv.max_positions,
            kv.ring.unwrap_or(0),
        ],
        freqs,
    ))
}
