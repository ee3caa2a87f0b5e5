//! Browser tests of the weight kernels (wasm-bindgen-test in headless Chromium on WebGPU;
//! SwiftShader in CI): the native cases on smaller shapes. A missing WebGPU adapter fails.

#![cfg(target_arch = "wasm32")]

use crate::common;

use common::browser_log as log;

use common::kernel_cases::reductions;
use common::linear_cases::{self, BIAS_ACCUMULATE, LINEAR_RUNS};
use common::linear_fused_cases;
use common::linear_kv_block_cases;
use emberlm::backend::gpu::ops::EmbedSource;
use emberlm::backend::gpu::KernelCache;
use emberlm::dtype::DType;
use wasm_bindgen_test::wasm_bindgen_test;

/// Every type × reduction on two small shapes, decode and prefill at 1, 2, 5 and 17 tokens,
/// each type with one of the four bias × accumulate pairs in turn (every pair on two or more
/// types; the native test runs every type with all four). On SwiftShader the time goes into
/// compiling each pipeline, and each pair is a pipeline of its own.
#[wasm_bindgen_test]
async fn linear_matches_reference() {
    let (ctx, cache) = common::shared_browser_gpu().await;
    let mut rng = common::rng("linear (browser)", &log);
    for (i, dtype) in DType::ALL.into_iter().enumerate() {
        let shapes = linear_cases::linear_shapes(dtype, true);
        let (bias, accumulate) = BIAS_ACCUMULATE[i % BIAS_ACCUMULATE.len()];
        for reduction in reductions(ctx) {
            linear_cases::check_linear(
                ctx,
                cache,
                dtype,
                reduction,
                bias,
                accumulate,
                &shapes,
                LINEAR_RUNS,
                &mut rng,
            )
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        }
        log(&format!(
            "linear {dtype} bias={bias} accumulate={accumulate}: ok"
        ));
    }
}

/// Norms folded into the input, SwiGLU / GELU epilogues and last-row heads (the native cases),
/// each fused form on one of three types in turn (the native test runs every form on each).
#[wasm_bindgen_test]
async fn fused_linears_match_reference() {
    let (ctx, cache) = common::shared_browser_gpu().await;
    let mut rng = common::rng("linear fused (browser)", &log);
    let dtypes = [DType::F16, DType::Q4_1, DType::Q4_K];
    for (i, options) in linear_fused_cases::fused_options().into_iter().enumerate() {
        let dtype = dtypes[i % dtypes.len()];
        for reduction in reductions(ctx) {
            linear_fused_cases::check_linear_fused(
                ctx,
                cache,
                dtype,
                reduction,
                options,
                &linear_cases::linear_shapes(dtype, true),
                LINEAR_RUNS,
                &mut rng,
            )
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        }
    }
}

#[wasm_bindgen_test]
async fn linear_and_embedding_reject_bad_arguments() {
    let ctx = common::browser_gpu().await;
    linear_cases::check_linear_errors(&ctx, &KernelCache::new())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
}

#[wasm_bindgen_test]
async fn embedding_is_bit_exact() {
    let (ctx, cache) = common::shared_browser_gpu().await;
    let mut rng = common::rng("embedding (browser)", &log);
    for dtype in DType::ALL {
        for source in [
            EmbedSource::Tokens,
            EmbedSource::Positions,
            EmbedSource::First,
        ] {
            for accumulate in [false, true] {
                linear_cases::check_embedding(ctx, cache, dtype, source, accumulate, &mut rng)
                    .await
                    .unwrap_or_else(|e| panic!("{e}"));
            }
        }
        log(&format!("embed {dtype}: ok"));
    }
}

/// The stacked Q/K/V layer encoding caches of block kinds in its own dispatch.
#[wasm_bindgen_test]
async fn qkv_linear_encodes_block_kinds_itself() {
    let (ctx, cache) = common::shared_browser_gpu().await;
    let mut rng = common::rng("linear qkv blocks (browser)", &log);
    for reduction in reductions(ctx) {
        linear_kv_block_cases::check_linear_qkv_blocks(ctx, cache, reduction, &mut rng)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

/// The stacked Q/K/V layer with RoPE and the KV-cache write in its epilogue.
#[wasm_bindgen_test]
async fn qkv_linear_writes_the_rotated_cache() {
    let (ctx, cache) = common::shared_browser_gpu().await;
    let mut rng = common::rng("linear qkv (browser)", &log);
    for dtype in [DType::F32, DType::Q8_0, DType::Q4_K] {
        for reduction in reductions(ctx) {
            linear_fused_cases::check_linear_qkv(ctx, cache, dtype, reduction, &mut rng)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
        }
    }
}
