//! The TypeScript declarations of the two option objects, `LoadOptions` and
//! `GenerateOptions`, as the tables of keys generate them (`engine::load_keys::typescript`,
//! `session::generate_keys::typescript`): tests in both layers hold this file equal to the
//! tables, and their ignored `print_*_typescript` tests print what to paste here.

use wasm_bindgen::prelude::*;

#[wasm_bindgen(typescript_custom_section)]
const TS_OPTIONS: &'static str = r#"
/**
 * Options of `Engine.load`. Keys may also be written in snake_case (`kv_cache`, `cache_budget_mb`,
 * ...); an unknown key is refused naming the nearest known one.
 */
export interface LoadOptions {
  /**
   * KV cache length in positions; `'auto'` (the default): the model's context, at most 4096, within
   * the device's limits.
   */
  contextLength?: number | 'auto';
  /** The same as `contextLength`. */
  max_seq_len?: number | 'auto';
  /**
   * A draft model for speculative decoding (a smaller model with the same vocabulary), loaded after
   * the model as `engine.loadDraft(draft)` would.
   */
  draft?: ModelSource;
  /** Called as the model downloads, parses and uploads to the GPU; exceptions are ignored. */
  onProgress?: (progress: LoadProgress) => void;
  /**
   * For URL sources: the store to keep the downloaded files in (e.g. `'emberlm-models-v1'`), keyed
   * by URL. A later load of the same URL reads it from there instead of the network; a download cut
   * off part-way resumes from what was kept. Where: see `storage`.
   */
  cache?: string;
  /**
   * Where `cache` keeps files: `'opfs'` (the Origin Private File System: written as the download
   * streams in, in parts, so gigabytes fit and a cut-off download resumes), `'cacheApi'` (the Cache
   * API, one entry per file, stored once the model has parsed), or `'auto'` (the default: OPFS
   * where the browser has it, else the Cache API). Needs `cache`.
   */
  storage?: 'auto' | 'opfs' | 'cacheApi';
  /**
   * The SHA-256 of the model's file as 64 hex digits (a split set: one per part, in part order,
   * separated by commas). Checked as the bytes arrive: a download that differs fails naming both
   * digests and is not kept; a stored copy that differs is fetched again.
   */
  sha256?: string;
  /** A name for messages when the source is raw bytes (default `model.gguf`). */
  name?: string;
  /**
   * A Jinja chat template (its text) to use instead of the model's own: for files without one
   * (Gemma 3's GGUF: `<start_of_turn>user` ...). Its end-of-turn token stops generation.
   */
  chatTemplate?: string;
  /**
   * Force kernel variants instead of the plan measured on this device: `'rows'` or `'workgroup'`
   * for every kernel family, or `'linear_decode=rows,attention=workgroup'`.
   */
  kernels?: string;
  /**
   * How the KV cache stores keys and values: `'f32'` (exact, the default), `'f16'`, `'q8_0'`,
   * `'q4_0'` or `'nf4'` (blocks of 32 with a scale; about 2×, 3.8× and 7× smaller than f32;
   * `fp32`, `fp16`, `q8`, `q4` are other names), or `'auto'`: each kind within `cacheBudgetMb` is
   * measured against f32 on this device (quality gates, then speed), the best kept and reused; the
   * decision is in `engine.info().kvCachePlan`. Also `cache_kind`.
   */
  kvCache?: 'f32' | 'f16' | 'q8_0' | 'q4_0' | 'nf4' | 'fp32' | 'fp16' | 'q8' | 'q4' | 'auto';
  /** The same as `kvCache`. */
  cache_kind?: 'f32' | 'f16' | 'q8_0' | 'q4_0' | 'nf4' | 'fp32' | 'fp16' | 'q8' | 'q4' | 'auto';
  /** The K cache's kind alone (overrides `kvCache` for K). */
  kCache?: 'f32' | 'f16' | 'q8_0' | 'q4_0' | 'nf4' | 'fp32' | 'fp16' | 'q8' | 'q4';
  /** The V cache's kind alone (overrides `kvCache` for V). */
  vCache?: 'f32' | 'f16' | 'q8_0' | 'q4_0' | 'nf4' | 'fp32' | 'fp16' | 'q8' | 'q4';
  /**
   * The largest KV cache allowed, MiB (default: no limit): with `kvCache: 'auto'` kinds over it are
   * dropped; with a fixed kind the context must fit it, or loading fails with the numbers.
   */
  cacheBudgetMb?: number;
  /** Calibration prompt, tokens (default 64); tunes `kvCache: 'auto'`. */
  cacheQualityPromptLen?: number;
  /** Calibration tokens decoded one at a time (default 4); tunes `kvCache: 'auto'`. */
  cacheQualityDecodeSteps?: number;
  /** Largest mean NLL increase over f32, nats per token (default 0.05); tunes `kvCache: 'auto'`. */
  cacheQualityMaxDeltaNll?: number;
  /** Largest perplexity ratio to f32 (default 1.05); tunes `kvCache: 'auto'`. */
  cacheQualityMaxPplRatio?: number;
  /**
   * Largest mean KL divergence from f32 on the needle probe (default 0.1); tunes `kvCache: 'auto'`.
   */
  cacheQualityMaxMeanKl?: number;
  /**
   * Time the kinds that pass and keep the fastest (default true; false keeps the smallest); tunes
   * `kvCache: 'auto'`.
   */
  cacheAutoBenchmark?: boolean;
  /** Decode steps timed per kind (default 8); tunes `kvCache: 'auto'`. */
  cacheAutoBenchSteps?: number;
  /** Prompt before the timed steps, tokens (default 64); tunes `kvCache: 'auto'`. */
  cacheAutoBenchPromptLen?: number;
  /**
   * Measure again when the stored decision is older than the interval (default true); tunes
   * `kvCache: 'auto'`.
   */
  cachePlanProbe?: boolean;
  /**
   * Age after which a stored decision is measured again, seconds (default 3600); tunes `kvCache:
   * 'auto'`.
   */
  cachePlanProbeIntervalSec?: number;
  /**
   * How attention reads long contexts: `'auto'` (default: key blocks chosen by context bucket, the
   * trained local window), `'fixed'` (`decodeQChunk` and `decodeLocalWindow` as given) or `'none'`
   * (every key in one block). Results are the same to float rounding.
   */
  decodePlan?: 'auto' | 'fixed' | 'none';
  /** Keys per attention block with `decodePlan: 'fixed'`. */
  decodeQChunk?: number;
  /**
   * Latest keys a local-attention layer reads with `decodePlan: 'fixed'` (models trained with local
   * attention only).
   */
  decodeLocalWindow?: number;
  /** End of the short bucket, keys (default 512): shorter contexts run whole. */
  decodeBucketShort?: number;
  /** End of the middle bucket, keys (default 2048): longer contexts use longer blocks. */
  decodeBucketMid?: number;
  /**
   * Precision of the matrix products: `'f32'` (default), `'f16'` (inputs and products in f16, sums
   * in f32; needs the adapter feature `shader-f16`, an error without it) or `'auto'` (f16 on a GPU
   * that has it; f32 otherwise, and on software adapters, which emulate f16, with
   * `engine.info().precisionNotice` saying why). On the CPU backend quantized matrices meet 8-bit
   * activations (`info().precision` is `'int8'`) unless `'f32'` is given by name: then every row is
   * dequantized and multiplied in f32, the GPU's answers at a fraction of the speed.
   */
  precision?: 'f32' | 'f16' | 'auto';
  /**
   * Which backend runs the model: `'auto'` (default: a hardware GPU; on a software adapter such as
   * SwiftShader, it or the CPU, whichever decodes faster, measured on the first load and kept; the
   * CPU where there is no usable WebGPU; `engine.info().backendNotice` says which and why), `'gpu'`
   * / `'webgpu'` (the adapter, even a software one) or `'cpu'` (the CPU backend, no GPU used). Also
   * `device`, its older name.
   */
  backend?: 'auto' | 'gpu' | 'webgpu' | 'cpu';
  /** The same as `backend`. */
  device?: 'auto' | 'gpu' | 'webgpu' | 'cpu';
}

