//! The GPU forward pass against the float64 goldens: every fixture model (GGUF and HF
//! folders) and SmolLM2, through prefill (one chunk and several) and through decode (one token
//! at a time through the KV cache), plus greedy decoding.

#![cfg(not(target_arch = "wasm32"))]

use crate::common;

use std::path::{Path, PathBuf};

use common::forward_cases::{self, Decode};
use common::golden::{Golden, TINY_MODELS};
use emberlm::backend::gpu::{KernelCache, KernelOverrides, SplitOverride, Variant};
use emberlm::loader::ModelFiles;
use emberlm::{GpuContext, GpuOptions};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Which golden prompts [`check`] runs.
#[derive(Clone, Copy, PartialEq)]
enum Prompts {
    All,
    /// Only the longest sequence.
    Longest,
}

/// Runs the golden prompts of `golden_file` through `model` as `decode` says and checks each.
fn check(
    (ctx, cache): (&GpuContext, &KernelCache),
    model: &Path,
    golden_file: &str,
    tol: f64,
    decode: Decode,
    prompts: Prompts,
) {
    let mut golden = Golden::parse(
        &std::fs::read_to_string(root().join("tests/fixtures/golden").join(golden_file)).unwrap(),
    );
    if prompts == Prompts::Longest {
        let longest = (0..golden.results.len())
            .max_by_key(|&i| golden.results[i].sequence().len())
            .unwrap();
        golden.results = vec![golden.results.swap_remove(longest)];
    }
    let start = std::time::Instant::now();
    let files = ModelFiles::open(model).unwrap();
    let weights = files.weights().unwrap();
    let name = model.display().to_string();
    let worst = pollster::block_on(forward_cases::check_model(
        &name,
        ctx,
        cache,
        &weights,
        &golden,
        tol,
        tol / 2.0,
        decode,
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    eprintln!(
        "{name}: max |Δ logit| vs f64 = {worst:.2e} ({:.1} s)",
        start.elapsed().as_secs_f64()
    );
}

/// A context whose every kernel family runs `variant`, with attention splitting the keys of
/// decode steps from 14 keys on into splits of 7 (flash-decoding, which the engine's policy
/// keeps for contexts far longer than these models'), so the goldens cover the split path
/// through the whole graph too.
fn forced(variant: Variant) -> GpuOptions {
    GpuOptions {
        kernels: KernelOverrides::all(variant).with_split(SplitOverride::Keys(7)),
        ..GpuOptions::default()
    }
}

#[test]
fn tiny_models_match_f64_goldens() {
    let Some(gpu) = common::shared_native_gpu(GpuOptions::default()) else {
        return;
    };
    let fx = root().join("tests/fixtures");
    for (model, golden) in TINY_MODELS {
        check(
            gpu,
            &fx.join(model),
            golden,
            2e-3,
            Decode::All,
            Prompts::All,
        );
    }
}

/// Every tiny model with each kernel family forced to each variant: every prompt prefilled in
/// one chunk and in chunks of 5, the longest decoded token by token with every row checked.
/// Decoding every prompt and the argmax chain on every prompt (greedy) run in the default plan
/// above: they run the same kernels as the longest prompt's decode, one step at a time (most of
/// this test's time when it ran them per variant: 539 s of both cores on lavapipe).
///
/// The models are those whose dispatches differ ([`in_every_variant`]). The Hugging Face folders
/// run in the default plan above: GPT-2's runs its f32 GGUF twin's dispatches, and the Llama
/// folders differ from their twins only in the RoPE layout (rotate-half, from the unpermuted
/// Q/K weights), which the Qwen 2, Qwen 3, Phi-3 and Gemma 3 files run in every shape.
#[test]
fn tiny_models_match_f64_goldens_in_every_kernel_variant() {
    for variant in Variant::EVERY_FAMILY {
        let Some(gpu) = common::shared_native_gpu(forced(variant)) else {
            return;
        };
        eprintln!("every kernel family forced to {variant}");
        let fx = root().join("tests/fixtures");
        for (model, golden) in TINY_MODELS {
            if !in_every_variant(model, variant) {
                continue;
            }
            check(
                gpu,
                &fx.join(model),
                golden,
                2e-3,
                Decode::LongestWithoutGreedy,
                Prompts::All,
            );
        }
    }
}

/// The files [`in_every_variant`] keeps in the quick tier.
const QUICK_EVERY_VARIANT: [&str; 6] = [
    "tiny-gpt2-f16.gguf",
    "tiny-llama-q4_1.gguf",
    "tiny-llama-256-q4_k_m.gguf",
    "tiny-qwen3-q8_0.gguf",
    "tiny-phi3-f32.gguf",
    "tiny-gemma3-f32.gguf",
];

/// Whether [`tiny_models_match_f64_goldens_in_every_kernel_variant`] runs `model` in `variant`:
/// every GGUF file in the rows shape (lavapipe's own, ~1-4 s a model); in the workgroup shape
/// (~5× slower here) every architecture and weight type once: of the 256-wide Llamas, whose
/// K-quant kernels the others lack, the Q4_K_M file (Q4_K and Q6_K tensors) and the Q5_K_M
/// file (Q5_K); their f32 and Q6_K twins add no kernel (each took ~18 s of the ~200 s).
///
/// The quick tier (`./build.sh test --quick`) runs one file per architecture and weight-type
/// family in each shape: GPT-2 on f16, Llama on Q4_1 and on Q4_K_M, Qwen 3 on Q8_0, Phi-3 and
/// Gemma 3.
fn in_every_variant(model: &str, variant: Variant) -> bool {
    if !model.ends_with(".gguf") {
        return false;
    }
    if common::require::quick_tier() {
        return QUICK_EVERY_VARIANT.contains(&model);
    }
    variant == Variant::ROWS
        || !matches!(
            model,
            "tiny-llama-256-f32.gguf" | "tiny-llama-256-q6_k.gguf"
        )
}

#[test]
fn smollm2_matches_f64_goldens() {
    let Some(model) = common::require::smollm2() else {
        return;
    };
    // both kernel shapes, prefilling in one chunk and decoding the last tokens of the longest
    // prompt through the KV cache: the rows shape (lavapipe's own) every prompt and the last
    // 8 tokens; the workgroup shape, ~4× slower on lavapipe (138 s against 38 s with every
    // prompt), the longest prompt and its last 4 tokens. The small chunks, decoding every
    // position and the argmax chain run on the tiny models in every shape, and for SmolLM2 in
    // the browser and on the CPU backend.
    for (variant, tail, prompts) in [
        (Variant::ROWS, 8, Prompts::All),
        (Variant::WORKGROUP, 4, Prompts::Longest),
    ] {
        let Some(gpu) = common::shared_native_gpu(forced(variant)) else {
            return;
        };
        eprintln!("every kernel family forced to {variant}");
        check(
            gpu,
            &model,
            "smollm2-135m-q4_1.golden.json",
            2e-2,
            Decode::Tail(tail),
            prompts,
        );
    }
}
