//! Batched decoding on the forward pass: sequences of mixed lengths, each in its own KV slot,
//! advanced together one token a step give every row the logits of decoding that sequence
//! alone, in every kernel shape, with learned positions (GPT-2), RoPE, and a quantised KV
//! cache; sequences leave the batch at different steps; bad batches are refused.

#![cfg(not(target_arch = "wasm32"))]

use crate::common;

use emberlm::backend::gpu::Forward;
use emberlm::backend::gpu::{KernelCache, KernelOverrides, Variant};
use emberlm::backend::{BatchToken, Readback, StepLogits};
use emberlm::dtype::kv::{KvKind, KvKinds};
use emberlm::loader::ModelFiles;
use emberlm::GpuOptions;
use rand::Rng;

fn fixture(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn full(l: StepLogits) -> Vec<f32> {
    match l {
        StepLogits::Full(row) => row,
        StepLogits::Candidates(_) => panic!("asked for whole rows"),
    }
}

/// One sequence: its prompt and the tokens fed after it.
struct Case {
    prompt: Vec<u32>,
    then: Vec<u32>,
}

fn cases(rng: &mut impl Rng, vocab: usize, n: usize) -> Vec<Case> {
    (0..n)
        .map(|i| {
            let (p, t) = (1 + (i * 7 + 2) % 13, 1 + (i * 5) % 9);
            let mut ids = |n: usize| (0..n).map(|_| rng.random_range(0..vocab as u32)).collect();
            Case {
                prompt: ids(p),
                then: ids(t),
            }
        })
        .collect()
}

/// How a batched row is held to the same sequence decoded alone.
#[derive(Clone, Copy)]
enum Bound {
    /// The same bits: the workgroup shape runs a batch's linears in the decode kernel, which
    /// keeps each token's one-token summation order.
    Exact,
    /// |batch − alone| ≤ this everywhere: the rows shape runs a batch's linears in the
    /// multi-token kernel, which adds in another order than the one-token one.
    Abs(f32),
    /// A quantised cache in the rows shape: the batch's kernels round K and V differently from decoding alone,
    /// and now and then a value lands on the other side of a q8_0 code boundary, which moved
    /// the tiny model's logits by up to 1.5e-2 over 31 seeds (most seeds: ~1e-5). So each row
    /// must be as close to the same sequence decoded alone with an f32 cache as the quantised
    /// run alone is (0.03-0.4 on the tiny model), give or take this slack: a code more or less
    /// moved that distance by at most 6e-3 over 13 seeds, while another sequence's logits
    /// are more than 6 away.
    QuantError(f32),
}

/// Every case decoded alone in the main sequence: the prompt's last row, then a row per
/// token after it.
fn decode_alone(
    ctx: &emberlm::GpuContext,
    fwd: &mut Forward,
    cases: &[Case],
) -> Vec<Vec<Vec<f32>>> {
    cases
        .iter()
        .map(|c| {
            fwd.truncate(0).unwrap();
            let mut rows = vec![pollster::block_on(fwd.forward(ctx, &c.prompt, false)).unwrap()];
            for &t in &c.then {
                rows.push(pollster::block_on(fwd.forward(ctx, &[t], false)).unwrap());
            }
            rows
        })
        .collect()
}

/// Decodes every case alone, then all together, and holds each row to `bound`.
fn batch_matches_alone(path: &std::path::Path, options: GpuOptions, what: &str, bound: Bound) {
    let Some(ctx) = common::native_gpu(options) else {
        return;
    };
    let mut rng = common::rng(what, &|m| eprintln!("{m}"));
    let files = ModelFiles::open(path).unwrap();
    let weights = files.weights().unwrap();
    let vocab = weights.config.vocab_size;
    let cache = KernelCache::new();
    let cases = cases(&mut rng, vocab, 6);
    // for a quantised cache, the same sequences alone with an f32 cache
    let exact = matches!(bound, Bound::QuantError(_)).then(|| {
        let f32_ctx = common::native_gpu(GpuOptions::default()).unwrap();
        let f32_cache = KernelCache::new();
        let mut fwd =
            pollster::block_on(Forward::new(&f32_ctx, &f32_cache, &weights, 32, 8)).unwrap();
        decode_alone(&f32_ctx, &mut fwd, &cases)
    });
    let mut fwd = pollster::block_on(Forward::new(&ctx, &cache, &weights, 32, 8)).unwrap();
    let want = decode_alone(&ctx, &mut fwd, &cases);
    let check = |got: &[f32], i: usize, row: usize, label: &str| {
        let d = max_diff(got, &want[i][row]);
        let tol = match (bound, &exact) {
            (Bound::Exact, _) => {
                assert!(
                    got.iter()
                        .zip(&want[i][row])
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{what}: {label} differs from decoding alone by {d} (the same bits expected)"
                );
                return;
            }
            (Bound::Abs(tol), _) => {
                assert!(d <= tol, "{what}: {label} differs by {d}");
                return;
            }
            (Bound::QuantError(slack), exact) => (
                slack,
                exact.as_ref().expect("the f32 run of a quantised bound"),
            ),
        };
        let (tol, exact) = tol;
        let alone = max_diff(&want[i][row], &exact[i][row]);
        let batch = max_diff(got, &exact[i][row]);
        assert!(
            batch <= alone + tol,
            "{what}: {label}: {batch} from the f32 cache's logits, alone {alone} \
             (batch vs alone {d})"
        );
        // the bound still tells sequences apart: another sequence's logits fail it
        let j = (i + 1) % exact.len();
        let other = max_diff(got, &exact[j][row.min(exact[j].len() - 1)]);
        assert!(
            other > alone + tol,
            "{what}: {label}: the bound {} would pass sequence {j} ({other})",
            alone + tol
        );
    };
    pollster::block_on(fwd.set_batch(&ctx, &cache, cases.len())).unwrap();
    assert_eq!(fwd.kv().slots(), cases.len());
    // slots out of order, so that a sequence's slot is not its index
    let slot = |i: usize| (i * 5 + 3) % cases.len();
    for (i, c) in cases.iter().enumerate() {
        let out =
            pollster::block_on(fwd.run_in_slot(&ctx, slot(i), 0, &c.prompt, Readback::LastRow))
                .unwrap();
        let emberlm::backend::Output::Logits(row) = out else {
            panic!("no logits")
        };
        check(&row, i, 0, &format!("prompt {i} in slot {}", slot(i)));
    }
    let longest = cases.iter().map(|c| c.then.len()).max().unwrap();
    let mut sizes = Vec::new();
    for k in 0..longest {
        let live: Vec<usize> = (0..cases.len())
            .filter(|&i| k < cases[i].then.len())
            .collect();
        sizes.push(live.len());
        let tokens: Vec<BatchToken> = live
            .iter()
            .map(|&i| BatchToken {
                slot: slot(i),
                pos: cases[i].prompt.len() + k,
                token: cases[i].then[k],
            })
            .collect();
        let rows =
            pollster::block_on(fwd.decode_batch(&ctx, &tokens, &vec![None; live.len()])).unwrap();
        for (&i, row) in live.iter().zip(rows) {
            check(&full(row), i, k + 1, &format!("step {k}, sequence {i}"));
        }
    }
    eprintln!("{what}: batch sizes {sizes:?} match decoding alone");
    assert!(sizes.contains(&cases.len()) && sizes.contains(&1));
    ctx.check().expect("no GPU error along the way");
}

#[test]
fn a_batch_decodes_each_sequence_as_alone_in_every_shape() {
    for variant in Variant::EVERY_FAMILY {
        let options = GpuOptions {
            kernels: KernelOverrides::all(variant),
            ..GpuOptions::default()
        };
        for model in ["tiny-llama-q4_1.gguf", "tiny-gpt2-f16.gguf"] {
            batch_matches_alone(
                &fixture(model),
                options.clone(),
                &format!("{model}, {variant}"),
                // the workgroup decode kernel keeps each token's one-token order
                if variant == Variant::WORKGROUP {
                    Bound::Exact
                } else {
                    Bound::Abs(1e-4)
                },
            );
        }
    }
}

#[test]
fn a_batch_over_a_quantised_cache_decodes_as_alone() {
    for variant in Variant::EVERY_FAMILY {
        let options = GpuOptions {
            kv_cache: KvKinds::both(KvKind::Q8_0),
            kernels: KernelOverrides::all(variant),
            ..GpuOptions::default()
        };
        batch_matches_alone(
            &fixture("tiny-llama-q4_1.gguf"),
            options,
            &format!("q8_0 cache, {variant}"),
            if variant == Variant::WORKGROUP {
                Bound::Exact
            } else {
                Bound::QuantError(5e-2)
            },
        );
    }
}

#[test]
fn bad_batches_are_refused() {
    let Some(ctx) = common::native_gpu(GpuOptions::default()) else {
        return;
    };
    let files = ModelFiles::open(&fixture("tiny-llama-q4_1.gguf")).unwrap();
    let weights = files.weights().unwrap();
    let cache = KernelCache::new();
    let mut fwd = pollster::block_on(Forward::new(&ctx, &cache, &weights, 16, 4)).unwrap();
    assert_eq!(fwd.max_batch(), 4);
    pollster::block_on(fwd.set_batch(&ctx, &cache, 6)).unwrap();
    let t = |slot, pos| BatchToken {
        slot,
        pos,
        token: 1,
    };
    let run = |fwd: &mut Forward, tokens: &[BatchToken]| {
        pollster::block_on(fwd.decode_batch(&ctx, tokens, &vec![None; tokens.len()]))
            .unwrap_err()
            .to_string()
    };
    let e = run(&mut fwd, &[t(0, 0), t(1, 0), t(2, 0), t(3, 0), t(4, 0)]);
    assert!(e.contains("1..=4"), "{e}");
    let e = run(&mut fwd, &[t(0, 0), t(0, 1)]);
    assert!(e.contains("slot 0 appears twice"), "{e}");
    let e = run(&mut fwd, &[t(6, 0)]);
    assert!(e.contains("not one of the cache's 6 slots"), "{e}");
    let e = run(&mut fwd, &[t(1, 16)]);
    assert!(e.contains("position 16"), "{e}");
    let e = pollster::block_on(fwd.decode_batch(&ctx, &[t(0, 0)], &[])).unwrap_err();
    assert!(e.to_string().contains("0 requests for 1"), "{e}");
    ctx.check().expect("no GPU error along the way");
}
