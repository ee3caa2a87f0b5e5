//! Norms, rotary embedding, softmax, attention, activations and embedding lookup.

use crate::config::{RopeFreqs, RopeLayout};
use crate::dtype::dequantize;
use crate::error::{Error, Result};
use crate::model::weights::Tensor;

use super::linear::dot;

/// RMSNorm over rows of length `n`: `x: [n_rows, n]`, `weight: [n]` → `[n_rows, n]`.
///
/// # Panics
/// When the slices do not match the shape (a programming error in the caller).
pub fn rms_norm(x: &[f32], weight: &[f32], n: usize, eps: f32) -> Vec<f32> {
    assert_eq!(weight.len(), n, "weight must be [n]");
    assert!(n > 0 && x.len().is_multiple_of(n), "x must be [n_rows, n]");
    x.chunks(n)
        .flat_map(|row| {
            let mean_sq = row
                .iter()
                .map(|&v| f64::from(v) * f64::from(v))
                .sum::<f64>()
                / n as f64;
            let scale = 1.0 / (mean_sq + f64::from(eps)).sqrt();
            row.iter()
                .zip(weight)
                .map(move |(&v, &g)| (f64::from(v) * scale * f64::from(g)) as f32)
        })
        .collect()
}

/// LayerNorm over rows of length `n`: `x: [n_rows, n]`, `weight: [n]`, `bias: [n]` →
/// `[n_rows, n]`, `(x − mean) / sqrt(var + eps) · weight + bias` with the biased (population)
/// variance, as PyTorch and GPT-2 use.
///
/// # Panics
/// When the slices do not match the shape (a programming error in the caller).
pub fn layer_norm(x: &[f32], weight: &[f32], bias: &[f32], n: usize, eps: f32) -> Vec<f32> {
    assert_eq!(weight.len(), n, "weight must be [n]");
    assert_eq!(bias.len(), n, "bias must be [n]");
    assert!(n > 0 && x.len().is_multiple_of(n), "x must be [n_rows, n]");
    x.chunks(n)
        .flat_map(|row| {
            // Two passes (mean, then squared deviations) rather than E[x²] − E[x]²: the
            // one-pass form cancels catastrophically when the mean is large against the spread.
            let mean = row.iter().map(|&v| f64::from(v)).sum::<f64>() / n as f64;
            let var = row
                .iter()
                .map(|&v| (f64::from(v) - mean).powi(2))
                .sum::<f64>()
                / n as f64;
            let scale = 1.0 / (var + f64::from(eps)).sqrt();
            row.iter().zip(weight).zip(bias).map(move |((&v, &g), &b)| {
                ((f64::from(v) - mean) * scale * f64::from(g) + f64::from(b)) as f32
            })
        })
        .collect()
}

/// Rotary position embedding, in place, for one token at position `pos`:
/// `x: [n_heads, head_dim]`. Pair `i` (of `head_dim / 2`) is rotated by the angle
/// `pos · theta^(−2i / head_dim)` (scaled as `rope`'s scaling says: `rope` is the base
/// `theta` alone or a [`RopeFreqs`]); [`RopeLayout::Interleaved`] pairs dimensions `(2i, 2i+1)`,
/// [`RopeLayout::RotateHalf`] pairs `(i, i + head_dim/2)`, [`RopeLayout::None`] leaves `x` as is.
///
/// # Panics
/// When `x` is not `[n_heads, head_dim]` or `head_dim` is odd with a rotating layout.
pub fn rope(
    x: &mut [f32],
    n_heads: usize,
    head_dim: usize,
    pos: usize,
    rope: impl Into<RopeFreqs>,
    layout: RopeLayout,
) {
    let rope = rope.into();
    assert_eq!(x.len(), n_heads * head_dim, "x must be [n_heads, head_dim]");
    if layout == RopeLayout::None {
        return;
    }
    assert!(head_dim.is_multiple_of(2), "RoPE needs an even head_dim");
    let half = head_dim / 2;
    for i in 0..half {
        let (a, b) = match layout {
            RopeLayout::Interleaved => (2 * i, 2 * i + 1),
            _ => (i, i + half),
        };
        // The angle in f64: at long positions an f32 angle alone is off by ~pos·2⁻²⁴ radians.
        let freq = rope.frequency(i, head_dim);
        let (sin, cos) = (pos as f64 * freq).sin_cos();
        for head in x.chunks_exact_mut(head_dim) {
            let (x0, x1) = (f64::from(head[a]), f64::from(head[b]));
            head[a] = (x0 * cos - x1 * sin) as f32;
            head[b] = (x0 * sin + x1 * cos) as f32;
        }
    }
}

