//! The table of load options: every key `Engine.load`, the command line, `serve-api` and a
//! `--config` file accept, the other spellings each is known by, what its value holds and
//! where it applies. [`super::load_options`] parses through it and the `LoadOptions`
//! TypeScript interface is generated from it, so a key exists in one place.

/// What a key's value holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A string.
    Text,
    /// A finite number.
    Number,
    /// A whole number `>= 0` (at most `u32::MAX`).
    Whole,
    /// A whole number, or `'auto'` for the default.
    WholeOrAuto,
    /// `true` or `false`.
    Flag,
    /// A JavaScript value the page takes as it is (a function, a model source): never parsed
    /// from JSON.
    Js,
}

/// Where a key applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Everywhere.
    All,
    /// In the page only (`Engine.load`); the reason it has no meaning natively.
    Page(&'static str),
    /// Natively only (command line, server, config files); the reason it has none in a page.
    Native(&'static str),
}

/// One load option.
#[derive(Debug, Clone, Copy)]
pub struct Key {
    /// The name as JavaScript writes it (camelCase).
    pub name: &'static str,
    /// Other names accepted for it, beyond the snake_case and kebab-case forms of `name`
    /// (which are always accepted).
    pub aliases: &'static [&'static str],
    /// What the value holds.
    pub kind: Kind,
    /// Whether it only tunes `kvCache: 'auto'` (an error with a fixed kind).
    pub tunes_auto: bool,
    /// Where it applies.
    pub scope: Scope,
    /// Its TypeScript type.
    pub ts: &'static str,
    /// One line of documentation (also the TypeScript doc comment).
    pub doc: &'static str,
}

const KINDS: &str = "'f32' | 'f16' | 'q8_0' | 'q4_0' | 'nf4' | 'fp32' | 'fp16' | 'q8' | 'q4'";
const KINDS_AUTO: &str =
    "'f32' | 'f16' | 'q8_0' | 'q4_0' | 'nf4' | 'fp32' | 'fp16' | 'q8' | 'q4' | 'auto'";

