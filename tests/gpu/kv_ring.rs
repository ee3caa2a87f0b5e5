//! Local-attention layers keep a ring of `window + chunk − 1` rows instead of the whole
//! context. On the tiny Gemma 3 fixture (five local layers with a window of 5, one global
//! layer), run in steps of 4 tokens so the rings (8 rows) wrap many times, both backends:
//! the cache takes the rings' memory, prefill and token-by-token decode give the float64
//! reference's logits, the fill mark moves back within a step's length and refuses to move
//! further (naming why), batched slots and copied prefixes wrap like the main sequence, and a
//! session that regenerates after a long answer recomputes rather than reading lost keys.

#![cfg(not(target_arch = "wasm32"))]

use crate::common;

use std::path::Path;
use std::rc::Rc;

use emberlm::backend::cpu::CpuForward;
use emberlm::backend::gpu::KernelCache;
use emberlm::backend::gpu::{Forward, GpuModel};
use emberlm::backend::{Backend, BatchToken, Output, Readback, Rows, StepLogits};
use emberlm::loader::ModelFiles;
use emberlm::model::reference::ReferenceModel;
use emberlm::GpuOptions;

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/tiny-gemma3-f32.gguf"
);
const CONTEXT: usize = 200;
const CHUNK: usize = 4;
/// The fixture's window plus a step, less one.
const RING: usize = 5 + CHUNK - 1;

fn tokens(n: usize, salt: u32, vocab: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 61 + salt * 17 + 5) % vocab as u32)
        .collect()
}

/// The reference's logits for every position of `tokens`, `[n][vocab]`.
fn reference(tokens: &[u32]) -> Vec<Vec<f32>> {
    let files = ModelFiles::open(Path::new(FIXTURE)).unwrap();
    let weights = files.weights().unwrap();
    let model = ReferenceModel::new(&weights).unwrap();
    model.forward(&mut model.new_cache(), tokens).unwrap()
}

fn assert_close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (&g, &r)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - r).abs() <= 2e-3 + 1e-3 * r.abs(),
            "{what}: logit {i}: {g} vs {r}"
        );
    }
}

fn logits(out: Output) -> Vec<f32> {
    match out {
        Output::Logits(l) => l,
        other => panic!("expected logits, got {other:?}"),
    }
}

fn full(l: StepLogits) -> Vec<f32> {
    match l {
        StepLogits::Full(v) => v,
        other => panic!("expected a full row, got {other:?}"),
    }
}

/// Every check, on one backend.
fn check(mut model: Box<dyn Backend>, what: &str) {
    let files = ModelFiles::open(Path::new(FIXTURE)).unwrap();
    let config = files.weights().unwrap().config.clone();
    let vocab = config.vocab_size;
    assert!(config.layer_window(0).is_some() && config.layer_window(5).is_none());

    // memory: five rings of 8 rows and one layer of the whole context
    let row = 2 * config.kv_dim() as u64 * 4;
    let want_bytes = row * (5 * RING as u64 + CONTEXT as u64);
    assert_eq!(model.memory().kv_cache, want_bytes, "{what}: KV bytes");
    assert_eq!(
        model.memory().kv_bytes_per_token,
        row,
        "{what}: bytes per position"
    );

    // prefill over many wraps, and decode one token at a time
    let seq = tokens(45, 1, vocab);
    let want = reference(&seq);
    let run = |m: &mut Box<dyn Backend>, t: &[u32], r| {
        pollster::block_on(m.run(Rows::Next(t), r)).unwrap()
    };
    let all = logits(run(&mut model, &seq, Readback::AllRows));
    for (t, w) in want.iter().enumerate() {
        assert_close(
            &all[t * vocab..][..vocab],
            w,
            &format!("{what}: prefill {t}"),
        );
    }
    model.truncate(0).unwrap();
    for (t, (&id, w)) in seq.iter().zip(&want).enumerate() {
        let row = logits(run(&mut model, &[id], Readback::LastRow));
        assert_close(&row, w, &format!("{what}: decode {t}"));
    }

    // back by a step's length: the rings still hold what the next step reads
    assert_eq!(model.reusable(45 - CHUNK), 45 - CHUNK);
    model.truncate(45 - CHUNK).unwrap();
    let again = logits(run(&mut model, &seq[45 - CHUNK..], Readback::LastRow));
    assert_close(
        &again,
        &want[44],
        &format!("{what}: after moving back {CHUNK}"),
    );
    // further back, the rings have lost keys: refused, and reusable says start over
    assert_eq!(model.reusable(20), 0);
    let err = model.truncate(20).unwrap_err().to_string();
    assert!(err.contains("rings were overwritten"), "{what}: {err}");
    assert_eq!(model.pos(), 45, "{what}: a refused move changes nothing");
    model.truncate(0).unwrap();

    // batched slots: prompts longer than the ring, then a few steps together
    let prompts = [
        tokens(30, 2, vocab),
        tokens(11, 3, vocab),
        tokens(23, 4, vocab),
    ];
    let wants: Vec<_> = prompts
        .iter()
        .map(|p| {
            let mut s = p.clone();
            s.extend(tokens(3, 9, vocab));
            (s.clone(), reference(&s))
        })
        .collect();
    pollster::block_on(model.set_batch(4)).unwrap();
    for (slot, p) in prompts.iter().enumerate() {
        let row = logits(
            pollster::block_on(model.run(
                Rows::InSlot {
                    slot,
                    pos: 0,
                    tokens: p,
                },
                Readback::LastRow,
            ))
            .unwrap(),
        );
        assert_close(
            &row,
            &wants[slot].1[p.len() - 1],
            &format!("{what}: slot {slot}"),
        );
    }
    // slot 3 takes slot 0's 30 positions (its rings have wrapped) and goes on the same way
    model.copy_slot_prefix(0, &[3], prompts[0].len()).unwrap();
    for k in 0..3 {
        let mut batch: Vec<BatchToken> = (0..3)
            .map(|s| BatchToken {
                slot: s,
                pos: prompts[s].len() + k,
                token: wants[s].0[prompts[s].len() + k],
            })
            .collect();
        batch.push(BatchToken {
            slot: 3,
            ..batch[0]
        });
        let rows = pollster::block_on(model.decode_batch(&batch, &[None; 4])).unwrap();
        for (b, row) in batch.iter().zip(rows) {
            let s = if b.slot == 3 { 0 } else { b.slot };
            assert_close(
                &full(row),
                &wants[s].1[b.pos],
                &format!("{what}: batched step {k}, slot {}", b.slot),
            );
        }
    }
}

