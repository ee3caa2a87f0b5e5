//! Engine counters on the tiny fixtures: one decode token and one prefill chunk are one pass,
//! one command buffer, one submit and one readback, allocate nothing and dispatch exactly the
//! graph's nodes (plus the candidate selection for a sampled decode token, which reads back at
//! most 4 KB); long and repeated generations leave the buffers alive unchanged.

#![cfg(not(target_arch = "wasm32"))]

use crate::common;

use std::path::Path;

use emberlm::backend::gpu::Forward;
use emberlm::backend::gpu::{Counters, KernelCache};
use emberlm::backend::StepLogits;
use emberlm::loader::ModelFiles;
use emberlm::sampling::{Sampler, SamplingParams};
use emberlm::session::{FinishReason, GenerateOptions, Prompt, Session};
use emberlm::GpuOptions;

fn fixture(name: &str) -> String {
    format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// Weight bytes one decode token should bind: every linear matrix once (the tied embedding as
/// the LM head too) plus the one embedding row gathered.
fn expected_weight_bytes_per_token(files: &ModelFiles) -> u64 {
    let weights = files.weights().unwrap();
    let embd = &weights.tensors["token_embd.weight"];
    let row = embd.data.len() as u64 / embd.shape[0] as u64;
    let matrices: u64 = weights
        .tensors
        .iter()
        .filter(|(name, t)| t.shape.len() == 2 && name.as_str() != "token_embd.weight")
        .map(|(_, t)| t.data.len() as u64)
        .sum();
    let head = if weights.config.tied_embeddings {
        embd.data.len() as u64
    } else {
        0
    };
    matrices + head + row
}

fn assert_one_sync(d: &Counters, what: &str) {
    assert_eq!(d.submits, 1, "{what}: submits {d:?}");
    assert_eq!(d.compute_passes, 1, "{what}: compute passes {d:?}");
    assert_eq!(d.command_buffers, 1, "{what}: command buffers {d:?}");
    assert_eq!(d.readback_waits, 1, "{what}: readbacks {d:?}");
    assert_eq!(d.buffers_created, 0, "{what}: buffers created {d:?}");
    assert_eq!(d.bind_groups_created, 0, "{what}: bind groups {d:?}");
    assert_eq!(d.pipelines_created, 0, "{what}: pipelines {d:?}");
    assert_eq!(d.buffers_alive, 0, "{what}: buffers alive {d:?}");
    assert_eq!(d.forward_steps, 1, "{what}: steps {d:?}");
}

#[test]
fn a_decode_token_and_a_prefill_chunk_are_one_submit_and_allocate_nothing() {
    let Some(ctx) = common::native_gpu(GpuOptions::default()) else {
        return;
    };
    for model in [
        "tiny-llama-q4_1.gguf",
        "tiny-llama-f32.gguf",
        "tiny-gpt2-f32.gguf",
    ] {
        let files = ModelFiles::open(Path::new(&fixture(model))).unwrap();
        let weights = files.weights().unwrap();
        let (vocab, chunk) = (weights.config.vocab_size as u64, 16usize);
        let cache = KernelCache::new();
        let mut fwd = pollster::block_on(Forward::new(&ctx, &cache, &weights, 64, chunk)).unwrap();
        let nodes = fwd.node_count() as u64;
        let layers = weights.config.n_layers as u64;
        eprintln!(
            "{model}: {nodes} dispatches per step ({layers} layers: {:.1} per layer + rest)",
            nodes as f64 / layers as f64
        );
        // Per layer: Q/K/V (norm, RoPE and the KV write fused), attention, output projection
        // (+ residual), feed-forward up or gate+up (norm and activation fused), down
        // (+ residual). Outside the layers: the embedding(s) and the LM head (final norm fused).
        let outside = if model.starts_with("tiny-gpt2") { 3 } else { 2 };
        assert_eq!(nodes, 5 * layers + outside, "{model}: dispatches per step");

        // prefill: one full chunk
        let tokens: Vec<u32> = (0..chunk as u32)
            .map(|i| (i * 7 + 3) % vocab as u32)
            .collect();
        let before = ctx.counters();
        pollster::block_on(fwd.forward(&ctx, &tokens, false)).unwrap();
        let d = ctx.counters().since(&before);
        eprintln!("{model} prefill chunk of {chunk}: {d:?}");
        assert_one_sync(&d, "prefill chunk");
        assert_eq!(d.dispatches, nodes, "prefill chunk dispatches");
        assert_eq!(
            d.readback_bytes,
            4 * vocab,
            "prefill reads back the last row only"
        );
        assert_eq!(d.forward_tokens, chunk as u64);

        // decode: one token, the whole row (what beam search and scoring read)
        let before = ctx.counters();
        pollster::block_on(fwd.forward(&ctx, &[5], false)).unwrap();
        let d = ctx.counters().since(&before);
        eprintln!("{model} decode token, full row: {d:?}");
        assert_one_sync(&d, "decode token");
        assert_eq!(d.dispatches, nodes, "decode dispatches");
        assert_eq!(
            d.readback_bytes,
            4 * vocab,
            "a full decode step reads back one logits row"
        );
        if model.starts_with("tiny-llama") {
            assert_eq!(
                d.weight_bytes_bound,
                expected_weight_bytes_per_token(&files),
                "every weight bound once per token"
            );
        }

        // decode: one sampled token reads back the GPU's candidates only
        for (name, params) in [
            ("greedy", SamplingParams::greedy()),
            (
                "default sampling",
                SamplingParams {
                    temperature: 0.7,
                    top_k: 40,
                    top_p: 0.9,
                    seed: Some(1),
                    ..SamplingParams::unfiltered()
                },
            ),
        ] {
            let sampler = Sampler::new(&params, vocab as usize).unwrap();
            let request = sampler.select_request(&[1, 2, 3], &[4]).unwrap().unwrap();
            let before = ctx.counters();
            let step = pollster::block_on(fwd.decode_select(&ctx, 5, Some(&request))).unwrap();
            let d = ctx.counters().since(&before);
            eprintln!("{model} decode token, {name}: {d:?}");
            assert!(matches!(step, StepLogits::Candidates(_)), "{name}");
            assert_one_sync(&d, name);
            assert_eq!(
                d.dispatches,
                nodes + 1,
                "{name}: the graph and the selection"
            );
            assert!(
                d.readback_bytes <= 4096,
                "{name}: reads back {} bytes",
                d.readback_bytes
            );
            assert_eq!(d.readback_bytes, request.result_bytes(), "{name}");
        }
    }
}

fn session(model: &str, context: Option<usize>) -> Option<Session> {
    let ctx = common::native_gpu(GpuOptions::default())?;
    let files = ModelFiles::open(Path::new(&fixture(model))).unwrap();
    Some(pollster::block_on(Session::new(ctx, &files, context)).unwrap())
}

fn never_stop(s: &Session, max_new_tokens: usize) -> GenerateOptions {
    let mut sampling = SamplingParams {
        max_new_tokens,
        ..SamplingParams::greedy()
    };
    for &id in s.eos_ids() {
        sampling.logit_bias.insert(id, -100.0);
    }
    GenerateOptions {
        sampling,
        ..GenerateOptions::default()
    }
}

#[test]
fn a_hundred_generations_leave_the_buffers_alive_unchanged() {
    let Some(mut s) = session("tiny-llama-q4_1.gguf", Some(64)) else {
        return;
    };
    let before = s.gpu().expect("a GPU session").counters();
    for i in 0..100 {
        let prompt = Prompt::Text(format!("Run {i}: permission is hereby granted"));
        let opts = never_stop(&s, 4 + i % 5);
        let g = pollster::block_on(s.generate(&prompt, &opts, &mut |_| {})).unwrap();
        assert_eq!(g.sequences[0].tokens.len(), 4 + i % 5);
    }
    let d = s.gpu().expect("a GPU session").counters().since(&before);
    eprintln!("100 generations: {d:?}");
    assert_eq!(d.buffers_alive, 0, "buffers alive changed: {d:?}");
    assert_eq!(d.buffer_bytes_alive, 0, "bytes alive changed: {d:?}");
    assert_eq!(d.pipelines_created, 0, "pipelines built: {d:?}");
    assert_eq!(d.bind_groups_created, 0, "bind groups created: {d:?}");
    assert_eq!(d.buffers_created, 0, "buffers created: {d:?}");
    assert_eq!(d.submits, d.forward_steps, "one submit per step: {d:?}");
    assert_eq!(
        d.readback_waits, d.forward_steps,
        "one readback per step: {d:?}"
    );
}

/// Tokens of the endurance run. What it catches is a GPU buffer created or kept per token or per
/// slide of the context: the counters are exact, so a leak shows after one slide, and a 64-token
/// context slides every ~32 tokens (the oldest half of the rest dropped), so 2,048 tokens are
/// ~63 slides (~40 s in a debug build on lavapipe). Positions are recomputed at each slide and
/// never pass 64, so a longer run meets nothing new; 10,000 tokens took ~3 minutes.
const ENDURANCE_TOKENS: usize = 2_048;

#[test]
fn two_thousand_tokens_through_a_sliding_64_token_context() {
    let Some(mut s) = session("tiny-llama-q4_1.gguf", Some(64)) else {
        return;
    };
    let before = s.gpu().expect("a GPU session").counters();
    let opts = never_stop(&s, ENDURANCE_TOKENS);
    let prompt = Prompt::Text("Permission is hereby granted".into());
    let g = pollster::block_on(s.generate(&prompt, &opts, &mut |_| {})).unwrap();
    let seq = &g.sequences[0];
    assert_eq!(seq.tokens.len(), ENDURANCE_TOKENS);
    assert_eq!(seq.finish_reason, FinishReason::Length);
    let d = s.gpu().expect("a GPU session").counters().since(&before);
    eprintln!(
        "{ENDURANCE_TOKENS} tokens: {d:?}, decode {:.1} tok/s",
        g.stats.decode_tok_per_s
    );
    assert!(
        g.warnings.iter().any(|w| w.starts_with("the context slid")),
        "{:?}",
        g.warnings
    );
    assert_eq!(d.buffers_alive, 0, "buffers alive changed: {d:?}");
    assert_eq!(d.buffer_bytes_alive, 0, "bytes alive changed: {d:?}");
    assert_eq!(d.buffers_created, 0, "buffers created: {d:?}");
}

#[test]
fn sampled_decode_steps_read_back_at_most_4_kb() {
    let Some(mut s) = session("tiny-llama-q4_1.gguf", Some(64)) else {
        return;
    };
    let vocab = s.config().vocab_size as u64;
    let prompt = Prompt::Text("Permission is hereby granted".into());
    for (name, temperature, top_k, top_p) in [("greedy", 0.0, 0, 1.0), ("default", 0.7, 40, 0.9)] {
        let mut opts = never_stop(&s, 12);
        opts.sampling.temperature = temperature;
        opts.sampling.top_k = top_k;
        opts.sampling.top_p = top_p;
        opts.sampling.seed = Some(9);
        s.reset();
        let before = s.gpu().expect("a GPU session").counters();
        let g = pollster::block_on(s.generate(&prompt, &opts, &mut |_| {})).unwrap();
        let d = s.gpu().expect("a GPU session").counters().since(&before);
        let decode_steps = 11;
        assert_eq!(
            g.stats.candidate_steps, decode_steps,
            "{name}: {:?}",
            g.stats
        );
        assert_eq!(d.readback_waits, d.forward_steps, "{name}: {d:?}");
        assert_eq!(d.submits, d.forward_steps, "{name}: {d:?}");
        assert_eq!(d.buffers_created, 0, "{name}: {d:?}");
        // The prompt is one prefill step reading one row; every decode step at most 4 KB.
        let prefill = 4 * vocab;
        let per_token = (d.readback_bytes - prefill) as f64 / decode_steps as f64;
        eprintln!("{name}: {per_token:.0} bytes read back per decode token ({d:?})");
        assert!(
            d.readback_bytes <= prefill + 4096 * decode_steps as u64,
            "{name}: {d:?}"
        );
    }
}
