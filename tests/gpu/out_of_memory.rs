//! A GPU that runs out of memory while a model loads: the load fails with `OutOfMemory`
//! naming what it was allocating (a tensor, the KV cache, the activations) and how much it
//! had made, every buffer it made is freed (the driver's own allocator report returns to where
//! it was), and the same device then loads the model and answers as a fresh load does.
//!
//! No adapter runs out of memory on demand, so the device's answer is simulated
//! (`GpuContext::out_of_memory_past_for_test`: the allocation scopes report out-of-memory once
//! more bytes than given were created); the scopes, the error and the cleanup are the real ones.

#![cfg(not(target_arch = "wasm32"))]

use crate::common;
use common::memory_files::open_ranged;

use std::path::Path;

use emberlm::backend::gpu::{Forward, GpuContext, KernelCache};
use emberlm::backend::DEFAULT_CHUNK;
use emberlm::loader::ModelFiles;
use emberlm::{Error, GpuOptions};

const FIXTURE: &str = "tiny-llama-q4_1.gguf";
const CONTEXT: usize = 64;

fn fixture() -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(FIXTURE);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Bytes the driver's allocator holds once every dropped buffer is gone (`None` where
/// the backend gives no report; Vulkan, lavapipe's included, does).
fn driver_allocated(ctx: &GpuContext) -> Option<u64> {
    // a buffer filled at creation stays with the queue's pending writes until a submit
    ctx.queue.submit([]);
    let _ = ctx.device.poll(wgpu::PollType::wait_indefinitely());
    ctx.device
        .generate_allocator_report()
        .map(|r| r.total_allocated_bytes)
}

/// A load of the fixture on `ctx`, whole (`ranged: false`) or read by range.
fn load(ctx: &GpuContext, cache: &KernelCache, ranged: bool) -> emberlm::Result<Forward> {
    let bytes = fixture();
    if ranged {
        let (_source, model) = open_ranged(&[(FIXTURE, bytes)]);
        let model = model.unwrap();
        return pollster::block_on(Forward::new_read(
            ctx,
            cache,
            model.layout(),
            &model,
            CONTEXT,
            DEFAULT_CHUNK,
            &mut |_, _| {},
        ));
    }
    let files = ModelFiles::from_parts(vec![(bytes, FIXTURE.to_string())]).unwrap();
    let weights = files.weights().unwrap();
    pollster::block_on(Forward::new(ctx, cache, &weights, CONTEXT, DEFAULT_CHUNK))
}

fn logits(ctx: &GpuContext, forward: &mut Forward) -> Vec<f32> {
    let tokens: Vec<u32> = (0..9u32).map(|i| (i * 41 + 3) % 200).collect();
    pollster::block_on(forward.forward(ctx, &tokens, true)).unwrap()
}

#[test]
fn running_out_of_gpu_memory_fails_the_load_by_name_and_frees_what_it_made() {
    // a device of its own: the simulated limit must not reach other tests' loads
    let Some(ctx) = common::native_gpu(GpuOptions::default()) else {
        return;
    };
    let cache = KernelCache::new();
    for ranged in [false, true] {
        let mut fresh = load(&ctx, &cache, ranged).unwrap();
        let want = logits(&ctx, &mut fresh);
        let report = fresh.memory();
        drop(fresh);
        let before = driver_allocated(&ctx);
        let (w, kv) = (report.weights, report.kv_cache);
        assert!(w > 0 && kv > 0 && report.activations > 0, "{report:?}");
        for (past, naming) in [
            (w / 2, "tensor"),
            (w + kv / 2, "the KV cache of 64 positions"),
            (w + kv, "the activations of"),
        ] {
            ctx.out_of_memory_past_for_test(Some(past));
            let err = load(&ctx, &cache, ranged)
                .err()
                .unwrap_or_else(|| panic!("ranged {ranged}: a load past {past} bytes succeeded"));
            let Error::OutOfMemory {
                what, allocated, ..
            } = &err
            else {
                panic!("ranged {ranged}, past {past}: not OutOfMemory: {err}");
            };
            let what_ok = match naming {
                // the whole load makes a tensor at a time, the ranged one a layer's at a time
                "tensor" => what.starts_with("tensor `") || what.ends_with("'s tensors"),
                n => what.starts_with(n),
            };
            assert!(
                what_ok,
                "ranged {ranged}, past {past}: `{what}` is not {naming}…"
            );
            assert!(
                *allocated > past,
                "ranged {ranged}: reported {allocated} bytes made, not past {past}"
            );
            assert_eq!(err.kind(), "OutOfMemory");
            let message = err.to_string();
            assert!(
                message.contains("ran out of memory") && message.contains(what.as_str()),
                "{message}"
            );
            assert_eq!(
                driver_allocated(&ctx),
                before,
                "ranged {ranged}, out of memory at {what}: buffers left behind"
            );
            ctx.check().expect("the device stays usable");
        }
        ctx.out_of_memory_past_for_test(None);
        let mut again = load(&ctx, &cache, ranged).unwrap();
        assert_eq!(
            logits(&ctx, &mut again),
            want,
            "ranged {ranged}: the load after the failures answers as the first"
        );
    }
}