#[test]
fn local_layers_keep_rings_on_the_gpu() {
    let Some(ctx) = common::native_gpu(GpuOptions::default()) else {
        return;
    };
    let files = ModelFiles::open(Path::new(FIXTURE)).unwrap();
    let weights = files.weights().unwrap();
    let kernels = Rc::new(KernelCache::new());
    let forward =
        pollster::block_on(Forward::new(&ctx, &kernels, &weights, CONTEXT, CHUNK)).unwrap();
    for l in 0..5 {
        assert_eq!(forward.kv().layout().ring(l), Some(RING), "layer {l}");
    }
    assert_eq!(forward.kv().layout().ring(5), None);
    let ctx = Rc::new(ctx);
    let model: Box<dyn Backend> = Box::new(GpuModel {
        ctx: Rc::clone(&ctx),
        forward,
        kernels,
    });
    check(model, "gpu");
    ctx.check().expect("no GPU error along the way");
}

#[test]
fn local_layers_keep_rings_on_the_cpu() {
    let files = ModelFiles::open(Path::new(FIXTURE)).unwrap();
    let weights = files.weights().unwrap();
    let model: Box<dyn Backend> = Box::new(CpuForward::new(&weights, CONTEXT, CHUNK).unwrap());
    check(model, "cpu");
}

/// `n` greedy tokens after `prompt`, end-of-sequence ignored.
fn generate(s: &mut emberlm::session::Session, prompt: &[u32], n: usize) -> Vec<u32> {
    let sampling = emberlm::sampling::SamplingParams {
        max_new_tokens: n,
        ignore_eos: true,
        ..emberlm::sampling::SamplingParams::greedy()
    };
    let options = emberlm::session::GenerateOptions {
        sampling,
        ..emberlm::session::GenerateOptions::default()
    };
    let prompt = emberlm::session::Prompt::Tokens(prompt.to_vec());
    let g = pollster::block_on(s.generate(&prompt, &options, &mut |_| {})).unwrap();
    g.sequences[0].tokens.clone()
}

/// A session steps 64 tokens at a time (rings of 68 rows here). After an answer longer than
/// that, asking the same prompt again cannot reuse the prompt's rows (the rings moved on): it
/// recomputes and answers as a fresh session does. Extending the last answer reuses
/// everything; a context slid past its end recomputes too.
#[test]
fn a_session_recomputes_what_the_rings_lost() {
    use emberlm::session::Session;
    let files = ModelFiles::open(Path::new(FIXTURE)).unwrap();
    let vocab = files.weights().unwrap().config.vocab_size;
    let prompt = tokens(9, 5, vocab);
    let mut s = Session::new_cpu(&files, None).unwrap();
    let first = generate(&mut s, &prompt, 90);
    assert_eq!(first.len(), 90);
    let again = generate(&mut s, &prompt, 90);
    assert_eq!(first, again, "the same prompt after a long answer");
    let mut longer = prompt.clone();
    longer.extend(&first);
    let extended = generate(&mut s, &longer, 5);
    let mut fresh = Session::new_cpu(&files, None).unwrap();
    assert_eq!(extended, generate(&mut fresh, &longer, 5), "extending");
    // sliding: 120 tokens through a context of 80 (rings of 68 rows)
    let mut small = Session::new_cpu(&files, Some(80)).unwrap();
    assert_eq!(generate(&mut small, &prompt, 120).len(), 120);
}

