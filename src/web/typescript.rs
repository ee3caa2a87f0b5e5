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

/** Load progress. `download` also covers reading a File or the Cache API; `upload` is the
 * weights going to the GPU, `load` the weights read into the CPU backend's memory a layer at a
 * time (from a File, the store or the server by range). */
export interface LoadProgress {
  phase: 'download' | 'parse' | 'upload' | 'load';
  /** Bytes (download, upload, load) or steps (parse) done. */
  loaded: number;
  /** Bytes or steps in all; 0 when unknown (a download without Content-Length). */
  total: number;
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

/** A function the model may call (`tools` of a chat request). */
export interface ChatTool {
  type: 'function';
  function: {
    /** 1 to 64 letters, digits, `_` or `-`; unique among the tools. */
    name: string;
    description?: string;
    /** JSON schema of the arguments object; without `additionalProperties` it is taken as closed. */
    parameters?: Record<string, unknown>;
    /** Refuse schema keywords the grammar engine cannot enforce instead of ignoring them. */
    strict?: boolean;
  };
}

/** A call the model made (`message.tool_calls`), or one sent back in the history. */
export interface ChatToolCall {
  id: string;
  type: 'function';
  /** `arguments` is JSON text, valid against the function's parameters. */
  function: { name: string; arguments: string };
}

/** One message of a chat request. */
export interface ChatCompletionMessage {
  role: 'system' | 'developer' | 'user' | 'assistant' | 'tool' | string;
  content: string | null | { type: 'text'; text: string }[];
  name?: string;
  /** The calls an assistant turn made. */
  tool_calls?: ChatToolCall[];
  /** The call a `tool` message answers. */
  tool_call_id?: string;
  refusal?: string | null;
}

/** A `chat.completions.create` request. */
export interface ChatCompletionRequest extends CompletionRequestBase {
  messages: ChatCompletionMessage[];
  /**
   * Functions the model may call. They reach the model through its chat template (or, for a
   * template that does not read `tools`, a system message: `engine.info().toolFormat`), and
   * every call is held to the template's call syntax with arguments valid against the schema.
   */
  tools?: ChatTool[];
  /** `'auto'` (default), `'none'`, `'required'` (a call from the first token), or one function. */
  tool_choice?: 'auto' | 'none' | 'required' | { type: 'function'; function: { name: string } };
  /** Several calls in one answer (default true). */
  parallel_tool_calls?: boolean;
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
    /** `content` is null when the answer is only calls. */
    message: { role: 'assistant'; content: string | null; refusal: null; tool_calls?: ChatToolCall[] };
    logprobs: { content: TokenLogprobInfo[]; refusal: null } | null;
    finish_reason: 'stop' | 'length' | 'abort' | 'tool_calls';
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
    /** A call comes whole in one chunk, as soon as its text is complete. */
    delta: { role?: 'assistant'; content?: string; tool_calls?: (ChatToolCall & { index: number })[] };
    logprobs: { content: TokenLogprobInfo[]; refusal: null } | null;
    finish_reason: 'stop' | 'length' | 'abort' | 'tool_calls' | null;
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

/** How `engine.embed` pools and scales each text's final hidden states. */
export interface EmbedOptions {
  /** `'mean'` over every token, the `'last'` token's, or the first (`'cls'`); by default the
   * model's own where its file names one (BERT models), else `'mean'`. */
  pooling?: 'mean' | 'last' | 'cls';
  /** Scale each vector to unit length (default true). */
  normalize?: boolean;
}

/** An OpenAI-style embeddings request (`engine.embeddings.create`). */
export interface EmbeddingRequest extends EmbedOptions {
  /** One text, or up to 2048. */
  input: string | string[];
  model?: string;
  /** `'float'` (the default) or `'base64'`: each vector's little-endian f32 bytes. */
  encoding_format?: 'float' | 'base64';
  /** Only the model's width is accepted. */
  dimensions?: number;
  user?: string;
}

/** The answer of `embeddings.create`. */
export interface EmbeddingResponse {
  object: 'list';
  data: { object: 'embedding'; index: number; embedding: number[] | string }[];
  model: string;
  usage: { prompt_tokens: number; total_tokens: number };
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
