//! What each fuzz target runs on one input, shared by `fuzz_targets/*.rs` and by
//! `tests/formats/fuzz_replay.rs`, which replays the saved corpora on stable. Malformed input must come
//! back as an `Err`; a panic here is a bug (in emberlm, or an assertion below that fails).
//!
//! Inputs made of two files are split at the first NUL byte, which no JSON text or template
//! contains: `config.json \0 model.safetensors`, `tokenizer.json \0 tokenizer_config.json`,
//! `template \0 message content`.

#![allow(dead_code)]

use emberlm::chat::{ChatMessage, ChatTemplate};
use emberlm::config::default_context;
use emberlm::format::gguf::{GgufHeader, GgufValue};
use emberlm::format::gguf_stream::GgufStream;
use emberlm::format::safetensors::{HfFolder, POOLING_FILE};
use emberlm::loader::ModelFiles;
use emberlm::model::weights::ModelWeights;
use emberlm::tokenizer::Tokenizer;

#[path = "requests.rs"]
mod requests;
#[allow(unused_imports)]
pub use requests::*;

const FILE: &str = "fuzz.gguf";

/// `(before, after)` the first NUL byte; `(data, None)` without one.
fn split_nul(data: &[u8]) -> (&[u8], Option<&[u8]>) {
    match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], Some(&data[i + 1..])),
        None => (data, None),
    }
}

// ---------------------------------------------------------------------------------------------
// GGUF header

/// `GgufHeader::parse`, every accessor on what parsed, `parse_prefix` on prefixes and
/// `GgufStream` in two chunkings, all of which must agree with each other.
pub fn gguf_header(data: &[u8]) {
    let parsed = GgufHeader::parse(data, FILE);
    if let Ok(h) = &parsed {
        check_header(h, data);
    }
    let total = data.len() as u64;
    for cut in [
        0,
        8,
        24,
        data.len() / 2,
        data.len().saturating_sub(1),
        data.len(),
    ] {
        let cut = cut.min(data.len());
        match GgufHeader::parse_prefix(&data[..cut], total, FILE) {
            Ok(Some(h)) => match &parsed {
                Ok(p) => assert_same_header(&h, p),
                Err(e) => panic!("a {cut}-byte prefix parses but the whole file fails: {e}"),
            },
            Ok(None) => assert!(cut < data.len(), "the whole file asks for more bytes"),
            Err(e) => assert!(
                parsed.is_err(),
                "a {cut}-byte prefix fails ({e}) but the whole file parses"
            ),
        }
    }
    for chunk in [data.len() / 3 + 1, 4096] {
        stream(data, chunk, parsed.as_ref().ok());
    }
}

fn check_header(h: &GgufHeader, data: &[u8]) {
    assert!(h.alignment.is_power_of_two());
    assert_eq!(h.data_offset % h.alignment, 0);
    assert_eq!(h.file(), FILE);
    for (key, value) in h.metadata() {
        assert!(h.get(key).is_some_and(|v| std::ptr::eq(v, value)));
        let _ = value.type_name();
        let _ = h.get_str(key);
        let _ = h.get_u64(key);
        let _ = h.get_u32(key);
        let _ = h.get_f32(key);
        let _ = h.get_bool(key);
        let _ = h.get_str_array(key);
        let _ = h.get_f32_array(key);
        let _ = h.get_i32_array(key);
        match h.get_array(key) {
            Ok(Some(a)) => {
                assert!(matches!(value, GgufValue::Array(_)));
                let _ = (a.len(), a.is_empty());
                let _ = a.type_name();
            }
            Ok(None) => panic!("`{key}` is listed but not found"),
            Err(_) => assert!(!matches!(value, GgufValue::Array(_))),
        }
    }
    assert!(h.get("no.such.key").is_none());
    let _ = h.architecture();
    for t in h.tensors() {
        assert!(h.tensor(&t.name).is_some_and(|u| std::ptr::eq(u, t)));
        assert_eq!(t.shape().len(), t.dims.len());
        let _ = t.n_elements();
        let range = h.tensor_range(t);
        let bytes = match h.tensor_data(data, t) {
            Ok(b) => b,
            Err(e) => panic!("tensor `{}` of a parsed header: {e}", t.name),
        };
        assert_eq!(bytes.len() as u64, t.n_bytes);
        assert_eq!(range.end - range.start, t.n_bytes);
    }
}

