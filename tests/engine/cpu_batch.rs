//! Batched decoding on the CPU backend: sequences of mixed lengths, each in its own KV slot,
//! advanced together one token a step give every row exactly the logits of decoding that
//! sequence alone (the same bits: the several-token row products compute each token as the
//! one-token ones do), for the types with a fused row path (Q8_0, Q4_0, Q4_1), a K-quant and a
//! float file; batches of 1 to 17 sequences, leaving at different steps.

#![cfg(not(target_arch = "wasm32"))]

use emberlm::backend::cpu::CpuForward;
use emberlm::backend::{BatchToken, Output, Readback, Rows, StepLogits};
use emberlm::loader::ModelFiles;

fn fixture(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// A small deterministic generator, so that a failure names a reproducible case.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u32) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) % u64::from(n)) as u32
    }
}

/// One sequence: its prompt and the tokens fed after it.
struct Case {
    prompt: Vec<u32>,
    then: Vec<u32>,
}

fn full(l: StepLogits) -> Vec<f32> {
    match l {
        StepLogits::Full(row) => row,
        StepLogits::Candidates(_) => panic!("asked for whole rows"),
    }
}

/// Decodes `n` cases alone, then all together, and asserts every row is the same bits.
fn batch_is_alone_bit_for_bit(model: &str, n: usize) {
    let files = ModelFiles::open(&fixture(model)).unwrap();
    let weights = files.weights().unwrap();
    let vocab = weights.config.vocab_size as u32;
    let mut backend = CpuForward::backend(&weights, 32).unwrap();
    let mut rng = Lcg(n as u64 * 977 + model.len() as u64);
    let cases: Vec<Case> = (0..n)
        .map(|i| {
            let (p, t) = (1 + (i * 7 + 2) % 13, 1 + (i * 5) % 9);
            let mut ids = |k: usize| (0..k).map(|_| rng.below(vocab)).collect::<Vec<_>>();
            Case {
                prompt: ids(p),
                then: ids(t),
            }
        })
        .collect();
    let mut want = Vec::new();
    for c in &cases {
        backend.truncate(0).unwrap();
        let mut rows = vec![pollster::block_on(backend.forward(&c.prompt, false)).unwrap()];
        for &t in &c.then {
            rows.push(pollster::block_on(backend.forward(&[t], false)).unwrap());
        }
        want.push(rows);
    }
    pollster::block_on(backend.set_batch(n)).unwrap();
    // Slots out of order, so that a sequence's slot is not its index.
    let slot = |i: usize| (i * 5 + 3) % n;
    for (i, c) in cases.iter().enumerate() {
        let out = pollster::block_on(backend.run(
            Rows::InSlot {
                slot: slot(i),
                pos: 0,
                tokens: &c.prompt,
            },
            Readback::LastRow,
        ))
        .unwrap();
        let Output::Logits(row) = out else {
            panic!("no logits")
        };
        assert!(row == want[i][0], "{model}: prompt {i} in slot {}", slot(i));
    }
    let longest = cases.iter().map(|c| c.then.len()).max().unwrap();
    let mut sizes = Vec::new();
    for k in 0..longest {
        let live: Vec<usize> = (0..n).filter(|&i| k < cases[i].then.len()).collect();
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
            pollster::block_on(backend.decode_batch(&tokens, &vec![None; live.len()])).unwrap();
        for (&i, row) in live.iter().zip(rows) {
            let row = full(row);
            let same = row
                .iter()
                .zip(&want[i][k + 1])
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{model}, B = {n}: step {k}, sequence {i} differs");
        }
    }
    // All together at first, fewer once the shortest have left.
    assert!(
        sizes[0] == n && (n == 1 || sizes[sizes.len() - 1] < n),
        "{sizes:?}"
    );
}

#[test]
fn a_cpu_batch_decodes_each_sequence_bit_for_bit_as_alone() {
    for model in [
        "tiny-llama-q4_1.gguf",
        "tiny-llama-q8_0.gguf",
        "tiny-llama-q4_0.gguf",
        "tiny-llama-256-q4_k_m.gguf",
        "tiny-gpt2-f16.gguf",
    ] {
        for n in [1, 3, 8, 17] {
            batch_is_alone_bit_for_bit(model, n);
        }
    }
}
