//! The CPU backend's kernels against references in f64 on fresh random inputs at awkward
//! sizes, shared by the native test (`tests/engine/cpu_kernels.rs`) and the browser test
//! (`tests/web/cpu.rs`).
//!
//! The matrix product of a quantized type runs on 8-bit activations, so it is checked twice:
//! exactly (to f32 rounding) against the f64 product of the dequantized weights with the
//! dequantized 8-bit activations, and against the f64 product with the f32 activations
//! within the bound the activation rounding allows (`Σ_half-blocks d/2 · Σ|w|`).

use emberlm::backend::cpu::kv::KvRows;
use emberlm::backend::cpu::ops::{self, AttnShape, KeyRange};
use emberlm::backend::cpu::quant::{Q8Rows, QA};
use emberlm::backend::cpu::QMatrix;
use emberlm::dtype::kv::KvKind;
use emberlm::dtype::{dequantize, DType};
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::linear_cases::{linear_shapes, random_weights};

/// `d ≤ tol`, false for NaN.
fn within(d: f64, tol: f64) -> bool {
    d <= tol
}

fn random_acts(rng: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let v: f32 = rng.random_range(-1.0..1.0);
            // a few outliers, as real activations have
            if i % 97 == 5 {
                v * 30.0
            } else {
                v
            }
        })
        .collect()
}

/// Every weight type, every shape of [`linear_shapes`], 1, 3 and 17 tokens, with and
/// without a bias.
pub fn check_matmul(rng: &mut ChaCha8Rng, small: bool) -> Result<(), String> {
    for dtype in DType::ALL {
        for (rows, cols) in linear_shapes(dtype, small) {
            for tokens in [1usize, 3, 17] {
                check_one(rng, dtype, rows, cols, tokens)
                    .map_err(|e| format!("{dtype} [{rows}, {cols}] × {tokens} tokens: {e}"))?;
            }
        }
    }
    Ok(())
}

fn check_one(
    rng: &mut ChaCha8Rng,
    dtype: DType,
    rows: usize,
    cols: usize,
    tokens: usize,
) -> Result<(), String> {
    let bytes = random_weights(rng, dtype, rows * cols);
    let w = dequantize(dtype, &bytes, (rows * cols) as u64, "w").map_err(|e| e.to_string())?;
    let m = QMatrix::new(dtype, rows, cols, bytes, "w").map_err(|e| e.to_string())?;
    let x = random_acts(rng, tokens * cols);
    let bias: Option<Vec<f32>> = (tokens != 3).then(|| random_acts(rng, rows));
    let mut y = vec![f32::NAN; tokens * rows];
    // On the CPU backend's threads where there are several, as in a forward step.
    emberlm::backend::cpu::run(|| m.matmul(&x, bias.as_deref(), &mut y));
    // The activations the product saw.
    let seen: Vec<f32> = if m.quantizes_activations() {
        let mut q8 = Q8Rows::default();
        q8.quantize(&x, cols);
        q8.q.iter()
            .enumerate()
            .map(|(i, &q)| f32::from(q) * q8.d[i / QA])
            .collect()
    } else {
        x.clone()
    };
    for t in 0..tokens {
        for r in 0..rows {
            let wr = &w[r * cols..][..cols];
            let b = bias.as_ref().map_or(0.0, |b| f64::from(b[r]));
            let exact: f64 = wr
                .iter()
                .zip(&seen[t * cols..][..cols])
                .map(|(&a, &b)| f64::from(a) * f64::from(b))
                .sum::<f64>()
                + b;
            let mag: f64 = wr
                .iter()
                .zip(&seen[t * cols..][..cols])
                .map(|(&a, &b)| (f64::from(a) * f64::from(b)).abs())
                .sum::<f64>()
                + b.abs();
            let got = f64::from(y[t * rows + r]);
            // f32 accumulation over `cols` products, and the f32 scales of the blocks
            let tol = 1e-5 * mag + 1e-30;
            if !within((got - exact).abs(), tol * 4.0) {
                return Err(format!(
                    "token {t} row {r}: {got} vs {exact} on the activations it saw (tolerance {tol:.1e})"
                ));
            }
            // against the true activations, within the rounding of 8-bit blocks
            let truth: f64 = wr
                .iter()
                .zip(&x[t * cols..][..cols])
                .map(|(&a, &b)| f64::from(a) * f64::from(b))
                .sum::<f64>()
                + b;
            let bound: f64 = wr
                .chunks(QA)
                .zip(x[t * cols..][..cols].chunks(QA))
                .map(|(wb, xb)| {
                    let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                    let half_step = f64::from(amax) / 127.0 / 2.0;
                    half_step * wb.iter().map(|v| f64::from(v.abs())).sum::<f64>()
                })
                .sum::<f64>();
            let bound = if m.quantizes_activations() {
                bound
            } else {
                0.0
            } + tol * 4.0;
            if !within((got - truth).abs(), bound) {
                return Err(format!(
                    "token {t} row {r}: {got} vs {truth} (|Δ| beyond the 8-bit bound {bound:.2e})"
                ));
            }
        }
    }
    Ok(())
}

