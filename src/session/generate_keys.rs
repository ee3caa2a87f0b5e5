//! The table of generation options: every key `generate`, `stream`, `generateBatch`, the
//! server's batch files and the worker client accept, the other spellings each is known by,
//! its TypeScript type and its documentation. [`super::options_parse`] reads options through
//! it and the `GenerateOptions` TypeScript interface is generated from it, so a key exists in
//! one place.

use crate::option_keys::doc_comment;

/// One generation option.
#[derive(Debug, Clone, Copy)]
pub struct Key {
    /// The name as JavaScript writes it (camelCase); its snake_case and kebab-case forms are
    /// always accepted too.
    pub name: &'static str,
    /// Other names accepted for it.
    pub aliases: &'static [&'static str],
    /// Its TypeScript type.
    pub ts: &'static str,
    /// Its documentation (also the TypeScript doc comment).
    pub doc: &'static str,
}

const fn key(name: &'static str, ts: &'static str, doc: &'static str) -> Key {
    Key {
        name,
        aliases: &[],
        ts,
        doc,
    }
}

/// Every generation option, in the order the TypeScript interface lists them.
pub const KEYS: &[Key] = &[
    key(
        "preset",
        "'conservative' | 'balanced' | 'creative'",
        "Named settings for temperature, topK and topP (those given beside it win): `'conservative'` (0.3 / 20 / 1), `'balanced'` (0.8 / 50 / 0.9, the defaults), `'creative'` (1.3 / 100 / 0.95).",
    ),
    key(
        "doSample",
        "boolean",
        "`false`: greedy decoding (temperature 0, whatever `temperature` says, as in Hugging Face); `true`: sample (the temperature must then be above 0).",
    ),
    key("maxNewTokens", "number", "Most tokens to generate (default 100)."),
    key(
        "temperature",
        "number",
        "Softmax temperature, >= 0; 0 is greedy (default 0.8).",
    ),
    key(
        "topK",
        "number",
        "Keep the k most likely tokens; 0 is off (default 50).",
    ),
    key(
        "topP",
        "number",
        "Nucleus sampling mass in (0, 1]; 1 is off (default 0.9).",
    ),
    key(
        "minP",
        "number",
        "Keep tokens at least this fraction of the best one's probability, [0, 1] (default 0).",
    ),
    key(
        "typicalP",
        "number",
        "Locally typical sampling mass in (0, 1]; 1 is off (default 1).",
    ),
    key(
        "repetitionPenalty",
        "number",
        "Hugging Face repetition penalty, > 0; 1 is off (default 1).",
    ),
    key(
        "presencePenalty",
        "number",
        "OpenAI presence penalty in [-2, 2] (default 0).",
    ),
    key(
        "frequencyPenalty",
        "number",
        "OpenAI frequency penalty in [-2, 2] (default 0).",
    ),
    key(
        "penaltyLastN",
        "number",
        "How many recent tokens the penalties look at; 0 is all (default 0).",
    ),
    key(
        "logitBias",
        "Record<number, number>",
        "Added to the logits of the given token ids, each in [-100, 100].",
    ),
    key(
        "seed",
        "number",
        "Random seed (a whole number below 2^53); drawn at random when absent.",
    ),
    key(
        "stop",
        "string | string[]",
        "Stop strings (at most 16); the text ends before the first match.",
    ),
    key(
        "stopTokenIds",
        "number[]",
        "Token ids that end generation, besides the model's end-of-sequence tokens.",
    ),
    key(
        "numBeams",
        "number",
        "Beam search width, 1..=16; 1 is no beam search (default 1).",
    ),
    key(
        "lengthPenalty",
        "number",
        "Beam search length penalty exponent (default 1).",
    ),
    key(
        "earlyStopping",
        "boolean",
        "Beam search stops once numBeams candidates are finished (default false).",
    ),
    key(
        "numReturnSequences",
        "number",
        "Sequences to return, 1..=64; with beam search at most numBeams (default 1).",
    ),
    key(
        "eosTokenId",
        "number | number[]",
        "End-of-sequence token id(s) replacing the model's (default: the model's).",
    ),
    key(
        "ignoreEos",
        "boolean",
        "Keep generating past end-of-sequence and end-of-turn tokens (stop strings and stopTokenIds still stop).",
    ),
    key(
        "special",
        "boolean",
        "Recognise special tokens (`<|im_start|>`, ...) written in a text prompt (default false).",
    ),
    key(
        "strict",
        "boolean",
        "Reject a prompt longer than the context instead of cutting it from the left.",
    ),
    key(
        "useCache",
        "boolean",
        "`false`: recompute the whole sequence at every token instead of reading the KV cache (same tokens, far slower; for teaching and measuring; not with beam search). Default true.",
    ),
    key(
        "echo",
        "boolean",
        "Put the prompt's text first: the stream's first event per sequence carries it (`id: null`) and every sequence's `text` starts with it (default false).",
    ),
    key(
        "nKeep",
        "number",
        "Tokens at the start that context sliding never drops (default: the BOS token).",
    ),
    key(
        "speculative",
        "boolean | SpeculativeOptions",
        "Speculative decoding (`true`: the defaults): drafts from the draft model (`loadDraft`) or from earlier text (`'lookup'`), verified several tokens per model step. Greedy output is identical to plain decoding; sampled output keeps the model's distribution. The result's `stats.speculative` reports the acceptance. Not with beam search or `useCache: false`. Its settings may also be written flat (`specK`, `specSource`, ...), which turns it on.",
    ),
    key(
        "specSource",
        "'draft' | 'lookup'",
        "Flat form of `speculative.method`: where drafts come from.",
    ),
    key(
        "specK",
        "number",
        "Flat form of `speculative.k`: tokens drafted per step, 1..=64 (default 4).",
    ),
    key(
        "specKAdaptive",
        "boolean",
        "Flat form of `speculative.adaptive`: adjust the draft length from each step's acceptance.",
    ),
    key(
        "specExtraToken",
        "boolean",
        "Flat form of `speculative.extraToken`: when every draft is accepted, take one more token from the model's row (default true).",
    ),
    key(
        "specDisableBelowAccept",
        "number",
        "Flat form of `speculative.disableBelowAccept`: fall back to plain decoding below this acceptance rate, [0, 1].",
    ),
    key(
        "specMethod",
        "'reject_sampling'",
        "The verification rule; only `'reject_sampling'` exists.",
    ),
    key(
        "responseFormat",
        "ResponseFormat",
        "The shape the text must have: every draw is limited to the tokens that keep the text inside it. A format that does not compile rejects the call before generation; a sequence that reaches `maxNewTokens` first ends with `finishReason: 'length'` and a warning. With beam search every beam follows it. Not with speculative decoding.",
    ),
    key(
        "topLogprobs",
        "number",
        "Report the model's most likely tokens at every step (0..=20, default 0) in each token event's `topLogprobs`, most likely first, under the model's own distribution. Not with beam search or speculative decoding.",
    ),
];

impl crate::option_keys::Named for Key {
    fn name(&self) -> &'static str {
        self.name
    }

    fn aliases(&self) -> &'static [&'static str] {
        self.aliases
    }
}

/// The `GenerateOptions` TypeScript interface: every key with its type and doc comment.
pub fn typescript() -> String {
    let mut out = doc_comment(
        "Generation options. snake_case names (`max_new_tokens`, ...) are accepted too; `null` or `undefined` is the default. An unknown option is refused naming the nearest known one, and an out-of-range one rejects the call with an Error whose message names it.",
        "",
    );
    out.push_str("export interface GenerateOptions {\n");
    for k in KEYS {
        out.push_str(&doc_comment(k.doc, "  "));
        out.push_str(&format!("  {}?: {};\n", k.name, k.ts));
    }
    out.push_str("}\n");
    out
}