/**
 * Generation options. snake_case names (`max_new_tokens`, ...) are accepted too; `null` or
 * `undefined` is the default. An unknown option is refused naming the nearest known one, and an
 * out-of-range one rejects the call with an Error whose message names it.
 */
export interface GenerateOptions {
  /**
   * Named settings for temperature, topK and topP (those given beside it win): `'conservative'`
   * (0.3 / 20 / 1), `'balanced'` (0.8 / 50 / 0.9, the defaults), `'creative'` (1.3 / 100 / 0.95).
   */
  preset?: 'conservative' | 'balanced' | 'creative';
  /**
   * `false`: greedy decoding (temperature 0, whatever `temperature` says, as in Hugging Face);
   * `true`: sample (the temperature must then be above 0).
   */
  doSample?: boolean;
  /** Most tokens to generate (default 100). */
  maxNewTokens?: number;
  /** Softmax temperature, >= 0; 0 is greedy (default 0.8). */
  temperature?: number;
  /** Keep the k most likely tokens; 0 is off (default 50). */
  topK?: number;
  /** Nucleus sampling mass in (0, 1]; 1 is off (default 0.9). */
  topP?: number;
  /** Keep tokens at least this fraction of the best one's probability, [0, 1] (default 0). */
  minP?: number;
  /** Locally typical sampling mass in (0, 1]; 1 is off (default 1). */
  typicalP?: number;
  /** Hugging Face repetition penalty, > 0; 1 is off (default 1). */
  repetitionPenalty?: number;
  /** OpenAI presence penalty in [-2, 2] (default 0). */
  presencePenalty?: number;
  /** OpenAI frequency penalty in [-2, 2] (default 0). */
  frequencyPenalty?: number;
  /** How many recent tokens the penalties look at; 0 is all (default 0). */
  penaltyLastN?: number;
  /** Added to the logits of the given token ids, each in [-100, 100]. */
  logitBias?: Record<number, number>;
  /** Random seed (a whole number below 2^53); drawn at random when absent. */
  seed?: number;
  /** Stop strings (at most 16); the text ends before the first match. */
  stop?: string | string[];
  /** Token ids that end generation, besides the model's end-of-sequence tokens. */
  stopTokenIds?: number[];
  /** Beam search width, 1..=16; 1 is no beam search (default 1). */
  numBeams?: number;
  /** Beam search length penalty exponent (default 1). */
  lengthPenalty?: number;
  /** Beam search stops once numBeams candidates are finished (default false). */
  earlyStopping?: boolean;
  /** Sequences to return, 1..=64; with beam search at most numBeams (default 1). */
  numReturnSequences?: number;
  /** End-of-sequence token id(s) replacing the model's (default: the model's). */
  eosTokenId?: number | number[];
  /**
   * Keep generating past end-of-sequence and end-of-turn tokens (stop strings and stopTokenIds
   * still stop).
   */
  ignoreEos?: boolean;
  /** Recognise special tokens (`<|im_start|>`, ...) written in a text prompt (default false). */
  special?: boolean;
  /** Reject a prompt longer than the context instead of cutting it from the left. */
  strict?: boolean;
  /**
   * `false`: recompute the whole sequence at every token instead of reading the KV cache (same
   * tokens, far slower; for teaching and measuring; not with beam search). Default true.
   */
  useCache?: boolean;
  /**
   * Put the prompt's text first: the stream's first event per sequence carries it (`id: null`) and
   * every sequence's `text` starts with it (default false).
   */
  echo?: boolean;
  /** Tokens at the start that context sliding never drops (default: the BOS token). */
  nKeep?: number;
  /**
   * Speculative decoding (`true`: the defaults): drafts from the draft model (`loadDraft`) or from
   * earlier text (`'lookup'`), verified several tokens per model step. Greedy output is identical
   * to plain decoding; sampled output keeps the model's distribution. The result's
   * `stats.speculative` reports the acceptance. Not with beam search or `useCache: false`. Its
   * settings may also be written flat (`specK`, `specSource`, ...), which turns it on.
   */
  speculative?: boolean | SpeculativeOptions;
  /** Flat form of `speculative.method`: where drafts come from. */
  specSource?: 'draft' | 'lookup';
  /** Flat form of `speculative.k`: tokens drafted per step, 1..=64 (default 4). */
  specK?: number;
  /** Flat form of `speculative.adaptive`: adjust the draft length from each step's acceptance. */
  specKAdaptive?: boolean;
  /**
   * Flat form of `speculative.extraToken`: when every draft is accepted, take one more token from
   * the model's row (default true).
   */
  specExtraToken?: boolean;
  /**
   * Flat form of `speculative.disableBelowAccept`: fall back to plain decoding below this
   * acceptance rate, [0, 1].
   */
  specDisableBelowAccept?: number;
  /** The verification rule; only `'reject_sampling'` exists. */
  specMethod?: 'reject_sampling';
  /**
   * The shape the text must have: every draw is limited to the tokens that keep the text inside it.
   * A format that does not compile rejects the call before generation; a sequence that reaches
   * `maxNewTokens` first ends with `finishReason: 'length'` and a warning. With beam search every
   * beam follows it. Not with speculative decoding.
   */
  responseFormat?: ResponseFormat;
  /**
   * Report the model's most likely tokens at every step (0..=20, default 0) in each token event's
   * `topLogprobs`, most likely first, under the model's own distribution. Not with beam search or
   * speculative decoding.
   */
  topLogprobs?: number;
}
"#;