/// Every load option, in the order the TypeScript interface lists them.
pub const KEYS: &[Key] = &[
    Key {
        name: "contextLength",
        tunes_auto: false,
        aliases: &["max_seq_len", "ctx"],
        kind: Kind::WholeOrAuto,
        scope: Scope::All,
        ts: "number | 'auto'",
        doc: "KV cache length in positions; `'auto'` (the default): the model's context, at most 4096, within the device's limits.",
    },
    Key {
        name: "draft",
        tunes_auto: false,
        aliases: &[],
        kind: Kind::Js,
        scope: Scope::Page("natively a draft model is given with --draft-model"),
        ts: "ModelSource",
        doc: "A draft model for speculative decoding (a smaller model with the same vocabulary), loaded after the model as `engine.loadDraft(draft)` would.",
    },
    Key {
        name: "onProgress",
        tunes_auto: false,
        aliases: &[],
        kind: Kind::Js,
        scope: Scope::Page("it is a JavaScript callback"),
        ts: "(progress: LoadProgress) => void",
        doc: "Called as the model downloads, parses and uploads to the GPU; exceptions are ignored.",
    },
    Key {
        name: "cache",
        tunes_auto: false,
        aliases: &["store"],
        kind: Kind::Text,
        scope: Scope::Page("it names the store a page downloads into"),
        ts: "string",
        doc: "For URL sources: the store to keep the downloaded files in (e.g. `'emberlm-models-v1'`), keyed by URL. A later load of the same URL reads it from there instead of the network; a download cut off part-way resumes from what was kept. Where: see `storage`.",
    },
    Key {
        name: "storage",
        tunes_auto: false,
        aliases: &[],
        kind: Kind::Text,
        scope: Scope::Page("it chooses the browser storage of a page's downloads"),
        ts: "'auto' | 'opfs' | 'cacheApi'",
        doc: "Where `cache` keeps files: `'opfs'` (the Origin Private File System: written as the download streams in, in parts, so gigabytes fit and a cut-off download resumes), `'cacheApi'` (the Cache API, one entry per file, stored once the model has parsed), or `'auto'` (the default: OPFS where the browser has it, else the Cache API). Needs `cache`.",
    },
    Key {
        name: "sha256",
        tunes_auto: false,
        aliases: &[],
        kind: Kind::Text,
        scope: Scope::Page("natively a model is a file the user chose, not a download"),
        ts: "string",
        doc: "The SHA-256 of the model's file as 64 hex digits (a split set: one per part, in part order, separated by commas). Checked as the bytes arrive: a download that differs fails naming both digests and is not kept; a stored copy that differs is fetched again.",
    },
    Key {
        name: "name",
        tunes_auto: false,
        aliases: &[],
        kind: Kind::Text,
        scope: Scope::Page("it names raw bytes given to the page; a file has its own name"),
        ts: "string",
        doc: "A name for messages when the source is raw bytes (default `model.gguf`).",
    },
    Key {
        name: "chatTemplate",
        tunes_auto: false,
        aliases: &[],
        kind: Kind::Text,
        scope: Scope::All,
        ts: "string",
        doc: "A Jinja chat template (its text) to use instead of the model's own: for files without one (Gemma 3's GGUF: `<start_of_turn>user` ...). Its end-of-turn token stops generation.",
    },
    Key {
        name: "kernels",
        tunes_auto: false,
        aliases: &[],
        kind: Kind::Text,
        scope: Scope::All,
        ts: "string",
        doc: "Force kernel variants instead of the plan measured on this device: `'rows'` or `'workgroup'` for every kernel family, or `'linear_decode=rows,attention=workgroup'`.",
    },
    Key {
        name: "kvCache",
        tunes_auto: false,
        aliases: &["cache_kind"],
        kind: Kind::Text,
        scope: Scope::All,
        ts: KINDS_AUTO,
        doc: "How the KV cache stores keys and values: `'f32'` (exact, the default), `'f16'`, `'q8_0'`, `'q4_0'` or `'nf4'` (blocks of 32 with a scale; about 2×, 3.8× and 7× smaller than f32; `fp32`, `fp16`, `q8`, `q4` are other names), or `'auto'`: each kind within `cacheBudgetMb` is measured against f32 on this device (quality gates, then speed), the best kept and reused; the decision is in `engine.info().kvCachePlan`. Also `cache_kind`.",
    },
    Key {
        name: "kCache",
        tunes_auto: false,
        aliases: &[],
        kind: Kind::Text,
        scope: Scope::All,
        ts: KINDS,
        doc: "The K cache's kind alone (overrides `kvCache` for K).",
    },
    Key {
        name: "vCache",
        tunes_auto: false,
        aliases: &[],
        kind: Kind::Text,
        scope: Scope::All,
        ts: KINDS,
        doc: "The V cache's kind alone (overrides `kvCache` for V).",
    },
    Key {
        name: "cacheBudgetMb",
        tunes_auto: false,
        aliases: &[],
        kind: Kind::Number,
        scope: Scope::All,
        ts: "number",
        doc: "The largest KV cache allowed, MiB (default: no limit): with `kvCache: 'auto'` kinds over it are dropped; with a fixed kind the context must fit it, or loading fails with the numbers.",
    },
    Key {
        name: "cacheQualityPromptLen",
        tunes_auto: true,
        aliases: &[],
        kind: Kind::Whole,
        scope: Scope::All,
        ts: "number",
        doc: "Calibration prompt, tokens (default 64); tunes `kvCache: 'auto'`.",
    },
    Key {
        name: "cacheQualityDecodeSteps",
        tunes_auto: true,
        aliases: &[],
        kind: Kind::Whole,
        scope: Scope::All,
        ts: "number",
        doc: "Calibration tokens decoded one at a time (default 4); tunes `kvCache: 'auto'`.",
    },
    Key {
        name: "cacheQualityMaxDeltaNll",
        tunes_auto: true,
        aliases: &[],
        kind: Kind::Number,
        scope: Scope::All,
        ts: "number",
        doc: "Largest mean NLL increase over f32, nats per token (default 0.05); tunes `kvCache: 'auto'`.",
    },
    Key {
        name: "cacheQualityMaxPplRatio",
        tunes_auto: true,
        aliases: &[],
        kind: Kind::Number,
        scope: Scope::All,
        ts: "number",
        doc: "Largest perplexity ratio to f32 (default 1.05); tunes `kvCache: 'auto'`.",
    },
    Key {
        name: "cacheQualityMaxMeanKl",
        tunes_auto: true,
        aliases: &[],
        kind: Kind::Number,
        scope: Scope::All,
        ts: "number",
        doc: "Largest mean KL divergence from f32 on the needle probe (default 0.1); tunes `kvCache: 'auto'`.",
    },
    Key {
        name: "cacheAutoBenchmark",
        tunes_auto: true,
        aliases: &[],
        kind: Kind::Flag,
        scope: Scope::All,
        ts: "boolean",
        doc: "Time the kinds that pass and keep the fastest (default true; false keeps the smallest); tunes `kvCache: 'auto'`.",
    },
    Key {
        name: "cacheAutoBenchSteps",
        tunes_auto: true,
        aliases: &[],
        kind: Kind::Whole,
        scope: Scope::All,
        ts: "number",
        doc: "Decode steps timed per kind (default 8); tunes `kvCache: 'auto'`.",
    },
    Key {
        name: "cacheAutoBenchPromptLen",
        tunes_auto: true,
        aliases: &[],
        kind: Kind::Whole,
        scope: Scope::All,
        ts: "number",
        doc: "Prompt before the timed steps, tokens (default 64); tunes `kvCache: 'auto'`.",
    },
    Key {
        name: "cachePlanPath",
        tunes_auto: true,
        aliases: &[],
        kind: Kind::Text,
        scope: Scope::Native("a page keeps its decisions in the Cache API"),
        ts: "string",
        doc: "Folder of the stored decisions (default: the user's cache directory); tunes `kvCache: 'auto'`.",
    },
    Key {
        name: "cachePlanProbe",
        tunes_auto: true,
        aliases: &[],
        kind: Kind::Flag,
        scope: Scope::All,
        ts: "boolean",
        doc: "Measure again when the stored decision is older than the interval (default true); tunes `kvCache: 'auto'`.",
    },
    Key {
        name: "cachePlanProbeIntervalSec",
        tunes_auto: true,
        aliases: &[],
        kind: Kind::Whole,
        scope: Scope::All,
        ts: "number",
        doc: "Age after which a stored decision is measured again, seconds (default 3600); tunes `kvCache: 'auto'`.",
    },
    Key {
        name: "decodePlan",
        tunes_auto: false,
        aliases: &[],
        kind: Kind::Text,
        scope: Scope::All,
        ts: "'auto' | 'fixed' | 'none'",
        doc: "How attention reads long contexts: `'auto'` (default: key blocks chosen by context bucket, the trained local window), `'fixed'` (`decodeQChunk` and `decodeLocalWindow` as given) or `'none'` (every key in one block). Results are the same to float rounding.",
    },
    Key {
        name: "decodeQChunk",
        tunes_auto: false,
        aliases: &[],
        kind: Kind::Whole,
        scope: Scope::All,
        ts: "number",
        doc: "Keys per attention block with `decodePlan: 'fixed'`.",
    },
    Key {
        name: "decodeLocalWindow",
        tunes_auto: false,
        aliases: &[],
        kind: Kind::Whole,
        scope: Scope::All,
        ts: "number",
        doc: "Latest keys a local-attention layer reads with `decodePlan: 'fixed'` (models trained with local attention only).",
    },
    Key {
        name: "decodeBucketShort",
        tunes_auto: false,
        aliases: &[],
        kind: Kind::Whole,
        scope: Scope::All,
        ts: "number",
        doc: "End of the short bucket, keys (default 512): shorter contexts run whole.",
    },
    Key {
        name: "decodeBucketMid",
        tunes_auto: false,
        aliases: &[],
        kind: Kind::Whole,
        scope: Scope::All,
        ts: "number",
        doc: "End of the middle bucket, keys (default 2048): longer contexts use longer blocks.",
    },
    Key {
        name: "precision",
        tunes_auto: false,
        aliases: &[],
        kind: Kind::Text,
        scope: Scope::All,
        ts: "'f32' | 'f16' | 'auto'",
        doc: "Precision of the matrix products: `'f32'` (default), `'f16'` (inputs and products in f16, sums in f32; needs the adapter feature `shader-f16`, an error without it) or `'auto'` (f16 on a GPU that has it; f32 otherwise, and on software adapters, which emulate f16, with `engine.info().precisionNotice` saying why). On the CPU backend quantized matrices meet 8-bit activations (`info().precision` is `'int8'`) unless `'f32'` is given by name: then every row is dequantized and multiplied in f32, the GPU's answers at a fraction of the speed.",
    },
    Key {
        name: "backend",
        tunes_auto: false,
        aliases: &["device"],
        kind: Kind::Text,
        scope: Scope::All,
        ts: "'auto' | 'gpu' | 'webgpu' | 'cpu'",
        doc: "Which backend runs the model: `'auto'` (default: a hardware GPU; on a software adapter such as SwiftShader, it or the CPU, whichever decodes faster, measured on the first load and kept; the CPU where there is no usable WebGPU; `engine.info().backendNotice` says which and why), `'gpu'` / `'webgpu'` (the adapter, even a software one) or `'cpu'` (the CPU backend, no GPU used). Also `device`, its older name.",
    },
];