/// Headers compared field by field (metadata through `Debug`, so that NaN equals NaN).
fn assert_same_header(a: &GgufHeader, b: &GgufHeader) {
    assert_eq!(a.version, b.version);
    assert_eq!(a.alignment, b.alignment);
    assert_eq!(a.data_offset, b.data_offset);
    assert_eq!(format!("{:?}", a.metadata()), format!("{:?}", b.metadata()));
    assert_eq!(a.tensors(), b.tensors());
}

/// Streams `data` in `chunk`-byte pieces: a stream that finishes must agree with `parsed` and
/// hand over exactly the bytes `tensor_data` gives.
fn stream(data: &[u8], chunk: usize, parsed: Option<&GgufHeader>) {
    let mut s = GgufStream::new(FILE, data.len() as u64);
    let mut result = Ok(());
    for piece in data.chunks(chunk.max(1)) {
        result = s.push(piece, |h, t, bytes| {
            assert_eq!(h.tensor_data(data, t).ok(), Some(bytes), "`{}`", t.name);
            Ok(())
        });
        if result.is_err() {
            break;
        }
    }
    match (result.and_then(|()| s.finish()), parsed) {
        (Ok(h), Some(p)) => assert_same_header(&h, p),
        (Ok(_), None) => panic!("the stream accepts a file the parser refuses"),
        (Err(_), _) => {}
    }
}

// ---------------------------------------------------------------------------------------------
// Whole models

/// A GGUF file as a model: configuration and tensors, tokenizer, chat template.
pub fn gguf_model(data: &[u8]) {
    let Ok(files) = ModelFiles::from_bytes(data.to_vec(), FILE) else {
        return;
    };
    let _ = files.name();
    if let Ok(w) = files.weights() {
        check_weights(&w);
    }
    check_ranged(&[(FILE.to_string(), data.to_vec())], &files);
    // The tokenizer as the model's loading builds it; `tokenizer_gguf` checks tokenizers in
    // depth (every sample, both special-token modes, streamed decoding), so one round trip here.
    if let Ok(tokenizer) = files.tokenizer() {
        check_tokenizer_briefly(&tokenizer);
        if let Ok(Some(template)) = files.chat_template(&tokenizer) {
            render(template, "Hello!");
        }
    }
}

/// Files in memory read a range at a time (a range past a file's end is an error, as a short
/// `File` gives in the page).
struct InMemory(Vec<Vec<u8>>);

impl emberlm::model::byte_source::ByteSource for InMemory {
    fn read(
        &self,
        file: usize,
        range: std::ops::Range<u64>,
    ) -> emberlm::model::byte_source::LocalFuture<'_, emberlm::Result<Vec<u8>>> {
        let got = self
            .0
            .get(file)
            .and_then(|f| f.get(range.start as usize..range.end as usize))
            .map(<[u8]>::to_vec)
            .ok_or_else(|| emberlm::Error::invalid("range", format!("{range:?} past the end")));
        Box::pin(async move { got })
    }
}

/// Runs a future that never waits (the in-memory source's).
fn ready<T>(f: impl std::future::Future<Output = T>) -> T {
    let mut f = std::pin::pin!(f);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match f.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(v) => v,
        std::task::Poll::Pending => panic!("an in-memory read waited"),
    }
}

