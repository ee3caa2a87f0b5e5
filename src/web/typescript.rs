//! The TypeScript declarations of the JavaScript API, for the `.d.ts` wasm-bindgen writes: the
//! arguments JavaScript passes and the objects it gets back (see `types.rs` and
//! `crate::session::TokenEvent` for the Rust side of the latter).

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

/** A GGUF model: a URL (fetched, with download progress), its bytes, or a File/Blob. */
export type ModelSource = string | URL | Uint8Array | ArrayBuffer | ArrayBufferView | Blob;

/** Load progress. `download` also covers reading a File or the Cache API. */
export interface LoadProgress {
  phase: 'download' | 'parse' | 'upload';
  /** Bytes (download, upload) or steps (parse) done. */
  loaded: number;
  /** Bytes or steps in all; 0 when unknown (a download without Content-Length). */
  total: number;
}

/** Options of `Engine.load`. */
export interface LoadOptions {
  /** KV cache length in positions (default: the model's context, at most 4096). */
  contextLength?: number;
  /** Called as the model downloads, parses and uploads to the GPU; exceptions are ignored. */
  onProgress?: (progress: LoadProgress) => void;
  /**
   * For URL sources: the Cache API cache to keep the file in (e.g. `'emberlm-models-v1'`),
   * keyed by URL. A later load of the same URL reads it from there instead of the network.
   */
  cache?: string;
  /** A name for messages when the source is raw bytes (default `model.gguf`). */
  name?: string;
  /**
   * Force kernel variants instead of the plan measured on this device: `'rows'` or
   * `'workgroup'` for every kernel family, or `'linear_decode=rows,attention=workgroup'`.
   */
  kernels?: string;
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

/**
 * Generation options. snake_case names (`max_new_tokens`, ...) are accepted too. An unknown or
 * out-of-range option rejects the call with an Error whose message names it.
 */
export interface GenerateOptions {
  /** Most tokens to generate (default 256). */
  maxNewTokens?: number;
  /** Softmax temperature, >= 0; 0 is greedy (default 1). */
  temperature?: number;
  /** Keep the k most likely tokens; 0 is off (default 0). */
  topK?: number;
  /** Nucleus sampling mass in (0, 1]; 1 is off (default 1). */
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
  stop?: string[];
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
  /** Recognise special tokens (`<|im_start|>`, ...) written in a text prompt (default false). */
  special?: boolean;
  /** Reject a prompt longer than the context instead of cutting it from the left. */
  strict?: boolean;
  /** Tokens at the start that context sliding never drops (default: the BOS token). */
  nKeep?: number;
}

/** One streamed piece of output. */
export interface TokenEvent {
  /** Text this event adds (may be empty while an incomplete character is held back). */
  text: string;
  /** The token id; null on the final event that releases held-back text. */
  id: number | null;
  /** The token's log-probability under the model; null with `id`. */
  logprob: number | null;
  /** Index of the sequence (with numReturnSequences > 1 or beam search). */
  sequence: number;
  /** Index of the prompt (always 0). */
  prompt: number;
}

/** `stop`: end of sequence or a stop string; `length`: maxNewTokens; `abort`: abort(). */
export type FinishReason = 'stop' | 'length' | 'abort';

/** One generated sequence. */
export interface SequenceResult {
  text: string;
  tokens: number[];
  finishReason: FinishReason;
  /** Sum of the tokens' log-probabilities. */
  logprob: number;
}

/** Timings and counts of one call. */
export interface GenerationStats {
  /** Prompt tokens (after the chat template and any cut). */
  promptTokens: number;
  /** Prompt tokens whose KV state was reused from the previous call. */
  cachedTokens: number;
  generatedTokens: number;
  prefillMs: number;
  decodeMs: number;
  timeToFirstTokenMs: number;
  /** Decode steps per second (0 when there were none). */
  decodeTokPerS: number;
  /** Sampled tokens drawn from the GPU-selected candidates alone (a few hundred bytes read). */
  candidateSteps: number;
  /** Sampled tokens drawn from a whole logits row read back. */
  fullRowSteps: number;
  /** Of those, steps whose candidates did not suffice, so the row was read as well. */
  selectFallbacks: number;
}

/** The result of `generate` (and the return value of `stream`'s iterator). */
export interface GenerationResult {
  /** The first sequence's text, tokens and finish reason. */
  text: string;
  tokens: number[];
  finishReason: FinishReason;
  /** Every sequence, best first for beam search. */
  sequences: SequenceResult[];
  /** The seed used (repeat the run with it); null for greedy and beam search. */
  seed: number | null;
  /** Things to know: a prompt cut to fit the context, a context slide. */
  warnings: string[];
  stats: GenerationStats;
  /** The prompt as token ids. */
  promptTokenIds: number[];
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

/** The model as loaded. */
export interface ModelInfo {
  /** The file name. */
  name: string;
  arch: 'llama' | 'gpt2';
  layers: number;
  vocab: number;
  hiddenSize: number;
  heads: number;
  kvHeads: number;
  headDim: number;
  ffnSize: number;
  /** The context the model was trained for. */
  contextLength: number;
  /** Weight bytes on the GPU. */
  weightBytes: number;
  bosId: number | null;
  eosIds: number[];
}

/** What `engine.info()` reports. */
export interface EngineInfo {
  /** The adapter's name as the browser reports it. */
  adapter: string;
  backend: string;
  deviceType: string;
  /** Features requested on the device. */
  features: string[];
  /** Every feature the adapter offers. */
  adapterFeatures: string[];
  subgroups: boolean;
  shaderF16: boolean;
  limits: {
    maxStorageBufferBindingSize: number;
    maxBufferSize: number;
    maxStorageBuffersPerShaderStage: number;
    maxComputeWorkgroupStorageSize: number;
    maxComputeInvocationsPerWorkgroup: number;
    maxComputeWorkgroupsPerDimension: number;
  };
  model: ModelInfo;
  /** KV cache length in positions. */
  contextLength: number;
  /** Whether the model brought its own chat template (otherwise a plain fallback is used). */
  hasChatTemplate: boolean;
  /** The file came from the Cache API, not the network. */
  loadedFromCache: boolean;
  /** The file was stored in the Cache API by this load. */
  storedInCache: boolean;
  /** The kernel plan of this device and model. */
  kernelPlan: KernelPlanInfo;
}

/**
 * The token events of one generation as an async iterator; the iterator's return value
 * (`done: true`) is the GenerationResult. Leaving a `for await` loop early aborts the
 * generation.
 */
export interface TokenStream extends AsyncIterator<TokenEvent, GenerationResult, undefined> {
  [Symbol.asyncIterator](): TokenStream;
}

/** Options of `engine.tokenize`. */
export interface TokenizeOptions {
  /** Recognise special tokens (`<|im_start|>`, ...) written in the text (default false). */
  special?: boolean;
  /** Put the BOS token first (default: what the model's tokenizer asks for). */
  addBos?: boolean;
}

/**
 * The engine's GPU work counters, totals since the device was created (they restart after
 * device loss): subtract two snapshots to get what one call did. `engine.counters()`.
 */
export interface EngineCounters {
  /** Compute dispatches recorded. */
  dispatches: number;
  /** Compute passes begun. */
  computePasses: number;
  /** Command buffers submitted. */
  commandBuffers: number;
  /** `queue.submit` calls. */
  submits: number;
  /** Waits for a mapped buffer (GPU to CPU syncs). */
  readbackWaits: number;
  /** Bytes copied from the GPU to the CPU. */
  readbackBytes: number;
  /** Buffers created, and their bytes. */
  buffersCreated: number;
  bufferBytesCreated: number;
  /** Buffers held now, and their bytes. */
  buffersAlive: number;
  bufferBytesAlive: number;
  bindGroupsCreated: number;
  /** Compute pipelines built (kernel cache misses). */
  pipelinesCreated: number;
  /** Model weight bytes bound by the dispatches recorded. */
  weightBytesBound: number;
  /** Forward steps (one prefill chunk or one decode token each), and the tokens they ran. */
  forwardSteps: number;
  forwardTokens: number;
  /** GPU memory the model holds, in bytes. */
  memory: { weights: number; kvCache: number; activations: number; total: number };
  /** Graph nodes (dispatches) of one forward step. */
  nodes: number;
  /** Prompt tokens per prefill step. */
  prefillChunk: number;
}
"#;