/// Softmax in place over all of `x`, numerically stable (the maximum is subtracted first) and
/// accumulated in f64. An empty slice is left alone; a slice of only `−∞` becomes NaN.
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let exps: Vec<f64> = x
        .iter()
        .map(|&v| (f64::from(v) - f64::from(max)).exp())
        .collect();
    let sum: f64 = exps.iter().sum();
    for (y, e) in x.iter_mut().zip(exps) {
        *y = (e / sum) as f32;
    }
}

/// Scaled dot-product attention of one query token over the first `n_kv` cached positions:
/// `q: [n_heads, head_dim]`, `k_cache`, `v_cache: [≥ n_kv, n_kv_heads · head_dim]` →
/// `[n_heads, head_dim]`. Scores are scaled by `1/sqrt(head_dim)`; with grouped-query attention
/// query head `h` reads KV head `h / (n_heads / n_kv_heads)`. No mask is applied: causality is
/// the caller's, who passes only the positions up to and including the query's own.
///
/// # Panics
/// When the slices do not match the shapes, `n_kv` is 0, or `n_heads` is not a multiple of
/// `n_kv_heads` (programming errors in the caller).
pub fn attention(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    n_kv: usize,
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
) -> Vec<f32> {
    let kv_dim = n_kv_heads * head_dim;
    assert_eq!(q.len(), n_heads * head_dim, "q must be [n_heads, head_dim]");
    assert!(n_kv > 0, "attention needs at least one key");
    assert!(
        k_cache.len() >= n_kv * kv_dim && v_cache.len() >= n_kv * kv_dim,
        "the caches must hold n_kv positions of n_kv_heads · head_dim"
    );
    assert!(
        n_kv_heads > 0 && n_heads.is_multiple_of(n_kv_heads),
        "n_heads must be a multiple of n_kv_heads"
    );
    let group = n_heads / n_kv_heads;
    let scale = 1.0 / (head_dim as f64).sqrt();
    let mut out = vec![0.0f32; n_heads * head_dim];
    let mut scores = vec![0.0f64; n_kv];
    let mut acc = vec![0.0f64; head_dim];
    for (h, (qh, oh)) in q
        .chunks_exact(head_dim)
        .zip(out.chunks_exact_mut(head_dim))
        .enumerate()
    {
        let kv_off = (h / group) * head_dim;
        for (t, s) in scores.iter_mut().enumerate() {
            let k = &k_cache[t * kv_dim + kv_off..][..head_dim];
            *s = dot(qh, k) * scale;
        }
        // Softmax kept in f64 (unlike [`softmax`]) so the weights are not rounded to f32
        // before they multiply V.
        let max = scores.iter().fold(f64::NEG_INFINITY, |m, &s| m.max(s));
        let mut sum = 0.0;
        for s in scores.iter_mut() {
            *s = (*s - max).exp();
            sum += *s;
        }
        acc.fill(0.0);
        for (t, &p) in scores.iter().enumerate() {
            let v = &v_cache[t * kv_dim + kv_off..][..head_dim];
            for (a, &vv) in acc.iter_mut().zip(v) {
                *a += p * f64::from(vv);
            }
        }
        for (o, a) in oh.iter_mut().zip(&acc) {
            *o = (a / sum) as f32;
        }
    }
    out
}

/// SiLU (swish): `x · sigmoid(x)`, evaluated in f64.
pub fn silu(x: f32) -> f32 {
    let x = f64::from(x);
    (x / (1.0 + (-x).exp())) as f32
}

/// GELU with GPT-2's tanh approximation:
/// `0.5 · x · (1 + tanh(sqrt(2/π) · (x + 0.044715 · x³)))`, evaluated in f64.
pub fn gelu_tanh(x: f32) -> f32 {
    let x = f64::from(x);
    let k = (2.0 / std::f64::consts::PI).sqrt();
    (0.5 * x * (1.0 + (k * (x + 0.044715 * x * x * x)).tanh())) as f32
}