use crate::option_keys::doc_comment;
pub use crate::option_keys::{normalized, words};

/// The key `spelled` names, in any of its spellings (`kvCache`, `kv_cache`, `--kv-cache`).
pub fn find(spelled: &str) -> Option<&'static Key> {
    crate::option_keys::find(KEYS, spelled)
}

/// The known key nearest to `spelled`, when one is near enough to be what was meant.
pub fn nearest(spelled: &str) -> Option<&'static str> {
    crate::option_keys::nearest(KEYS, spelled)
}

impl crate::option_keys::Named for Key {
    fn name(&self) -> &'static str {
        self.name
    }

    fn aliases(&self) -> &'static [&'static str] {
        self.aliases
    }
}

/// The `LoadOptions` TypeScript interface: every key with its type and doc comment, and each
/// named alias as a field of its own (so that TypeScript accepts what the runtime accepts).
pub fn typescript() -> String {
    let mut out = doc_comment(
        "Options of `Engine.load`. Keys may also be written in snake_case (`kv_cache`, `cache_budget_mb`, ...); an unknown key is refused naming the nearest known one.",
        "",
    );
    out.push_str("export interface LoadOptions {\n");
    for k in KEYS {
        if matches!(k.scope, Scope::Native(_)) {
            continue;
        }
        out.push_str(&doc_comment(k.doc, "  "));
        out.push_str(&format!("  {}?: {};\n", k.name, k.ts));
        for a in k
            .aliases
            .iter()
            .filter(|a| a.contains('_') || **a == "device")
        {
            out.push_str(&doc_comment(&format!("The same as `{}`.", k.name), "  "));
            out.push_str(&format!("  {a}?: {};\n", k.ts));
        }
    }
    out.push_str("}\n");
    out
}
