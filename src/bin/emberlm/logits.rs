//! `emberlm logits`: the top logits at every input position on the backend `--device` picks
//! (through the engine, as every request), and with f16 precision how they agree with the same
//! input in f32.

use std::path::PathBuf;

use emberlm::backend::gpu::{MatmulPrecision, Precision};
use emberlm::engine::Engine;

use crate::cli::{load_engine_with, model_path};
use crate::{CliResult, Failure};

/// What the products ran in: the GPU's precision (`f32`, `f16`), or on the CPU backend
/// `int8` (quantized weights meet activations quantized to 8 bits per block of 32; float
/// weights meet f32 ones) or `f32` (`--precision f32`: every row dequantized).
fn precision_of(engine: &Engine) -> &'static str {
    engine
        .inspect(|s| s.forward().precision_name())
        .unwrap_or("int8")
}

#[allow(clippy::too_many_arguments)]
pub fn logits(
    model: Option<PathBuf>,
    prompt: Option<String>,
    special: bool,
    tokens: Option<Vec<u32>>,
    top: usize,
    decode: bool,
    context: Option<usize>,
) -> CliResult<()> {
    if context == Some(0) {
        return Err(Failure::usage("--ctx must be at least 1"));
    }
    let model = model_path(model)?;
    let engine = load_engine_with(Some(model.clone()), context, |_| {})?;
    let tokens = match (prompt, tokens) {
        (Some(text), _) => engine
            .inspect(|s| s.tokenizer().encode(&text, special, None))
            .ok_or_else(|| Failure::from("the engine lost its model".to_string()))??,
        (None, Some(ids)) => ids,
        (None, None) => return Err(Failure::usage("give --prompt or --tokens")),
    };
    if tokens.is_empty() {
        return Err(Failure::usage("the input has no tokens"));
    }
    let vocab = engine.inspect(|s| s.config().vocab_size).unwrap_or(0);
    let backend = engine
        .inspect(|s| s.forward().kind().name())
        .unwrap_or("cpu");
    let precision = precision_of(&engine);
    let logits = pollster::block_on(engine.all_logits(&tokens, decode))?;
    let f16 =
        engine.inspect(|s| s.gpu().map(|g| g.precision())).flatten() == Some(MatmulPrecision::F16);
    drop(engine);
    // f16 products: the same input in f32, and how the two agree
    let vs_f32 = if f16 {
        let f32_engine = load_engine_with(Some(model), context, |o| {
            o.gpu.precision = Precision::F32;
        })?;
        let reference = pollster::block_on(f32_engine.all_logits(&tokens, decode))?;
        Some(emberlm::sampling::agreement(
            &reference, &logits, &tokens, vocab,
        ))
    } else {
        None
    };
    let positions: Vec<Vec<(usize, f32)>> = logits
        .chunks(vocab)
        .map(|row| {
            let mut ids: Vec<usize> = (0..row.len()).collect();
            let k = top.min(row.len());
            ids.select_nth_unstable_by(k.saturating_sub(1), |&a, &b| row[b].total_cmp(&row[a]));
            ids.truncate(k);
            ids.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
            ids.into_iter().map(|i| (i, row[i])).collect()
        })
        .collect();
    let mut out = serde_json::json!({
        "tokens": tokens,
        "backend": backend,
        "precision": precision,
        "positions": positions,
    });
    if let Some(a) = vs_f32 {
        out["vs_f32"] = serde_json::to_value(a)?;
    }
    println!("{}", serde_json::to_string(&out)?);
    Ok(())
}
