//! The CPU backend's element-wise and attention kernels, in f32 (RoPE angles in f64).

pub use super::kv::KeyRange;
use crate::config::{NormKind, RopeLayout};

/// `out[r] = x[r] / rms(x[r]) · w` for the rows of `x: [n, d]`.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let d = w.len();
    for (xr, yr) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let ss: f32 = xr.iter().map(|v| v * v).sum::<f32>() / d as f32;
        let inv = 1.0 / (ss + eps).sqrt();
        for ((y, &v), &g) in yr.iter_mut().zip(xr).zip(w) {
            *y = v * inv * g;
        }
    }
}

/// `out[r] = (x[r] − mean) / std · w + b` for the rows of `x: [n, d]`.
pub fn layer_norm(x: &[f32], w: &[f32], b: &[f32], eps: f32, out: &mut [f32]) {
    let d = w.len();
    for (xr, yr) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let mean = xr.iter().sum::<f32>() / d as f32;
        let var = xr.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / d as f32;
        let inv = 1.0 / (var + eps).sqrt();
        for (((y, &v), &g), &bb) in yr.iter_mut().zip(xr).zip(w).zip(b) {
            *y = (v - mean) * inv * g + bb;
        }
    }
}

/// The rows of `x: [n, d]` through a norm of `kind`: LayerNorm with its `bias`, RMSNorm
/// otherwise (a LayerNorm given no bias, which no graph builds, is read as RMSNorm).
pub fn norm(kind: NormKind, x: &[f32], w: &[f32], bias: Option<&[f32]>, eps: f32, out: &mut [f32]) {
    match (kind, bias) {
        (NormKind::LayerNorm, Some(b)) => layer_norm(x, w, b, eps, out),
        _ => rms_norm(x, w, eps, out),
    }
}

/// RoPE in place on one token's heads, `x: [heads, head_dim]`, at position `pos`, with the
/// frequency of each pair (`freqs: [head_dim / 2]`).
pub fn rope(x: &mut [f32], head_dim: usize, pos: usize, freqs: &[f64], layout: RopeLayout) {
    if layout == RopeLayout::None {
        return;
    }
    let half = head_dim / 2;
    for (i, &f) in freqs.iter().enumerate().take(half) {
        let (a, b) = match layout {
            RopeLayout::Interleaved => (2 * i, 2 * i + 1),
            _ => (i, i + half),
        };
        let (sin, cos) = crate::math::sin_cos(pos as f64 * f);
        let (sin, cos) = (sin as f32, cos as f32);
        for head in x.chunks_exact_mut(head_dim) {
            let (x0, x1) = (head[a], head[b]);
            head[a] = x0 * cos - x1 * sin;
            head[b] = x0 * sin + x1 * cos;
        }
    }
}

pub use super::attention::{attention, AttnShape};

/// SiLU, `x · sigmoid(x)`.
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + crate::math::exp_f32(-x))
}

/// GELU, exact: `x · Φ(x) = x/2 · (1 + erf(x/√2))` (BERT).
#[inline]
pub fn gelu_erf(x: f32) -> f32 {
    0.5 * x * (1.0 + crate::math::erf_f32(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// GELU, tanh approximation.
#[inline]
pub fn gelu_tanh(x: f32) -> f32 {
    const K: f32 = 0.797_884_6; // √(2/π)
    0.5 * x * (1.0 + crate::math::tanh_f32(K * (x + 0.044715 * x * x * x)))
}
