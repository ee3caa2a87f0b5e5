//! Precision f16 end to end on lavapipe (which has `shader-f16`): the tiny fixtures' logits
//! with f16 matrix products against the same run in f32, over prefill and decode: largest
//! |Δ logit|, next-token KL and NLL delta within bounds that a broken f16 path (an input not
//! rounded back, a product in the wrong place, an overflow) would exceed by orders of
//! magnitude, and the kernel plan kept apart from f32's.

#![cfg(not(target_arch = "wasm32"))]

use crate::common;

use emberlm::backend::gpu::Forward;
use emberlm::backend::gpu::{KernelCache, MatmulPrecision, Precision};
use emberlm::loader::ModelFiles;
use emberlm::sampling::agreement;
use emberlm::GpuOptions;
use rand::Rng;

/// The logits of `tokens` as one prefill and then decoded one at a time, at `precision`.
fn logits(path: &str, precision: Precision, tokens: &[u32]) -> Option<(Vec<f32>, Vec<f32>)> {
    let ctx = common::native_gpu(GpuOptions {
        precision,
        ..GpuOptions::default()
    })?;
    if precision == Precision::F16 && ctx.precision() != MatmulPrecision::F16 {
        eprintln!("SKIPPED: the adapter has no shader-f16");
        return None;
    }
    let files = ModelFiles::open(std::path::Path::new(path)).unwrap();
    let weights = files.weights().unwrap();
    let cache = KernelCache::new();
    let mut fwd = pollster::block_on(Forward::new(&ctx, &cache, &weights, 64, 16)).unwrap();
    let prefill = pollster::block_on(fwd.forward(&ctx, tokens, true)).unwrap();
    fwd.truncate(0).unwrap();
    let mut decode = Vec::new();
    for &t in tokens {
        decode.extend(pollster::block_on(fwd.forward(&ctx, &[t], false)).unwrap());
    }
    let key = emberlm::backend::gpu::plan_key(&ctx, &weights, 16);
    assert_eq!(
        key.shape.contains("precision=f16"),
        precision == Precision::F16,
        "the f16 plan is stored under its own key: {}",
        key.shape
    );
    ctx.check().expect("no GPU error");
    Some((prefill, decode))
}

#[test]
fn f16_products_stay_close_to_f32() {
    let mut rng = common::rng("precision", &|m| eprintln!("{m}"));
    for name in [
        "tiny-llama-q4_1.gguf",
        "tiny-gpt2-f16.gguf",
        "tiny-llama-spm-f32.gguf",
    ] {
        let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
        let vocab = ModelFiles::open(std::path::Path::new(&path))
            .unwrap()
            .weights()
            .unwrap()
            .config
            .vocab_size;
        let tokens: Vec<u32> = (0..40).map(|_| rng.random_range(0..vocab as u32)).collect();
        let Some((p32, d32)) = logits(&path, Precision::F32, &tokens) else {
            return;
        };
        let Some((p16, d16)) = logits(&path, Precision::F16, &tokens) else {
            return;
        };
        for (what, a, b) in [("prefill", &p32, &p16), ("decode", &d32, &d16)] {
            let m = agreement(a, b, &tokens, vocab);
            eprintln!("{name} {what}: {m:?}");
            assert!(m.max_abs_diff > 0.0, "{name} {what}: f16 changed nothing");
            assert!(m.max_abs_diff <= 0.15, "{name} {what}: {m:?}");
            assert!(m.mean_kl <= 1e-3, "{name} {what}: {m:?}");
            assert!(m.nll_delta.abs() <= 0.02, "{name} {what}: {m:?}");
            assert!(m.top1_agreement >= 0.9, "{name} {what}: {m:?}");
        }
    }
}

/// The GPU context at precision f16, or `None` (with a notice) without `shader-f16`.
fn f16_gpu() -> Option<emberlm::GpuContext> {
    let ctx = common::native_gpu(GpuOptions {
        precision: Precision::F16,
        ..GpuOptions::default()
    })?;
    if ctx.precision() != MatmulPrecision::F16 {
        eprintln!("SKIPPED: the adapter has no shader-f16");
        return None;
    }
    Some(ctx)
}

