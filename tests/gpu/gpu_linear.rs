//! Native GPU tests of the weight kernels (Vulkan; Mesa lavapipe in CI): linear layers and
//! embedding lookups for every stored weight type against the CPU reference.
//!
//! Without an adapter these tests print why and pass, unless `EMBERLM_REQUIRE_GPU=1` is set
//! (as `./build.sh test` does), in which case they fail.

#![cfg(not(target_arch = "wasm32"))]

use crate::common;

use common::kernel_cases::reductions;
use common::linear_cases::{self, BIAS_ACCUMULATE, LINEAR_RUNS};
use common::linear_fused_cases;
use common::linear_kv_block_cases;
use emberlm::backend::gpu::ops::EmbedSource;
use emberlm::backend::gpu::KernelCache;
use emberlm::dtype::DType;
use emberlm::GpuOptions;

fn log(msg: &str) {
    eprintln!("{msg}");
}

/// Every type × reduction × bias × accumulate, each on four shapes with decode and prefill at
/// 1, 2, 5 and 17 tokens.
fn linear_matches_reference(dtypes: &[DType]) {
    let Some(ctx) = common::native_gpu(GpuOptions::default()) else {
        return;
    };
    let cache = KernelCache::new();
    let mut rng = common::rng("linear", &log);
    for &dtype in dtypes {
        let started = std::time::Instant::now();
        let shapes = linear_cases::linear_shapes(dtype, false);
        for reduction in reductions(&ctx) {
            for (bias, accumulate) in BIAS_ACCUMULATE {
                pollster::block_on(linear_cases::check_linear(
                    &ctx,
                    &cache,
                    dtype,
                    reduction,
                    bias,
                    accumulate,
                    &shapes,
                    LINEAR_RUNS,
                    &mut rng,
                ))
                .unwrap_or_else(|e| panic!("{e}"));
            }
        }
        log(&format!("linear {dtype}: ok ({:.1?})", started.elapsed()));
    }
}

// Split by type family so that the test harness runs them on separate threads.
#[test]
fn linear_float_types_match_reference() {
    linear_matches_reference(&[DType::F32, DType::F16, DType::BF16]);
}

#[test]
fn linear_32_blocks_match_reference() {
    linear_matches_reference(&[
        DType::Q8_0,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
    ]);
}

#[test]
fn linear_k_quants_match_reference() {
    linear_matches_reference(&[DType::Q4_K, DType::Q5_K, DType::Q6_K]);
}

