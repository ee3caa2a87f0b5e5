//! Step-aware op cases (RoPE + KV-cache write, the SwiGLU gate, the in-place LayerNorm;
//! attention is in
//! `attention_cases.rs`) against the CPU reference in `emberlm::model::reference`, run
//! natively on lavapipe (`tests/gpu/gpu_ops.rs`) and in the browser on WebGPU (`tests/web/ops.rs`,
//! with the smaller case lists).
//!
//! Every case fills all `max_tokens` rows (and every cache row) and checks that rows the step
//! does not cover come back bit-for-bit unchanged, so a kernel that ignores `n_tokens` or
//! writes outside its rows fails. Sizes are deliberately awkward: widths not multiples of the
//! workgroup, key counts not multiples of the attention key tile, odd head counts.
//!
//! Each check returns the worst `|gpu − reference| / tolerance` seen (≤ 1 when it passes), so
//! the margins can be logged.

use emberlm::backend::gpu::ops::{RowNorm, RowNormKind};
use emberlm::backend::gpu::{
    GpuContext, Heads, KernelBinding, KernelCache, Qkv, RopeKvWrite, StepParams, SwiGlu,
};
use emberlm::config::{RopeFreqs, RopeLayout, RopeScaling};
use emberlm::model::reference;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

pub(crate) fn random_vec(rng: &mut ChaCha8Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-scale..scale)).collect()
}

pub(crate) fn err(what: impl std::fmt::Display) -> impl Fn(emberlm::Error) -> String {
    move |e| format!("{what}: {e}")
}

/// A step uniform holding `StepParams::new(pos0, n_tokens)`.
pub(crate) fn step_buffer(ctx: &GpuContext, pos0: u32, n_tokens: u32) -> wgpu::Buffer {
    let b = StepParams::create_buffer(ctx, "step");
    StepParams::new(pos0, n_tokens).write(ctx, &b);
    b
}

pub(crate) fn run(ctx: &GpuContext, bindings: &[&KernelBinding], n_tokens: u32) {
    ctx.submit_pass("ops test", |pass| {
        for b in bindings {
            b.record(pass, n_tokens);
        }
    });
}

/// Compares `got[range]` with `want[range]` within `tol(i)`; returns the worst diff / tol.
pub(crate) fn close(
    what: &str,
    got: &[f32],
    want: &[f32],
    range: std::ops::Range<usize>,
    tol: impl Fn(usize) -> f32,
) -> Result<f32, String> {
    let mut worst = 0.0f32;
    for i in range {
        let (g, w, t) = (got[i], want[i], tol(i));
        let diff = (g - w).abs();
        // written so that a NaN from the GPU fails too
        let within = diff <= t;
        if !within {
            return Err(format!(
                "{what}: element {i}: gpu {g} vs reference {w} (|diff| {diff:e} > tol {t:e})"
            ));
        }
        worst = worst.max(diff / t);
    }
    Ok(worst)
}

/// Fails unless `got[range]` has exactly the bits of `original[range]`.
pub(crate) fn untouched(
    what: &str,
    got: &[f32],
    original: &[f32],
    range: std::ops::Range<usize>,
) -> Result<(), String> {
    for i in range {
        if got[i].to_bits() != original[i].to_bits() {
            return Err(format!(
                "{what}: element {i} outside the step was changed: {} -> {}",
                original[i], got[i]
            ));
        }
    }
    Ok(())
}

/// Value written where a kernel must not write (rows past the step).
pub(crate) const SENTINEL: f32 = 1234.5;

// ---------------------------------------------------------------------------------------
// RoPE + KV-cache write

/// One RoPE / attention geometry and step.
#[derive(Debug, Clone, Copy)]
pub struct StepCase {
    /// Query heads.
    pub n_heads: u32,
    /// KV heads.
    pub n_kv_heads: u32,
    /// Values per head.
    pub head_dim: u32,
    /// Rows of the activation buffers.
    pub max_tokens: u32,
    /// Tokens in the step.
    pub n_tokens: u32,
    /// Position of the step's first token.
    pub pos0: u32,
    /// Rows of the KV cache.
    pub max_positions: u32,
}

impl StepCase {
    pub(crate) const fn new(
        (n_heads, n_kv_heads, head_dim): (u32, u32, u32),
        (max_tokens, n_tokens, pos0): (u32, u32, u32),
        max_positions: u32,
    ) -> Self {
        Self {
            n_heads,
            n_kv_heads,
            head_dim,
            max_tokens,
            n_tokens,
            pos0,
            max_positions,
        }
    }