/// The files read a range at a time (`RangedGguf`, the page's GPU load from a `File`) agree
/// with `whole`, the same files read whole: where the whole files give weights, the ranged read
/// opens (unless it refuses a file whose matrices are split on load), describes the same
/// configuration and bytes, and reads every tensor as the whole files hold it, with the same
/// fingerprint; where they do not, it fails without a panic.
fn check_ranged(files: &[(String, Vec<u8>)], whole: &ModelFiles) {
    use emberlm::format::gguf_ranged::RangedGguf;
    use emberlm::model::byte_source::TensorReader;

    let names: Vec<(String, u64)> = files
        .iter()
        .map(|(n, b)| (n.clone(), b.len() as u64))
        .collect();
    let source = std::rc::Rc::new(InMemory(files.iter().map(|(_, b)| b.clone()).collect()));
    let ranged = ready(RangedGguf::open(source, &names));
    let weights = whole.weights();
    let (ranged, weights) = match (ranged, weights) {
        (Ok(r), Ok(w)) => (r, w),
        (Err(emberlm::Error::Unsupported { .. }), Ok(_)) => return,
        (Err(e), Ok(_)) => panic!("the whole files load, read by range: {e}"),
        (Ok(r), Err(_)) => {
            // the whole load's error may lie in the tensors' bytes: reading them fails or not,
            // without a panic
            let all: Vec<String> = r.layout().tensors.keys().cloned().collect();
            let _ = ready(r.read_tensors(&all));
            return;
        }
        (Err(_), Err(_)) => return,
    };
    let layout = ranged.layout();
    assert_eq!(layout.config, weights.config);
    assert_eq!(layout.weight_bytes(), weights.weight_bytes());
    let all: Vec<String> = layout.tensors.keys().cloned().collect();
    assert_eq!(all, weights.tensors.keys().cloned().collect::<Vec<_>>());
    let read = ready(ranged.read_tensors(&all)).expect("every tensor of whole files reads");
    for (name, t) in &read {
        assert_eq!(t.data, weights.tensors[name].data, "{name}");
    }
    assert_eq!(ranged.fingerprint().ok(), Some(weights.fingerprint()));
}

/// Most parts a `gguf_split` input is cut into.
const MAX_SPLIT_PARTS: usize = 6;

/// The parts of a `gguf_split` input: each a 4-byte little-endian length and that many bytes
/// (fewer when the input ends first); what is left after the last whole length is the last part.
fn length_prefixed(mut data: &[u8]) -> Vec<&[u8]> {
    let mut parts = Vec::new();
    while parts.len() + 1 < MAX_SPLIT_PARTS && data.len() >= 4 {
        let n = u32::from_le_bytes([data[0], data[1], data[2], data[3]]) as usize;
        let rest = &data[4..];
        let n = n.min(rest.len());
        parts.push(&rest[..n]);
        data = &rest[n..];
    }
    if !data.is_empty() || parts.is_empty() {
        parts.push(data);
    }
    parts
}

/// Several GGUF files as one model (a split set, in the order given): the set's checks, then the
/// model's weights and tokenizer as `gguf_model` takes them. The input as text goes through the
/// split layout's names: a name that parses names itself again, and a first part's URL leads
/// the list of every part's URLs.
pub fn gguf_split(data: &[u8]) {
    use emberlm::format::gguf_split::{part_urls, PartName};

    if let Ok(text) = std::str::from_utf8(data) {
        if let Some(name) = PartName::parse(text) {
            assert_eq!(name.sibling(name.no), text, "{name:?}");
            assert!(name.no < name.count, "{name:?}");
        }
        if let Some(urls) = part_urls(text) {
            assert!(urls.len() >= 2, "{text:?}: {urls:?}");
            assert_eq!(urls[0], text);
        }
    }
    let files: Vec<(Vec<u8>, String)> = length_prefixed(data)
        .into_iter()
        .enumerate()
        .map(|(i, p)| (p.to_vec(), format!("fuzz-{:05}.gguf", i + 1)))
        .collect();
    let count = files.len();
    let named: Vec<(String, Vec<u8>)> = files.iter().map(|(b, n)| (n.clone(), b.clone())).collect();
    let Ok(files) = ModelFiles::from_parts(files) else {
        return;
    };
    check_ranged(&named, &files);
    assert_eq!(files.file_count(), count);
    let _ = files.name();
    if let Ok(w) = files.weights() {
        check_weights(&w);
    }
    if let Ok(tokenizer) = files.tokenizer() {
        check_tokenizer_briefly(&tokenizer);
    }
}

/// `config.json \0 model.safetensors` as a Hugging Face folder.
pub fn safetensors_hf(data: &[u8]) {
    let (config, weights) = split_nul(data);
    // the config is also read as sentence-transformers' pooling file (its `pooling_mode_*`
    // flags, which config.json itself ignores)
    let mut files = vec![
        ("config.json".to_string(), config.to_vec()),
        (POOLING_FILE.to_string(), config.to_vec()),
    ];
    if let Some(w) = weights {
        files.push(("model.safetensors".to_string(), w.to_vec()));
    }
    let Ok(folder) = HfFolder::from_files("fuzz", files) else {
        return;
    };
    if let Ok(w) = ModelFiles::Hf(folder).weights() {
        check_weights(&w);
    }
}