/// The tiled matrix product (where this CPU or build has one) against the row-at-a-time path,
/// bit for bit: every 32-value type, awkward widths (an odd number of blocks, fewer and more
/// than eight), 1, 2 and 3 tokens (fewer than a product of stored rows repacks for). `Ok(false)`
/// where no matrix was kept in tiles (nothing was compared).
pub fn check_tiles_match_rows(rng: &mut ChaCha8Rng) -> Result<bool, String> {
    let mut tiled = false;
    for dtype in [
        DType::Q8_0,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
    ] {
        for blocks in [1usize, 3, 8, 13, 24] {
            let (rows, cols) = (48, blocks * 32);
            let bytes = random_weights(rng, dtype, rows * cols);
            let err = |e: emberlm::Error| format!("{dtype} [{rows}, {cols}]: {e}");
            let tiles = QMatrix::new(dtype, rows, cols, bytes.clone(), "w").map_err(err)?;
            let stored = QMatrix::stored(dtype, rows, cols, bytes, "w").map_err(err)?;
            if !tiles.is_tiled() {
                continue;
            }
            tiled = true;
            for tokens in 1..=3 {
                let x = random_acts(rng, tokens * cols);
                let mut want = vec![f32::NAN; tokens * rows];
                let mut got = vec![f32::NAN; tokens * rows];
                stored.matmul(&x, None, &mut want);
                tiles.matmul(&x, None, &mut got);
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    if g.to_bits() != w.to_bits() {
                        return Err(format!(
                            "{dtype} [{rows}, {cols}] × {tokens} tokens, token {} row {}: \
                             tiles {g:e}, rows {w:e}",
                            i / rows,
                            i % rows
                        ));
                    }
                }
            }
        }
    }
    Ok(tiled)
}

/// Attention over random caches: tokens at their own positions over their own key ranges
/// (sliding windows included), grouped-query heads, stacked queries, caches of every kind
/// (the reference reads the values the kind's decoder gives).
pub fn check_attention(rng: &mut ChaCha8Rng) -> Result<(), String> {
    let kind_pairs = [
        (KvKind::F32, KvKind::F32),
        (KvKind::F16, KvKind::F16),
        (KvKind::Q8_0, KvKind::Q8_0),
        (KvKind::Q4_0, KvKind::Q4_0),
        (KvKind::Nf4, KvKind::Nf4),
        (KvKind::Q8_0, KvKind::Nf4),
        (KvKind::F16, KvKind::Q4_0),
    ];
    for &(n_heads, n_kv_heads, head_dim, stacked) in &[
        (4usize, 2usize, 8usize, false),
        (3, 1, 20, true),
        (2, 2, 64, false),
    ] {
        for &(k_kind, v_kind) in &kind_pairs {
            check_attention_case(
                rng,
                (n_heads, n_kv_heads, head_dim, stacked),
                k_kind,
                v_kind,
            )
            .map_err(|e| format!("K {k_kind:?} V {v_kind:?}: {e}"))?;
        }
    }
    Ok(())
}

/// `rows` random rows of `kv_dim` stored in `kind`, and the values its decoder reads back.
fn random_cache(
    rng: &mut ChaCha8Rng,
    kind: KvKind,
    rows: usize,
    kv_dim: usize,
) -> (KvRows, Vec<f32>) {
    let mut cache = KvRows::new(kind, kv_dim, rows).expect("a small cache");
    let mut decoded = Vec::with_capacity(rows * kv_dim);
    for r in 0..rows {
        let row = random_acts(rng, kv_dim);
        cache.write(r, &row);
        decoded.extend(kind.decode_row(&kind.encode_row(&row), kv_dim));
    }
    (cache, decoded)
}

