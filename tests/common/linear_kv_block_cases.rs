//! The stacked Q/K/V projection encoding KV caches of block kinds in its own dispatch
//! ([`LinearOptions::kv_blocks`]), run natively on lavapipe and in the browser on WebGPU: `y`
//! holds q (rotated) | k (rotated) | v as the reference computes them, the cache rows of the
//! step's positions hold exactly what the CPU encoder makes of the k and v rows in `y` (or,
//! where a GPU's division rounds otherwise, one value per block a code away, still within the
//! kind's encoding error), and every other cache word is untouched. Every kernel shape, decode steps of one and several
//! tokens, prefill steps of one to more than a tile of tokens, every kind (mixed too), with
//! and without a local layer's ring.

use emberlm::backend::gpu::ops::{
    InputNorm, KvWriteBinding, LinearKernel, LinearOptions, NormBinding,
};
use emberlm::backend::gpu::{GpuContext, KernelCache, Reduction, StepParams};
use emberlm::config::{RopeFreqs, RopeLayout, RopeScaling};
use emberlm::dtype::kv::{KvKind, KvKinds};
use emberlm::dtype::DType;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::linear_cases::{every_variant, random_vec, step_buffer, upload_matrix, with_variants};
use super::linear_fused_cases::{qkv_reference, QkvHeads};

/// Decode steps of one and of three tokens (the decode kernel repeats per token), prefill
/// steps from one token to more than one 32-token tile.
const RUNS: &[(LinearKernel, u32)] = &[
    (LinearKernel::Decode, 1),
    (LinearKernel::Decode, 3),
    (LinearKernel::Prefill, 1),
    (LinearKernel::Prefill, 5),
    (LinearKernel::Prefill, 17),
    (LinearKernel::Prefill, 40),
];

/// The kinds the cases cover, each with the weight type and whether the layer keeps a ring.
fn cases() -> Vec<(KvKinds, DType, bool)> {
    let pair = |k, v| KvKinds { k, v };
    vec![
        (KvKinds::both(KvKind::Q8_0), DType::Q8_0, false),
        (pair(KvKind::Q4_0, KvKind::Nf4), DType::F32, true),
        (pair(KvKind::F16, KvKind::Q8_0), DType::Q4_K, false),
        (pair(KvKind::Nf4, KvKind::F32), DType::Q8_0, true),
        (pair(KvKind::F32, KvKind::F16), DType::F32, false),
    ]
}

