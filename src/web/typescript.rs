//! The TypeScript declarations of the JavaScript API that are not derived from Rust types, for
//! the `.d.ts` wasm-bindgen writes: the arguments JavaScript passes and the iterator `stream`
//! returns. The objects it gets back (`TokenEvent`, `FinishReason`, `GenerationResult`,
//! `SequenceResult`, `GenerationStats`, `EngineInfo`, `ModelInfo`, `EngineLimits`,
//! `EngineCounters`, `EngineMemory`) are declared by `Tsify` from `types.rs` and
//! `crate::session`, and only named here.

use wasm_bindgen::prelude::*;

#[wasm_bindgen(typescript_custom_section)]
const TS_TYPES: &'static str = r#"
/** One turn of a conversation. */
export interface ChatMessage {
  /** `system`, `user`, `assistant` (other roles go to the chat template unchanged). */
  role: string;
  content: string;
}

/**
 * What to generate from: plain text, a conversation (the model's chat template is applied and
 * the assistant's turn opened), or token ids used as they are.
 */
export type Prompt = string | ChatMessage[] | number[];

/** One prompt of `generateBatch` with options that replace the shared ones for it. */
export type BatchPrompt = { prompt: Prompt } & GenerateOptions;

/** `generateBatch`'s shared options: generation options and the most sequences per step. */
export interface BatchOptions extends GenerateOptions {
  /** Sequences decoded together in one step (default: as many as the device and the KV memory allow). */
  maxBatch?: number;
}

/** One file: a URL (fetched, with download progress), its bytes, or a File/Blob. */
export type ModelFile = string | URL | Uint8Array | ArrayBuffer | ArrayBufferView | Blob;

/**
 * A GGUF model: one file, or every part of a split GGUF set (llama.cpp's
 * `NAME-00001-of-0000N.gguf` layout) as a list or a `FileList`, in any order. The first part's
 * URL alone stands for the whole set: the other parts are fetched from beside it.
 */
export type ModelSource = ModelFile | ModelFile[] | FileList;

/** A file kept in a store by `Engine.load(url, { cache })` (`Engine.listStored`). */
export interface StoredFile {
  url: string;
  /** Bytes stored; null when a Cache API entry carries no length. */
  bytes: number | null;
  /** The file's length when known (equal to `bytes` once complete). */
  total: number | null;
  /** Where it is kept: the Origin Private File System or the Cache API. */
  storage: 'opfs' | 'cacheApi';
  /** False for a download cut off part-way: the next load of the URL asks for the rest. */
  complete: boolean;
}

/** Load progress. `download` also covers reading a File or the Cache API. */
export interface LoadProgress {
  phase: 'download' | 'parse' | 'upload';
  /** Bytes (download, upload) or steps (parse) done. */
  loaded: number;
  /** Bytes or steps in all; 0 when unknown (a download without Content-Length). */
  total: number;
}

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
   * `engine.info().precisionNotice` saying why).
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

/** Options of `engine.profile`. */
export interface ProfileOptions {
  /** Position of the profiled decode step (default 32). */
  decodePos?: number;
  /** Tokens of the profiled prefill chunk (default 32, at most one chunk). */
  promptTokens?: number;
}

/** One kernel of a profiled step (every node of the same kernel, variant and shape). */
export interface KernelProfileRow {
  kernel: string;
  shape: string;
  variant: 'workgroup' | 'rows' | null;
  /** Dispatches per step. */
  count: number;
  /** Seconds per step, all its dispatches. */
  seconds: number;
  /** Model weights and KV cache read per step, bytes. */
  bytes: number;
}

/** One profiled step. */
export interface StepProfile {
  n_tokens: number;
  pos0: number;
  /** Slowest first. */
  rows: KernelProfileRow[];
  kernels_seconds: number;
  /** The whole step in one pass, timed the same way. */
  step_seconds: number;
}

/** What `engine.profile()` resolves to. */
export interface KernelProfile {
  plan: KernelPlanInfo;
  decode: StepProfile;
  prefill: StepProfile;
}