fn check_attention_case(
    rng: &mut ChaCha8Rng,
    (n_heads, n_kv_heads, head_dim, stacked): (usize, usize, usize, bool),
    k_kind: KvKind,
    v_kind: KvKind,
) -> Result<(), String> {
    {
        let kv_dim = n_kv_heads * head_dim;
        let q_dim = n_heads * head_dim;
        let q_stride = if stacked { q_dim + 2 * kv_dim } else { q_dim };
        let cache_rows = 41;
        let (k_cache, k) = random_cache(rng, k_kind, cache_rows, kv_dim);
        let (v_cache, v) = random_cache(rng, v_kind, cache_rows, kv_dim);
        let keys = [
            KeyRange::rows(0, 1),
            KeyRange::rows(3, 40),
            KeyRange::rows(20, 41),
            // a local layer's ring of 17 rows from row 7: positions 30..45 wrap at 34
            KeyRange {
                first: 30,
                end: 45,
                base: 7,
                ring: 17,
            },
        ];
        let q = random_acts(rng, keys.len() * q_stride);
        let mut out = vec![f32::NAN; keys.len() * q_dim];
        let shape = AttnShape {
            n_heads,
            n_kv_heads,
            head_dim,
            q_stride,
            score_scale: 1.0,
        };
        emberlm::backend::cpu::run(|| {
            ops::attention(&q, &k_cache, &v_cache, &keys, shape, &mut out)
        });
        let group = n_heads / n_kv_heads;
        for (t, kr) in keys.iter().enumerate() {
            for h in 0..n_heads {
                let qh = &q[t * q_stride + h * head_dim..][..head_dim];
                let off = (h / group) * head_dim;
                // the reference walks the rows in position order, wrapping by hand
                let rows: Vec<usize> = (kr.first..kr.end)
                    .map(|p| match kr.ring {
                        0 => kr.base + p,
                        ring => kr.base + p % ring,
                    })
                    .collect();
                let scores: Vec<f64> = rows
                    .iter()
                    .map(|&r| {
                        qh.iter()
                            .zip(&k[r * kv_dim + off..][..head_dim])
                            .map(|(&a, &b)| f64::from(a) * f64::from(b))
                            .sum::<f64>()
                            / (head_dim as f64).sqrt()
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f64 = e.iter().sum();
                for d in 0..head_dim {
                    let want: f64 = rows
                        .iter()
                        .zip(&e)
                        .map(|(&r, p)| p / sum * f64::from(v[r * kv_dim + off + d]))
                        .sum();
                    let got = f64::from(out[t * q_dim + h * head_dim + d]);
                    if !within((got - want).abs(), 1e-4 * (1.0 + want.abs())) {
                        return Err(format!(
                            "attention ({n_heads}/{n_kv_heads} heads of {head_dim}) token {t} head {h} dim {d}: {got} vs {want}"
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

/// RMSNorm and LayerNorm of random rows of an odd width against f64.
pub fn check_norms(rng: &mut ChaCha8Rng) -> Result<(), String> {
    let (n, d) = (5, 77);
    let x = random_acts(rng, n * d);
    let g = random_acts(rng, d);
    let b = random_acts(rng, d);
    let mut rms = vec![0.0; n * d];
    let mut ln = vec![0.0; n * d];
    ops::rms_norm(&x, &g, 1e-5, &mut rms);
    ops::layer_norm(&x, &g, &b, 1e-5, &mut ln);
    for (r, xr) in x.chunks(d).enumerate() {
        let xs: Vec<f64> = xr.iter().map(|&v| f64::from(v)).collect();
        let ms = xs.iter().map(|v| v * v).sum::<f64>() / d as f64;
        let mean = xs.iter().sum::<f64>() / d as f64;
        let var = xs.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / d as f64;
        for i in 0..d {
            let want_rms = xs[i] / (ms + 1e-5).sqrt() * f64::from(g[i]);
            let want_ln = (xs[i] - mean) / (var + 1e-5).sqrt() * f64::from(g[i]) + f64::from(b[i]);
            for (what, got, want) in [
                ("rms", rms[r * d + i], want_rms),
                ("layer", ln[r * d + i], want_ln),
            ] {
                if !within((f64::from(got) - want).abs(), 1e-4 * (1.0 + want.abs())) {
                    return Err(format!("{what} norm row {r} [{i}]: {got} vs {want}"));
                }
            }
        }
    }
    Ok(())
}

/// The integer dot product gives the bits of its definition (`src/backend/cpu/dot.rs`) on this
/// target, whichever SIMD path it takes, so native and browser models agree bit for bit.
pub fn check_dot_order(rng: &mut ChaCha8Rng) -> Result<(), String> {
    for halves in [2usize, 4, 6, 16, 18, 40] {
        let n = halves * 16;
        let w: Vec<i8> = (0..n)
            .map(|_| rng.random_range(-128i32..=127) as i8)
            .collect();
        let q: Vec<i8> = (0..n)
            .map(|_| rng.random_range(-127i32..=127) as i8)
            .collect();
        let scale: Vec<f32> = (0..halves)
            .map(|_| rng.random_range(-0.1f32..0.1))
            .collect();
        let d: Vec<f32> = (0..halves)
            .map(|_| rng.random_range(0.0f32..0.05))
            .collect();
        let mut acc = [0.0f32; 4];
        for h in 0..halves {
            let s: i32 = (0..16)
                .map(|i| i32::from(w[h * 16 + i]) * i32::from(q[h * 16 + i]))
                .sum();
            acc[h % 4] += s as f32 * (scale[h] * d[h]);
        }
        let want = (acc[0] + acc[1]) + (acc[2] + acc[3]);
        let got = emberlm::backend::cpu::dot::scaled_dot(&w, &q, &scale, &d);
        if got.to_bits() != want.to_bits() {
            return Err(format!(
                "{halves} half-blocks: {got:e} vs the definition's {want:e}"
            ));
        }
    }
    Ok(())
}