fn check_weights(w: &ModelWeights<'_>) {
    if let Err(e) = w.check_shapes() {
        panic!("weights were returned but fail the shape check: {e}");
    }
    let _ = w.tally();
    let _ = w.memory_estimate(default_context(&w.config));
    for (name, t) in &w.tensors {
        let values = t.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
        let bytes = values.and_then(|n| t.dtype.bytes_for(n as u64, name).ok());
        assert_eq!(bytes, Some(t.data.len() as u64), "tensor `{name}`");
    }
}

// ---------------------------------------------------------------------------------------------
// Tokenizers

/// `tokenizer.json \0 tokenizer_config.json`, then the config's chat template if any.
pub fn tokenizer_json(data: &[u8]) {
    let (json, config) = split_nul(data);
    let Ok(tokenizer) = Tokenizer::from_json(json, config, "fuzz/tokenizer.json") else {
        return;
    };
    // Any decoder pipeline can come from JSON, including ones that stream inexactly.
    check_tokenizer(&tokenizer, false);
    if let Some(config) = config {
        if let Ok(Some(template)) = ChatTemplate::from_tokenizer_config(config, &tokenizer) {
            render(template, "Hello!");
        }
    }
}

/// A GGUF header's `tokenizer.ggml.*` metadata as a tokenizer, then its chat template if any.
pub fn tokenizer_gguf(data: &[u8]) {
    let Ok(header) = GgufHeader::parse(data, FILE) else {
        return;
    };
    let Ok(tokenizer) = Tokenizer::from_gguf(&header) else {
        return;
    };
    check_tokenizer(&tokenizer, true);
    if let Ok(Some(template)) = ChatTemplate::from_gguf(&header, &tokenizer) {
        render(template, "Hello!");
    }
}

const SAMPLES: &[&str] = &[
    "Hello, world! 123 4567",
    " <s> </s> <|im_start|>user\n<|im_end|> <|endoftext|>",
    "é 🚀 \u{2581}x\t\r\n  \u{0}\u{ffff}",
];

/// Encodes and decodes the samples; with `exact_stream`, streamed decoding must reproduce the
/// full decode.
fn check_tokenizer(tok: &Tokenizer, exact_stream: bool) {
    let _ = (tok.bos_id(), tok.eos_ids(), tok.unk_id(), tok.pad_id());
    let _ = tok.add_bos_default();
    let vocab = tok.vocab_size();
    for id in (0..vocab.min(8)).chain(vocab.saturating_sub(2)..vocab) {
        let id = id as u32;
        let _ = (tok.id_to_token(id), tok.is_special(id));
    }
    if let Ok(outside) = u32::try_from(vocab) {
        assert!(tok.decode(&[outside], false).is_err());
        assert!(tok.stream_decoder(false).push(outside).is_err());
    }
    for text in SAMPLES {
        for special in [false, true] {
            let Ok(ids) = tok.encode(text, special, Some(false)) else {
                continue;
            };
            if let Some(&bad) = ids.iter().find(|&&id| id as usize >= vocab) {
                panic!("encode({text:?}) gave id {bad}, outside the vocabulary of {vocab}");
            }
            for skip in [false, true] {
                let Ok(text) = tok.decode(&ids, skip) else {
                    continue;
                };
                stream_decode(tok, &ids, skip, exact_stream.then_some(text.as_str()));
            }
        }
    }
    let _ = tok.encode(SAMPLES[0], false, None);
}

/// One sample encoded (ids inside the vocabulary) and decoded, whole and streamed.
fn check_tokenizer_briefly(tok: &Tokenizer) {
    let vocab = tok.vocab_size();
    let Ok(ids) = tok.encode(SAMPLES[0], true, None) else {
        return;
    };
    if let Some(&bad) = ids.iter().find(|&&id| id as usize >= vocab) {
        panic!("encode gave id {bad}, outside the vocabulary of {vocab}");
    }
    if let Ok(text) = tok.decode(&ids, false) {
        stream_decode(tok, &ids, false, Some(&text));
    }
}

