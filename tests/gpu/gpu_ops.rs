//! Native GPU tests of the step-aware ops (RoPE + KV-cache write, attention, the SwiGLU gate)
//! against the CPU reference, and their argument checks; the cases live in
//! `tests/common/ops_cases.rs` and `tests/common/attention_cases.rs` and also run in the
//! browser (`tests/web/ops.rs`).
//!
//! Without an adapter these tests print why and pass, unless `EMBERLM_REQUIRE_GPU=1` is set
//! (as `./build.sh test` does), in which case they fail.

#![cfg(not(target_arch = "wasm32"))]

use crate::common;

use common::kernel_cases::reductions;
use common::{attention_cases, ops_cases};
use emberlm::backend::gpu::{
    Attention, Heads, KernelCache, KeySplit, Qkv, Reduction, RopeKvWrite, StepParams, SwiGlu,
};
use emberlm::config::RopeLayout;
use emberlm::GpuOptions;

fn log(msg: &str) {
    eprintln!("{msg}");
}

fn ok(what: &str, started: std::time::Instant, result: Result<f32, String>) {
    match result {
        Ok(worst) => log(&format!(
            "{what}: ok (worst error / tolerance {worst:.3}, {:.2} s)",
            started.elapsed().as_secs_f64()
        )),
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn rope_kv_write_matches_reference() {
    let Some(ctx) = common::native_gpu(GpuOptions::default()) else {
        return;
    };
    let cache = KernelCache::new();
    let mut rng = common::rng("rope", &log);
    for layout in [
        RopeLayout::Interleaved,
        RopeLayout::RotateHalf,
        RopeLayout::None,
    ] {
        let t = std::time::Instant::now();
        let r = pollster::block_on(ops_cases::check_rope(
            &ctx,
            &cache,
            layout,
            ops_cases::ROPE_CASES,
            &mut rng,
        ));
        ok(&format!("rope {layout:?}"), t, r);
    }
}

#[test]
fn attention_matches_reference() {
    let Some(ctx) = common::native_gpu(GpuOptions::default()) else {
        return;
    };
    let cache = KernelCache::new();
    let mut rng = common::rng("attention", &log);
    for reduction in reductions(&ctx) {
        let t = std::time::Instant::now();
        let r = pollster::block_on(attention_cases::check_attention(
            &ctx,
            &cache,
            reduction,
            attention_cases::ATTENTION_CASES,
            &mut rng,
        ));
        ok(&format!("attention {reduction:?}"), t, r);
    }
}

#[test]
fn attention_long_context_matches_reference() {
    let Some(ctx) = common::native_gpu(GpuOptions::default()) else {
        return;
    };
    let cache = KernelCache::new();
    let mut rng = common::rng("attention long", &log);
    // the subgroup path where there is one (the faster of the two on a GPU), else the tree
    let reduction = Reduction::best(&ctx);
    let t = std::time::Instant::now();
    let r = pollster::block_on(attention_cases::check_attention(
        &ctx,
        &cache,
        reduction,
        attention_cases::ATTENTION_LONG_CASES,
        &mut rng,
    ));
    ok(&format!("attention 3000 positions {reduction:?}"), t, r);
}

#[test]
fn rope_and_attention_over_a_step_sequence() {
    let Some(ctx) = common::native_gpu(GpuOptions::default()) else {
        return;
    };
    let cache = KernelCache::new();
    let mut rng = common::rng("step sequence", &log);
    for (reduction, layout) in [
        (Reduction::Workgroup, RopeLayout::RotateHalf),
        (Reduction::best(&ctx), RopeLayout::Interleaved),
    ] {
        let t = std::time::Instant::now();
        let r = pollster::block_on(attention_cases::check_step_sequence(
            &ctx, &cache, reduction, layout, &mut rng,
        ));
        ok(&format!("step sequence {reduction:?} {layout:?}"), t, r);
    }
}

#[test]
fn elementwise_matches_reference() {
    let Some(ctx) = common::native_gpu(GpuOptions::default()) else {
        return;
    };
    let cache = KernelCache::new();
    let mut rng = common::rng("elementwise", &log);
    let t = std::time::Instant::now();
    let r = pollster::block_on(ops_cases::check_elementwise(
        &ctx,
        &cache,
        ops_cases::ELEMENTWISE_CASES,
        &mut rng,
    ));
    ok("elementwise", t, r);
}

/// Asserts that `result` failed naming `name` (as `` `name` ``).
fn names<T: std::fmt::Debug>(result: emberlm::Result<T>, name: &str) {
    let err = result.expect_err(&format!("expected an error naming `{name}`"));
    let msg = err.to_string();
    assert!(msg.contains(&format!("`{name}`")), "{name}: {msg}");
}

#[test]
fn bad_arguments_are_rejected_naming_them() {
    let Some(ctx) = common::native_gpu(GpuOptions::default()) else {
        return;
    };
    let cache = KernelCache::new();
    let buf = |floats: u64| ctx.storage_zeroed("b", floats * 4).unwrap();
    let step = StepParams::create_buffer(&ctx, "step");
    let not_uniform = buf(4);
    let small_step = ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("small step"),
        size: 8,
        usage: wgpu::BufferUsages::UNIFORM,
        mapped_at_creation: false,
    });
    let heads = Heads {
        n_heads: 4,
        n_kv_heads: 2,
        head_dim: 16,
    };
    let (max_tokens, max_positions) = (3u32, 10u32);
    let (q, k, v) = (buf(3 * 64), buf(3 * 32), buf(3 * 32));
    let (kc, vc) = (buf(10 * 32), buf(10 * 32));
    pollster::block_on(async {
        let r = Reduction::Workgroup;
        let rope = RopeKvWrite::new(&ctx, &cache, RopeLayout::RotateHalf)
            .await
            .unwrap();
        let sep = Qkv {
            q: &q,
            k: &k,
            v: &v,
        };
        let bind = |qkv, kc, vc, heads, theta, positions| {
            rope.bind(
                &ctx, &step, qkv, kc, vc, heads, theta, positions, max_tokens,
            )
        };
        bind(sep, &kc, &vc, heads, 1e4, max_positions).unwrap();
        names(
            rope.bind(
                &ctx,
                &not_uniform,
                sep,
                &kc,
                &vc,
                heads,
                1e4,
                max_positions,
                max_tokens,
            ),
            "step",
        );
        names(bind(sep, &kc, &vc, heads, 1e4, 11), "k_cache");
        names(bind(sep, &kc, &kc, heads, 1e4, max_positions), "k_cache");
        names(bind(sep, &kc, &vc, heads, 0.5, max_positions), "theta");
        let odd = Heads {
            head_dim: 15,
            ..heads
        };
        names(bind(sep, &kc, &vc, odd, 1e4, max_positions), "head_dim");
        let wide = Heads {
            n_heads: 1,
            n_kv_heads: 1,
            head_dim: 512,
        };
        names(bind(sep, &kc, &vc, wide, 1e4, 1), "head_dim");
        let ungrouped = Heads {
            n_kv_heads: 3,
            ..heads
        };
        names(
            bind(sep, &kc, &vc, ungrouped, 1e4, max_positions),
            "n_kv_heads",
        );
        let aliased = Qkv {
            q: &q,
            k: &kc,
            v: &v,
        };
        names(
            bind(aliased, &kc, &vc, heads, 1e4, max_positions),
            "k_cache",
        );
        let short_q = buf(3 * 64 - 1);
        let short = Qkv {
            q: &short_q,
            k: &k,
            v: &v,
        };
        names(bind(short, &kc, &vc, heads, 1e4, max_positions), "q");

        let attn = Attention::new(&ctx, &cache, r).await.unwrap();
        let out = buf(3 * 64);
        let bind = |q_stride, out, heads, positions| {
            attn.bind(
                &ctx, &step, &q, q_stride, &kc, &vc, out, heads, positions, max_tokens, None,
            )
        };
        bind(64, &out, heads, max_positions).unwrap();
        names(bind(63, &out, heads, max_positions), "q_row_stride");
        names(bind(65, &out, heads, max_positions), "q");
        names(bind(64, &q, heads, max_positions), "out");
        names(bind(64, &out, heads, 11), "k_cache");
        names(
            bind(
                64,
                &out,
                Heads {
                    n_heads: 0,
                    ..heads
                },
                max_positions,
            ),
            "n_heads",
        );
        // split attention: a scratch too small, a zero split length, a scratch that is `out`
        let split_bind = |keys_per_split, scratch| {
            let split = KeySplit {
                keys_per_split,
                min_keys: 1,
                max_tokens,
            };
            attn.bind(
                &ctx,
                &step,
                &q,
                64,
                &kc,
                &vc,
                &out,
                heads,
                max_positions,
                max_tokens,
                Some((split, scratch)),
            )
        };
        let heads_len = |kps: u32| {
            KeySplit {
                keys_per_split: kps,
                min_keys: 1,
                max_tokens,
            }
            .scratch_len(heads, max_positions)
        };
        let scratch = buf(heads_len(5));
        split_bind(5, &scratch).unwrap();
        names(split_bind(4, &scratch), "split scratch");
        names(split_bind(0, &scratch), "keys_per_split");
        let big = buf(heads_len(1));
        names(split_bind(1, &out), "split scratch");
        split_bind(1, &big).unwrap();

        let swiglu = SwiGlu::new(&ctx, &cache).await.unwrap();
        names(swiglu.bind_fused(&ctx, &step, &k, &out, 17, 3), "gate_up");
        names(swiglu.bind(&ctx, &step, &q, &k, &buf(10), 16, 3), "out");
        names(swiglu.bind(&ctx, &step, &q, &k, &out, 0, 3), "n");
        names(swiglu.bind(&ctx, &step, &q, &k, &out, 16, 0), "max_tokens");
        names(swiglu.bind(&ctx, &small_step, &q, &k, &out, 16, 3), "step");
    });
    ctx.check()
        .expect("argument errors are caught before reaching the GPU");
}

#[test]
fn step_params_are_checked_against_the_bound_sizes() {
    assert_eq!(
        StepParams::checked(5, 3, 4, 8).unwrap(),
        StepParams::new(5, 3)
    );
    for (pos0, n, name) in [
        (0, 0, "n_tokens"),
        (0, 5, "n_tokens"),
        (6, 3, "pos0"),
        (u32::MAX, 1, "pos0"),
    ] {
        let msg = StepParams::checked(pos0, n, 4, 8).unwrap_err().to_string();
        assert!(msg.contains(&format!("`{name}`")), "{msg}");
    }
}