    pub(crate) fn heads(&self) -> Heads {
        Heads {
            n_heads: self.n_heads,
            n_kv_heads: self.n_kv_heads,
            head_dim: self.head_dim,
        }
    }
}

/// RoPE steps: head_dim 16 and 64, odd head counts, GQA 1/2/3, decode and prefill chunks at
/// pos0 = 0 and after cached positions, and positions far beyond where an f32 angle holds.
pub const ROPE_CASES: &[StepCase] = &[
    StepCase::new((3, 1, 16), (7, 7, 0), 16),
    StepCase::new((4, 2, 64), (17, 17, 5), 40),
    StepCase::new((5, 5, 16), (2, 1, 37), 40),
    StepCase::new((9, 3, 64), (3, 2, 4094), 4096),
    StepCase::new((3, 1, 16), (3, 3, 100_000), 100_003),
    StepCase::new((2, 1, 256), (2, 2, 10), 12),
];
/// Smaller list for the browser.
pub const ROPE_CASES_SMALL: &[StepCase] = &[
    StepCase::new((3, 1, 16), (7, 7, 0), 8),
    StepCase::new((4, 2, 64), (3, 2, 5), 9),
    StepCase::new((5, 5, 16), (1, 1, 20_000), 20_001),
];

/// RoPE tolerance: each rotated value within `1e-5 · |(x0, x1)|` of the reference, the
/// length of the pair it came from (what a rotation error scales with).
pub const ROPE_TOL: f32 = 1e-5;

/// Index, within a head, of the other dimension of `d`'s pair.
fn partner(d: usize, hd: usize, layout: RopeLayout) -> usize {
    match layout {
        RopeLayout::Interleaved => d ^ 1,
        RopeLayout::RotateHalf => (d + hd / 2) % hd,
        RopeLayout::None => d,
    }
}

