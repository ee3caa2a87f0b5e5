//! The request-side fuzz targets (response formats, OpenAI requests, load options, HTTP heads,
//! tune records, KV block decoding, grammars), split from `common.rs` by concern; `common.rs` re-exports them.

#![allow(dead_code)]

#[allow(unused_imports)]
use super::*;

// ---------------------------------------------------------------------------------------------
// Response formats

/// The text as a GBNF grammar (translated to Lark, or refused with a line and column), and as
/// a `response_format` object (parsed, and what parsed reads back the same).
pub fn response_format(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match emberlm::constrain::gbnf::to_lark(text) {
        Ok(lark) => assert!(lark.starts_with("start: "), "{lark}"),
        Err(e) => assert!(e.to_string().contains("gbnf"), "{e}"),
    }
    if let Ok(value) = serde_json::from_str::<serde_json::Value>(text) {
        if let Ok(format) = emberlm::constrain::ResponseFormat::from_value(&value) {
            let again = emberlm::constrain::ResponseFormat::from_value(&format.to_value());
            assert_eq!(again.ok().as_ref(), Some(&format), "{text}");
        }
    }
}

/// The text as load options, on every surface (a page's object, a settings file): read, then
/// validated into the engine's options, or refused with a message naming an option; never a
/// panic. What a page and a file both accept resolves the same.
pub fn load_options(data: &[u8]) {
    use emberlm::engine::{LoadOptions, Surface};
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let file = LoadOptions::from_file_text(text, "fuzz.json");
    if let Err(e) = &file {
        assert!(e.to_string().contains("fuzz.json"), "{e}");
    }
    let Ok(value) = serde_json::from_str::<serde_json::Value>(text) else {
        assert!(file.is_err());
        return;
    };
    let page = LoadOptions::from_json(&value, Surface::Page);
    let page = page.map(|o| o.resolve().map(|r| format!("{r:?}")));
    let file = file.map(|o| o.resolve().map(|r| format!("{r:?}")));
    for r in [&page, &file] {
        match r {
            Err(e) | Ok(Err(e)) => assert!(!e.to_string().is_empty()),
            Ok(Ok(_)) => {}
        }
    }
    if let (Ok(Ok(a)), Ok(Ok(b))) = (&page, &file) {
        assert_eq!(a, b, "{text}");
    }
}

