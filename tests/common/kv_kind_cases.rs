//! KV-cache kind cases (f32, f16, q8_0, q4_0, nf4; K and V in different kinds), run natively
//! on lavapipe (`tests/gpu/kv_kinds.rs`) and in the browser on WebGPU (`tests/web/ops.rs`):
//!
//! - the store kernel (`KvStore`) against the CPU encoder `KvKind::encode_row`: f32 and f16
//!   bit for bit, the block kinds code for code (the GPU may round a value lying within a
//!   rounding's reach of a code boundary the other way: such a code differs by one step and
//!   is counted, never more than a few per case), every value within the format's error, and
//!   rows outside the step untouched;
//! - attention reading caches of each kind against `reference::attention` over the CPU
//!   decoder's values (the GPU decodes the same numbers, so the f32 tolerance applies);
//! - rotation, the store and attention through a sequence of steps, the caches read back
//!   after each.

use emberlm::backend::gpu::ops::{AttentionKeys, KvSource, KvStore};
use emberlm::backend::gpu::variants::attention as attention_variants;
use emberlm::backend::gpu::{
    Attention, GpuContext, Heads, KernelCache, Reduction, RopeKvWrite, StepParams, Variant,
};
use emberlm::config::RopeLayout;
use emberlm::dtype::kv::{KvKind, KvKinds, KV_BLOCK};
use emberlm::model::reference;
use rand_chacha::ChaCha8Rng;

use super::attention_cases::ATTENTION_TOL;
use super::ops_cases::{close, err, random_vec, step_buffer, StepCase};

/// The kind pairs every check runs: each kind for both caches, and two mixed pairs.
pub fn kind_pairs() -> Vec<KvKinds> {
    let mut out: Vec<KvKinds> = KvKind::ALL.iter().map(|&k| KvKinds::both(k)).collect();
    out.push(KvKinds {
        k: KvKind::Q8_0,
        v: KvKind::Nf4,
    });
    out.push(KvKinds {
        k: KvKind::F16,
        v: KvKind::Q4_0,
    });
    out
}

/// Store geometries `(kv_dim, q_dim, positions, max_tokens, n_tokens, pos0)`: rows of one
/// block, one and a half, an odd number of blocks, a ragged last block and SmolLM2's 192.
pub const STORE_CASES: &[(u32, u32, u32, u32, u32, u32)] = &[
    (32, 64, 9, 4, 3, 2),
    (48, 48, 20, 5, 5, 15),
    (96, 32, 7, 2, 1, 6),
    (70, 10, 12, 3, 2, 0),
    (192, 576, 40, 17, 17, 20),
];

fn words_of(f: &[f32]) -> Vec<u32> {
    f.iter().map(|v| v.to_bits()).collect()
}

