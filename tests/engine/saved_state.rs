//! A saved conversation restored into a fresh session continues exactly as the session that
//! saved it: the same greedy tokens, with the restored positions reused (no forward pass over
//! them), on the CPU backend and on the GPU, with f32 and quantized caches and with Gemma 3's
//! local rings wrapped. A state from another model, another KV kind or a longer context, and a
//! damaged file, are refused with the reason, and the session keeps its conversation.

#![cfg(not(target_arch = "wasm32"))]

use crate::common;

use std::path::PathBuf;

use emberlm::dtype::kv::{KvKind, KvKinds};
use emberlm::loader::ModelFiles;
use emberlm::sampling::SamplingParams;
use emberlm::session::{GenerateOptions, Generation, Prompt, Session};
use emberlm::GpuOptions;

fn files(name: &str) -> ModelFiles {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    ModelFiles::open(&path).unwrap()
}

/// Greedy decoding of `n` tokens (the embeddings tests use it too).
pub(crate) fn greedy(n: usize) -> GenerateOptions {
    GenerateOptions {
        sampling: SamplingParams {
            max_new_tokens: n,
            ..SamplingParams::greedy()
        },
        ..GenerateOptions::default()
    }
}

fn run(s: &mut Session, tokens: &[u32], n: usize) -> Generation {
    pollster::block_on(s.generate(&Prompt::Tokens(tokens.to_vec()), &greedy(n), &mut |_| {}))
        .unwrap()
}

/// Sessions of one kind: the CPU backend, or the GPU with `kinds` (`None`: no GPU here).
type Load<'a> = &'a dyn Fn(&ModelFiles, Option<usize>) -> Option<Session>;

fn cpu(kinds: KvKinds) -> impl Fn(&ModelFiles, Option<usize>) -> Option<Session> {
    move |f, context| {
        let mut s = Session::new_cpu(f, context).unwrap();
        if kinds != KvKinds::default() {
            pollster::block_on(s.set_kv_kinds(kinds)).unwrap();
        }
        Some(s)
    }
}

fn gpu(kinds: KvKinds) -> impl Fn(&ModelFiles, Option<usize>) -> Option<Session> {
    move |f, context| {
        let ctx = common::native_gpu(GpuOptions {
            kv_cache: kinds,
            ..GpuOptions::default()
        })?;
        Some(pollster::block_on(Session::new(ctx, f, context)).unwrap())
    }
}

/// Talks, saves, talks on; a fresh session restored from the save talks on identically, and
/// reuses every restored position.
fn continues_exactly(model: &str, load: Load<'_>, first: usize) {
    let f = files(model);
    let Some(mut a) = load(&f, Some(96)) else {
        return;
    };
    let prompt: Vec<u32> = (0..first as u32).map(|i| (i * 37 + 11) % 200 + 3).collect();
    let g = run(&mut a, &prompt, 6);
    let note = serde_json::json!({ "messages": ["kept as given"] });
    let bytes = pollster::block_on(a.save_state(Some(note.clone()))).unwrap();
    let held = a.cached_tokens().to_vec();
    assert_eq!(
        held.len(),
        prompt.len() + g.sequences[0].tokens.len() - 1,
        "{model}"
    );
    let mut next = held.clone();
    next.extend([5, 9, 14]);
    let want = run(&mut a, &next, 8);

    let mut b = load(&f, Some(96)).unwrap();
    let restored = pollster::block_on(b.restore_state(&bytes, "conversation.kv")).unwrap();
    assert_eq!(restored.positions, held.len(), "{model}");
    assert_eq!(restored.note, Some(note), "{model}");
    assert_eq!(b.cached_tokens(), held.as_slice(), "{model}");
    let got = run(&mut b, &next, 8);
    assert_eq!(got.sequences[0].tokens, want.sequences[0].tokens, "{model}");
    assert_eq!(
        got.stats.cached_tokens,
        held.len(),
        "{model}: restored rows were recomputed"
    );
    assert_eq!(got.stats.cached_tokens, want.stats.cached_tokens, "{model}");
}

#[test]
fn a_restored_conversation_continues_exactly_on_the_cpu() {
    let f32 = KvKinds::default();
    continues_exactly("tiny-llama-q4_1.gguf", &cpu(f32), 9);
    continues_exactly("tiny-gpt2-f32.gguf", &cpu(f32), 5);
    continues_exactly(
        "tiny-llama-q8_0.gguf",
        &cpu(KvKinds::both(KvKind::Q8_0)),
        12,
    );
    // more positions than the local layers' rings hold: the rings are saved whole
    continues_exactly("tiny-gemma3-f32.gguf", &cpu(f32), 70);
}

#[test]
fn a_restored_conversation_continues_exactly_on_the_gpu() {
    continues_exactly("tiny-llama-q4_1.gguf", &gpu(KvKinds::default()), 9);
    continues_exactly("tiny-llama-q4_0.gguf", &gpu(KvKinds::both(KvKind::F16)), 7);
    continues_exactly("tiny-gemma3-f32.gguf", &gpu(KvKinds::default()), 70);
}

#[test]
fn a_state_from_elsewhere_is_refused_and_the_conversation_stays() {
    let llama = files("tiny-llama-q4_1.gguf");
    let mut a = Session::new_cpu(&llama, Some(96)).unwrap();
    run(&mut a, &[3, 4, 5, 6, 7, 8, 9], 4);
    let bytes = pollster::block_on(a.save_state(None)).unwrap();

    let refused = |s: &mut Session, bytes: &[u8]| {
        let before = s.cached_tokens().to_vec();
        let e = pollster::block_on(s.restore_state(bytes, "c.kv"))
            .unwrap_err()
            .to_string();
        assert_eq!(s.cached_tokens(), before.as_slice(), "{e}");
        assert!(e.starts_with("c.kv"), "{e}");
        e
    };
    // another model (the same shape, other weights)
    let mut other = Session::new_cpu(&files("tiny-llama-q8_0.gguf"), Some(96)).unwrap();
    run(&mut other, &[1, 2, 3], 2);
    assert!(refused(&mut other, &bytes).contains("another model"));
    // another KV kind
    let mut q8 = Session::new_cpu(&llama, Some(96)).unwrap();
    pollster::block_on(q8.set_kv_kinds(KvKinds::both(KvKind::Q8_0))).unwrap();
    assert!(refused(&mut q8, &bytes).contains("q8_0"));
    // a shorter context than the conversation
    let mut short = Session::new_cpu(&llama, Some(8)).unwrap();
    assert!(refused(&mut short, &bytes).contains("context of 8"));
    // damaged and cut files
    let mut same = Session::new_cpu(&llama, Some(96)).unwrap();
    let mut damaged = bytes.clone();
    let n = damaged.len();
    damaged[n / 2] ^= 0x40;
    assert!(refused(&mut same, &damaged).contains("digest"));
    assert!(refused(&mut same, &bytes[..n - 3]).contains("cut short"));
}