/// f16 values packed two per word, as an f16 activation buffer holds them.
fn pack_f16(values: &[f32]) -> Vec<u16> {
    let mut out: Vec<u16> = values
        .iter()
        .map(|&v| half::f16::from_f32(v).to_bits())
        .collect();
    out.resize(values.len().next_multiple_of(2), 0);
    out
}

/// `values` f16 words read back from `buffer`, as f32.
fn read_f16(ctx: &emberlm::GpuContext, buffer: &wgpu::Buffer, values: usize) -> Vec<f32> {
    let bytes = pollster::block_on(ctx.read_bytes(buffer, (2 * values).next_multiple_of(4) as u64))
        .unwrap();
    bytes
        .chunks_exact(2)
        .take(values)
        .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
        .collect()
}

/// Whether `got` (an f16 written by a kernel) is `want` rounded to f16, within one unit in
/// the last place (WGSL leaves the rounding direction of the conversion to the device).
fn is_f16_of(got: f32, want: f32) -> bool {
    let w = half::f16::from_f32(want.clamp(-65504.0, 65504.0));
    let g = half::f16::from_f32(got);
    let ulps = (i32::from(w.to_bits() as i16) - i32::from(g.to_bits() as i16)).abs();
    ulps <= 1 && got.is_finite()
}