/// The store kernel against the CPU encoder, reading K and V from one stacked `q | k | v`
/// buffer as the fused projection leaves them. Returns the worst error / tolerance.
pub async fn check_store(
    ctx: &GpuContext,
    cache: &KernelCache,
    rng: &mut ChaCha8Rng,
) -> Result<f32, String> {
    let mut worst = 0.0f32;
    for kinds in kind_pairs() {
        let store = KvStore::new(ctx, cache, kinds)
            .await
            .map_err(err(format!("kv_store {kinds}")))?;
        for &(kv_dim, q_dim, positions, max_tokens, n_tokens, pos0) in STORE_CASES {
            let what = format!("kv_store {kinds} kv_dim={kv_dim} pos0={pos0} n={n_tokens}");
            let e = err(&what);
            let (kd, stride) = (kv_dim as usize, (q_dim + 2 * kv_dim) as usize);
            // outliers in some blocks, as keys have
            let mut src = random_vec(rng, max_tokens as usize * stride, 1.0);
            for (i, v) in src.iter_mut().enumerate() {
                if i % 37 == 5 {
                    *v *= 12.0;
                }
            }
            let source = ctx.storage_from("qkv", &src).map_err(&e)?;
            let mut caches = Vec::new();
            let mut before = Vec::new();
            for kind in [kinds.k, kinds.v] {
                let words = positions as usize * kind.row_words(kd);
                // random bits: a row the kernel must not write keeps them
                let fill: Vec<f32> = random_vec(rng, words, 3.0);
                caches.push(ctx.storage_from("cache", &fill).map_err(&e)?);
                before.push(words_of(&fill));
            }
            let step = step_buffer(ctx, pos0, n_tokens);
            let src_at = KvSource {
                k: &source,
                k_off: q_dim,
                k_stride: stride as u32,
                v: &source,
                v_off: q_dim + kv_dim,
                v_stride: stride as u32,
            };
            let b = store
                .bind(
                    ctx, &step, src_at, &caches[0], &caches[1], kv_dim, positions, max_tokens,
                )
                .map_err(&e)?;
            ctx.submit_pass("kv store test", |pass| b.record(pass, n_tokens));
            for (which, kind) in [(0usize, kinds.k), (1, kinds.v)] {
                let rw = kind.row_words(kd);
                let got = words_of(
                    &ctx.read_f32(&caches[which], positions as usize * rw)
                        .await
                        .map_err(&e)?,
                );
                let off = q_dim as usize + which * kd;
                let mut differing = 0usize;
                for p in 0..positions as usize {
                    let row = &got[p * rw..][..rw];
                    let t = p.wrapping_sub(pos0 as usize);
                    if t >= n_tokens as usize {
                        if row != &before[which][p * rw..][..rw] {
                            return Err(format!(
                                "{what}: cache {which} row {p} outside the step was written"
                            ));
                        }
                        continue;
                    }
                    let x = &src[t * stride + off..][..kd];
                    let want = kind.encode_row(x);
                    let exact = matches!(kind, KvKind::F32 | KvKind::F16);
                    if exact && row != want.as_slice() {
                        return Err(format!(
                            "{what}: {kind} row {p} differs from the CPU encoding"
                        ));
                    }
                    let decoded = kind.decode_row(row, kd);
                    let cpu = kind.decode_row(&want, kd);
                    for (b, block) in x.chunks(KV_BLOCK).enumerate() {
                        let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
                        let tol = kind.max_error(amax).max(f32::MIN_POSITIVE);
                        let at = b * KV_BLOCK;
                        worst = worst.max(close(
                            &format!("{what}: {kind} row {p} block {b} vs the input"),
                            &decoded[at..][..block.len()],
                            block,
                            0..block.len(),
                            |_| tol,
                        )?);
                        differing += decoded[at..][..block.len()]
                            .iter()
                            .zip(&cpu[at..][..block.len()])
                            .filter(|(g, c)| g.to_bits() != c.to_bits())
                            .count();
                    }
                }
                if differing > 4 {
                    return Err(format!(
                        "{what}: {kind}: {differing} values differ from the CPU encoding (more than boundary ties explain)"
                    ));
                }
            }
        }
    }
    Ok(worst)
}

/// Uploads `rows` f32 cache rows of `kv_dim` values encoded in `kind`; returns the buffer and
/// the values the GPU will decode (the CPU decoder's).
fn upload_cache(
    ctx: &GpuContext,
    kind: KvKind,
    rows: &[f32],
    kv_dim: usize,
) -> Result<(wgpu::Buffer, Vec<f32>), emberlm::Error> {
    let mut words = Vec::new();
    let mut decoded = Vec::new();
    for row in rows.chunks(kv_dim) {
        let w = kind.encode_row(row);
        decoded.extend(kind.decode_row(&w, kv_dim));
        words.extend(w);
    }
    let as_f32: Vec<f32> = words.iter().map(|&w| f32::from_bits(w)).collect();
    Ok((ctx.storage_from("cache", &as_f32)?, decoded))
}

