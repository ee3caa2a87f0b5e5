//! The GPU forward pass against the float64 goldens, shared by the native test
//! (`tests/gpu/forward_golden.rs`, on lavapipe) and the browser test (`tests/web/forward.rs`, on
//! WebGPU): teacher-forced prefill, decode one token at a time through the KV cache, and greedy
//! decoding. Every check returns the largest |logit − f64| it saw, or a message naming what
//! failed.

use emberlm::backend::gpu::Forward;
use emberlm::backend::gpu::{GpuContext, KernelCache};
use emberlm::model::weights::ModelWeights;

use super::golden::{Golden, GoldenResult};

/// Prefill chunk sizes of [`check_model`]: the whole sequence in one step, and small steps
/// that split every prompt.
pub const CHUNKS: [usize; 2] = [64, 5];

/// The KV cache size the checks use: enough for every golden sequence.
pub fn context(weights: &ModelWeights<'_>) -> usize {
    weights.config.context_length.min(256)
}

/// Index of the largest value (the first one on ties).
pub fn argmax(v: &[f32]) -> u32 {
    v.iter()
        .enumerate()
        .fold(
            (0, f32::NEG_INFINITY),
            |b, (i, &x)| if x > b.1 { (i, x) } else { b },
        )
        .0 as u32
}

/// Runs `prompt_tokens + f64_greedy_tokens` from position 0 in `fwd`'s chunks, all logits
/// kept, and checks them.
pub async fn check_prefill(
    ctx: &GpuContext,
    fwd: &mut Forward,
    r: &GoldenResult,
    tol: f64,
    nll_tol: f64,
) -> Result<f64, String> {
    let vocab = fwd.config().vocab_size;
    fwd.truncate(0).map_err(|e| e.to_string())?;
    let logits = fwd
        .forward(ctx, &r.sequence(), true)
        .await
        .map_err(|e| e.to_string())?;
    r.check(&logits, vocab, tol, nll_tol)
}

/// Runs the same sequence one token per step through the KV cache and checks every row.
pub async fn check_decode(
    ctx: &GpuContext,
    fwd: &mut Forward,
    r: &GoldenResult,
    tol: f64,
    nll_tol: f64,
) -> Result<f64, String> {
    let vocab = fwd.config().vocab_size;
    fwd.truncate(0).map_err(|e| e.to_string())?;
    let mut rows = Vec::new();
    for &t in &r.sequence() {
        rows.extend(
            fwd.forward(ctx, &[t], true)
                .await
                .map_err(|e| e.to_string())?,
        );
    }
    r.check(&rows, vocab, tol, nll_tol)
}

/// After [`check_prefill`] of the same result (the whole sequence in `fwd`'s KV cache):
/// truncates the cache to all but the last `n` tokens and decodes those `n` one per step, its
/// keys and values before them those of the prefill, and checks the `n` rows against the f64
/// path, without prefilling the sequence again (on SwiftShader, a real model's prefill takes a
/// minute).
pub async fn check_tail_after_prefill(
    ctx: &GpuContext,
    fwd: &mut Forward,
    r: &GoldenResult,
    n: usize,
    tol: f64,
) -> Result<f64, String> {
    let vocab = fwd.config().vocab_size;
    let seq = r.sequence();
    let n = n.clamp(1, r.f64_greedy_tokens.len());
    let split = seq.len() - n;
    fwd.truncate(split).map_err(|e| e.to_string())?;
    let mut rows = Vec::with_capacity(n * vocab);
    for &t in &seq[split..] {
        rows.extend(
            fwd.forward(ctx, &[t], true)
                .await
                .map_err(|e| e.to_string())?,
        );
    }
    // the first decoded row is that of position split, path row split + 1 - prompt_tokens.len()
    r.check_path_from(&rows, vocab, tol, split + 1 - r.prompt_tokens.len())
}

