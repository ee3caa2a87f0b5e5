//! The CPU forward pass against the float64 goldens, shared by the native test
//! (`tests/cpu_golden.rs`) and the browser test (`tests/web_cpu.rs`): teacher-forced prefill
//! in one chunk and in small ones, decode one token at a time through the KV cache, and
//! greedy decoding. Returns the largest |logit − f64| seen, or a message naming what failed.

use emberlm::forward::cpu::CpuForward;
use emberlm::forward::Readback;
use emberlm::model::weights::ModelWeights;

use super::golden::Golden;

/// Index of the largest value (the first one on ties).
fn argmax(v: &[f32]) -> u32 {
    v.iter()
        .enumerate()
        .fold(
            (0, f32::NEG_INFINITY),
            |b, (i, &x)| if x > b.1 { (i, x) } else { b },
        )
        .0 as u32
}

fn logits(fwd: &mut CpuForward, tokens: &[u32], all: bool) -> Result<Vec<f32>, String> {
    let readback = if all {
        Readback::AllRows
    } else {
        Readback::LastRow
    };
    match fwd.run(tokens, readback).map_err(|e| e.to_string())? {
        emberlm::forward::Output::Logits(l) => Ok(l),
        other => Err(format!("expected logits, got {other:?}")),
    }
}

/// Every prompt of `golden` through `weights` on the CPU: prefill in chunks of 64 and 5,
/// decode token by token (every prompt when `decode_all`, else the longest), and greedy
/// decoding when `greedy` (exact only where the activations stay f32: 8-bit activations may
/// flip a near-tie, which the tolerance of the logits covers instead).
pub fn check_model(
    name: &str,
    weights: &ModelWeights<'_>,
    golden: &Golden,
    tol: f64,
    nll_tol: f64,
    decode_all: bool,
    greedy: bool,
) -> Result<f64, String> {
    let longest_seq = golden
        .results
        .iter()
        .map(|r| r.sequence().len())
        .max()
        .unwrap_or(1);
    let context = weights.config.context_length.min(longest_seq.max(256));
    let longest = (0..golden.results.len())
        .max_by_key(|&i| golden.results[i].sequence().len())
        .unwrap_or(0);
    let mut worst = 0.0f64;
    for chunk in [64, 5] {
        let mut fwd =
            CpuForward::new(weights, context, chunk).map_err(|e| format!("{name}: {e}"))?;
        for (i, r) in golden.results.iter().enumerate() {
            let vocab = fwd.config().vocab_size;
            fwd.truncate(0).map_err(|e| e.to_string())?;
            let all = logits(&mut fwd, &r.sequence(), true)?;
            worst = worst.max(
                r.check(&all, vocab, tol, nll_tol)
                    .map_err(|e| format!("{name} prefill (chunk {chunk}): {e}"))?,
            );
            if chunk != 5 {
                continue;
            }
            if decode_all || i == longest {
                fwd.truncate(0).map_err(|e| e.to_string())?;
                let mut rows = Vec::new();
                for &t in &r.sequence() {
                    rows.extend(logits(&mut fwd, &[t], true)?);
                }
                worst = worst.max(
                    r.check(&rows, vocab, tol, nll_tol)
                        .map_err(|e| format!("{name} decode: {e}"))?,
                );
            }
            if !greedy {
                continue;
            }
            let want = &r.f64_greedy_tokens;
            fwd.truncate(0).map_err(|e| e.to_string())?;
            let mut last = logits(&mut fwd, &r.prompt_tokens, false)?;
            let mut got = Vec::new();
            while got.len() < want.len() {
                got.push(argmax(&last));
                if got.len() < want.len() {
                    last = logits(&mut fwd, &[argmax(&last)], false)?;
                }
            }
            if &got != want {
                return Err(format!(
                    "{name} greedy {:?}: {got:?}, f64 says {want:?}",
                    r.prompt
                ));
            }
        }
    }
    Ok(worst)
}