/** The kernel plan: which shape each kernel family runs, and why. */
export interface KernelPlanInfo {
  /** Family (`linear_decode`, `linear_prefill`, `attention`) → [variant, how it was chosen]. */
  choices: Record<string, ['workgroup' | 'rows', 'measured' | 'reused' | 'forced' | 'guessed']>;
  /** Seconds per run of each timed variant (empty when nothing was timed). */
  timings: { family: string; variant: string; seconds: number }[];
  /** Seconds spent measuring at this load. */
  measure_seconds: number;
  /** Where the plan is kept (a Cache API URL), when it is. */
  stored_at: string | null;
  /** The attention key split when forced (`'off'` or `{ keys: N }`); absent: the policy. */
  attention_split?: 'off' | { keys: number };
}

/** The automatic KV-cache plan's decision (`kvCache: 'auto'`) and what it measured. */
export interface KvCachePlanInfo {
  /** The chosen kind, for K and V. */
  kind: 'f32' | 'f16' | 'q8_0' | 'q4_0' | 'nf4';
  /** Measured at this load, or reused from the Cache API. */
  source: 'measured' | 'reused';
  /** When it was measured, seconds since the Unix epoch. */
  measured_at: number;
  budget_mb: number | null;
  context: number;
  /** Every kind: its cache size, the gates' values, the timed speed, why it was dropped. */
  candidates: {
    kind: string;
    bytes: number;
    bytes_per_token: number;
    dropped: string | null;
    delta_nll: number | null;
    ppl_ratio: number | null;
    mean_kl: number | null;
    decode_tok_s: number | null;
  }[];
  /** Why the choice fell back to f32, when it did. */
  notice: string | null;
  /** Where the decision is kept (a Cache API URL), when it is. */
  stored_at: string | null;
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

/**
 * A response format (`GenerateOptions.responseFormat`), as OpenAI's `response_format` with
 * regular expressions and grammars besides: JSON is written with `", "` and `": "` and no other
 * whitespace.
 */
export type ResponseFormat =
  | { type: 'text' }
  | { type: 'json_object'; schema?: object | string }
  | {
      type: 'json_schema';
      json_schema: {
        name?: string;
        description?: string;
        schema?: object | boolean;
        /** false: schema keywords the compiler does not support are ignored (default true: refused). */
        strict?: boolean;
      };
    }
  /** Rust `regex` syntax, matched against the whole text. */
  | { type: 'regex'; regex: string }
  /** A Lark grammar; `start` is the start rule. */
  | { type: 'lark'; lark: string }
  /** A llama.cpp GBNF grammar; `root` is the start rule. `grammar` is the same (WebLLM's name). */
  | { type: 'gbnf'; gbnf: string }
  | { type: 'grammar'; grammar: string };

/** Fields shared by `chat.completions.create` and `completions.create` (OpenAI's names). */
export interface CompletionRequestBase {
  /** Echoed in the response (the engine runs its own model whatever this says). */
  model?: string;
  /** Answer with an async iterator of chunks instead of one object. */
  stream?: boolean;
  stream_options?: { include_usage?: boolean };
  /** In [0, 2] (default 1; 0 is greedy). */
  temperature?: number;
  top_p?: number;
  /** Most tokens to generate (default 256 for chat, 16 for completions). */
  max_tokens?: number;
  stop?: string | string[];
  seed?: number;
  /** Choices to generate, 1..=64 (default 1). */
  n?: number;
  response_format?: ResponseFormat;
  frequency_penalty?: number;
  presence_penalty?: number;
  /** Token id (as a string key) to bias in [-100, 100]. */
  logit_bias?: Record<string, number>;
  user?: string;
}

/** A `chat.completions.create` request. */
export interface ChatCompletionRequest extends CompletionRequestBase {
  messages: { role: 'system' | 'developer' | 'user' | 'assistant' | string; content: string | { type: 'text'; text: string }[]; name?: string }[];
  max_completion_tokens?: number;
  /** Report each generated token's log-probability. */
  logprobs?: boolean;
  /** With `logprobs: true`: the most likely tokens at each position, 0..=20. */
  top_logprobs?: number;
}

/** A `completions.create` request. */
export interface CompletionRequest extends CompletionRequestBase {
  prompt: string | number[];
  /** Put the prompt before the completion in `text`. */
  echo?: boolean;
  /** Report each token's log-probability and this many of the most likely tokens, 0..=20. */
  logprobs?: number;
}

/** Token counts of a completion. */
export interface CompletionUsage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
}

/** One generated token's log-probability (`logprobs: true`), with the most likely tokens at
 * its position (`top_logprobs`; empty when none were asked for). */
