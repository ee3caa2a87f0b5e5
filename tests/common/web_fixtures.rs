//! The tiny GGUF fixtures and their goldens compiled into the browser tests.

macro_rules! fixture {
    ($name:literal) => {
        (
            concat!($name, ".gguf"),
            include_bytes!(concat!("../fixtures/", $name, ".gguf")).as_slice(),
            include_str!(concat!("../fixtures/golden/", $name, ".golden.json")),
        )
    };
}

/// Every tiny GGUF fixture: every architecture, both tokenizers, every weight type.
pub const TINY_GGUFS: [(&str, &[u8], &str); 16] = [
    fixture!("tiny-gpt2-f32"),
    fixture!("tiny-gpt2-f16"),
    fixture!("tiny-llama-f32"),
    fixture!("tiny-llama-q8_0"),
    fixture!("tiny-llama-q4_0"),
    fixture!("tiny-llama-q4_1"),
    fixture!("tiny-llama-256-f32"),
    fixture!("tiny-llama-256-q4_k_m"),
    fixture!("tiny-llama-256-q5_k_m"),
    fixture!("tiny-llama-256-q6_k"),
    fixture!("tiny-llama-spm-f32"),
    fixture!("tiny-qwen2-f32"),
    fixture!("tiny-qwen3-q8_0"),
    fixture!("tiny-phi3-f32"),
    fixture!("tiny-gemma3-f32"),
    fixture!("tiny-llama3-rope-f32"),
];

/// The encoder fixtures (BERT, no LM head: goldens of pooled states, see
/// `tools/make_bert_fixtures.py`).
pub const ENCODER_GGUFS: [(&str, &[u8], &str); 1] = [(
    "tiny-bert-f32.gguf",
    include_bytes!("../fixtures/tiny-bert-f32.gguf").as_slice(),
    include_str!("../fixtures/golden/tiny-bert.golden.json"),
)];
