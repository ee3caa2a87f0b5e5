//! The bench's speculative decoding section: plain greedy decoding against prompt lookup on
//! an extractive prompt with the benched model (acceptance rate, tokens per model step, tok/s
//! ratio), and draft-model speculation on the tiny fixture pairs (a draft equal to the model,
//! and Q8_0 / Q4_0 twins of an f32 model) for the mechanics. Every speculative run is checked
//! to give the plain run's tokens.

use std::path::Path;

use emberlm::loader::ModelFiles;
use emberlm::sampling::SamplingParams;
use emberlm::session::{GenerateOptions, Generation, Prompt, Session, SpecOptions, SpecSource};
use emberlm::GpuContext;
use serde_json::{json, Value};
use web_time::Instant;

use crate::{CliResult, Failure};

/// The extractive request: the answer copies text from the prompt.
const EXTRACT: &str = "Copy the second paragraph of this text exactly, word for word.\n\n\
The library loads a model file in the browser, uploads its weights to the GPU and keeps the \
conversation in a cache on the device.\n\n\
Every token is computed by compute shaders: matrix products, normalisation, attention over \
the cache and the selection of candidates, so that the page reads back only a few hundred \
bytes per token.\n\n\
The same code also runs natively for tests and benchmarks.";

/// The tiny fixtures of the mechanics runs: (model, draft).
const PAIRS: &[(&str, &str)] = &[
    ("tiny-llama-f32.gguf", "tiny-llama-f32.gguf"),
    ("tiny-llama-f32.gguf", "tiny-llama-q8_0.gguf"),
    ("tiny-llama-f32.gguf", "tiny-llama-q4_0.gguf"),
];

/// What the section measures.
pub struct SpecBench {
    /// Tokens generated per run.
    pub max_new_tokens: usize,
}

/// A generation after a warm-up call: the result, its seconds and the bytes it read back
/// from the GPU.
fn timed(
    s: &mut Session,
    prompt: &Prompt,
    params: &SamplingParams,
    speculative: Option<SpecOptions>,
) -> CliResult<(Generation, f64, u64)> {
    let options = GenerateOptions {
        sampling: params.clone(),
        speculative,
        ..GenerateOptions::default()
    };
    // the first call builds the pipelines and fills the cache's prompt; the second is timed
    // from the same cached prompt
    pollster::block_on(s.generate(prompt, &options, &mut |_| {}))?;
    let read = |s: &Session| s.forward().gpu().map(|c| c.counters().readback_bytes);
    let before = read(s);
    let start = Instant::now();
    let g = pollster::block_on(s.generate(prompt, &options, &mut |_| {}))?;
    let seconds = start.elapsed().as_secs_f64();
    let bytes = read(s)
        .zip(before)
        .map_or(0, |(after, before)| after - before);
    Ok((g, seconds, bytes))
}

/// One comparison: plain against speculative, as JSON and a printed line.
fn compare(
    what: &str,
    s: &mut Session,
    prompt: &Prompt,
    params: &SamplingParams,
    spec: SpecOptions,
) -> CliResult<(Value, String)> {
    let (plain, plain_s, plain_bytes) = timed(s, prompt, params, None)?;
    let (fast, fast_s, fast_bytes) = timed(s, prompt, params, Some(spec.clone()))?;
    let tokens = plain.sequences[0].tokens.len();
    if fast.sequences[0].tokens != plain.sequences[0].tokens {
        return Err(Failure {
            code: 1,
            message: format!("{what}: speculative decoding changed the greedy tokens"),
        });
    }
    let st = fast.stats.speculative.clone().unwrap_or_default();
    let per_step = tokens.saturating_sub(1) as f64 / st.target_steps.max(1) as f64;
    let (plain_tps, fast_tps) = (tokens as f64 / plain_s, tokens as f64 / fast_s);
    let row = json!({
        "run": what, "method": st.method, "k": spec.k, "adaptive": spec.adaptive,
        "tokens": tokens, "drafted": st.drafted, "accepted": st.accepted,
        "acceptance_rate": st.acceptance_rate, "target_steps": st.target_steps,
        "tokens_per_target_step": per_step,
        "plain_tok_s": plain_tps, "speculative_tok_s": fast_tps, "speedup": fast_tps / plain_tps,
        "plain_readback_bytes_per_token": plain_bytes / tokens.max(1) as u64,
        "speculative_readback_bytes_per_token": fast_bytes / tokens.max(1) as u64,
    });
    let line = format!(
        "speculative {what} ({}, k {}{}): {}/{} drafts accepted ({:.0}%), {:.2} tokens per model step, {:.2} → {:.2} tok/s ({:.2}×), {} → {} bytes read back per token",
        st.method,
        spec.k,
        if spec.adaptive { " adaptive" } else { "" },
        st.accepted,
        st.drafted,
        100.0 * st.acceptance_rate,
        per_step,
        plain_tps,
        fast_tps,
        fast_tps / plain_tps,
        plain_bytes / tokens.max(1) as u64,
        fast_bytes / tokens.max(1) as u64
    );
    Ok((row, line))
}

impl SpecBench {
    /// Runs the section on `model` (a fresh session) and on the tiny pairs when
    /// `fixtures` holds them (the notes say when it does not).
    pub fn run(&self, model: &Path, fixtures: &Path) -> CliResult<(Value, Vec<String>)> {
        let greedy = SamplingParams {
            max_new_tokens: self.max_new_tokens,
            ..SamplingParams::greedy()
        };
        let mut rows = Vec::new();
        let mut lines = Vec::new();
        let files = ModelFiles::open(model)?;
        let ctx = pollster::block_on(GpuContext::new(crate::cli::gpu_options()))?;
        let mut s = pollster::block_on(Session::new(ctx, &files, Some(1024)))?;
        let prompt = Prompt::Chat(vec![emberlm::chat::ChatMessage::new("user", EXTRACT)]);
        for (k, adaptive) in [(4, false), (8, false), (4, true)] {
            let spec = SpecOptions {
                source: Some(SpecSource::Lookup),
                k,
                adaptive,
                ..SpecOptions::default()
            };
            eprintln!("bench: speculative lookup k={k} adaptive={adaptive}");
            let (row, line) = compare("extractive prompt", &mut s, &prompt, &greedy, spec)?;
            rows.push(row);
            lines.push(line);
        }
        drop(s);
        let mut notes = Vec::new();
        for (target, draft) in PAIRS {
            let (t, d) = (fixtures.join(target), fixtures.join(draft));
            if !t.exists() || !d.exists() {
                notes.push(format!(
                    "speculative draft pairs: {} not found, skipped",
                    fixtures.display()
                ));
                break;
            }
            let ctx = pollster::block_on(GpuContext::new(crate::cli::gpu_options()))?;
            let mut s = pollster::block_on(Session::new(ctx, &ModelFiles::open(&t)?, Some(128)))?;
            pollster::block_on(s.load_draft(&ModelFiles::open(&d)?))?;
            let spec = SpecOptions {
                source: Some(SpecSource::Draft),
                ..SpecOptions::default()
            };
            let what = format!("{target} with draft {draft}");
            eprintln!("bench: {what}");
            let prompt = Prompt::Text("Once upon a time".into());
            let params = SamplingParams {
                max_new_tokens: 64,
                ..greedy.clone()
            };
            let (row, line) = compare(&what, &mut s, &prompt, &params, spec)?;
            rows.push(row);
            lines.push(line);
        }
        lines.extend(notes);
        Ok((json!(rows), lines))
    }
}
