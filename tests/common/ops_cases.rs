//! Step-aware op cases (norms, RoPE + KV-cache write, attention, elementwise) against the CPU
//! reference in `emberlm::model::reference`, run natively on lavapipe (`tests/gpu_ops.rs`)
//! and in the browser on WebGPU (`tests/web_ops.rs`, with the smaller case lists).
//!
//! Every case fills all `max_tokens` rows (and every cache row) and checks that rows the step
//! does not cover come back bit-for-bit unchanged, so a kernel that ignores `n_tokens` or
//! writes outside its rows fails. Sizes are deliberately awkward: widths not multiples of the
//! workgroup, key counts not multiples of the attention key tile, odd head counts.
//!
//! Each check returns the worst `|gpu − reference| / tolerance` seen (≤ 1 when it passes), so
//! the margins can be logged.

use emberlm::config::RopeLayout;
use emberlm::gpu::ops::attention::ROWS_MAX_HEAD_DIM;
use emberlm::gpu::ops::{AttentionBinding, KeySplit};
use emberlm::gpu::{
    Add, Attention, Gelu, GpuContext, Heads, KernelBinding, KernelCache, LayerNorm, Qkv, QkvForm,
    Reduction, RmsNorm, RopeKvWrite, StepParams, SwiGlu, Variant,
};
use emberlm::model::reference;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

fn random_vec(rng: &mut ChaCha8Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-scale..scale)).collect()
}

fn err(what: impl std::fmt::Display) -> impl Fn(emberlm::Error) -> String {
    move |e| format!("{what}: {e}")
}

/// A step uniform holding `StepParams::new(pos0, n_tokens)`.
fn step_buffer(ctx: &GpuContext, pos0: u32, n_tokens: u32) -> wgpu::Buffer {
    let b = StepParams::create_buffer(ctx, "step");
    StepParams::new(pos0, n_tokens).write(ctx, &b);
    b
}

fn run(ctx: &GpuContext, bindings: &[&KernelBinding], n_tokens: u32) {
    ctx.submit_pass("ops test", |pass| {
        for b in bindings {
            b.record(pass, n_tokens);
        }
    });
}

fn run_attention(ctx: &GpuContext, binding: &AttentionBinding, step: &StepParams) {
    ctx.submit_pass("attention test", |pass| binding.record(pass, step));
}

/// How an attention case is bound: whole, split into splits of this many keys from the first
/// key on (any step), or with the engine's policy.
#[derive(Debug, Clone, Copy)]
enum SplitForm {
    Whole,
    Keys(u32),
    Policy,
}

impl SplitForm {
    fn split(self, c: &StepCase) -> Option<KeySplit> {
        match self {
            SplitForm::Whole => None,
            SplitForm::Keys(keys_per_split) => Some(KeySplit {
                keys_per_split,
                min_keys: 1,
                max_tokens: c.max_tokens,
            }),
            SplitForm::Policy => Some(KeySplit::policy(c.max_positions)),
        }
    }
}