/// What one prefill on the GPU gave: the rings of layers 0 (local) and 5 (global), every
/// row's logits, the reference's rows and the vocabulary size.
struct GpuRun {
    rings: [Option<usize>; 2],
    got: Vec<f32>,
    want: Vec<Vec<f32>>,
    vocab: usize,
}

/// `n` tokens (salted by `salt`) prefilled in steps of [`CHUNK`] on a device with `options`;
/// `None` without a GPU.
fn gpu_prefill(options: GpuOptions, n: usize, salt: u32) -> Option<GpuRun> {
    let ctx = common::native_gpu(options)?;
    let files = ModelFiles::open(Path::new(FIXTURE)).unwrap();
    let weights = files.weights().unwrap();
    let vocab = weights.config.vocab_size;
    let kernels = KernelCache::new();
    let mut fwd =
        pollster::block_on(Forward::new(&ctx, &kernels, &weights, CONTEXT, CHUNK)).unwrap();
    let layout = fwd.kv().layout();
    let rings = [layout.ring(0), layout.ring(5)];
    let seq = tokens(n, salt, vocab);
    let got = pollster::block_on(fwd.forward(&ctx, &seq, true)).unwrap();
    ctx.check().expect("no GPU error along the way");
    Some(GpuRun {
        rings,
        got,
        want: reference(&seq),
        vocab,
    })
}

/// Rings of an encoded cache (K in q8_0, V in f16) on the GPU, in both kernel shapes: the
/// store kernel writes and attention reads the same wrapped rows, so a 45-token prefill in
/// steps of 4 stays within the encodings' rounding of the reference at every position (0.05
/// seen, 0.1 allowed; a row written outside the ring costs several units).
#[test]
fn an_encoded_cache_wraps_its_rings_too() {
    use emberlm::backend::gpu::{KernelOverrides, Variant};
    use emberlm::dtype::kv::{KvKind, KvKinds};
    for variant in Variant::EVERY_FAMILY {
        let options = GpuOptions {
            kv_cache: KvKinds {
                k: KvKind::Q8_0,
                v: KvKind::F16,
            },
            kernels: KernelOverrides::all(variant),
            ..GpuOptions::default()
        };
        let Some(run) = gpu_prefill(options, 45, 6) else {
            return;
        };
        assert_eq!(run.rings, [Some(RING), None]);
        let vocab = run.vocab;
        let mut worst = 0.0f32;
        for (t, w) in run.want.iter().enumerate() {
            for (&g, &r) in run.got[t * vocab..][..vocab].iter().zip(w) {
                worst = worst.max((g - r).abs());
            }
        }
        eprintln!("{variant}: q8_0 K / f16 V rings, max |Δ logit| vs f64 = {worst:.3e}");
        assert!(worst <= 0.1, "{variant}: {worst}");
    }
}

/// A fixed decode plan's local window (`decode_local_window`) replaces the trained window of
/// the local layers only, and sizes their rings: with a window of 7 the rings hold 7 + 4 − 1
/// rows, the global layer stays global, the first 5 positions (inside both windows) are the
/// reference's, and later ones are not (the window took effect).
#[test]
fn a_fixed_local_window_sizes_the_rings() {
    use emberlm::backend::gpu::{DecodePlan, DecodePlanMode};
    let options = GpuOptions {
        decode_plan: DecodePlan {
            mode: DecodePlanMode::Fixed,
            q_chunk: Some(16),
            local_window: Some(7),
            ..DecodePlan::default()
        },
        ..GpuOptions::default()
    };
    let Some(run) = gpu_prefill(options, 30, 7) else {
        return;
    };
    assert_eq!(run.rings, [Some(7 + CHUNK - 1), None]);
    let (got, want, vocab) = (&run.got, &run.want, run.vocab);
    for (t, w) in want.iter().enumerate().take(5) {
        assert_close(&got[t * vocab..][..vocab], w, &format!("position {t}"));
    }
    let later = (5..30)
        .flat_map(|t| got[t * vocab..][..vocab].iter().zip(&want[t]))
        .map(|(&g, &r)| (g - r).abs())
        .fold(0.0f32, f32::max);
    assert!(later > 1e-2, "a window of 7 changed nothing: {later}");
}
