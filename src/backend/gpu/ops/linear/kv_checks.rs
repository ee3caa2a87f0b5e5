//! The checks of a Q/K/V projection's KV-cache binding (the caches, the head geometry, the
//! RoPE table) against the layer's options.

use super::options::{KvWriteBinding, LinearOptions};
use crate::backend::gpu::device::GpuContext;
use crate::backend::gpu::ops::weight_checks::check_words;
use crate::backend::gpu::ops::{optional_input, positive, MAX_HEAD_DIM};
use crate::dtype::kv::{KvKind, KV_BLOCK};
use crate::error::{Error, Result};

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
        if !hd.is_multiple_of(2) || hd > MAX_HEAD_DIM {
            return Err(Error::invalid(
                "head_dim",
                format!(
                    "must be even and at most {} for RoPE, got {hd}",
                    MAX_HEAD_DIM
                ),
            ));
        }
        crate::backend::gpu::ops::rope::check_freqs(kv.rope, hd)?;
        let pairs = crate::backend::gpu::ops::rope::freq_pairs(kv.rope, hd);
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