/// The text as an OpenAI-style request body (chat, completions and embeddings) and as
/// JavaScript generate options: parsed, or refused with a message; never a panic.
pub fn openai_request(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    use emberlm::openai::{CompletionKind, Request};
    for kind in [CompletionKind::Chat, CompletionKind::Text] {
        if let Err(e) = Request::from_json(kind, text) {
            assert!(!e.to_string().is_empty());
        }
    }
    if let Ok(options) = emberlm::session::GenerateOptions::from_json(text) {
        assert!(options.top_logprobs <= emberlm::sampling::MAX_TOP_LOGPROBS);
    }
    // and as an embeddings request: what parses holds between 1 and MAX_INPUTS non-empty texts
    use emberlm::openai::embeddings::{EmbeddingRequest, MAX_INPUTS};
    match EmbeddingRequest::from_json(text) {
        Ok(r) => {
            assert!((1..=MAX_INPUTS).contains(&r.input.len()), "{text}");
            assert!(r.input.iter().all(|t| !t.is_empty()), "{text}");
            assert!(r.dimensions != Some(0), "{text}");
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
}

// ---------------------------------------------------------------------------------------------
// HTTP request heads (`emberlm serve-api`)

/// `http_head::parse_head` on the bytes and on prefixes of them: no panic; a complete head lies
/// within the bytes, its path has no query, it parses the same alone, and no shorter prefix
/// is a complete head. A complete head then goes through the access checks of a server with
/// a key, an allowed name and an allowed page: no panic, and only what they allow passes.
pub fn http_head(data: &[u8]) {
    use emberlm::openai::access::{AccessPolicy, Decision};
    use emberlm::openai::http_head::{parse_head, HeadParse, HEAD_LIMIT};
    let whole = parse_head(data);
    match &whole {
        HeadParse::Complete(h) => {
            assert!(h.len <= data.len() && h.len <= HEAD_LIMIT, "{h:?}");
            assert!(!h.path.contains('?'), "{h:?}");
            let policy = AccessPolicy::new(
                vec!["fuzz-key".into()],
                "127.0.0.1",
                &["llm.lan".into()],
                &["https://app.example".into()],
            )
            .expect("a valid policy");
            match policy.check(&h.method, &h.access, false) {
                Decision::Allow { cors } => {
                    let auth = h.access.authorization.as_deref().unwrap_or("");
                    assert!(auth.contains("fuzz-key"), "allowed without the key: {h:?}");
                    assert!(h.access.host.is_some(), "allowed without a Host: {h:?}");
                    assert_eq!(cors, h.access.origin, "{h:?}");
                }
                Decision::Preflight(headers) => {
                    assert!(h.method == "OPTIONS" && h.access.preflight, "{h:?}");
                    assert!(headers
                        .iter()
                        .any(|(n, _)| *n == "Access-Control-Allow-Origin"));
                }
                Decision::Refuse(r) => {
                    assert!(matches!(r.status, 400 | 401 | 403 | 421), "{r:?}");
                    assert!(!r.message.is_empty());
                }
            }
            assert_eq!(parse_head(&data[..h.len]), whole, "the head alone");
            for cut in [0, h.len / 2, h.len.saturating_sub(1)] {
                if let HeadParse::Complete(early) = parse_head(&data[..cut]) {
                    panic!(
                        "a complete head {early:?} in the first {cut} of {} bytes",
                        h.len
                    );
                }
            }
        }
        HeadParse::Invalid(status, why) => {
            assert!(matches!(status, 400 | 431), "{status} {why}");
            assert!(!why.is_empty());
        }
        HeadParse::Partial => assert!(data.len() < HEAD_LIMIT),
    }
}

// ---------------------------------------------------------------------------------------------
// Stored tuning records (kernel plans, KV-cache decisions)

/// The key every fuzzed record is read for (the corpus's records carry it).
fn tune_key() -> emberlm::tune::TuneKey {
    emberlm::tune::TuneKey::new(
        "kernel-plan",
        "fuzz adapter".into(),
        "fuzz driver".into(),
        "fuzz shape".into(),
    )
}

/// The text as a stored record, read as a kernel plan and as a KV-cache decision the way a
/// load reads them: trusted or refused, never a panic; a trusted value written back is
/// trusted again.
pub fn tune_record(data: &[u8]) {
    use emberlm::backend::gpu::{KernelOverrides, KernelPlan, Variant};
    use emberlm::tune::{parse_record, record_text, Lookup};
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let key = tune_key();
    for overrides in [
        KernelOverrides::default(),
        KernelOverrides::all(Variant::ROWS),
    ] {
        if let Some(plan) = KernelPlan::from_record(text, &key, &overrides) {
            assert!(!plan.describe().is_empty());
        }
    }
    match parse_record::<emberlm::session::CacheDecision>(text, &key) {
        Lookup::Found(d) => {
            let _ = emberlm::dtype::kv::KvKind::parse("kv_cache", &d.kind);
            let again = record_text(&key, &d).expect("a decision is written");
            let read = parse_record::<emberlm::session::CacheDecision>(&again, &key);
            assert!(matches!(read, Lookup::Found(_)), "{again}: {read:?}");
        }
        Lookup::Rejected(why) => assert!(!why.is_empty()),
        Lookup::Missing => panic!("text was given"),
    }
}

// ---------------------------------------------------------------------------------------------
// Quantized blocks

/// Blocks of a quantized type (chosen by the first byte) decoded two ways that must agree:
/// the reference dequantization and the CPU backend's integer unpacking (small integers, a
/// scale per 16 values and an offset per 32), value by value.
pub fn block_decode(data: &[u8]) {
    use emberlm::dtype::DType;
    // the block types (every type but the floats)
    let types: Vec<DType> = DType::ALL
        .into_iter()
        .filter(|t| t.block_elements() > 1)
        .collect();
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let dtype = types[usize::from(pick) % types.len()];
    let (block, elements) = (
        dtype.block_bytes() as usize,
        dtype.block_elements() as usize,
    );
    let blocks = rest.len() / block;
    if blocks == 0 {
        return;
    }
    let bytes = &rest[..blocks * block];
    let cols = blocks * elements;
    let mut want = vec![0.0f32; cols];
    emberlm::dtype::dequantize_into(dtype, bytes, &mut want, "fuzz")
        .expect("whole blocks dequantize");
    let mut row = emberlm::backend::cpu::quant::UnpackedRow::with_cols(cols);
    row.unpack(dtype, bytes);
    for (i, &w) in want.iter().enumerate() {
        let got = f32::from(row.w[i]) * row.scale[i / 16] + row.offset[i / 32];
        let agree = match (w.is_finite(), got.is_finite()) {
            (true, true) => (got - w).abs() <= 1e-6 * w.abs().max(1e-30) + f32::MIN_POSITIVE,
            (a, b) => !a && !b,
        };
        assert!(
            agree,
            "{dtype:?} value {i}: unpacked {got} vs dequantized {w}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Grammar compilation

/// The tiny GPT-2 fixture's byte-level tokenizer, which every grammar is compiled against.
const GRAMMAR_MODEL: &[u8] = include_bytes!("../../tests/fixtures/tiny-gpt2-f32.gguf");

thread_local! {
    /// The compiler for [`GRAMMAR_MODEL`]'s vocabulary, built once per thread.
    static GRAMMARS: Option<emberlm::constrain::Grammars> = {
        let files = ModelFiles::from_bytes(GRAMMAR_MODEL.to_vec(), "tiny-gpt2-f32.gguf").ok()?;
        let tokenizer = std::sync::Arc::new(files.tokenizer().ok()?);
        let eos = tokenizer.eos_ids().first().copied().unwrap_or(0);
        emberlm::constrain::Grammars::new(&tokenizer, tokenizer.vocab_size(), eos).ok()
    };
}

/// An error while a constrained text goes on: it names the response format, and is the
/// engine's message without its parser-state dump.
fn assert_step_error(message: &str) {
    assert!(message.contains("response_format"), "{message}");
    assert_no_state_dump(message);
}

/// An error is the engine's message without the parser-state dump llguidance appends.
fn assert_no_state_dump(message: &str) {
    assert!(
        !message.contains("<state>"),
        "the state dump leaked: {message}"
    );
}

/// A response format compiled for a real vocabulary: the first byte picks the kind (JSON
/// schema, strict or not; regex; Lark; GBNF), the rest is its text. Compiling gives a
/// constraint or an error; a constraint then walks up to eight tokens, each the first its mask
/// allows, and every mask allows something and the state takes the token it allowed (or
/// either is an error naming the response format).
pub fn grammar_compile(data: &[u8]) {
    use emberlm::constrain::ResponseFormat;

    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let format = match pick % 4 {
        0 => {
            let Ok(schema) = serde_json::from_str(text) else {
                return;
            };
            ResponseFormat::JsonSchema {
                schema,
                strict: pick & 4 != 0,
            }
        }
        1 => ResponseFormat::Regex(text.to_string()),
        2 => ResponseFormat::Lark(text.to_string()),
        _ => ResponseFormat::Gbnf(text.to_string()),
    };
    GRAMMARS.with(|grammars| {
        let grammars = grammars.as_ref().expect("the fixture's grammar compiler");
        let constraint = match grammars.compile(&format) {
            Ok(Some(c)) => c,
            Ok(None) => panic!("a {} compiled to no constraint", format.kind()),
            Err(e) => {
                let message = e.to_string();
                assert!(!message.is_empty());
                assert_no_state_dump(&message);
                return;
            }
        };
        let mut state = constraint.start();
        for _ in 0..8 {
            if state.must_end() {
                break;
            }
            let mask = match state.mask(&[]) {
                Ok(mask) => mask,
                // No token allowed here, or a grammar whose lexer grows past its limits
                // only as the text goes on: an error that names the response format.
                Err(e) => {
                    assert_step_error(&e.to_string());
                    break;
                }
            };
            assert!(mask.count() > 0);
            let Some(id) = (0..mask.len() as u32).find(|&id| mask.allows(id)) else {
                panic!("a mask of {} tokens with none found", mask.count());
            };
            // An allowed token can still grow the parser past its limits (a row of more
            // items than the engine allows): the same kind of error.
            if let Err(e) = state.accept(id) {
                assert_step_error(&e.to_string());
                break;
            }
        }
    });
}

// ---------------------------------------------------------------------------------------------
// Tool calling

/// Tool calling on arbitrary text, three ways (the first byte picks): the text as a request's
/// `{ tools, tool_choice, parallel_tool_calls }` (refused with a message, or read into unique,
/// valid names whose call grammar compiles for a real vocabulary in every syntax or is
/// refused naming the tools or the format); the text as a model's answer read back in every
/// syntax (every call's arguments a JSON object, the content a prefix of the text but for
/// Llama 3's),
/// and streamed in pieces cut where the other bytes say, which must give exactly what the
/// whole answer gives.
pub fn tool_calls(data: &[u8]) {
    use emberlm::chat::tool_calls::{grammar, read_calls, CallStream};
    use emberlm::chat::tools::{ToolSyntax, MAX_NAME};
    use emberlm::chat::ToolRequest;

    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let syntaxes = [
        ToolSyntax::Hermes,
        ToolSyntax::Llama3,
        ToolSyntax::Mistral,
        ToolSyntax::MistralArgs,
    ];
    if pick % 2 == 0 {
        let Ok(value) = serde_json::from_str::<serde_json::Value>(text) else {
            return;
        };
        let request = match ToolRequest::from_openai(
            value.get("tools"),
            value.get("tool_choice"),
            value.get("parallel_tool_calls"),
        ) {
            Ok(Some(r)) => r,
            Ok(None) => return,
            Err(e) => {
                assert!(!e.to_string().is_empty());
                return;
            }
        };
        let mut names: Vec<&str> = request.tools.iter().map(|t| t.name.as_str()).collect();
        assert!(
            names.iter().all(|n| (1..=MAX_NAME).contains(&n.len())),
            "{text}"
        );
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), request.tools.len(), "{text}");
        let _ = request.template_tools();
        GRAMMARS.with(|grammars| {
            let grammars = grammars.as_ref().expect("the fixture's grammar compiler");
            for syntax in syntaxes {
                let Some(lark) = grammar(&request, syntax, &|_| None) else {
                    assert!(request.callable().is_empty());
                    continue;
                };
                let format = emberlm::constrain::ResponseFormat::Lark(lark);
                if let Err(e) = grammars.compile(&format) {
                    let message = e.to_string();
                    assert!(message.contains("response_format"), "{message}");
                    assert_no_state_dump(&message);
                }
            }
        });
        return;
    }
    for syntax in syntaxes {
        let whole = read_calls(text, syntax);
        for call in &whole.calls {
            let args: serde_json::Value =
                serde_json::from_str(&call.arguments).expect("arguments are JSON");
            assert!(args.is_object(), "{text}");
        }
        if syntax != ToolSyntax::Llama3 {
            assert!(text.starts_with(&whole.content), "{text}");
        }
        // streamed in pieces: cut after each char whose byte in `rest` (wrapping) is odd
        let mut stream = CallStream::new(syntax);
        let (mut content, mut calls) = (String::new(), Vec::new());
        let mut piece = String::new();
        for (i, c) in text.chars().enumerate() {
            piece.push(c);
            if rest[i % rest.len()] & 1 == 1 {
                let p = stream.push(&piece);
                content.push_str(&p.content);
                calls.extend(p.calls);
                piece.clear();
            }
        }
        let p = stream.push(&piece);
        content.push_str(&p.content);
        calls.extend(p.calls);
        let p = stream.finish();
        content.push_str(&p.content);
        calls.extend(p.calls);
        assert_eq!(content, whole.content, "{syntax:?} {text:?}");
        assert_eq!(calls, whole.calls, "{syntax:?} {text:?}");
    }
}
