//! Attention cases against `reference::attention`, alone (every variant, whole and split
//! keys) and after RoPE + the KV-cache write over a sequence of steps; run natively on
//! lavapipe (`tests/gpu/gpu_ops.rs`) and in the browser on WebGPU (`tests/web/ops.rs`, with the
//! smaller case list). Rows the step does not cover must come back unchanged, as in
//! `ops_cases`; each check returns the worst `|gpu − reference| / tolerance`.

use emberlm::backend::gpu::ops::{AttentionBinding, AttentionKeys, KeySplit};
use emberlm::backend::gpu::variants::attention as attention_variants;
use emberlm::backend::gpu::variants::attention::AttentionVariant;
use emberlm::backend::gpu::DecodePlan;
use emberlm::backend::gpu::{
    Attention, GpuContext, Heads, KernelCache, Qkv, Reduction, RopeKvWrite, StepParams, Variant,
};
use emberlm::config::RopeLayout;
use emberlm::model::reference;
use rand_chacha::ChaCha8Rng;

use super::ops_cases::{close, err, random_vec, step_buffer, untouched, StepCase, SENTINEL};

fn run_attention(ctx: &GpuContext, binding: &AttentionBinding, step: &StepParams) {
    ctx.submit_pass("attention test", |pass| binding.record(pass, step));
}

/// How an attention case is bound: whole, split into splits of this many keys from the first
/// key on (any step), with the engine's policy, in two tiers (the first keys per split from
/// one key on, the second from `min_keys` on: decode planning), or over a local window of
/// `window` keys split into splits of `keys` keys, or as the default decode plan says; or
/// bidirectionally (an encoder: every token reads every key of the step), whole or split.
#[derive(Debug, Clone, Copy)]
enum SplitForm {
    Whole,
    Keys(u32),
    Policy,
    Tiered {
        first: u32,
        second: u32,
        min_keys: u32,
    },
    Window {
        window: u32,
        keys: u32,
    },
    /// The default decode plan's tiers (`decode_plan: auto`).
    Planned,
    /// Every token reads every key the sequence holds after the step, whole or in splits of
    /// this many keys.
    Bidirectional(Option<u32>),
}

impl SplitForm {
    fn keys(self, c: &StepCase) -> AttentionKeys {
        let from_one = |keys_per_split| KeySplit {
            keys_per_split,
            min_keys: 1,
            max_tokens: c.max_tokens,
        };
        match self {
            SplitForm::Whole => AttentionKeys::whole(),
            SplitForm::Keys(k) => AttentionKeys::from(Some(from_one(k))),
            SplitForm::Policy => AttentionKeys::from(Some(KeySplit::policy(c.max_positions))),
            SplitForm::Tiered {
                first,
                second,
                min_keys,
            } => AttentionKeys::tiered(vec![
                KeySplit {
                    min_keys,
                    ..from_one(second)
                },
                from_one(first),
            ]),
            SplitForm::Planned => {
                AttentionKeys::tiered(DecodePlan::default().splits(c.max_positions))
            }
            SplitForm::Window { window, keys } => {
                AttentionKeys::from(Some(from_one(keys))).with_window(Some(window))
            }
            SplitForm::Bidirectional(keys) => {
                AttentionKeys::from(keys.map(from_one)).with_bidirectional(true)
            }
        }
    }

