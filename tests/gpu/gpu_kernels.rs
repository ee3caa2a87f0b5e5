//! Native GPU tests (Vulkan; Mesa lavapipe in CI) of the kernel machinery: the pipeline cache,
//! deterministic reductions, and GPU failures surfacing as errors.
//!
//! Without an adapter these tests print why and pass, unless `EMBERLM_REQUIRE_GPU=1` is set
//! (as `./build.sh test` does), in which case they fail.

#![cfg(not(target_arch = "wasm32"))]

use crate::common;

use common::kernel_cases::{self, reductions};
use emberlm::backend::gpu::ops::Linear;
use emberlm::backend::gpu::{kernels::ShaderFile, Defines, KernelCache, Reduction};
use emberlm::dtype::DType;
use emberlm::{Error, GpuOptions};

fn log(msg: &str) {
    eprintln!("{msg}");
}

#[test]
fn reductions_are_deterministic() {
    let Some(ctx) = common::native_gpu(GpuOptions::default()) else {
        return;
    };
    let cache = KernelCache::new();
    let mut rng = common::rng("determinism", &log);
    for reduction in reductions(&ctx) {
        pollster::block_on(kernel_cases::check_linear_deterministic(
            &ctx, &cache, reduction, &mut rng,
        ))
        .unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]
fn pipelines_are_cached_by_defines() {
    let Some(ctx) = common::native_gpu(GpuOptions::default()) else {
        return;
    };
    let cache = KernelCache::new();
    let r = Reduction::Workgroup;
    pollster::block_on(async {
        // a linear layer builds two pipelines: decode and prefill
        Linear::new(&ctx, &cache, DType::F32, r, false, false)
            .await
            .unwrap();
        Linear::new(&ctx, &cache, DType::F32, r, false, false)
            .await
            .unwrap();
        assert_eq!(cache.len(), 2, "same keys, the same two pipelines");
        Linear::new(&ctx, &cache, DType::F32, r, true, false)
            .await
            .unwrap();
        assert_eq!(cache.len(), 4, "bias is a different define");
    });
}

#[test]
fn broken_shader_is_an_error_naming_file_and_entry() {
    let Some(ctx) = common::native_gpu(GpuOptions::default()) else {
        return;
    };
    let cache = KernelCache::new();
    let bad = ShaderFile {
        name: "broken.wgsl",
        source: "@compute @workgroup_size(1) fn main() { let x: u32 = undefined_thing; }",
    };
    let err = pollster::block_on(cache.pipeline(&ctx, &bad, "main", &Defines::new()))
        .expect_err("an undefined identifier must not compile");
    let msg = err.to_string();
    assert!(matches!(err, Error::Shader { .. }), "{msg}");
    assert!(msg.contains("broken.wgsl") && msg.contains("main"), "{msg}");
    // the failure was captured by the scope, so the device is still healthy
    ctx.check().expect("no stray uncaptured error");
    assert!(cache.is_empty());
}

#[test]
fn oversized_buffer_fails_before_allocating() {
    let Some(ctx) = common::native_gpu(GpuOptions::default()) else {
        return;
    };
    let too_big = ctx.limits().max_storage_buffer_binding_size + 4;
    let err = ctx.storage_zeroed("kv cache", too_big).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::Limit { .. }), "{msg}");
    assert!(
        msg.contains("kv cache") && msg.contains("maxStorageBufferBindingSize"),
        "{msg}"
    );
}

#[test]
fn subgroup_reduction_without_the_feature_is_refused() {
    let Some(ctx) = common::native_gpu(GpuOptions {
        allow_subgroups: false,
        ..GpuOptions::default()
    }) else {
        return;
    };
    assert!(!ctx.has_subgroups());
    let err = pollster::block_on(Linear::new(
        &ctx,
        &KernelCache::new(),
        DType::F32,
        Reduction::Subgroup,
        false,
        false,
    ))
    .unwrap_err();
    assert!(err.to_string().contains("subgroups"), "{err}");
}

#[test]
fn device_loss_is_an_error_not_a_panic() {
    let Some(ctx) = common::native_gpu(GpuOptions::default()) else {
        return;
    };
    let buf = ctx.storage_from("data", &[1.0f32, 2.0, 3.0]).unwrap();
    assert_eq!(
        pollster::block_on(ctx.read_f32(&buf, 3)).unwrap(),
        [1.0, 2.0, 3.0]
    );
    ctx.destroy_for_test();
    let err =
        pollster::block_on(ctx.read_f32(&buf, 3)).expect_err("a destroyed device reads nothing");
    assert!(matches!(err, Error::DeviceLost { .. }), "{err}");
    assert!(ctx.is_lost());
}