/// Prefills the prompt, then feeds back the argmax: the tokens must be the first `steps` of
/// `f64_greedy_tokens`.
pub async fn check_greedy(
    ctx: &GpuContext,
    fwd: &mut Forward,
    r: &GoldenResult,
    steps: usize,
) -> Result<(), String> {
    let want = &r.f64_greedy_tokens[..steps.min(r.f64_greedy_tokens.len())];
    fwd.truncate(0).map_err(|e| e.to_string())?;
    let mut last = fwd
        .forward(ctx, &r.prompt_tokens, false)
        .await
        .map_err(|e| e.to_string())?;
    let mut generated = Vec::new();
    while generated.len() < want.len() {
        let next = argmax(&last);
        generated.push(next);
        if generated.len() < want.len() {
            last = fwd
                .forward(ctx, &[next], false)
                .await
                .map_err(|e| e.to_string())?;
        }
    }
    if generated != want {
        return Err(format!(
            "{:?}: greedy {generated:?}, f64 says {want:?}",
            r.prompt
        ));
    }
    Ok(())
}

/// How many golden prompts [`check_model`] also decodes token by token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decode {
    /// Every prompt (native).
    All,
    /// Only the longest sequence (the browser, where every step costs a submit and a readback
    /// on SwiftShader): greedy still runs one token per step on every prompt.
    Longest,
    /// Only the longest sequence, and no greedy runs: where steps are slow (a GPU-shaped plan
    /// on a software adapter, the browser's many models). The decoded sequence is the prompt
    /// plus the f64 greedy tokens, so its logits already cover the greedy path; the caller
    /// checks the argmax chain itself elsewhere.
    LongestWithoutGreedy,
    /// For the slowest shapes (a real model in a GPU-shaped plan on a software adapter, ~2 s a
    /// step): every prompt prefilled in one chunk (the longest last), then its last `n` tokens
    /// decoded again one per step through the KV cache the prefill left (with more keys than
    /// the split threshold of the forced plans). No small chunks, no greedy runs: the other
    /// shape and the tiny models cover those.
    Tail(usize),
}

/// Every prompt of `golden` through `weights` (`name` goes into error messages): prefill in
/// each of [`CHUNKS`]; with the small chunks also greedy, and decode token by token on the
/// prompts `decode` selects. Returns the largest |logit − f64|.
#[allow(clippy::too_many_arguments)]
pub async fn check_model(
    name: &str,
    ctx: &GpuContext,
    cache: &KernelCache,
    weights: &ModelWeights<'_>,
    golden: &Golden,
    tol: f64,
    nll_tol: f64,
    decode: Decode,
) -> Result<f64, String> {
    let longest = (0..golden.results.len())
        .max_by_key(|&i| golden.results[i].sequence().len())
        .unwrap_or(0);
    let mut worst = 0.0f64;
    if let Decode::Tail(n) = decode {
        let mut fwd = Forward::new(ctx, cache, weights, context(weights), CHUNKS[0])
            .await
            .map_err(|e| format!("{name}: {e}"))?;
        // the longest last, so that its decode starts from its prefill's KV cache
        let order = (0..golden.results.len())
            .filter(|&i| i != longest)
            .chain([longest]);
        for i in order {
            let d = check_prefill(ctx, &mut fwd, &golden.results[i], tol, nll_tol)
                .await
                .map_err(|e| format!("{name} prefill (chunk {}): {e}", CHUNKS[0]))?;
            worst = worst.max(d);
        }
        let d = check_tail_after_prefill(ctx, &mut fwd, &golden.results[longest], n, tol)
            .await
            .map_err(|e| format!("{name} decode of the last {n} tokens: {e}"))?;
        return Ok(worst.max(d));
    }
    for chunk in CHUNKS {
        let mut fwd = Forward::new(ctx, cache, weights, context(weights), chunk)
            .await
            .map_err(|e| format!("{name}: {e}"))?;
        for (i, r) in golden.results.iter().enumerate() {
            let d = check_prefill(ctx, &mut fwd, r, tol, nll_tol)
                .await
                .map_err(|e| format!("{name} prefill (chunk {chunk}): {e}"))?;
            worst = worst.max(d);
            if chunk != CHUNKS[1] {
                continue;
            }
            if decode == Decode::All || i == longest {
                let d = check_decode(ctx, &mut fwd, r, tol, nll_tol)
                    .await
                    .map_err(|e| format!("{name} decode: {e}"))?;
                worst = worst.max(d);
            }
            if decode != Decode::LongestWithoutGreedy {
                check_greedy(ctx, &mut fwd, r, r.f64_greedy_tokens.len())
                    .await
                    .map_err(|e| format!("{name} greedy: {e}"))?;
            }
        }
    }
    Ok(worst)
}