/// Attention over caches of every kind pair (every variant, whole and split keys) against the
/// reference over the decoded caches. Returns the worst error / tolerance.
pub async fn check_attention_kinds(
    ctx: &GpuContext,
    cache: &KernelCache,
    reduction: Reduction,
    cases: &[StepCase],
    rng: &mut ChaCha8Rng,
) -> Result<f32, String> {
    let mut worst = 0.0f32;
    for kinds in kind_pairs() {
        for spec in attention_variants::ALL {
            let variant = spec.spec.variant;
            for c in cases {
                if !spec.applies(c.head_dim) {
                    continue;
                }
                let what = format!("attention {kinds} {variant} {reduction:?} {c:?}");
                let e = err(&what);
                let op = Attention::with_kinds(ctx, cache, reduction, variant, c.head_dim, kinds)
                    .await
                    .map_err(&e)?;
                let hd = c.head_dim as usize;
                let (q_dim, kv_dim) = (c.n_heads as usize * hd, c.n_kv_heads as usize * hd);
                let (rows, live, pos0) =
                    (c.max_tokens as usize, c.n_tokens as usize, c.pos0 as usize);
                let q = random_vec(rng, rows * q_dim, 2.0);
                let positions = c.max_positions as usize;
                let (kb, k_dec) = upload_cache(
                    ctx,
                    kinds.k,
                    &random_vec(rng, positions * kv_dim, 1.5),
                    kv_dim,
                )
                .map_err(&e)?;
                let (vb, v_dec) = upload_cache(
                    ctx,
                    kinds.v,
                    &random_vec(rng, positions * kv_dim, 1.0),
                    kv_dim,
                )
                .map_err(&e)?;
                let qb = ctx.storage_from("q", &q).map_err(&e)?;
                let ob = ctx
                    .storage_zeroed("out", (rows * q_dim * 4) as u64)
                    .map_err(&e)?;
                let step = step_buffer(ctx, c.pos0, c.n_tokens);
                let keys = c.pos0 + c.n_tokens;
                let split = emberlm::backend::gpu::KeySplit {
                    keys_per_split: (keys / 3).max(1) + 1,
                    min_keys: 1,
                    max_tokens: c.max_tokens,
                };
                // whole or split, each within the kernel's key limit
                let limit = op.key_limit(c.head_dim);
                let scratch_len = (AttentionKeys::from(Some(split)).limited(limit, c.max_tokens))
                    .scratch_len(c.heads(), c.max_positions)
                    .max(1);
                let scratch = ctx.storage_zeroed("scratch", scratch_len * 4).map_err(&e)?;
                for with_split in [false, true] {
                    let keys = AttentionKeys::from(with_split.then_some(split));
                    let b = op
                        .bind_keys(
                            ctx,
                            &step,
                            (&qb, q_dim as u32),
                            (&kb, &vb),
                            &ob,
                            c.heads(),
                            (c.max_positions, c.max_tokens),
                            &keys,
                            Some(&scratch),
                        )
                        .map_err(&e)?;
                    let params = StepParams::new(c.pos0, c.n_tokens);
                    ctx.submit_pass("attention kinds test", |pass| b.record(pass, &params));
                    let got = ctx.read_f32(&ob, rows * q_dim).await.map_err(&e)?;
                    let abs_v: Vec<f32> = v_dec.iter().map(|v| v.abs()).collect();
                    let (nh, nkv) = (c.n_heads as usize, c.n_kv_heads as usize);
                    for t in 0..live {
                        let qt = &q[t * q_dim..][..q_dim];
                        let n_kv = pos0 + t + 1;
                        let want = reference::attention(qt, &k_dec, &v_dec, n_kv, nh, nkv, hd);
                        let scale = reference::attention(qt, &k_dec, &abs_v, n_kv, nh, nkv, hd);
                        worst = worst.max(close(
                            &format!("{what} split={with_split} token {t}"),
                            &got[t * q_dim..][..q_dim],
                            &want,
                            0..q_dim,
                            |i| ATTENTION_TOL * scale[i] + 1e-7,
                        )?);
                    }
                }
            }
        }
    }
    Ok(worst)
}