/// RoPE + cache write for one layout against `reference::rope`.
pub async fn check_rope(
    ctx: &GpuContext,
    cache: &KernelCache,
    layout: RopeLayout,
    cases: &[StepCase],
    rng: &mut ChaCha8Rng,
) -> Result<f32, String> {
    let op = RopeKvWrite::new(ctx, cache, layout)
        .await
        .map_err(err(format!("rope {layout:?}")))?;
    let mut worst = 0.0f32;
    for (ci, c) in cases.iter().enumerate() {
        // every other case with Llama 3's frequency scaling (kept, blended and divided pairs)
        let theta = RopeFreqs {
            theta: 10000.0,
            scaling: if ci % 2 == 1 {
                RopeScaling::Llama3 {
                    factor: 8.0,
                    low_freq_factor: 1.0,
                    high_freq_factor: 4.0,
                    original_context: 64,
                }
            } else {
                RopeScaling::None
            },
        };
        let what = format!("rope {layout:?} {c:?} scaling {}", theta.scaling.describe());
        let e = err(&what);
        let hd = c.head_dim as usize;
        let (q_dim, kv_dim) = (c.n_heads as usize * hd, c.n_kv_heads as usize * hd);
        let (rows, live, pos0) = (c.max_tokens as usize, c.n_tokens as usize, c.pos0 as usize);
        let cache_len = c.max_positions as usize * kv_dim;
        let q = random_vec(rng, rows * q_dim, 2.0);
        let k = random_vec(rng, rows * kv_dim, 2.0);
        let v = random_vec(rng, rows * kv_dim, 2.0);
        let k_old = random_vec(rng, cache_len, 1.0);
        let v_old = random_vec(rng, cache_len, 1.0);

        let step = step_buffer(ctx, c.pos0, c.n_tokens);
        let kc = ctx.storage_from("k_cache", &k_old).map_err(&e)?;
        let vc = ctx.storage_from("v_cache", &v_old).map_err(&e)?;
        let qb = ctx.storage_from("q", &q).map_err(&e)?;
        let kb = ctx.storage_from("k", &k).map_err(&e)?;
        let vb = ctx.storage_from("v", &v).map_err(&e)?;
        let qkv = Qkv {
            q: &qb,
            k: &kb,
            v: &vb,
        };
        let b = op
            .bind(
                ctx,
                &step,
                qkv,
                &kc,
                &vc,
                c.heads(),
                &theta,
                c.max_positions,
                c.max_tokens,
            )
            .map_err(&e)?;
        run(ctx, &[&b], c.n_tokens);
        let (got_q, stride, q_orig) = (
            ctx.read_f32(&qb, rows * q_dim).await.map_err(&e)?,
            q_dim,
            q.clone(),
        );
        let got_k = ctx.read_f32(&kc, cache_len).await.map_err(&e)?;
        let got_v = ctx.read_f32(&vc, cache_len).await.map_err(&e)?;

        // expected: q rows rotated in place, cache rows pos0.. = rotated k and plain v
        let mut want_q = q_orig.clone();
        let mut want_k = k_old.clone();
        let mut want_v = v_old.clone();
        for t in 0..live {
            let pos = pos0 + t;
            let qr = &mut want_q[t * stride..][..q_dim];
            reference::rope(qr, c.n_heads as usize, hd, pos, &theta, layout);
            let kr = &mut want_k[pos * kv_dim..][..kv_dim];
            kr.copy_from_slice(&k[t * kv_dim..][..kv_dim]);
            reference::rope(kr, c.n_kv_heads as usize, hd, pos, &theta, layout);
            want_v[pos * kv_dim..][..kv_dim].copy_from_slice(&v[t * kv_dim..][..kv_dim]);
        }
        // tolerance from the pair's length before rotation
        let pair_tol = |input: &[f32], i: usize| {
            let d = i % hd;
            let j = i - d + partner(d, hd, layout);
            ROPE_TOL * (input[i].powi(2) + input[j].powi(2)).sqrt() + f32::MIN_POSITIVE
        };
        for t in 0..live {
            let row = t * stride;
            worst = worst.max(close(
                &format!("{what} q row {t}"),
                &got_q,
                &want_q,
                row..row + q_dim,
                |i| pair_tol(&q_orig[row..], i - row),
            )?);
            let pos = pos0 + t;
            let (src, dst) = (t * kv_dim, pos * kv_dim);
            worst = worst.max(close(
                &format!("{what} k_cache row {pos}"),
                &got_k,
                &want_k,
                dst..dst + kv_dim,
                |i| pair_tol(&k[src..], i - dst),
            )?);
            untouched(
                &format!("{what} v_cache row {pos} (a copy)"),
                &got_v,
                &want_v,
                dst..dst + kv_dim,
            )?;
        }
        // everything else: the other rows and cache rows
        untouched(
            &format!("{what} q"),
            &got_q,
            &q_orig,
            live * stride..rows * stride,
        )?;
        let (lo, hi) = (pos0 * kv_dim, (pos0 + live) * kv_dim);
        for (name, got, want) in [("k_cache", &got_k, &k_old), ("v_cache", &got_v, &v_old)] {
            untouched(&format!("{what} {name}"), got, want, 0..lo)?;
            untouched(&format!("{what} {name}"), got, want, hi..cache_len)?;
        }
    }
    Ok(worst)
}

// ---------------------------------------------------------------------------------------
// SwiGLU

/// `(n, max_tokens, n_tokens)` for the SwiGLU gate.
pub const ELEMENTWISE_CASES: &[(u32, u32, u32)] = &[
    (1, 1, 1),
    (7, 3, 2),
    (300, 17, 17),
    (1031, 4, 3),
    (1536, 7, 7),
];
/// Smaller list for the browser.
pub const ELEMENTWISE_CASES_SMALL: &[(u32, u32, u32)] = &[(7, 3, 2), (300, 4, 3)];

/// SwiGLU tolerance: `|gpu − ref| ≤ 1e-5 · |ref| + 1e-12` (exp's error grows with |x|; the
/// inputs reach ±100, where the activation is 0 or x to within f32).
pub const ACTIVATION_TOL: f32 = 1e-5;

/// Inputs in ±8, with some extremes where exp would overflow without care.
fn activation_inputs(rng: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
    let mut x = random_vec(rng, n, 8.0);
    for (slot, value) in [0.0f32, -30.0, 30.0, -100.0, 100.0, 1e-6, -1e-6]
        .iter()
        .enumerate()
    {
        if slot * 3 < n {
            x[slot * 3] = *value;
        }
    }
    x
}