#[test]
fn linear_large_shapes() {
    let Some(ctx) = common::native_gpu(GpuOptions::default()) else {
        return;
    };
    let cache = KernelCache::new();
    let mut rng = common::rng("linear large", &log);
    for reduction in reductions(&ctx) {
        pollster::block_on(linear_cases::check_linear_large(
            &ctx, &cache, reduction, &mut rng,
        ))
        .unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]
fn linear_and_embedding_reject_bad_arguments() {
    let Some(ctx) = common::native_gpu(GpuOptions::default()) else {
        return;
    };
    pollster::block_on(linear_cases::check_linear_errors(&ctx, &KernelCache::new()))
        .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn embedding_is_bit_exact() {
    let Some(ctx) = common::native_gpu(GpuOptions::default()) else {
        return;
    };
    let cache = KernelCache::new();
    let mut rng = common::rng("embedding", &log);
    for dtype in DType::ALL {
        for source in [
            EmbedSource::Tokens,
            EmbedSource::Positions,
            EmbedSource::First,
        ] {
            for accumulate in [false, true] {
                pollster::block_on(linear_cases::check_embedding(
                    &ctx, &cache, dtype, source, accumulate, &mut rng,
                ))
                .unwrap_or_else(|e| panic!("{e}"));
            }
        }
        log(&format!("embed {dtype}: ok"));
    }
}

/// Norms folded into the input, SwiGLU / GELU epilogues and last-row heads, for a float, a
/// 32-block and a K-quant type, both kernels and both reductions.
#[test]
fn fused_linears_match_reference() {
    let Some(ctx) = common::native_gpu(GpuOptions::default()) else {
        return;
    };
    let cache = KernelCache::new();
    let mut rng = common::rng("linear fused", &log);
    for dtype in [DType::F16, DType::Q4_1, DType::Q4_K] {
        for reduction in reductions(&ctx) {
            for options in linear_fused_cases::fused_options() {
                pollster::block_on(linear_fused_cases::check_linear_fused(
                    &ctx,
                    &cache,
                    dtype,
                    reduction,
                    options,
                    &linear_cases::linear_shapes(dtype, true),
                    LINEAR_RUNS,
                    &mut rng,
                ))
                .unwrap_or_else(|e| panic!("{e}"));
            }
        }
    }
}

/// The stacked Q/K/V layer with RoPE and the KV-cache write in its epilogue.
#[test]
fn qkv_linear_writes_the_rotated_cache() {
    let Some(ctx) = common::native_gpu(GpuOptions::default()) else {
        return;
    };
    let cache = KernelCache::new();
    let mut rng = common::rng("linear qkv", &log);
    for dtype in [DType::F32, DType::Q8_0, DType::Q4_K] {
        for reduction in reductions(&ctx) {
            pollster::block_on(linear_fused_cases::check_linear_qkv(
                &ctx, &cache, dtype, reduction, &mut rng,
            ))
            .unwrap_or_else(|e| panic!("{e}"));
        }
    }
}

/// The stacked Q/K/V layer encoding caches of block kinds (and mixed kinds) in its own
/// dispatch, every shape, against the CPU encoder.
#[test]
fn qkv_linear_encodes_block_kinds_itself() {
    let Some(ctx) = common::native_gpu(GpuOptions::default()) else {
        return;
    };
    let cache = KernelCache::new();
    let mut rng = common::rng("linear qkv blocks", &log);
    for reduction in reductions(&ctx) {
        pollster::block_on(linear_kv_block_cases::check_linear_qkv_blocks(
            &ctx, &cache, reduction, &mut rng,
        ))
        .unwrap_or_else(|e| panic!("{e}"));
    }
}

/// Precision f16 (lavapipe has `shader-f16`): every linear kernel, in both shapes, against a
/// reference that rounds the inputs and each product to f16 and sums in f64, for float,
/// legacy and k-quant types, within half an f16 ulp per product (drivers may keep a product of
/// two f16 values in f32). Without the feature `f16` is an error naming it.
#[test]
fn linear_in_f16_precision_matches_reference() {
    use emberlm::backend::gpu::{MatmulPrecision, Precision};
    let Some(probe) = common::native_gpu(GpuOptions::default()) else {
        return;
    };
    if !probe.report().shader_f16 {
        let err = pollster::block_on(emberlm::GpuContext::new(GpuOptions {
            precision: Precision::F16,
            ..GpuOptions::default()
        }))
        .unwrap_err();
        assert!(err.to_string().contains("shader-f16"), "{err}");
        log("SKIPPED: the adapter has no shader-f16; f16 refused by name");
        return;
    }
    drop(probe);
    let ctx = common::native_gpu(GpuOptions {
        precision: Precision::F16,
        ..GpuOptions::default()
    })
    .expect("the adapter offered shader-f16");
    assert_eq!(ctx.precision(), MatmulPrecision::F16);
    let cache = KernelCache::new();
    let mut rng = common::rng("linear f16", &log);
    for dtype in [
        DType::F32,
        DType::F16,
        DType::Q8_0,
        DType::Q4_1,
        DType::Q6_K,
    ] {
        let shapes = linear_cases::linear_shapes(dtype, true);
        let reduction = reductions(&ctx)[0];
        for (bias, accumulate) in [(false, false), (true, true)] {
            pollster::block_on(linear_cases::check_linear(
                &ctx,
                &cache,
                dtype,
                reduction,
                bias,
                accumulate,
                &shapes,
                LINEAR_RUNS,
                &mut rng,
            ))
            .unwrap_or_else(|e| panic!("precision f16: {e}"));
        }
    }
}
