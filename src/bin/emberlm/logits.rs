//! `emberlm logits`: the top logits at every input position, and with f16 precision how they
//! agree with the same input in f32.

use std::path::PathBuf;

use emberlm::config::default_context;
use emberlm::loader::ModelFiles;
use emberlm::{GpuContext, GpuOptions};

use crate::cli::{gpu_options, model_path};
use crate::{CliResult, Failure};

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
    let files = ModelFiles::open(&model_path(model)?)?;
    let weights = files.weights()?;
    let tokens = match (prompt, tokens) {
        (Some(text), _) => files.tokenizer()?.encode(&text, special, None)?,
        (None, Some(ids)) => ids,
        (None, None) => return Err(Failure::usage("give --prompt or --tokens")),
    };
    if tokens.is_empty() {
        return Err(Failure::usage("the input has no tokens"));
    }
    let context = context.unwrap_or_else(|| default_context(&weights.config));
    let run = |options: GpuOptions| -> CliResult<(Vec<f32>, GpuContext)> {
        let gpu = pollster::block_on(GpuContext::new(options))?;
        if let Some(notice) = gpu.precision_notice() {
            eprintln!("emberlm: {notice}");
        }
        let cache = emberlm::gpu::KernelCache::new();
        let mut fwd = pollster::block_on(emberlm::forward::Forward::new(
            &gpu,
            &cache,
            &weights,
            context,
            emberlm::forward::DEFAULT_CHUNK,
        ))?;
        let logits = if decode {
            let mut rows = Vec::with_capacity(tokens.len() * weights.config.vocab_size);
            for &t in &tokens {
                rows.extend(pollster::block_on(fwd.forward(&gpu, &[t], true))?);
            }
            rows
        } else {
            pollster::block_on(fwd.forward(&gpu, &tokens, true))?
        };
        Ok((logits, gpu))
    };
    let vocab = weights.config.vocab_size;
    let (logits, gpu) = run(gpu_options())?;
    let precision = gpu.precision();
    drop(gpu);
    // f16 products: the same input in f32, and how the two agree
    let vs_f32 = if precision == emberlm::gpu::MatmulPrecision::F16 {
        let (reference, _) = run(GpuOptions {
            precision: emberlm::gpu::Precision::F32,
            ..gpu_options()
        })?;
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
        "precision": precision.as_str(),
        "positions": positions,
    });
    if let Some(a) = vs_f32 {
        out["vs_f32"] = serde_json::to_value(a)?;
    }
    println!("{}", serde_json::to_string(&out)?);
    Ok(())
}