/// Compares `got[range]` with `want[range]` within `tol(i)`; returns the worst diff / tol.
fn close(
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
fn untouched(
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
const SENTINEL: f32 = 1234.5;

// ---------------------------------------------------------------------------------------
// Norms

/// `(n, max_tokens, n_tokens)` for the norms: widths below, at and above the workgroup and
/// not multiples of it (576 is SmolLM2's hidden size, 768 GPT-2's).
pub const NORM_CASES: &[(u32, u32, u32)] = &[
    (1, 1, 1),
    (7, 3, 2),
    (576, 4, 3),
    (768, 17, 17),
    (1031, 7, 5),
    (4097, 2, 1),
];
/// Smaller list for the browser.
pub const NORM_CASES_SMALL: &[(u32, u32, u32)] = &[(7, 3, 2), (300, 4, 3), (1031, 2, 1)];

/// Relative tolerance of both norms: `|gpu − ref| ≤ 1e-5 · (|ref| + 1)`.
pub const NORM_TOL: f32 = 1e-5;

/// RMSNorm and LayerNorm against `reference::rms_norm` / `reference::layer_norm`.
pub async fn check_norms(
    ctx: &GpuContext,
    cache: &KernelCache,
    reduction: Reduction,
    cases: &[(u32, u32, u32)],
    rng: &mut ChaCha8Rng,
) -> Result<f32, String> {
    let rms = RmsNorm::new(ctx, cache, reduction)
        .await
        .map_err(err("rms_norm"))?;
    let ln = LayerNorm::new(ctx, cache, reduction)
        .await
        .map_err(err("layer_norm"))?;
    let eps = 1e-5;
    let mut worst = 0.0f32;
    for &(n, max_tokens, n_tokens) in cases {
        let (len, rows, live) = (n as usize, max_tokens as usize, n_tokens as usize);
        // LayerNorm gets a mean well away from 0 so a one-pass variance would show
        let offset = rng.random_range(-10.0..10.0);
        let x: Vec<f32> = random_vec(rng, rows * len, 3.0)
            .into_iter()
            .map(|v| v + offset)
            .collect();
        let weight = random_vec(rng, len, 2.0);
        let bias = random_vec(rng, len, 1.0);
        let sentinel = vec![SENTINEL; rows * len];
        let what = format!("norm {reduction:?} n={n} tokens={n_tokens}/{max_tokens}");
        let e = err(&what);
        let step = step_buffer(ctx, 0, n_tokens);
        let xb = ctx.storage_from("x", &x).map_err(&e)?;
        let wb = ctx.storage_from("weight", &weight).map_err(&e)?;
        let bb = ctx.storage_from("bias", &bias).map_err(&e)?;
        let yr = ctx.storage_from("y rms", &sentinel).map_err(&e)?;
        let yl = ctx.storage_from("y ln", &sentinel).map_err(&e)?;
        let b_rms = rms
            .bind(ctx, &step, &xb, &wb, &yr, n, eps, max_tokens)
            .map_err(&e)?;
        let b_ln = ln
            .bind(ctx, &step, &xb, &wb, &bb, &yl, n, eps, max_tokens)
            .map_err(&e)?;
        run(ctx, &[&b_rms, &b_ln], n_tokens);
        let got_rms = ctx.read_f32(&yr, rows * len).await.map_err(&e)?;
        let got_ln = ctx.read_f32(&yl, rows * len).await.map_err(&e)?;

        let live_x = &x[..live * len];
        let want = reference::rms_norm(live_x, &weight, len, eps);
        let tol = |i: usize, w: &[f32]| NORM_TOL * (w[i].abs() + 1.0);
        worst = worst.max(close(
            &format!("rms_norm {what}"),
            &got_rms,
            &want,
            0..live * len,
            |i| tol(i, &want),
        )?);
        untouched(
            &format!("rms_norm {what}"),
            &got_rms,
            &sentinel,
            live * len..rows * len,
        )?;
        let want = reference::layer_norm(live_x, &weight, &bias, len, eps);
        worst = worst.max(close(
            &format!("layer_norm {what}"),
            &got_ln,
            &want,
            0..live * len,
            |i| tol(i, &want),
        )?);
        untouched(
            &format!("layer_norm {what}"),
            &got_ln,
            &sentinel,
            live * len..rows * len,
        )?;
    }
    Ok(worst)
}

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
    const fn new(
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

    fn heads(&self) -> Heads {
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

/// RoPE + cache write for one layout and q/k/v form against `reference::rope`.
pub async fn check_rope(
    ctx: &GpuContext,
    cache: &KernelCache,
    layout: RopeLayout,
    form: QkvForm,
    cases: &[StepCase],
    rng: &mut ChaCha8Rng,
) -> Result<f32, String> {
    let op = RopeKvWrite::new(ctx, cache, layout, form)
        .await
        .map_err(err(format!("rope {layout:?} {form:?}")))?;
    let theta = 10000.0f32;
    let mut worst = 0.0f32;
    for c in cases {
        let what = format!("rope {layout:?} {form:?} {c:?}");
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
        let width = q_dim + 2 * kv_dim;
        let (got_q, stride, q_orig) = match form {
            QkvForm::Separate => {
                let qb = ctx.storage_from("q", &q).map_err(&e)?;
                let kb = ctx.storage_from("k", &k).map_err(&e)?;
                let vb = ctx.storage_from("v", &v).map_err(&e)?;
                let qkv = Qkv::Separate {
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
                        theta,
                        c.max_positions,
                        c.max_tokens,
                    )
                    .map_err(&e)?;
                run(ctx, &[&b], c.n_tokens);
                (
                    ctx.read_f32(&qb, rows * q_dim).await.map_err(&e)?,
                    q_dim,
                    q.clone(),
                )
            }
            QkvForm::Fused => {
                let fused: Vec<f32> = (0..rows)
                    .flat_map(|t| {
                        [
                            &q[t * q_dim..][..q_dim],
                            &k[t * kv_dim..][..kv_dim],
                            &v[t * kv_dim..][..kv_dim],
                        ]
                        .concat()
                    })
                    .collect();
                let qkv = ctx.storage_from("qkv", &fused).map_err(&e)?;
                let b = op
                    .bind(
                        ctx,
                        &step,
                        Qkv::Fused(&qkv),
                        &kc,
                        &vc,
                        c.heads(),
                        theta,
                        c.max_positions,
                        c.max_tokens,
                    )
                    .map_err(&e)?;
                run(ctx, &[&b], c.n_tokens);
                (
                    ctx.read_f32(&qkv, rows * width).await.map_err(&e)?,
                    width,
                    fused,
                )
            }
        };
        let got_k = ctx.read_f32(&kc, cache_len).await.map_err(&e)?;
        let got_v = ctx.read_f32(&vc, cache_len).await.map_err(&e)?;

        // expected: q rows rotated in place, cache rows pos0.. = rotated k and plain v
        let mut want_q = q_orig.clone();
        let mut want_k = k_old.clone();
        let mut want_v = v_old.clone();
        for t in 0..live {
            let pos = pos0 + t;
            let qr = &mut want_q[t * stride..][..q_dim];
            reference::rope(qr, c.n_heads as usize, hd, pos, theta, layout);
            let kr = &mut want_k[pos * kv_dim..][..kv_dim];
            kr.copy_from_slice(&k[t * kv_dim..][..kv_dim]);
            reference::rope(kr, c.n_kv_heads as usize, hd, pos, theta, layout);
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
        // everything else: the q/k/v parts past the rotated q, the other rows and cache rows
        if form == QkvForm::Fused {
            for t in 0..live {
                untouched(&what, &got_q, &q_orig, t * stride + q_dim..(t + 1) * stride)?;
            }
        }
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
// Attention

/// Attention steps: head_dim 16, 20 (not a multiple of 4: scalar keys), 64, 128, 256; GQA
/// 1/2/3; odd head counts; decode and prefill chunks at pos0 = 0 and after cached positions;
/// key counts below, at and past multiples of the key tile (256).
pub const ATTENTION_CASES: &[StepCase] = &[
    StepCase::new((3, 1, 16), (1, 1, 0), 8),
    StepCase::new((4, 2, 64), (2, 2, 300), 400),
    StepCase::new((6, 2, 64), (7, 7, 0), 7),
    StepCase::new((5, 5, 16), (17, 17, 260), 300),
    StepCase::new((3, 3, 20), (3, 2, 513), 520),
    StepCase::new((9, 3, 64), (2, 1, 255), 256),
    StepCase::new((2, 1, 128), (3, 3, 100), 103),
    StepCase::new((2, 1, 256), (2, 2, 40), 42),
];
/// The long-context case: 3000 cached positions, decode and a two-token chunk.
pub const ATTENTION_LONG_CASES: &[StepCase] = &[
    StepCase::new((3, 1, 64), (1, 1, 2999), 3000),
    StepCase::new((4, 2, 64), (2, 2, 2998), 3000),
];
/// Smaller list for the browser.
pub const ATTENTION_CASES_SMALL: &[StepCase] = &[
    StepCase::new((3, 1, 16), (1, 1, 0), 4),
    StepCase::new((4, 2, 64), (2, 2, 257), 260),
    StepCase::new((3, 3, 20), (7, 7, 3), 12),
    StepCase::new((6, 2, 16), (2, 1, 300), 302),
];

/// Attention tolerance: `|gpu − ref| ≤ 1e-5 · Σ_j p_j·|v_j|` (the output's scale: the same
/// attention over `|v|`), plus 1e-7 for outputs that cancel to nearly 0.
pub const ATTENTION_TOL: f32 = 1e-5;

/// Attention against `reference::attention`, each case with mild and peaked scores and, for
/// the second, q read from rows wider than the queries (as from a fused qkv buffer).
/// Every variant (the workgroup and rows shapes) is checked; the worst error comes back.
pub async fn check_attention(
    ctx: &GpuContext,
    cache: &KernelCache,
    reduction: Reduction,
    cases: &[StepCase],
    rng: &mut ChaCha8Rng,
) -> Result<f32, String> {
    let mut worst = 0.0f32;
    for variant in Variant::ALL {
        let w = check_attention_variant(ctx, cache, reduction, variant, cases, rng).await?;
        worst = worst.max(w);
    }
    Ok(worst)
}

async fn check_attention_variant(
    ctx: &GpuContext,
    cache: &KernelCache,
    reduction: Reduction,
    variant: Variant,
    cases: &[StepCase],
    rng: &mut ChaCha8Rng,
) -> Result<f32, String> {
    let mut worst = 0.0f32;
    for c in cases {
        let built = Attention::with_variant(ctx, cache, reduction, variant, c.head_dim).await;
        if variant == Variant::Rows && c.head_dim > ROWS_MAX_HEAD_DIM {
            // refused with the reason, never run with a silently short head loop
            match built {
                Err(e) if e.to_string().contains("at most 128") => continue,
                other => {
                    return Err(format!(
                        "rows attention, head_dim {}: {other:?}",
                        c.head_dim
                    ))
                }
            }
        }
        let op = built.map_err(err("attention"))?;
        let step_keys = c.pos0 + c.n_tokens;
        // whole; split in 2–4 ragged splits whatever the length (prefill chunks included); and
        // the engine's policy, which splits long decode steps only
        let awkward = (step_keys / 3).max(1) + 1;
        let forms = [
            (false, SplitForm::Whole),
            (true, SplitForm::Keys(awkward)),
            (false, SplitForm::Policy),
        ];
        for (fused_stride, form) in forms {
            let q_scale = if fused_stride { 6.0f32 } else { 1.0 };
            let what =
                format!("attention {variant} {reduction:?} {c:?} q_scale={q_scale} {form:?}");
            let e = err(&what);
            let hd = c.head_dim as usize;
            let (q_dim, kv_dim) = (c.n_heads as usize * hd, c.n_kv_heads as usize * hd);
            let (rows, live, pos0) = (c.max_tokens as usize, c.n_tokens as usize, c.pos0 as usize);
            let stride = if fused_stride {
                q_dim + 2 * kv_dim
            } else {
                q_dim
            };
            let q = random_vec(rng, rows * stride, q_scale);
            // rows past the step's last position hold NaN: reading one poisons the output
            let kv_len = pos0 + live;
            let filled = |rng: &mut ChaCha8Rng| {
                let mut v = random_vec(rng, c.max_positions as usize * kv_dim, 1.0);
                v[kv_len * kv_dim..].fill(f32::NAN);
                v
            };
            let k_cache = filled(rng);
            let v_cache = filled(rng);
            let sentinel = vec![SENTINEL; rows * q_dim];

            let step = step_buffer(ctx, c.pos0, c.n_tokens);
            let qb = ctx.storage_from("q", &q).map_err(&e)?;
            let kb = ctx.storage_from("k_cache", &k_cache).map_err(&e)?;
            let vb = ctx.storage_from("v_cache", &v_cache).map_err(&e)?;
            let ob = ctx.storage_from("out", &sentinel).map_err(&e)?;
            // NaN: a partial read before it is written poisons the output
            let split = form.split(c);
            let scratch_len = split.map_or(1, |s| s.scratch_len(c.heads(), c.max_positions));
            let scratch = ctx
                .storage_from("split scratch", &vec![f32::NAN; scratch_len as usize])
                .map_err(&e)?;
            let b = op
                .bind(
                    ctx,
                    &step,
                    &qb,
                    stride as u32,
                    &kb,
                    &vb,
                    &ob,
                    c.heads(),
                    c.max_positions,
                    c.max_tokens,
                    split.map(|s| (s, &scratch)),
                )
                .map_err(&e)?;
            let params = StepParams::new(c.pos0, c.n_tokens);
            if matches!(form, SplitForm::Keys(k) if step_keys.div_ceil(k) > 1)
                && b.splits(&params) < 2
            {
                return Err(format!("{what}: the step did not split"));
            }
            run_attention(ctx, &b, &params);
            let got = ctx.read_f32(&ob, rows * q_dim).await.map_err(&e)?;

            let abs_v: Vec<f32> = v_cache.iter().map(|v| v.abs()).collect();
            let (nh, nkv) = (c.n_heads as usize, c.n_kv_heads as usize);
            for t in 0..live {
                let qt = &q[t * stride..][..q_dim];
                let n_kv = pos0 + t + 1;
                let want = reference::attention(qt, &k_cache, &v_cache, n_kv, nh, nkv, hd);
                let scale = reference::attention(qt, &k_cache, &abs_v, n_kv, nh, nkv, hd);
                let row = t * q_dim;
                worst = worst.max(close(
                    &format!("{what} token {t} (position {})", pos0 + t),
                    &got[row..row + q_dim],
                    &want,
                    0..q_dim,
                    |i| ATTENTION_TOL * scale[i] + 1e-7,
                )?);
            }
            untouched(&what, &got, &sentinel, live * q_dim..rows * q_dim)?;
        }
    }
    Ok(worst)
}

// ---------------------------------------------------------------------------------------
// RoPE and attention together over a sequence of steps

/// Prefill chunks then decode steps through one set of bindings, the step uniform rewritten
/// between steps (as the forward pass will): RoPE + cache write then attention in one pass per
/// step, against the reference run step by step on CPU-side caches.
pub async fn check_step_sequence(
    ctx: &GpuContext,
    cache: &KernelCache,
    reduction: Reduction,
    layout: RopeLayout,
    rng: &mut ChaCha8Rng,
) -> Result<f32, String> {
    let heads = Heads {
        n_heads: 6,
        n_kv_heads: 2,
        head_dim: 16,
    };
    let (max_tokens, max_positions) = (5u32, 300u32);
    // chunks and decode steps, then enough chunks to cross the 256-key tile with one chunk
    // straddling it; stops at max_positions
    let steps = [5u32, 3, 5, 1, 1];
    let steps_long = [5u32; 57];
    let theta = 500.0f32;
    let what = format!("step sequence {reduction:?} {layout:?}");
    let e = err(&what);
    let (nh, nkv, hd) = (6usize, 2usize, 16usize);
    let (q_dim, kv_dim) = (nh * hd, nkv * hd);
    let rope = RopeKvWrite::new(ctx, cache, layout, QkvForm::Separate)
        .await
        .map_err(&e)?;
    let attn = Attention::new(ctx, cache, reduction).await.map_err(&e)?;
    let step = StepParams::create_buffer(ctx, "step");
    let rows = max_tokens as usize;
    let qb = ctx
        .storage_zeroed("q", (rows * q_dim * 4) as u64)
        .map_err(&e)?;
    let kb = ctx
        .storage_zeroed("k", (rows * kv_dim * 4) as u64)
        .map_err(&e)?;
    let vb = ctx
        .storage_zeroed("v", (rows * kv_dim * 4) as u64)
        .map_err(&e)?;
    let cache_bytes = (max_positions as usize * kv_dim * 4) as u64;
    let kc = ctx.storage_zeroed("k_cache", cache_bytes).map_err(&e)?;
    let vc = ctx.storage_zeroed("v_cache", cache_bytes).map_err(&e)?;
    let ob = ctx
        .storage_zeroed("out", (rows * q_dim * 4) as u64)
        .map_err(&e)?;
    let qkv = Qkv::Separate {
        q: &qb,
        k: &kb,
        v: &vb,
    };
    let b_rope = rope
        .bind(
            ctx,
            &step,
            qkv,
            &kc,
            &vc,
            heads,
            theta,
            max_positions,
            max_tokens,
        )
        .map_err(&e)?;
    // steps from 100 keys on split into 37-key splits (chunks of up to 5 tokens included)
    let split = KeySplit {
        keys_per_split: 37,
        min_keys: 100,
        max_tokens,
    };
    let scratch = ctx
        .storage_from(
            "split scratch",
            &vec![f32::NAN; split.scratch_len(heads, max_positions) as usize],
        )
        .map_err(&e)?;
    let b_attn = attn
        .bind(
            ctx,
            &step,
            &qb,
            q_dim as u32,
            &kc,
            &vc,
            &ob,
            heads,
            max_positions,
            max_tokens,
            Some((split, &scratch)),
        )
        .map_err(&e)?;

    let mut cpu_k = Vec::new();
    let mut cpu_v = Vec::new();
    let mut pos0 = 0u32;
    let mut worst = 0.0f32;
    let all: Vec<u32> = steps.iter().chain(&steps_long).copied().collect();
    for n_tokens in all {
        if pos0 + n_tokens > max_positions {
            break;
        }
        let params = StepParams::checked(pos0, n_tokens, max_tokens, max_positions).map_err(&e)?;
        let n = n_tokens as usize;
        let q = random_vec(rng, n * q_dim, 2.0);
        let k = random_vec(rng, n * kv_dim, 2.0);
        let v = random_vec(rng, n * kv_dim, 2.0);
        ctx.queue.write_buffer(&qb, 0, bytemuck::cast_slice(&q));
        ctx.queue.write_buffer(&kb, 0, bytemuck::cast_slice(&k));
        ctx.queue.write_buffer(&vb, 0, bytemuck::cast_slice(&v));
        params.write(ctx, &step);
        ctx.submit_pass("rope and attention", |pass| {
            b_rope.record(pass, n_tokens);
            b_attn.record(pass, &params);
        });
        let got = ctx.read_f32(&ob, n * q_dim).await.map_err(&e)?;

        for t in 0..n {
            let pos = pos0 as usize + t;
            let mut kt = k[t * kv_dim..][..kv_dim].to_vec();
            reference::rope(&mut kt, nkv, hd, pos, theta, layout);
            cpu_k.extend(kt);
            cpu_v.extend_from_slice(&v[t * kv_dim..][..kv_dim]);
        }
        for t in 0..n {
            let pos = pos0 as usize + t;
            let mut qt = q[t * q_dim..][..q_dim].to_vec();
            reference::rope(&mut qt, nh, hd, pos, theta, layout);
            let want = reference::attention(&qt, &cpu_k, &cpu_v, pos + 1, nh, nkv, hd);
            let abs_v: Vec<f32> = cpu_v.iter().map(|v| v.abs()).collect();
            let scale = reference::attention(&qt, &cpu_k, &abs_v, pos + 1, nh, nkv, hd);
            worst = worst.max(close(
                &format!("{what} position {pos}"),
                &got[t * q_dim..][..q_dim],
                &want,
                0..q_dim,
                // RoPE's error on q and k adds to attention's
                |i| 2.0 * ATTENTION_TOL * scale[i] + 1e-7,
            )?);
        }
        pos0 += n_tokens;
    }
    Ok(worst)
}

// ---------------------------------------------------------------------------------------
// Elementwise

/// `(n, max_tokens, n_tokens)` for the elementwise ops.
pub const ELEMENTWISE_CASES: &[(u32, u32, u32)] = &[
    (1, 1, 1),
    (7, 3, 2),
    (300, 17, 17),
    (1031, 4, 3),
    (1536, 7, 7),
];
/// Smaller list for the browser.
pub const ELEMENTWISE_CASES_SMALL: &[(u32, u32, u32)] = &[(7, 3, 2), (300, 4, 3)];

/// SwiGLU and GELU tolerance: `|gpu − ref| ≤ 1e-5 · |ref| + 1e-12` (exp's error grows with
/// |x|; the inputs reach ±100, where the activations are 0 or x to within f32).
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

/// SwiGLU (separate and fused), GELU and Add against the reference.
pub async fn check_elementwise(
    ctx: &GpuContext,
    cache: &KernelCache,
    cases: &[(u32, u32, u32)],
    rng: &mut ChaCha8Rng,
) -> Result<f32, String> {
    let swiglu = SwiGlu::new(ctx, cache).await.map_err(err("swiglu"))?;
    let gelu = Gelu::new(ctx, cache).await.map_err(err("gelu"))?;
    let add = Add::new(ctx, cache).await.map_err(err("add"))?;
    let mut worst = 0.0f32;
    for &(n, max_tokens, n_tokens) in cases {
        let what = format!("elementwise n={n} tokens={n_tokens}/{max_tokens}");
        let e = err(&what);
        let (len, rows, live) = (n as usize, max_tokens as usize, n_tokens as usize);
        let total = rows * len;
        let gate = activation_inputs(rng, total);
        let up = random_vec(rng, total, 3.0);
        let a = random_vec(rng, total, 3.0);
        let b = random_vec(rng, total, 3.0);
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
        let xb = ctx.storage_from("x", &gate).map_err(&e)?;
        let ab = ctx.storage_from("a", &a).map_err(&e)?;
        let bb = ctx.storage_from("b", &b).map_err(&e)?;
        let bindings = [
            swiglu
                .bind(ctx, &step, &gb, &ub, &out1, n, max_tokens)
                .map_err(&e)?,
            swiglu
                .bind_fused(ctx, &step, &fb, &out2, n, max_tokens)
                .map_err(&e)?,
            gelu.bind(ctx, &step, &xb, n, max_tokens).map_err(&e)?,
            add.bind(ctx, &step, &ab, &bb, n, max_tokens).map_err(&e)?,
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
        let got = ctx.read_f32(&xb, total).await.map_err(&e)?;
        let want: Vec<f32> = gate.iter().map(|&x| reference::gelu_tanh(x)).collect();
        worst = worst.max(close(
            &format!("gelu {what}"),
            &got,
            &want,
            0..live_n,
            |i| tol(&want, i),
        )?);
        untouched(&format!("gelu {what}"), &got, &gate, live_n..total)?;
        let got = ctx.read_f32(&ab, total).await.map_err(&e)?;
        // f32 addition is exactly rounded on every conforming GPU: the same bits as the CPU
        let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
        untouched(&format!("add {what}"), &got, &want, 0..live_n)?;
        untouched(&format!("add {what}"), &got, &a, live_n..total)?;
    }
    Ok(worst)
}