/// Streams `ids`; when every push succeeds, the pieces must add up to `full` when given.
fn stream_decode(tok: &Tokenizer, ids: &[u32], skip_special: bool, full: Option<&str>) {
    let mut decoder = tok.stream_decoder(skip_special);
    let mut text = String::new();
    for &id in ids {
        match decoder.push(id) {
            Ok(piece) => text.push_str(&piece),
            Err(_) => return,
        }
    }
    let Ok(rest) = decoder.finish() else {
        return;
    };
    text.push_str(&rest);
    if let Some(full) = full {
        assert_eq!(text, full, "streamed decode of {ids:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// Chat templates

/// `template \0 message content`: compile, then render a short conversation.
pub fn chat_template(data: &[u8]) {
    let (source, content) = split_nul(data);
    let source = String::from_utf8_lossy(source);
    let content = content.map(String::from_utf8_lossy).unwrap_or_default();
    let Ok(template) = ChatTemplate::new(&source, "<s>", "</s>") else {
        return;
    };
    render(template, &content);
}

/// The render budget of the fuzz targets: a hundredth of the product's
/// ([`emberlm::chat::RENDER_FUEL`]), so that templates that spend it all (the fuzzer finds
/// many: sorting and de-duplicating long ranges) cost a hundredth as much and the campaign
/// gets through more inputs. Running out takes the same path at any budget; the tests check the
/// product's budget itself.
const FUZZ_FUEL: u64 = emberlm::chat::RENDER_FUEL / 100;

fn render(template: ChatTemplate, content: &str) {
    let template = template.with_fuel(FUZZ_FUEL);
    let messages = [
        ChatMessage::new("system", "You are terse."),
        ChatMessage::new("user", content),
        ChatMessage::new("assistant", "Yes."),
        ChatMessage::new("user", "And?"),
    ];
    let _ = template.render(&messages, true);
    let _ = template.render(&messages[1..2], false);
}

// ---------------------------------------------------------------------------------------------
// Downloads kept in the page's storage

/// A stored record, a `Content-Range` header, the `sha256` and `storage` options and the store's
/// file names on arbitrary bytes: every parse either fails cleanly or gives what the rules
/// promise (a record round-trips; a resume continues only at the byte asked for; a name is a
/// file name; a digest reads back as written).
pub fn stored_download(data: &[u8]) {
    use emberlm::store::{self, range, StoredRecord};

    if let Ok(r) = StoredRecord::parse(data, "record.json") {
        let again = StoredRecord::parse(r.to_json().as_bytes(), "record.json")
            .expect("a record written by to_json parses");
        assert_eq!(again, r);
    }
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // the numbers a resume is decided on, drawn from the input
    let mut n = [0u64; 3];
    for (i, b) in data.iter().enumerate() {
        n[i % 3] = n[i % 3].wrapping_mul(31).wrapping_add(u64::from(*b));
    }
    let (asked, length, total) = (n[0] % 4096, n[1] % 8192, n[2] % 8192);
    if let Some(r) = range::parse_content_range(text) {
        assert!(r.first <= r.last, "{text:?}: {r:?}");
        if let Some(t) = r.total {
            assert!(r.last < t, "{text:?}: {r:?}");
        }
        for from in [asked, r.first] {
            if range::resume(from, 206, Some(text), length, total) == range::Resume::Continue {
                assert_eq!(r.first, from, "{text:?}: continued at another byte");
                if let (Some(t), true) = (r.total, total > 0) {
                    assert_eq!(t, total, "{text:?}: continued on another file");
                }
            }
        }
    }
    let status = (n[0] % 600) as u16;
    if let range::Resume::Continue = range::resume(asked, status, Some(text), length, total) {
        assert_eq!(status, 206);
    }
    if let Ok(digests) = store::parse_digests(text) {
        let words: Vec<String> = text
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|w| !w.is_empty())
            .map(|w| w.strip_prefix("sha256:").unwrap_or(w).to_ascii_lowercase())
            .collect();
        let back: Vec<String> = digests.iter().map(|d| store::hex(d)).collect();
        assert_eq!(back, words);
    }
    let _ = store::Medium::parse(text);
    let folder = store::folder_name(text);
    assert!(
        !folder.is_empty()
            && folder.len() <= 100
            && folder != "."
            && folder != ".."
            && !folder.contains(['/', '\\', '\0']),
        "{text:?} -> {folder:?}"
    );
    if let Some(i) = store::part_index(text) {
        assert_eq!(store::part_name(i), text);
    }
    let entry = store::entry_name(text);
    assert!(entry.len() == 32 && entry.bytes().all(|b| b.is_ascii_hexdigit()));
}