export interface TokenLogprobInfo {
  token: string;
  logprob: number;
  bytes: number[];
  top_logprobs: { token: string; logprob: number; bytes: number[] }[];
}

/** The answer of `chat.completions.create` without `stream`. */
export interface ChatCompletion {
  id: string;
  object: 'chat.completion';
  created: number;
  model: string;
  system_fingerprint: null;
  choices: {
    index: number;
    message: { role: 'assistant'; content: string; refusal: null };
    logprobs: { content: TokenLogprobInfo[]; refusal: null } | null;
    finish_reason: 'stop' | 'length' | 'abort';
  }[];
  usage: CompletionUsage;
  /** Present when the generation had something to report (an unfinished response format, a cut prompt). */
  warnings?: string[];
}

/** One chunk of a streamed chat completion. */
export interface ChatCompletionChunk {
  id: string;
  object: 'chat.completion.chunk';
  created: number;
  model: string;
  system_fingerprint: null;
  choices: {
    index: number;
    delta: { role?: 'assistant'; content?: string };
    logprobs: { content: TokenLogprobInfo[]; refusal: null } | null;
    finish_reason: 'stop' | 'length' | 'abort' | null;
  }[];
  /** On the last chunk with `stream_options.include_usage`. */
  usage?: CompletionUsage;
  warnings?: string[];
}

/** The answer of `completions.create` (and each of its chunks when streamed). */
export interface TextCompletion {
  id: string;
  object: 'text_completion';
  created: number;
  model: string;
  system_fingerprint?: null;
  choices: {
    index: number;
    text: string;
    logprobs: {
      tokens: string[];
      token_logprobs: number[];
      /** Per position, token text to log-probability; null when `logprobs` was 0. */
      top_logprobs: Record<string, number>[] | null;
      text_offset: number[];
    } | null;
    finish_reason: 'stop' | 'length' | 'abort' | null;
  }[];
  usage?: CompletionUsage;
  warnings?: string[];
}

/** Speculative decoding settings (`GenerateOptions.speculative`). */
export interface SpeculativeOptions {
  /** Where drafts come from (default: the draft model when one is loaded, else lookup). */
  method?: 'draft' | 'lookup';
  /** Tokens drafted per step, 1..=64 (default 4). */
  k?: number;
  /** Adjust the draft length within [1, 2k] from each step's acceptance (default false). */
  adaptive?: boolean;
  /** Fall back to plain decoding below this acceptance rate, [0, 1] (default 0). */
  disableBelowAccept?: number;
  /** When every draft is accepted, take one more token from the model's row (default true). */
  extraToken?: boolean;
  /** The verification rule; only `'reject_sampling'` exists. */
  specMethod?: 'reject_sampling';
}

/** What `gpuInfo()` reports about the adapter (snake_case, as the native CLI prints it). */
export interface AdapterReport {
  name: string;
  vendor: number;
  device: number;
  backend: string;
  device_type: string;
  driver: string;
  driver_info: string;
  adapter_features: string[];
  device_features: string[];
  subgroups: boolean;
  shader_f16: boolean;
  subgroup_min_size: number;
  subgroup_max_size: number;
  limits: {
    max_storage_buffer_binding_size: number;
    max_buffer_size: number;
    max_storage_buffers_per_shader_stage: number;
    max_compute_workgroup_storage_size: number;
    max_compute_invocations_per_workgroup: number;
    max_compute_workgroups_per_dimension: number;
  };
}

/**
 * The token events of one generation as an async iterator; the iterator's return value
 * (`done: true`) is the GenerationResult. Leaving a `for await` loop early aborts the
 * generation.
 */
export interface TokenStream extends AsyncIterator<TokenEvent, GenerationResult, undefined> {
  [Symbol.asyncIterator](): TokenStream;
}

/** What `engine.perplexity(text)` resolves to. */
export interface PerplexityResult {
  /** Tokens predicted (every token but the first of each context window). */
  tokens: number;
  /** Mean negative log-likelihood per predicted token, nats. */
  nll: number;
  /** exp(nll). */
  ppl: number;
}

/** Options of `engine.tokenize`. */
export interface TokenizeOptions {
  /** Recognise special tokens (`<|im_start|>`, ...) written in the text (default false). */
  special?: boolean;
  /** Put the BOS token first (default: what the model's tokenizer asks for). */
  addBos?: boolean;
}

"#;