/// Attention geometries for the kinds (head sizes 16, 20, 64; GQA; decode and chunks; key
/// counts around the 256-key tile).
pub const KIND_ATTENTION_CASES: &[StepCase] = &[
    StepCase::new((3, 1, 16), (1, 1, 0), 8),
    StepCase::new((4, 2, 64), (2, 2, 300), 400),
    StepCase::new((3, 3, 20), (3, 2, 61), 70),
    StepCase::new((9, 3, 64), (5, 5, 250), 256),
];

/// Long contexts: a prefill chunk and a decode step past 2,000 keys (head_dim 64 as SmolLM2's,
/// and 128).
pub const KIND_ATTENTION_LONG_CASES: &[StepCase] = &[
    StepCase::new((3, 1, 64), (3, 3, 2997), 3000),
    StepCase::new((2, 1, 128), (1, 1, 2599), 2600),
];

/// The smaller list for the browser.
pub const KIND_ATTENTION_CASES_SMALL: &[StepCase] = &[
    StepCase::new((3, 1, 16), (1, 1, 0), 8),
    StepCase::new((4, 2, 64), (2, 2, 40), 50),
];

/// Separate Q/K/V through a sequence of steps with caches of `kinds`: the rotation-only RoPE,
/// the store and attention in one pass per step. After each step the caches are read back:
/// every row written so far must decode to the reference's rotated keys and its values
/// within the format's error, and the attention output must match the reference run over
/// exactly the decoded caches (the f32 tolerance, doubled for RoPE's error on q).
pub async fn check_step_sequence_kinds(
    ctx: &GpuContext,
    cache: &KernelCache,
    reduction: Reduction,
    kinds: KvKinds,
    rng: &mut ChaCha8Rng,
) -> Result<f32, String> {
    let heads = Heads {
        n_heads: 4,
        n_kv_heads: 2,
        head_dim: 16,
    };
    let (nh, nkv, hd) = (4usize, 2usize, 16usize);
    let (q_dim, kv_dim) = (nh * hd, nkv * hd);
    let (max_tokens, max_positions, theta) = (4u32, 40u32, 1000.0f32);
    let layout = RopeLayout::RotateHalf;
    let what = format!("step sequence {kinds} {reduction:?}");
    let e = err(&what);
    let rope = RopeKvWrite::rotate_only(ctx, cache, layout)
        .await
        .map_err(&e)?;
    let store = KvStore::new(ctx, cache, kinds).await.map_err(&e)?;
    let attn = Attention::with_kinds(ctx, cache, reduction, Variant::WORKGROUP, hd as u32, kinds)
        .await
        .map_err(&e)?;
    let rows = max_tokens as usize;
    let buf = |name: &str, n: usize| ctx.storage_zeroed(name, (n * 4) as u64);
    let qb = buf("q", rows * q_dim).map_err(&e)?;
    let kb = buf("k", rows * kv_dim).map_err(&e)?;
    let vb = buf("v", rows * kv_dim).map_err(&e)?;
    let ob = buf("out", rows * q_dim).map_err(&e)?;
    let (k_rw, v_rw) = (kinds.k.row_words(kv_dim), kinds.v.row_words(kv_dim));
    let kc = buf("k cache", max_positions as usize * k_rw).map_err(&e)?;
    let vc = buf("v cache", max_positions as usize * v_rw).map_err(&e)?;
    let step = StepParams::create_buffer(ctx, "step");
    let b_rope = rope
        .bind_rotate_only(ctx, &step, &qb, &kb, heads, theta, max_tokens)
        .map_err(&e)?;
    let src = KvSource {
        k: &kb,
        k_off: 0,
        k_stride: kv_dim as u32,
        v: &vb,
        v_off: 0,
        v_stride: kv_dim as u32,
    };
    let b_store = store
        .bind(
            ctx,
            &step,
            src,
            &kc,
            &vc,
            kv_dim as u32,
            max_positions,
            max_tokens,
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
            None,
        )
        .map_err(&e)?;
    let (mut ref_k, mut ref_v) = (Vec::new(), Vec::new());
    let mut pos0 = 0u32;
    let mut worst = 0.0f32;
    for n_tokens in [4u32, 1, 3, 1, 4, 4, 2, 1, 1] {
        let params = StepParams::checked(pos0, n_tokens, max_tokens, max_positions).map_err(&e)?;
        let n = n_tokens as usize;
        let q = random_vec(rng, n * q_dim, 2.0);
        let k = random_vec(rng, n * kv_dim, 2.0);
        let v = random_vec(rng, n * kv_dim, 2.0);
        ctx.queue.write_buffer(&qb, 0, bytemuck::cast_slice(&q));
        ctx.queue.write_buffer(&kb, 0, bytemuck::cast_slice(&k));
        ctx.queue.write_buffer(&vb, 0, bytemuck::cast_slice(&v));
        params.write(ctx, &step);
        ctx.submit_pass("rope, store and attention", |pass| {
            b_rope.record(pass, n_tokens);
            b_store.record(pass, n_tokens);
            b_attn.record(pass, &params);
        });
        let got = ctx.read_f32(&ob, n * q_dim).await.map_err(&e)?;
        for t in 0..n {
            let pos = pos0 as usize + t;
            let mut kt = k[t * kv_dim..][..kv_dim].to_vec();
            reference::rope(&mut kt, nkv, hd, pos, theta, layout);
            ref_k.extend(kt);
            ref_v.extend_from_slice(&v[t * kv_dim..][..kv_dim]);
        }
        let filled = (pos0 + n_tokens) as usize;
        let mut decoded = Vec::new();
        for (kind, buffer, rw, reference_rows, name) in [
            (kinds.k, &kc, k_rw, &ref_k, "k"),
            (kinds.v, &vc, v_rw, &ref_v, "v"),
        ] {
            let words = words_of(&ctx.read_f32(buffer, filled * rw).await.map_err(&e)?);
            let mut rows_dec = Vec::with_capacity(filled * kv_dim);
            for p in 0..filled {
                let row = kind.decode_row(&words[p * rw..][..rw], kv_dim);
                let want = &reference_rows[p * kv_dim..][..kv_dim];
                for (b, block) in want.chunks(KV_BLOCK).enumerate() {
                    let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
                    // RoPE's own error on the keys comes on top of the format's
                    let tol = kind.max_error(amax) + 1e-5 * amax + 1e-7;
                    let at = b * KV_BLOCK;
                    close(
                        &format!("{what}: {name} cache row {p} block {b}"),
                        &row[at..][..block.len()],
                        block,
                        0..block.len(),
                        |_| tol,
                    )?;
                }
                rows_dec.extend(row);
            }
            decoded.push(rows_dec);
        }
        let abs_v: Vec<f32> = decoded[1].iter().map(|v| v.abs()).collect();
        for t in 0..n {
            let pos = pos0 as usize + t;
            let mut qt = q[t * q_dim..][..q_dim].to_vec();
            reference::rope(&mut qt, nh, hd, pos, theta, layout);
            let want = reference::attention(&qt, &decoded[0], &decoded[1], pos + 1, nh, nkv, hd);
            let scale = reference::attention(&qt, &decoded[0], &abs_v, pos + 1, nh, nkv, hd);
            worst = worst.max(close(
                &format!("{what} position {pos}"),
                &got[t * q_dim..][..q_dim],
                &want,
                0..q_dim,
                |i| 2.0 * ATTENTION_TOL * scale[i] + 1e-7,
            )?);
        }
        pos0 += n_tokens;
    }
    Ok(worst)
}
