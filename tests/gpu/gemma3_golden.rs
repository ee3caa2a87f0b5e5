//! Gemma 3 270M (Q4_K_M: F32, Q5_0, Q4_K, Q8_0 and Q6_K tensors; a tied Q8_0 embedding of
//! 178 MB, larger than lavapipe's 128 MiB storage binding, so split across bindings) against
//! the float64 goldens at 3e-2: the short prompts teacher-forced through one prefill (every
//! row, with the prompt NLL); the 805-token prompt, past the 512-key window of the local
//! layers, prefilled in chunks and then decoded token by token along the path.
//! Greedy tokens equal f64's wherever the margin allows.

#![cfg(not(target_arch = "wasm32"))]

use crate::common;

use std::path::PathBuf;

use common::golden::Golden;
use emberlm::forward::Forward;
use emberlm::gpu::KernelCache;
use emberlm::loader::ModelFiles;
use emberlm::GpuOptions;

const TOL: f64 = 3e-2;

fn golden() -> Golden {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/golden/gemma-3-270m-q4_k_m.golden.json");
    Golden::parse(&std::fs::read_to_string(path).unwrap())
}

#[test]
fn gemma3_matches_f64_goldens_through_prefill_and_decode() {
    let Some(model) = common::require::gemma3() else {
        return;
    };
    let Some(ctx) = common::native_gpu(GpuOptions::default()) else {
        return;
    };
    let golden = golden();
    let files = ModelFiles::open(&model).unwrap();
    let weights = files.weights().unwrap();
    let vocab = weights.config.vocab_size;
    let long = golden
        .results
        .iter()
        .max_by_key(|r| r.sequence().len())
        .unwrap();
    let longest = long.sequence().len();
    assert!(longest > 512, "the goldens run past the window");
    let cache = KernelCache::new();
    let mut fwd = pollster::block_on(Forward::new(&ctx, &cache, &weights, longest, 64)).unwrap();
    let run = |fwd: &mut Forward, tokens: &[u32], all: bool| {
        pollster::block_on(fwd.forward(&ctx, tokens, all)).unwrap()
    };
    let mut worst = 0.0f64;
    for r in &golden.results {
        let seq = r.sequence();
        let first = r.prompt_tokens.len() - 1;
        if seq.len() < 64 {
            // one prefill of the whole path, every row: the top-5 and the prompt NLL
            fwd.truncate(0).unwrap();
            let rows = run(&mut fwd, &seq, true);
            worst = worst.max(
                r.check(&rows, vocab, TOL, TOL / 2.0)
                    .unwrap_or_else(|e| panic!("prefill: {e}")),
            );
        }
        if !std::ptr::eq(r, long) {
            // decode along the path is checked on the long prompt (past the window, the harder
            // case) and on the tiny Gemma 3 models; each step here costs a 262,144-wide head
            continue;
        }
        // the prompt but its last token in chunks, then the path one token a step
        fwd.truncate(0).unwrap();
        run(&mut fwd, &seq[..first], false);
        let mut rows = Vec::new();
        for &t in &seq[first..] {
            rows.extend(run(&mut fwd, &[t], true));
        }
        worst = worst.max(
            r.check_path(&rows, vocab, TOL)
                .unwrap_or_else(|e| panic!("decode: {e}")),
        );
    }
    eprintln!("Gemma 3 270M: max |Δ logit| vs f64 = {worst:.2e}");
}
