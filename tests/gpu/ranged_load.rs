//! A GPU load that reads a model's files a byte range at a time ([`RangedGguf`], what the page
//! uses for a `File` or a stored download): the same logits, bit for bit, as the load of the
//! whole file, for every model form (fused QKV and gate/up, biases, QK-norm, local layers, RoPE
//! factors, a split set given in any order); the host holding one group of tensors at a time;
//! the same model fingerprint (a conversation saved from one load restores into the other);
//! and bad sources refused by name.

#![cfg(not(target_arch = "wasm32"))]

use crate::common;
use common::memory_files::Files;

use std::path::Path;
use std::rc::Rc;

use emberlm::backend::gpu::Forward;
use emberlm::backend::DEFAULT_CHUNK;
use emberlm::format::gguf_model::must_read_whole;
use emberlm::format::gguf_ranged::RangedGguf;
use emberlm::loader::ModelFiles;
use emberlm::model::byte_source::ByteSource;
use emberlm::{Error, GpuOptions, Result};

/// The model `ranged` describes, loaded a group of tensors at a time (64 positions).
fn load_read(
    ctx: &emberlm::GpuContext,
    cache: &emberlm::backend::gpu::KernelCache,
    ranged: &RangedGguf,
) -> Result<Forward> {
    pollster::block_on(Forward::new_read(
        ctx,
        cache,
        ranged.layout(),
        ranged,
        64,
        DEFAULT_CHUNK,
        &mut |_, _| {},
    ))
}

