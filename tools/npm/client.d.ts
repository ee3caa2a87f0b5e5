// EngineClient: the engine in a dedicated module Worker, driven over postMessage. The types of
// options, events and results are the engine's own (./emberlm.js).
import type {
  ChatCompletion,
  ChatCompletionChunk,
  ChatCompletionRequest,
  CompletionRequest,
  EmbedOptions,
  EmbeddingRequest,
  EmbeddingResponse,
  EngineCounters,
  EngineInfo,
  FinishReason,
  GenerateOptions,
  GenerationResult,
  GenerationStats,
  LoadOptions,
  LoadProgress,
  ModelInfo,
  ModelSource,
  Prompt,
  ChatMessage,
  StoredFile,
  SequenceResult,
  TextCompletion,
  TokenizeOptions,
  TokenEvent,
  TokenStream,
} from './emberlm.js';

export type {
  ChatMessage,
  EngineInfo,
  FinishReason,
  GenerateOptions,
  GenerationResult,
  GenerationStats,
  LoadOptions,
  LoadProgress,
  ModelInfo,
  ModelSource,
  Prompt,
  SequenceResult,
  StoredFile,
  TokenEvent,
  TokenStream,
};

/** What an error's `kind` can be: the message starts with it too (`Limit: ...`). */
export type EngineErrorKind =
  | 'NoAdapter'
  | 'RequestDevice'
  | 'DeviceLost'
  | 'Gpu'
  | 'Shader'
  | 'Readback'
  | 'Limit'
  | 'Format'
  | 'Unsupported'
  | 'Io'
  | 'Tokenizer'
  | 'Template'
  | 'InvalidArgument'
  | 'Cancelled'
  | 'NoModel'
  | 'NoWasmSimd'
  | 'Panic'
  | 'Internal'
  | 'Worker';

/** The errors EngineClient's promises reject with. */
export interface EngineError extends Error {
  kind: EngineErrorKind | (string & {});
  /** InvalidArgument: the option that was refused. */
  option?: string;
  /** Limit: the buffer that does not fit, the device limit, and the bytes needed and allowed. */
  what?: string;
  limit?: string;
  needed?: number;
  allowed?: number;
}

export declare class EngineClient {
  /**
   * Starts the worker: `worker.js` next to this file unless another script URL is given, as a
   * module worker unless `type` is `'classic'`.
   */
  constructor(workerUrl?: string | URL, options?: { type?: WorkerType });
  /** The worker running the engine. */
  readonly worker: Worker;
  /**
   * Loads a GGUF model: a URL (resolved against the page), a File/Blob, or bytes (an
   * ArrayBuffer is transferred to the worker); or a list of those (or a FileList), the parts
   * of a split GGUF set. Resolves to the engine's info.
   */
  load(source: ModelSource, options?: LoadOptions): Promise<EngineInfo>;
  /**
   * Loads a draft model for speculative decoding (a smaller model with the same vocabulary;
   * sources as `load`). Resolves to the engine's info, whose `draft` names it.
   */
  loadDraft(source: ModelSource, options?: { name?: string; cache?: string }): Promise<EngineInfo>;
  /** Drops the draft model. Resolves to the engine's info. */
  unloadDraft(): Promise<EngineInfo>;
  /** Generates; `onToken` sees every token as it comes. */
  generate(
    prompt: Prompt,
    options?: GenerateOptions,
    onToken?: (event: TokenEvent) => void,
  ): Promise<GenerationResult>;
  /** The token events as an async iterator; leaving a `for await` loop early aborts. */
  stream(prompt: Prompt, options?: GenerateOptions): TokenStream;
  /**
   * The OpenAI-style chat API, as on the engine: the completion, or with `stream: true` an
   * async iterator of chunks.
   */
  readonly chat: {
    completions: {
      create(
        request: ChatCompletionRequest,
      ): Promise<ChatCompletion | AsyncIterableIterator<ChatCompletionChunk>>;
    };
  };
  /** OpenAI-style plain completions (`stream: true`: an async iterator of chunks). */
  readonly completions: {
    create(request: CompletionRequest): Promise<TextCompletion | AsyncIterableIterator<TextCompletion>>;
  };
  /** Stops the running generation between two tokens (finishReason `abort`). */
  abort(): Promise<void>;
  /** Forgets the conversation: the next call starts from an empty KV cache. */
  reset(): Promise<void>;
  /**
   * The conversation as bytes: its tokens and KV-cache rows, with `note` (any JSON value kept
   * beside them), as `engine.saveConversation` gives them.
   */
  saveConversation(note?: unknown): Promise<Uint8Array>;
  /**
   * Restores what `saveConversation` gave: the next call continues that conversation without
   * reading it again. Rejects, leaving the conversation as it was, for bytes that are cut,
   * changed, or from another model, engine version or KV-cache kind.
   */
  restoreConversation(bytes: Uint8Array): Promise<{ positions: number; note: unknown }>;
  /**
   * One `Float32Array` per text: its final hidden states pooled and, unless `normalize` is
   * false, scaled to unit length, as `engine.embed` gives them. The conversation is kept.
   */
  embed(texts: string | string[], options?: EmbedOptions): Promise<Float32Array[]>;
  /** The OpenAI-style embeddings API: `embeddings.create({ input, ... })`. */
  readonly embeddings: {
    create(request: EmbeddingRequest): Promise<EmbeddingResponse>;
  };
  /** The adapter, its limits, the model and the context length. */
  info(): Promise<EngineInfo>;
  /** The text's token ids, as `engine.tokenize` gives them. */
  tokenize(text: string, options?: TokenizeOptions): Promise<number[]>;
  /** What the engine did since its device was created, as `engine.counters()`. */
  counters(): Promise<EngineCounters>;
  /** Frees the model; the worker stays for another load. */
  free(): Promise<void>;
  /** Destroys the GPU device as a driver reset would (for tests). */
  destroyDeviceForTest(): Promise<void>;
  /**
   * The files `load(url, { cache })` kept in the Cache API cache `cache` (a split set's parts
   * each under its own URL); no model needs to be loaded.
   */
  listStored(cache: string): Promise<StoredFile[]>;
  /**
   * Deletes `url` from the Cache API cache `cache`, with every other part when it is a split
   * set's first part. Resolves to the number of files deleted.
   */
  deleteStored(url: string, cache: string): Promise<number>;
  /** The emberlm version. */
  version(): Promise<string>;
  /** Stops the worker; pending calls reject with kind `Worker`. */
  terminate(): void;
}