/// One row of an embedding table `table: [rows, width]` of any storage type, dequantized:
/// `[width]`. Only that row's bytes are read, so a large quantized table is never expanded.
///
/// Errors when `id` is not a row of the table, the table is not two-dimensional, its byte size
/// does not match its shape, or a row is not a whole number of quantization blocks.
pub fn embedding_row(table: &Tensor<'_>, id: u32) -> Result<Vec<f32>> {
    let &[rows, width] = table.shape.as_slice() else {
        return Err(Error::invalid(
            "table",
            format!(
                "an embedding table must be [rows, width], got shape {:?}",
                table.shape
            ),
        ));
    };
    let id = id as usize;
    if id >= rows {
        return Err(Error::invalid(
            "id",
            format!("token id {id} is outside the embedding table of {rows} rows"),
        ));
    }
    let row_bytes = usize::try_from(table.dtype.bytes_for(width as u64, "embedding row")?)
        .map_err(|_| Error::invalid("table", "row size does not fit in memory"))?;
    let bytes = id
        .checked_mul(row_bytes)
        .and_then(|start| table.data.get(start..start.checked_add(row_bytes)?))
        .ok_or_else(|| {
            Error::invalid(
                "table",
                format!(
                    "embedding table data ({} bytes) is too short for row {id} of {row_bytes} bytes",
                    table.data.len()
                ),
            )
        })?;
    dequantize(table.dtype, bytes, width as u64, "embedding row")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use std::borrow::Cow;

    fn close(a: f32, b: f64, tol: f64) -> bool {
        (f64::from(a) - b).abs() <= tol
    }

    #[test]
    fn rms_norm_unit_rows() {
        // mean of squares of [3, 4] is 12.5
        let y = rms_norm(&[3.0, 4.0, 0.0, 0.0], &[1.0, 2.0], 2, 0.0);
        let s = 1.0 / 12.5f64.sqrt();
        assert!((f64::from(y[0]) - 3.0 * s).abs() < 1e-6);
        assert!((f64::from(y[1]) - 8.0 * s).abs() < 1e-6);
        // an all-zero row with eps = 0 divides 0 by 0: the reference says NaN, honestly
        assert!(y[2].is_nan());
    }

    #[test]
    fn layer_norm_centres_scales_and_shifts() {
        // [1, 2, 3, 4]: mean 2.5, population variance 1.25
        let x = [1.0, 2.0, 3.0, 4.0, 7.0, 7.0, 7.0, 7.0];
        let y = layer_norm(&x, &[1.0, 1.0, 2.0, 1.0], &[0.0, 0.0, 0.0, 10.0], 4, 0.0);
        let s = 1.0 / 1.25f64.sqrt();
        for (got, want) in y[..4]
            .iter()
            .zip([-1.5 * s, -0.5 * s, 1.0 * s, 1.5 * s + 10.0])
        {
            assert!(close(*got, want, 1e-6), "{got} vs {want}");
        }
        // a constant row is all bias once eps keeps the division finite
        let y = layer_norm(&x[4..], &[1.0; 4], &[0.5; 4], 4, 1e-5);
        assert!(y.iter().all(|&v| v == 0.5), "{y:?}");
    }

    #[test]
    fn rope_rotates_pairs_by_position() {
        // pair 0 has frequency 1: rotating (1, 0) by `pos` radians gives (cos pos, sin pos)
        let (heads, hd, pos) = (2, 4, 3);
        let mut x = vec![0.0f32; heads * hd];
        x[0] = 1.0;
        x[hd] = 1.0;
        rope(&mut x, heads, hd, pos, 10000.0, RopeLayout::Interleaved);
        for h in 0..heads {
            assert!(close(x[h * hd], 3f64.cos(), 1e-6));
            assert!(close(x[h * hd + 1], 3f64.sin(), 1e-6));
        }
        // rotate-half pairs (0, 2) instead; pair 1 has frequency 10000^(-1/2) = 0.01
        let mut y = vec![0.0, 1.0, 0.0, 0.0];
        rope(&mut y, 1, 4, pos, 10000.0, RopeLayout::RotateHalf);
        assert!(close(y[1], 0.03f64.cos(), 1e-6) && close(y[3], 0.03f64.sin(), 1e-6));
        assert_eq!((y[0], y[2]), (0.0, 0.0));
        // position 0 and RopeLayout::None change nothing
        let orig: Vec<f32> = (0..8).map(|i| i as f32 - 3.5).collect();
        let mut z = orig.clone();
        rope(&mut z, 2, 4, 0, 10000.0, RopeLayout::RotateHalf);
        assert_eq!(z, orig);
        rope(&mut z, 2, 4, 17, 10000.0, RopeLayout::None);
        assert_eq!(z, orig);
    }

    #[test]
    fn rope_layouts_agree_under_the_gguf_permutation() {
        // GGUF stores dimension j·hd/2 + i of a head at 2i + j: interleaved RoPE on the permuted
        // vector must equal rotate-half RoPE on the original, permuted the same way.
        let (heads, hd) = (3, 8);
        let orig: Vec<f32> = (0..heads * hd)
            .map(|i| ((i * 7) % 11) as f32 - 5.0)
            .collect();
        let perm = |v: &[f32]| {
            let mut out = vec![0.0; v.len()];
            for h in 0..heads {
                for i in 0..hd / 2 {
                    for j in 0..2 {
                        out[h * hd + 2 * i + j] = v[h * hd + j * hd / 2 + i];
                    }
                }
            }
            out
        };
        let mut half = orig.clone();
        rope(&mut half, heads, hd, 41, 500.0, RopeLayout::RotateHalf);
        let mut inter = perm(&orig);
        rope(&mut inter, heads, hd, 41, 500.0, RopeLayout::Interleaved);
        assert_eq!(perm(&half), inter);
    }

    #[test]
    fn softmax_is_stable_and_normalised() {
        let mut x = [1.0, 2.0, 3.0];
        softmax(&mut x);
        let e: Vec<f64> = [1.0f64, 2.0, 3.0].iter().map(|v| v.exp()).collect();
        let s: f64 = e.iter().sum();
        for (got, want) in x.iter().zip(&e) {
            assert!(close(*got, want / s, 1e-7));
        }
        let mut big = [1000.0, 1000.0, f32::NEG_INFINITY];
        softmax(&mut big);
        assert_eq!(big, [0.5, 0.5, 0.0]);
        softmax(&mut []);
    }

    #[test]
    fn activations_match_closed_forms() {
        assert_eq!(silu(0.0), 0.0);
        assert!(close(silu(1.0), 1.0 / (1.0 + (-1f64).exp()), 1e-7));
        assert!(close(silu(-30.0), -30.0 * (-30f64).exp(), 1e-15));
        assert_eq!(gelu_tanh(0.0), 0.0);
        // 0.5·(1 + tanh(sqrt(2/π)·1.044715))
        assert!(close(gelu_tanh(1.0), 0.841_191_990_608_276_8, 1e-7));
        assert!(close(gelu_tanh(-1.0), -0.158_808_009_391_723_2, 1e-7));
        assert_eq!(gelu_tanh(20.0), 20.0);
    }

    #[test]
    fn attention_matches_a_direct_computation_with_gqa() {
        let (n_heads, n_kv_heads, hd, n_kv) = (4, 2, 2, 3);
        let kv_dim = n_kv_heads * hd;
        let q: Vec<f32> = (0..n_heads * hd).map(|i| (i as f32 * 0.37).sin()).collect();
        let k: Vec<f32> = (0..(n_kv + 1) * kv_dim)
            .map(|i| (i as f32 * 0.91).cos())
            .collect();
        let v: Vec<f32> = (0..(n_kv + 1) * kv_dim)
            .map(|i| i as f32 * 0.1 - 0.5)
            .collect();
        // the extra cached position (a "future" token) must be ignored
        let out = attention(&q, &k, &v, n_kv, n_heads, n_kv_heads, hd);
        for h in 0..n_heads {
            let g = h / 2;
            let s: Vec<f64> = (0..n_kv)
                .map(|t| {
                    (0..hd)
                        .map(|d| f64::from(q[h * hd + d]) * f64::from(k[t * kv_dim + g * hd + d]))
                        .sum::<f64>()
                        / (hd as f64).sqrt()
                })
                .collect();
            let z: f64 = s.iter().map(|v| v.exp()).sum();
            for d in 0..hd {
                let want: f64 = (0..n_kv)
                    .map(|t| s[t].exp() / z * f64::from(v[t * kv_dim + g * hd + d]))
                    .sum();
                assert!(close(out[h * hd + d], want, 1e-6), "head {h} dim {d}");
            }
        }
        // one position: the output is that position's value row, whatever the scores
        let one = attention(&q, &k, &v, 1, n_heads, n_kv_heads, hd);
        assert_eq!(one, [&v[0..2], &v[0..2], &v[2..4], &v[2..4]].concat());
    }

    #[test]
    fn embedding_row_dequantizes_one_row_of_any_type() {
        // Q8_0, two rows of 32: f16 scale then 32 signed bytes per block
        let mut data = Vec::new();
        for (scale, base) in [(0.5f32, 0i8), (0.25, -16)] {
            data.extend(half::f16::from_f32(scale).to_le_bytes());
            data.extend((0..32).map(|i| (base + i as i8) as u8));
        }
        let table = Tensor {
            shape: vec![2, 32],
            dtype: DType::Q8_0,
            data: Cow::Owned(data),
        };
        let row = embedding_row(&table, 1).unwrap();
        let want: Vec<f32> = (0..32).map(|i| 0.25 * (i as f32 - 16.0)).collect();
        assert_eq!(row, want);
        let all = dequantize(table.dtype, &table.data, 64, "t").unwrap();
        assert_eq!(embedding_row(&table, 0).unwrap(), all[..32]);

        let f = Tensor {
            shape: vec![3, 2],
            dtype: DType::F32,
            data: Cow::Owned(
                [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
            ),
        };
        assert_eq!(embedding_row(&f, 2).unwrap(), vec![5.0, 6.0]);
        let err = embedding_row(&f, 3).unwrap_err().to_string();
        assert!(err.contains("token id 3"), "{err}");
        let short = Tensor {
            data: Cow::Owned(vec![0; 20]),
            ..f.clone()
        };
        assert!(embedding_row(&short, 2).is_err());
        let flat = Tensor {
            shape: vec![6],
            ..f
        };
        assert!(embedding_row(&flat, 0).is_err());
    }
}