/// f16 activations between products hold exactly what the f32 buffers would, rounded: a
/// linear reading f16 input gives the bits of one reading the rounded values as f32 (the f16
/// products round their inputs anyway), and a linear, attention (whole and split) or SwiGLU
/// writing f16 writes its f32 result rounded, in every kernel shape.
#[test]
fn f16_activations_hold_the_f32_values_rounded() {
    use common::linear_cases::{every_variant, upload_matrix, with_variants, LINEAR_RUNS};
    use emberlm::backend::gpu::ops::LinearOptions;
    use emberlm::backend::gpu::{
        Attention, Heads, KeySplit, Reduction, StepParams, SwiGlu, Variant,
    };
    use emberlm::dtype::kv::KvKinds;
    use emberlm::dtype::DType;

    let Some(ctx) = f16_gpu() else {
        return;
    };
    let cache = KernelCache::new();
    let mut rng = common::rng("f16 activations", &|m| eprintln!("{m}"));
    let step = StepParams::create_buffer(&ctx, "step");
    let mut random =
        |n: usize| -> Vec<f32> { (0..n).map(|_| rng.random_range(-2.0..2.0)).collect() };

    // linear: [70, 96] Q4_1, up to 17 tokens
    let (rows, cols, tokens) = (70usize, 96usize, 17usize);
    let (x, y0) = (random(tokens * cols), random(tokens * rows));
    let x_rounded: Vec<f32> = x.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect();
    let mut wrng = common::rng("f16 activations weights", &|_| {});
    let (w, _) = upload_matrix(&ctx, &mut wrng, DType::Q4_1, rows, cols).unwrap();
    let build = |options| {
        pollster::block_on(every_variant(
            &ctx,
            &cache,
            DType::Q4_1,
            Reduction::Workgroup,
            options,
            "f16",
        ))
        .unwrap()
    };
    let plain = build(LinearOptions::default());
    let x_in = build(LinearOptions {
        x_f16: true,
        ..LinearOptions::default()
    });
    let y_out = build(LinearOptions {
        y_f16: true,
        ..LinearOptions::default()
    });
    let xb = ctx.storage_from("x", &x).unwrap();
    let xr = ctx.storage_from("x rounded", &x_rounded).unwrap();
    let x16 = ctx.storage_from("x f16", &pack_f16(&x)).unwrap();
    let (ya, yb) = (
        ctx.storage_from("ya", &y0).unwrap(),
        ctx.storage_from("yb", &y0).unwrap(),
    );
    let y16 = ctx.storage_from("y f16", &pack_f16(&y0)).unwrap();
    let max = tokens as u32;
    let runs = [(
        plain.bind(&ctx, &step, &w, &xr, None, &ya, max).unwrap(),
        x_in.bind(&ctx, &step, &w, &x16, None, &yb, max).unwrap(),
    )];
    let to_f16 = plain.bind(&ctx, &step, &w, &xb, None, &ya, max).unwrap();
    let from_f32 = y_out.bind(&ctx, &step, &w, &xb, None, &y16, max).unwrap();
    for (variant, &(kernel, n)) in with_variants(LINEAR_RUNS) {
        ctx.queue
            .write_buffer(&step, 0, bytemuck::bytes_of(&StepParams::new(0, n)));
        let what = format!("{variant} {kernel:?} {n} tokens");
        let len = n as usize * rows;
        for (a, b) in &runs {
            ctx.submit_pass("f16 x", |pass| {
                a.record_variant(pass, n, kernel, Some(variant));
                b.record_variant(pass, n, kernel, Some(variant));
            });
            let (ga, gb) = pollster::block_on(async {
                (
                    ctx.read_f32(&ya, len).await.unwrap(),
                    ctx.read_f32(&yb, len).await.unwrap(),
                )
            });
            assert!(
                ga.iter().zip(&gb).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{what}: an f16 x differs from its values in f32"
            );
        }
        ctx.submit_pass("f16 y", |pass| {
            to_f16.record_variant(pass, n, kernel, Some(variant));
            from_f32.record_variant(pass, n, kernel, Some(variant));
        });
        let want = pollster::block_on(ctx.read_f32(&ya, len)).unwrap();
        let got = read_f16(&ctx, &y16, len);
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            assert!(
                is_f16_of(g, w),
                "{what}: y[{i}] is {g}, the f32 kernel gives {w}"
            );
        }
    }

    // attention: 4 heads over 2 KV heads of 16, 5 tokens at positions 40.., whole and split
    let heads = Heads {
        n_heads: 4,
        n_kv_heads: 2,
        head_dim: 16,
    };
    let (positions, n) = (64u32, 5u32);
    let q = ctx.storage_from("q", &random(n as usize * 64)).unwrap();
    let kc = ctx
        .storage_from("k cache", &random(positions as usize * 32))
        .unwrap();
    let vc = ctx
        .storage_from("v cache", &random(positions as usize * 32))
        .unwrap();
    let split = KeySplit::with_keys(8);
    let scratch = ctx
        .storage_zeroed("split", 4 * split.scratch_len(heads, positions))
        .unwrap();
    let len = n as usize * 64;
    for variant in Variant::EVERY_FAMILY {
        for tokens in [n, 1] {
            for split in [None, Some((split, &scratch))] {
                let build = |f16| {
                    pollster::block_on(Attention::with_output(
                        &ctx,
                        &cache,
                        Reduction::Workgroup,
                        variant,
                        16,
                        KvKinds::default(),
                        f16,
                    ))
                    .unwrap()
                };
                let (a32, a16) = (build(false), build(true));
                let out32 = ctx.storage_zeroed("out", 4 * len as u64).unwrap();
                let out16 = ctx.storage_zeroed("out f16", 2 * len as u64).unwrap();
                let b32 = a32
                    .bind(
                        &ctx, &step, &q, 64, &kc, &vc, &out32, heads, positions, n, split,
                    )
                    .unwrap();
                let b16 = a16
                    .bind(
                        &ctx, &step, &q, 64, &kc, &vc, &out16, heads, positions, n, split,
                    )
                    .unwrap();
                let params = StepParams::new(40, tokens);
                ctx.queue
                    .write_buffer(&step, 0, bytemuck::bytes_of(&params));
                ctx.submit_pass("f16 attention", |pass| {
                    b32.record(pass, &params);
                    b16.record(pass, &params);
                });
                let values = tokens as usize * 64;
                let want = pollster::block_on(ctx.read_f32(&out32, values)).unwrap();
                let got = read_f16(&ctx, &out16, values);
                let what = format!(
                    "attention {variant} {tokens} tokens split={}",
                    split.is_some()
                );
                assert!(want.iter().any(|&v| v != 0.0), "{what}: nothing written");
                for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        is_f16_of(g, w),
                        "{what}: out[{i}] is {g}, the f32 kernel gives {w}"
                    );
                }
            }
        }
    }

    // SwiGLU over a fused gate | up buffer of 2 × 37 values per token
    let ff = 37u32;
    let gate_up = ctx
        .storage_from("gate_up", &random(tokens * 2 * ff as usize))
        .unwrap();
    let build = |f16| pollster::block_on(SwiGlu::with_output(&ctx, &cache, false, f16)).unwrap();
    let out32 = ctx
        .storage_zeroed("out", 4 * (tokens as u64) * u64::from(ff))
        .unwrap();
    let out16 = ctx
        .storage_zeroed("out f16", 2 * (tokens as u64) * u64::from(ff) + 2)
        .unwrap();
    let b32 = build(false)
        .bind_fused(&ctx, &step, &gate_up, &out32, ff, max)
        .unwrap();
    let b16 = build(true)
        .bind_fused(&ctx, &step, &gate_up, &out16, ff, max)
        .unwrap();
    let params = StepParams::new(0, max);
    ctx.queue
        .write_buffer(&step, 0, bytemuck::bytes_of(&params));
    ctx.submit_pass("f16 swiglu", |pass| {
        b32.record(pass, max);
        b16.record(pass, max);
    });
    let values = tokens * ff as usize;
    let want = pollster::block_on(ctx.read_f32(&out32, values)).unwrap();
    let got = read_f16(&ctx, &out16, values);
    for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
        assert!(
            is_f16_of(g, w),
            "swiglu: out[{i}] is {g}, the f32 kernel gives {w}"
        );
    }
    // an f16 output needs room for half a word per value only, and no more is accepted short
    let short = ctx
        .storage_zeroed("short", 2 * (tokens as u64) * u64::from(ff) - 4)
        .unwrap();
    let err = build(true)
        .bind_fused(&ctx, &step, &gate_up, &short, ff, max)
        .unwrap_err();
    assert!(err.to_string().contains("out"), "{err}");
    ctx.check().expect("no GPU error");
}