/// Heads of 32 values: 3 query heads and 2 KV heads (96 + 2 · 64 = 224 rows: seven blocks of
/// rows, a partial prefill tile of 64), positions from 1000 on so the angles are large.
pub async fn check_linear_qkv_blocks(
    ctx: &GpuContext,
    cache: &KernelCache,
    reduction: Reduction,
    rng: &mut ChaCha8Rng,
) -> Result<(), String> {
    let (n_heads, n_kv, hd, positions) = (3usize, 2usize, 32usize, 1200usize);
    let freqs = RopeFreqs {
        theta: 10000.0,
        scaling: RopeScaling::None,
    };
    let (q_rows, kv_rows) = (n_heads * hd, n_kv * hd);
    let rows = q_rows + 2 * kv_rows;
    let max_tokens = 40usize;
    for (kinds, dtype, ringed) in cases() {
        let cols = match dtype.block_elements() {
            1 => 45,
            32 => 96,
            _ => 256,
        };
        // a ring of 48 rows: the step's positions wrap around it
        let ring = ringed.then_some(48u32);
        let cache_rows = ring.map_or(positions, |r| r as usize);
        let options = LinearOptions {
            has_bias: true,
            norm: Some(InputNorm::Rms),
            kv_write: true,
            rope: true,
            kv_blocks: Some(kinds),
            ..LinearOptions::default()
        };
        let what = format!(
            "linear qkv {dtype} {reduction:?} K {} V {} ring {ring:?}",
            kinds.k.name(),
            kinds.v.name()
        );
        let e = |e: emberlm::Error| format!("{what}: {e}");
        let op = every_variant(ctx, cache, dtype, reduction, options, &what).await?;
        let (w, wv) = upload_matrix(ctx, rng, dtype, rows, cols)?;
        let x = random_vec(rng, max_tokens * cols, 1.0);
        let bias = random_vec(rng, rows, 0.5);
        let nw = random_vec(rng, cols, 2.0);
        let (k_words, v_words) = (kinds.k.row_words(kv_rows), kinds.v.row_words(kv_rows));
        let kc0: Vec<u32> = (0..cache_rows * k_words).map(|_| rng.random()).collect();
        let vc0: Vec<u32> = (0..cache_rows * v_words).map(|_| rng.random()).collect();
        let step = step_buffer(ctx);
        let xb = ctx.storage_from("x", &x).map_err(e)?;
        let bb = ctx.storage_from("bias", &bias).map_err(e)?;
        let nwb = ctx.storage_from("norm w", &nw).map_err(e)?;
        let yb = ctx
            .storage_zeroed("y", (max_tokens * rows * 4) as u64)
            .map_err(e)?;
        let kb = ctx.storage_from("k cache", &kc0).map_err(e)?;
        let vb = ctx.storage_from("v cache", &vc0).map_err(e)?;
        let norm = NormBinding {
            weight: &nwb,
            bias: None,
            eps: 1e-6,
        };
        let kv = KvWriteBinding {
            caches: Some((&kb, &vb)),
            q_rows: q_rows as u32,
            kv_rows: kv_rows as u32,
            head_dim: hd as u32,
            rope: &freqs,
            max_positions: positions as u32,
            ring,
        };
        let binding = op
            .bind_qkv(
                ctx,
                &step,
                &w,
                &xb,
                Some(&bb),
                Some(norm),
                Some(kv),
                &yb,
                max_tokens as u32,
            )
            .map_err(e)?;
        for (variant, &(kernel, n_tokens)) in with_variants(RUNS) {
            let (n, pos0) = (n_tokens as usize, 1000 + 3 * n_tokens as usize);
            let at = format!("{what} {variant} {kernel:?} n={n}");
            ctx.queue.write_buffer(&kb, 0, bytemuck::cast_slice(&kc0));
            ctx.queue.write_buffer(&vb, 0, bytemuck::cast_slice(&vc0));
            ctx.queue.write_buffer(
                &step,
                0,
                bytemuck::bytes_of(&StepParams::new(pos0 as u32, n_tokens)),
            );
            ctx.submit_pass("linear qkv blocks test", |pass| {
                binding.record_variant(pass, n_tokens, kernel, Some(variant))
            });
            let y = ctx.read_f32(&yb, max_tokens * rows).await.map_err(e)?;
            let kc = ctx.read_bytes(&kb, kb.size()).await.map_err(e)?;
            let vc = ctx.read_bytes(&vb, vb.size()).await.map_err(e)?;
            let (kc, vc): (Vec<u32>, Vec<u32>) = (
                bytemuck::pod_collect_to_vec(&kc),
                bytemuck::pod_collect_to_vec(&vc),
            );
            // cache row of each of the step's tokens
            let row_of = |t: usize| (pos0 + t) % cache_rows;
            for (cache, c0, words, first) in [
                (&kc, &kc0, k_words, q_rows),
                (&vc, &vc0, v_words, q_rows + kv_rows),
            ] {
                let kind = if first == q_rows { kinds.k } else { kinds.v };
                for r in 0..cache_rows {
                    let got = &cache[r * words..(r + 1) * words];
                    let written = (0..n).find(|&t| row_of(t) == r);
                    let want = match written {
                        Some(t) => kind.encode_row(&y[t * rows + first..][..kv_rows]),
                        None => c0[r * words..(r + 1) * words].to_vec(),
                    };
                    let close = written.is_some_and(|t| {
                        one_code_apart(kind, got, &want, &y[t * rows + first..][..kv_rows])
                    });
                    if got != want.as_slice() && !close {
                        return Err(format!(
                            "{at}: {} cache row {r}: got {got:08x?}, want {want:08x?}",
                            kind.name()
                        ));
                    }
                }
            }
            for t in 0..n {
                let heads = QkvHeads { n_heads, n_kv, hd };
                let rope = (pos0 + t, &freqs, RopeLayout::Interleaved);
                let row = &x[t * cols..(t + 1) * cols];
                let (want, tol) = qkv_reference(row, &nw, (&wv, &bias), heads, rope);
                for r in 0..rows {
                    let (got, want) = (y[t * rows + r], want[r]);
                    let diff = (f64::from(got) - f64::from(want)).abs();
                    if diff > tol {
                        return Err(format!(
                            "{at} token {t} y row {r}: gpu {got} vs reference {want} (|diff| {diff:e} > {tol:e})"
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

/// Whether the cache row `got` differs from the CPU encoder's `want` only where a division's
/// last bit decides a code: at most one value per 32-value block decodes differently, and every
/// value of `got` is still within the kind's encoding error of `values`. WGSL lets a GPU divide
/// to 2.5 ulp (NVIDIA's Vulkan driver on an H200 does: `amax / 127` and `1 / d` then put one q8_0
/// value on the other side of a rounding boundary), where the CPU and lavapipe divide exactly.
fn one_code_apart(kind: KvKind, got: &[u32], want: &[u32], values: &[f32]) -> bool {
    let (g, w) = (
        kind.decode_row(got, values.len()),
        kind.decode_row(want, values.len()),
    );
    values
        .chunks(32)
        .zip(g.chunks(32).zip(w.chunks(32)))
        .all(|(v, (g, w))| {
            let absmax = v.iter().fold(0f32, |m, x| m.max(x.abs()));
            let bound = kind.max_error(absmax);
            let moved = g.iter().zip(w).filter(|(a, b)| a != b).count();
            moved <= 1 && g.iter().zip(v).all(|(a, b)| (a - b).abs() <= bound)
        })
}