/// LayerNorm tolerance: `|gpu − ref| ≤ 1e-5 · (|g| + |b|) + 1e-6` per value (a normalised
/// value is O(1); its f32 mean and variance round once per element of the row).
pub const LAYER_NORM_TOL: f32 = 1e-5;

/// SwiGLU (separate and fused gate/up buffers) and the in-place LayerNorm of each token's row
/// (BERT's post-norms; rows offset far from 0, where a one-pass variance would cancel) against
/// the reference.
pub async fn check_elementwise(
    ctx: &GpuContext,
    cache: &KernelCache,
    cases: &[(u32, u32, u32)],
    rng: &mut ChaCha8Rng,
) -> Result<f32, String> {
    let swiglu = SwiGlu::new(ctx, cache).await.map_err(err("swiglu"))?;
    let layer_norm = RowNorm::new(ctx, cache, RowNormKind::Layer)
        .await
        .map_err(err("layer_norm"))?;
    let mut worst = 0.0f32;
    for &(n, max_tokens, n_tokens) in cases {
        let what = format!("elementwise n={n} tokens={n_tokens}/{max_tokens}");
        let e = err(&what);
        let (len, rows, live) = (n as usize, max_tokens as usize, n_tokens as usize);
        let total = rows * len;
        let gate = activation_inputs(rng, total);
        let up = random_vec(rng, total, 3.0);
        let sentinel = vec![SENTINEL; total];
        let step = step_buffer(ctx, 7, n_tokens);

        let gb = ctx.storage_from("gate", &gate).map_err(&e)?;
        let ub = ctx.storage_from("up", &up).map_err(&e)?;
        let fused: Vec<f32> = (0..rows)
            .flat_map(|t| [&gate[t * len..][..len], &up[t * len..][..len]].concat())
            .collect();
        let fb = ctx.storage_from("gate_up", &fused).map_err(&e)?;
        let out1 = ctx.storage_from("out", &sentinel).map_err(&e)?;
        let out2 = ctx.storage_from("out fused", &sentinel).map_err(&e)?;
        let bindings = [
            swiglu
                .bind(ctx, &step, &gb, &ub, &out1, n, max_tokens)
                .map_err(&e)?,
            swiglu
                .bind_fused(ctx, &step, &fb, &out2, n, max_tokens)
                .map_err(&e)?,
        ];
        run(ctx, &bindings.iter().collect::<Vec<_>>(), n_tokens);
        let live_n = live * len;

        let want: Vec<f32> = gate
            .iter()
            .zip(&up)
            .map(|(&g, &u)| reference::silu(g) * u)
            .collect();
        let tol = |w: &[f32], i: usize| ACTIVATION_TOL * w[i].abs() + 1e-12;
        for (name, buf) in [("swiglu", &out1), ("swiglu fused", &out2)] {
            let got = ctx.read_f32(buf, total).await.map_err(&e)?;
            worst = worst.max(close(
                &format!("{name} {what}"),
                &got,
                &want,
                0..live_n,
                |i| tol(&want, i),
            )?);
            untouched(&format!("{name} {what}"), &got, &sentinel, live_n..total)?;
        }

        // the LayerNorm, in place over rows of `n` offset by 40
        let x: Vec<f32> = random_vec(rng, total, 3.0)
            .iter()
            .map(|v| v + 40.0)
            .collect();
        let (g, b) = (random_vec(rng, len, 2.0), random_vec(rng, len, 1.0));
        let eps = 1e-12;
        let xb = ctx.storage_from("x", &x).map_err(&e)?;
        let gb = ctx.storage_from("gain", &g).map_err(&e)?;
        let bb = ctx.storage_from("bias", &b).map_err(&e)?;
        let bound = layer_norm
            .bind_layer(ctx, &step, &xb, &gb, &bb, (n, eps), max_tokens)
            .map_err(&e)?;
        run(ctx, &[&bound], n_tokens);
        let got = ctx.read_f32(&xb, total).await.map_err(&e)?;
        let want = reference::layer_norm(&x[..live_n], &g, &b, len, eps);
        let what = format!("layer_norm {what}");
        worst = worst.max(close(&what, &got, &want, 0..live_n, |i| {
            let c = i % len;
            LAYER_NORM_TOL * (g[c].abs() + b[c].abs()) + 1e-6
        })?);
        untouched(&what, &got, &x, live_n..total)?;
    }
    Ok(worst)
}