/// Precision f16 stores the attention output and the feed-forward hidden state as f16: the
/// activation buffers are smaller by half of theirs, and f32 rejects the f16 options by name.
#[test]
fn precision_f16_halves_the_product_inputs() {
    use emberlm::backend::gpu::ops::LinearOptions;
    use emberlm::backend::gpu::Reduction;
    let path = format!(
        "{}/tests/fixtures/tiny-llama-q4_1.gguf",
        env!("CARGO_MANIFEST_DIR")
    );
    let files = ModelFiles::open(std::path::Path::new(&path)).unwrap();
    let weights = files.weights().unwrap();
    let c = weights.config.clone();
    let bytes = |ctx: &emberlm::GpuContext| {
        let cache = KernelCache::new();
        let fwd = pollster::block_on(Forward::new(ctx, &cache, &weights, 64, 16)).unwrap();
        fwd.memory().activations
    };
    // one fixed plan for both, so that only the precision changes the buffers
    let mut kernels = emberlm::backend::gpu::KernelOverrides::default()
        .with_split(emberlm::backend::gpu::SplitOverride::Keys(32));
    for family in emberlm::backend::gpu::Family::ALL {
        kernels = kernels.with(family, emberlm::backend::gpu::Variant::ROWS);
    }
    let gpu_options = |precision| GpuOptions {
        precision,
        kernels: kernels.clone(),
        ..GpuOptions::default()
    };
    let Some(f32_ctx) = common::native_gpu(gpu_options(Precision::F32)) else {
        return;
    };
    let cache = KernelCache::new();
    let options = LinearOptions {
        y_f16: true,
        ..LinearOptions::default()
    };
    let err = pollster::block_on(emberlm::backend::gpu::ops::Linear::with_options(
        &f32_ctx,
        &cache,
        emberlm::dtype::DType::Q4_1,
        Reduction::Workgroup,
        options,
    ))
    .unwrap_err();
    assert!(err.to_string().contains("precision f16"), "{err}");
    let Some(f16_ctx) = common::native_gpu(gpu_options(Precision::F16)) else {
        return;
    };
    if f16_ctx.precision() != MatmulPrecision::F16 {
        eprintln!("SKIPPED: the adapter has no shader-f16");
        return;
    }
    let halved = 16 * (c.q_dim() + c.ffn_size) as u64 * 2;
    let (b32, b16) = (bytes(&f32_ctx), bytes(&f16_ctx));
    eprintln!(
        "activations: f32 {b32} B, f16 {b16} B, q_dim {} ffn {}",
        c.q_dim(),
        c.ffn_size
    );
    assert_eq!(b32 - b16, halved);
}