    /// The keys per split a step of `kv_len` keys must run with under a kernel whose
    /// invocations walk at most `limit` keys (`None`: whole).
    fn expected_split(self, c: &StepCase, kv_len: u32, limit: u32) -> Option<u32> {
        let keys = self.keys(c).limited(limit, c.max_tokens);
        let split = keys.split_for(c.n_tokens, kv_len)?;
        (keys.keys_read(kv_len).div_ceil(split.keys_per_split) > 1).then_some(split.keys_per_split)
    }
}

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
    for spec in attention_variants::ALL {
        let variant = spec.spec.variant;
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
        let spec = AttentionVariant::find(variant).ok_or("no such variant")?;
        if !spec.applies(c.head_dim) {
            // refused with the reason, never run with a silently short head loop
            let reason = format!("at most {}", spec.max_head_dim);
            match built {
                Err(e) if e.to_string().contains(&reason) => continue,
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
        // a window shorter than the step's keys (some tokens read them all, the last ones
        // not), split in ragged splits of the window
        let window = (step_keys * 2 / 3).max(1);
        let forms = [
            (false, SplitForm::Whole),
            (true, SplitForm::Keys(awkward)),
            (false, SplitForm::Policy),
            (true, SplitForm::Planned),
            (
                false,
                SplitForm::Tiered {
                    first: 5,
                    second: awkward,
                    // odd lengths stay in the first tier, even ones reach the second
                    min_keys: if step_keys % 2 == 0 {
                        step_keys.div_ceil(2)
                    } else {
                        step_keys + 1
                    },
                },
            ),
            (
                true,
                SplitForm::Window {
                    window,
                    keys: (window / 2).max(1) + 1,
                },
            ),
            (false, SplitForm::Window { window: 1, keys: 1 }),
            (false, SplitForm::Bidirectional(None)),
            (true, SplitForm::Bidirectional(Some(awkward))),
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
            let mut k_cache = filled(rng);
            let mut v_cache = filled(rng);
            let keys = form.keys(c);
            // rows older than every token's window hold NaN too
            let oldest = pos0 + 1 - keys.keys_read(c.pos0 + 1) as usize;
            k_cache[..oldest * kv_dim].fill(f32::NAN);
            v_cache[..oldest * kv_dim].fill(f32::NAN);
            let sentinel = vec![SENTINEL; rows * q_dim];

            let step = step_buffer(ctx, c.pos0, c.n_tokens);
            let qb = ctx.storage_from("q", &q).map_err(&e)?;
            let kb = ctx.storage_from("k_cache", &k_cache).map_err(&e)?;
            let vb = ctx.storage_from("v_cache", &v_cache).map_err(&e)?;
            let ob = ctx.storage_from("out", &sentinel).map_err(&e)?;
            // NaN: a partial read before it is written poisons the output
            let limit = op.key_limit(c.head_dim);
            let scratch_len = (keys.clone().limited(limit, c.max_tokens))
                .scratch_len(c.heads(), c.max_positions)
                .max(1);
            let scratch = ctx
                .storage_from("split scratch", &vec![f32::NAN; scratch_len as usize])
                .map_err(&e)?;
            let b = op
                .bind_keys(
                    ctx,
                    &step,
                    (&qb, stride as u32),
                    (&kb, &vb),
                    &ob,
                    c.heads(),
                    (c.max_positions, c.max_tokens),
                    &keys,
                    Some(&scratch),
                )
                .map_err(&e)?;
            let params = StepParams::new(c.pos0, c.n_tokens);
            let expected = form.expected_split(c, step_keys, limit);
            if b.keys_per_split(&params) != expected {
                return Err(format!(
                    "{what}: the step ran splits of {:?} keys, expected {expected:?}",
                    b.keys_per_split(&params)
                ));
            }
            run_attention(ctx, &b, &params);
            let got = ctx.read_f32(&ob, rows * q_dim).await.map_err(&e)?;

            let abs_v: Vec<f32> = v_cache.iter().map(|v| v.abs()).collect();
            let (nh, nkv) = (c.n_heads as usize, c.n_kv_heads as usize);
            for t in 0..live {
                let qt = &q[t * stride..][..q_dim];
                let n_kv = match form {
                    SplitForm::Bidirectional(_) => kv_len,
                    _ => pos0 + t + 1,
                };
                // a window reads the latest keys only
                let lo = n_kv - keys.keys_read(n_kv as u32) as usize;
                let (kw, vw, aw) = (
                    &k_cache[lo * kv_dim..],
                    &v_cache[lo * kv_dim..],
                    &abs_v[lo * kv_dim..],
                );
                let want = reference::attention(qt, kw, vw, n_kv - lo, nh, nkv, hd);
                let scale = reference::attention(qt, kw, aw, n_kv - lo, nh, nkv, hd);
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
    let rope = RopeKvWrite::new(ctx, cache, layout).await.map_err(&e)?;
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
    let qkv = Qkv {
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
