//! Browser tests of the step-aware ops (wasm-bindgen-test in headless Chromium on WebGPU;
//! SwiftShader in CI, without subgroups): the cases of `tests/common/ops_cases.rs` and
//! `tests/common/attention_cases.rs` at the smaller sizes. A missing WebGPU adapter fails.

#![cfg(target_arch = "wasm32")]

use crate::common;

use common::browser_log as log;

use common::kernel_cases::reductions;
use common::{attention_cases, kv_kind_cases, ops_cases};
use emberlm::backend::gpu::Reduction;
use emberlm::config::RopeLayout;
use wasm_bindgen_test::wasm_bindgen_test;

fn ok(what: &str, result: Result<f32, String>) {
    match result {
        Ok(worst) => log(&format!("{what}: ok (worst error / tolerance {worst:.3})")),
        Err(e) => panic!("{e}"),
    }
}

#[wasm_bindgen_test]
async fn rope_kv_write_matches_reference() {
    let (ctx, cache) = common::shared_browser_gpu().await;
    let mut rng = common::rng("rope (browser)", &log);
    for layout in [
        RopeLayout::Interleaved,
        RopeLayout::RotateHalf,
        RopeLayout::None,
    ] {
        let r =
            ops_cases::check_rope(ctx, cache, layout, ops_cases::ROPE_CASES_SMALL, &mut rng).await;
        ok(&format!("rope {layout:?}"), r);
    }
}

#[wasm_bindgen_test]
async fn attention_matches_reference() {
    let (ctx, cache) = common::shared_browser_gpu().await;
    let mut rng = common::rng("attention (browser)", &log);
    for reduction in reductions(ctx) {
        let r = attention_cases::check_attention(
            ctx,
            cache,
            reduction,
            attention_cases::ATTENTION_CASES_SMALL,
            &mut rng,
        )
        .await;
        ok(&format!("attention {reduction:?}"), r);
    }
}

#[wasm_bindgen_test]
async fn rope_and_attention_over_a_step_sequence() {
    let (ctx, cache) = common::shared_browser_gpu().await;
    let mut rng = common::rng("step sequence (browser)", &log);
    let reduction = Reduction::best(ctx);
    let r = attention_cases::check_step_sequence(
        ctx,
        cache,
        reduction,
        RopeLayout::RotateHalf,
        &mut rng,
    )
    .await;
    ok(&format!("step sequence {reduction:?}"), r);
}

#[wasm_bindgen_test]
async fn elementwise_matches_reference() {
    let (ctx, cache) = common::shared_browser_gpu().await;
    let mut rng = common::rng("elementwise (browser)", &log);
    let r = ops_cases::check_elementwise(ctx, cache, ops_cases::ELEMENTWISE_CASES_SMALL, &mut rng)
        .await;
    ok("elementwise", r);
}

#[wasm_bindgen_test]
async fn kv_store_matches_the_cpu_encoder() {
    let (ctx, cache) = common::shared_browser_gpu().await;
    let mut rng = common::rng("kv store (browser)", &log);
    ok(
        "kv store",
        kv_kind_cases::check_store(ctx, cache, &mut rng).await,
    );
}

#[wasm_bindgen_test]
async fn attention_reads_every_kv_kind() {
    let (ctx, cache) = common::shared_browser_gpu().await;
    let mut rng = common::rng("attention kinds (browser)", &log);
    let reduction = Reduction::best(ctx);
    let r = kv_kind_cases::check_attention_kinds(
        ctx,
        cache,
        reduction,
        kv_kind_cases::KIND_ATTENTION_CASES_SMALL,
        &mut rng,
    )
    .await;
    ok(&format!("attention kinds {reduction:?}"), r);
    // the step sequence (store, rotate, attend over growing positions) with f32 and with the
    // two mixed pairs, which between them put every quantised kind on one side (the native test
    // runs all seven pairs; each pair is pipelines of its own to compile on SwiftShader)
    let pairs = kv_kind_cases::kind_pairs()
        .into_iter()
        .filter(|p| p.k != p.v || p.k == emberlm::dtype::kv::KvKind::F32);
    for kinds in pairs {
        let r =
            kv_kind_cases::check_step_sequence_kinds(ctx, cache, reduction, kinds, &mut rng).await;
        ok(&format!("step sequence {kinds} {reduction:?}"), r);
    }
}