fn fixture(name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn open(files: &[(&str, Vec<u8>)]) -> (Rc<Files>, Result<RangedGguf>) {
    open_merging(files, 0)
}

/// [`open`] from a source that asks for neighbouring tensors together up to `merge` bytes.
fn open_merging(files: &[(&str, Vec<u8>)], merge: u64) -> (Rc<Files>, Result<RangedGguf>) {
    let source = Files::new(files.iter().map(|(_, b)| b.clone()).collect(), merge);
    let names: Vec<(String, u64)> = files
        .iter()
        .map(|(n, b)| (n.to_string(), b.len() as u64))
        .collect();
    let dyn_source: Rc<dyn ByteSource> = source.clone();
    let ranged = pollster::block_on(RangedGguf::open(dyn_source, &names));
    (source, ranged)
}

/// Every position's logits of `tokens` from the whole files and from the ranged read, which
/// must be the same bits; also the host's largest read against the largest layer.
fn same_logits(files: &[(&str, Vec<u8>)]) {
    same_logits_merging(files, 0);
}

/// [`same_logits`] from a source that reads neighbouring tensors together up to `merge` bytes;
/// how many reads the tensors took (`None` without a GPU).
fn same_logits_merging(files: &[(&str, Vec<u8>)], merge: u64) -> Option<usize> {
    let (ctx, cache) = common::shared_native_gpu(GpuOptions::default())?;
    let whole = ModelFiles::from_parts(
        files
            .iter()
            .map(|(n, b)| (b.clone(), n.to_string()))
            .collect(),
    )
    .unwrap();
    let weights = whole.weights().unwrap();
    let tokens: Vec<u32> = (0..11u32).map(|i| (i * 37 + 5) % 200).collect();
    let mut want = pollster::block_on(Forward::new(ctx, cache, &weights, 64, DEFAULT_CHUNK))
        .unwrap_or_else(|e| panic!("{}: {e}", files[0].0));
    let want = pollster::block_on(want.forward(ctx, &tokens, true)).unwrap();

    let (source, ranged) = open_merging(files, merge);
    let ranged = ranged.unwrap_or_else(|e| panic!("{}: {e}", files[0].0));
    assert_eq!(ranged.layout().config, weights.config, "{}", files[0].0);
    assert_eq!(ranged.layout().weight_bytes(), weights.weight_bytes());
    assert!(ranged.fingerprint().is_err(), "nothing read yet");
    let mut loaded = 0u64;
    let mut got = pollster::block_on(Forward::new_read(
        ctx,
        cache,
        ranged.layout(),
        &ranged,
        64,
        DEFAULT_CHUNK,
        &mut |done, total| {
            assert!(
                done <= total && done >= loaded,
                "{done} of {total} after {loaded}"
            );
            loaded = done;
        },
    ))
    .unwrap_or_else(|e| panic!("{}: {e}", files[0].0));
    assert_eq!(loaded, weights.weight_bytes());
    let got = pollster::block_on(got.forward(ctx, &tokens, true)).unwrap();
    assert_eq!(got.len(), want.len());
    let differ = got
        .iter()
        .zip(&want)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    assert_eq!(differ, 0, "{}: {differ} logits differ", files[0].0);
    assert_eq!(ranged.fingerprint().unwrap(), weights.fingerprint());

    // one layer's tensors at a time (or one tensor outside the layers): never the files
    let layer_bytes = |l: usize| -> u64 {
        let prefix = format!("blk.{l}.");
        weights
            .tensors
            .iter()
            .filter(|(n, _)| n.starts_with(&prefix))
            .map(|(_, t)| t.data.len() as u64)
            .sum()
    };
    let largest_group = (0..weights.config.n_layers)
        .map(layer_bytes)
        .chain(weights.tensors.values().map(|t| t.data.len() as u64))
        .max()
        .unwrap();
    assert!(
        ranged.largest_read() <= largest_group,
        "{} bytes in one read, the largest group holds {largest_group}",
        ranged.largest_read()
    );
    let file_bytes: u64 = files.iter().map(|(_, b)| b.len() as u64).sum();
    let largest_tensor_read = source
        .asked
        .borrow()
        .iter()
        .filter(|(_, r)| r.start > 0)
        .map(|(_, r)| r.end - r.start)
        .max()
        .unwrap();
    assert!(
        largest_tensor_read < file_bytes / 2,
        "a read of most of the file"
    );
    // every tensor byte is read once, headers aside
    let tensor_reads: u64 = source
        .asked
        .borrow()
        .iter()
        .filter(|(_, r)| r.start > 0)
        .map(|(_, r)| r.end - r.start)
        .sum();
    assert!(
        tensor_reads <= weights.weight_bytes() + 4096,
        "{tensor_reads} bytes read for {} of tensors",
        weights.weight_bytes()
    );
    let reads = source
        .asked
        .borrow()
        .iter()
        .filter(|(_, r)| r.start > 0)
        .count();
    Some(reads)
}

/// A source where each read is a round trip (HTTP ranges) gets a layer's neighbouring tensors
/// in one read, within its limit, with the same bits.
#[test]
fn neighbouring_tensors_are_read_together_where_the_source_asks() {
    let name = "tiny-llama-q4_1.gguf";
    let files = [(name, fixture(name))];
    let Some(alone) = same_logits_merging(&files, 0) else {
        return;
    };
    let together = same_logits_merging(&files, 1 << 20).unwrap();
    let weights = ModelFiles::from_parts(vec![(fixture(name), name.to_string())])
        .unwrap()
        .weights()
        .unwrap()
        .tensors
        .len();
    assert_eq!(alone, weights, "one read per tensor without merging");
    assert!(
        together * 4 <= alone,
        "{together} reads merged against {alone} alone"
    );
    // a limit smaller than a layer splits it, and never reads past the limit but for one tensor
    let (source, ranged) = open_merging(&files, 4096);
    let ranged = ranged.unwrap();
    let Some((ctx, cache)) = common::shared_native_gpu(GpuOptions::default()) else {
        return;
    };
    load_read(ctx, cache, &ranged).unwrap();
    let sizes: Vec<u64> = ranged
        .layout()
        .tensors
        .values()
        .map(|t| t.stored_len())
        .collect();
    for (_, r) in source.asked.borrow().iter().filter(|(_, r)| r.start > 0) {
        let n = r.end - r.start;
        assert!(
            n <= 4096 || sizes.contains(&n),
            "a read of {n} bytes: more than the limit and not one tensor"
        );
    }
}

#[test]
fn every_model_form_gives_the_same_logits_read_by_range() {
    for name in [
        "tiny-llama-q4_1.gguf",
        "tiny-llama-q8_0.gguf",
        "tiny-llama-256-q4_k_m.gguf",
        "tiny-gpt2-f16.gguf",
        "tiny-gemma3-f32.gguf",
        "tiny-qwen3-q8_0.gguf",
        "tiny-qwen2-f32.gguf",
        "tiny-llama3-rope-f32.gguf",
    ] {
        same_logits(&[(name, fixture(name))]);
    }
}

#[test]
fn a_split_set_in_any_order_reads_by_range() {
    let part = |k: u32| {
        let name = format!("tiny-llama-q4_1-0000{k}-of-00003.gguf");
        let bytes = fixture(&format!("split/{name}"));
        (name, bytes)
    };
    let parts = [part(3), part(1), part(2)];
    let files: Vec<(&str, Vec<u8>)> = parts.iter().map(|(n, b)| (n.as_str(), b.clone())).collect();
    same_logits(&files);
}

#[test]
fn a_saved_conversation_moves_between_the_two_loads() {
    use emberlm::sampling::SamplingParams;
    use emberlm::session::{GenerateOptions, Prompt, Session};
    let greedy = |n: usize| GenerateOptions {
        sampling: SamplingParams {
            max_new_tokens: n,
            ..SamplingParams::greedy()
        },
        ..GenerateOptions::default()
    };
    let Some(ctx) = common::native_gpu(GpuOptions::default()) else {
        return;
    };
    let name = "tiny-llama-q4_1.gguf";
    let bytes = fixture(name);
    let whole = ModelFiles::from_bytes(bytes.clone(), name).unwrap();
    let mut a = pollster::block_on(Session::new(ctx, &whole, Some(64))).unwrap();
    let ids: Vec<u32> = (1..9).collect();
    let run = |s: &mut Session, tokens: &[u32], n: usize| {
        pollster::block_on(s.generate(&Prompt::Tokens(tokens.to_vec()), &greedy(n), &mut |_| {}))
            .unwrap()
            .sequences[0]
            .tokens
            .clone()
    };
    let first = run(&mut a, &ids, 4);
    let saved = pollster::block_on(a.save_state(None)).unwrap();
    let mut turn = ids.clone();
    turn.extend(&first);
    turn.extend([17, 18]);
    let next = run(&mut a, &turn, 6);

    let (_, ranged) = open(&[(name, bytes)]);
    let ranged = ModelFiles::Ranged(Box::new(ranged.unwrap()));
    let ctx = common::native_gpu(GpuOptions::default()).unwrap();
    let mut b = pollster::block_on(Session::new(ctx, &ranged, Some(64))).unwrap();
    pollster::block_on(b.restore_state(&saved, "saved")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        run(&mut b, &turn, 6),
        next,
        "the restored conversation continues alike"
    );
    assert!(ranged.weights().is_err(), "a ranged model holds no tensors");
    assert_eq!(
        ranged.weight_bytes().unwrap(),
        whole.weight_bytes().unwrap()
    );
}

#[test]
fn bad_sources_are_refused_by_name() {
    let bytes = fixture("tiny-llama-q4_1.gguf");
    // a file cut short inside its tensors: the read of the missing bytes fails, naming it
    let Some((ctx, cache)) = common::shared_native_gpu(GpuOptions::default()) else {
        return;
    };
    let mut short = bytes.clone();
    short.truncate(bytes.len() - 100);
    let source = Files::new(vec![short], 0);
    let dyn_source: Rc<dyn ByteSource> = source.clone();
    let names = [("cut.gguf".to_string(), bytes.len() as u64)];
    let ranged = pollster::block_on(RangedGguf::open(dyn_source, &names)).unwrap();
    let err = load_read(ctx, cache, &ranged).expect_err("a short file");
    assert!(err.to_string().contains("past its end"), "{err}");

    // not GGUF, and a truncated header
    let (_, e) = open(&[("x.gguf", b"GGUF\x03\x00\x00\x00".to_vec())]);
    let e = e.expect_err("a header cut short");
    assert!(e.to_string().contains("x.gguf"), "{e}");
    let (_, e) = open(&[("noise.bin", vec![7u8; 1000])]);
    assert!(e.expect_err("not GGUF").to_string().contains("noise.bin"));

    // one part of a split set alone
    let name = "tiny-llama-q4_1-00002-of-00003.gguf";
    let (_, e) = open(&[(name, fixture(&format!("split/{name}")))]);
    let e = e.expect_err("a part alone").to_string();
    assert!(e.contains("every part is needed"), "{e}");

    // a file whose matrices the loader splits is refused for reading by range
    // (only that: the page then reads it whole, where any other refusal stands)
    let (_, e) = open(&[("tiny-phi3-f32.gguf", fixture("tiny-phi3-f32.gguf"))]);
    let e = e.expect_err("a stacked file");
    assert!(must_read_whole(&e), "{e}");
    assert!(e.to_string().contains("stacks matrices"), "{e}");
    let other = Error::Unsupported {
        file: "x.gguf".into(),
        what: "architecture `mamba3`".into(),
    };
    assert!(!must_read_whole(&other));
}

/// After a lost device the engine rebuilds from the files it kept: a model read by range is
/// read again, a layer at a time, and the conversation continues with the same tokens.
#[test]
fn a_lost_device_reads_the_model_again_by_range() {
    use emberlm::chat::ChatMessage;
    use emberlm::engine::{Engine, EngineOptions};
    use emberlm::sampling::SamplingParams;
    use emberlm::session::{GenerateOptions, Prompt};
    let Some(ctx) = common::native_gpu(GpuOptions::default()) else {
        return;
    };
    let name = "tiny-llama-q4_1.gguf";
    let (source, ranged) = open(&[(name, fixture(name))]);
    let files = ModelFiles::Ranged(Box::new(ranged.unwrap()));
    let engine = pollster::block_on(Engine::new(
        ctx,
        files,
        EngineOptions::default(),
        &mut |_, _| {},
    ))
    .unwrap();
    let options = GenerateOptions {
        sampling: SamplingParams {
            max_new_tokens: 8,
            ..SamplingParams::greedy()
        },
        ..GenerateOptions::default()
    };
    let prompt = Prompt::Chat(vec![ChatMessage::new(
        "user",
        "Permission is hereby granted",
    )]);
    let generate = || {
        pollster::block_on(engine.generate(&prompt, &options, &mut |_| {}))
            .map(|g| g.sequences[0].tokens.clone())
    };
    let want = generate().unwrap();
    let reads = source.reads.get();
    pollster::block_on(engine.destroy_device_for_test());
    assert!(matches!(generate(), Err(Error::DeviceLost { .. })));
    assert_eq!(generate().unwrap(), want);
    assert_eq!(engine.rebuilds(), 1);
    assert!(
        source.reads.get() > reads,
        "the rebuild read the tensors again"
    );
}

/// What a load from a URL asks once the header is read: a model described by its header alone
/// (no tensor read) is refused with the numbers where it could not load (a context past the
/// model's; a row past a binding), and accepted with the context a load would take.
#[test]
fn a_model_is_checked_from_its_header_before_any_tensor_is_read() {
    use emberlm::session::Session;
    let name = "tiny-llama-q4_1.gguf";
    let (source, ranged) = open(&[(name, fixture(name))]);
    let ranged = ranged.unwrap();
    let layout = ranged.layout();
    let header_reads = source.reads.get();

    // the CPU backend: the model's context by default, a longer one refused by name
    let choice = Session::check_cpu_fit(layout, None, Default::default()).unwrap();
    assert_eq!(choice.context, layout.config.context_length);
    let e = Session::check_cpu_fit(layout, Some(100_000), Default::default()).unwrap_err();
    assert!(
        matches!(&e, Error::InvalidArgument { name, .. } if *name == "context"),
        "{e}"
    );

    if let Some((ctx, _)) = common::shared_native_gpu(GpuOptions::default()) {
        let choice = Session::check_gpu_fit(ctx, layout, Some(64)).unwrap();
        assert_eq!(choice.context, 64);
        assert!(Session::check_gpu_fit(ctx, layout, Some(100_000)).is_err());
    }
    // a device whose bindings hold less than one row of a matrix
    let capped = GpuOptions {
        binding_cap: Some(16),
        ..GpuOptions::default()
    };
    if let Some((ctx, _)) = common::shared_native_gpu(capped) {
        match Session::check_gpu_fit(ctx, layout, None) {
            Err(Error::Limit {
                limit,
                needed,
                allowed,
                ..
            }) => {
                assert_eq!(limit, "maxStorageBufferBindingSize");
                assert_eq!(allowed, 16);
                assert!(needed > 16);
            }
            other => panic!("a row past the binding: {other:?}"),
        }
    }
    assert_eq!(source.reads.get(), header_reads, "no tensor was read");
}
