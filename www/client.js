// EngineClient: the wasm Engine's API, run in a dedicated Worker (www/worker.js) so the page
// never blocks. Every method returns a promise (info() too, since it crosses to the worker);
// calls that use the model run one at a time in the order made, as with Engine itself.
import { tokenStream } from './token_stream.js';

/** Rebuilds an Error from the plain object the worker sent, keeping `kind` and the limit fields. */
function toError(plain) {
  const e = new Error(plain.message);
  for (const [key, value] of Object.entries(plain)) {
    if (key !== 'message') e[key] = value;
  }
  return e;
}

/**
 * A model source as the worker gets it: URLs resolved against this page (the worker's base is
 * its script), ArrayBuffers added to `transfer`, lists (and a FileList) item by item.
 */
function forWorker(source, transfer) {
  if (Array.isArray(source) || (typeof FileList !== 'undefined' && source instanceof FileList)) {
    return Array.from(source, (item) => forWorker(item, transfer));
  }
  if (typeof source === 'string' || source instanceof URL) {
    return new URL(source, document.baseURI).href;
  }
  if (source instanceof ArrayBuffer && !transfer.includes(source)) {
    transfer.push(source);
  }
  return source;
}

export class EngineClient {
  /**
   * Starts the worker: `worker.js` next to this file, or the script at `workerUrl`, as a module
   * worker unless `type` is 'classic' (a page opened from file:// can only start classic ones).
   */
  constructor(workerUrl = undefined, { type = 'module' } = {}) {
    // Written out as `new Worker(new URL(...))` so that bundlers (Vite, webpack) find the worker
    // and bundle it with the wasm module.
    this.worker = workerUrl
      ? new Worker(workerUrl, { type })
      : new Worker(new URL('./worker.js', import.meta.url), { type: 'module' });
    /** Set once the worker failed: later calls reject with it at once. */
    this.failure = null;
    this.calls = new Map();
    this.nextId = 1;
    this.worker.onmessage = ({ data }) => this.#receive(data);
    this.worker.onerror = (event) => {
      // A failure outside any call (the worker script did not load, a wasm trap): settle
      // everything so nothing waits forever.
      const error = new Error(`Worker: ${event.message || 'the engine worker failed'}`);
      error.kind = 'Worker';
      this.failure = error;
      for (const call of this.calls.values()) call.reject(error);
      this.calls.clear();
    };
  }

  #receive({ id, progress, token, result, error }) {
    const call = this.calls.get(id);
    if (!call) return;
    if (progress) call.onProgress?.(progress);
    else if (token) call.onToken?.(token);
    else {
      this.calls.delete(id);
      if (error) call.reject(toError(error));
      else call.resolve(result);
    }
  }

  #call(op, args = {}, handlers = {}, transfer = []) {
    const id = this.nextId++;
    return {
      id,
      promise: new Promise((resolve, reject) => {
        if (this.failure) {
          reject(this.failure);
          return;
        }
        this.calls.set(id, { resolve, reject, ...handlers });
        this.worker.postMessage({ id, op, ...args }, transfer);
      }),
    };
  }

  /**
   * Loads a GGUF model: a URL (resolved against this page), a File/Blob, or bytes (an
   * ArrayBuffer is transferred to the worker); or a list of those (or a FileList), the parts of
   * a split GGUF set. Options as Engine.load: { contextLength, onProgress, cache, storage, sha256, name }.
   * Resolves to engine.info().
   */
  load(source, { onProgress, ...options } = {}) {
    const transfer = [];
    source = forWorker(source, transfer);
    if (options.draft !== undefined) {
      options = { ...options, draft: forWorker(options.draft, transfer) };
    }
    return this.#call('load', { source, options }, { onProgress }, transfer).promise;
  }

  /**
   * Loads a draft model for speculative decoding (a smaller model with the same vocabulary;
   * sources as `load`). Resolves to engine.info(), whose `draft` names it.
   */
  loadDraft(source, options = {}) {
    const transfer = [];
    source = forWorker(source, transfer);
    return this.#call('loadDraft', { source, options }, {}, transfer).promise;
  }

  /** Drops the draft model. Resolves to engine.info(). */
  unloadDraft() {
    return this.#call('unloadDraft').promise;
  }

  /** Generates; `onToken(event)` sees every token. Resolves to the GenerationResult. */
  generate(prompt, options = {}, onToken = undefined) {
    return this.#call('generate', { prompt, options }, { onToken }).promise;
  }

  /**
   * The token events as an async iterator whose return value is the GenerationResult; leaving a
   * `for await` loop early aborts the generation.
   */
  stream(prompt, options = {}) {
    return tokenStream((onToken) => {
      const { id, promise } = this.#call('stream', { prompt, options }, { onToken });
      return { result: promise, cancel: () => this.#call('cancel', { target: id }).promise };
    });
  }

  /**
   * The OpenAI-style chat API, as on the engine: `chat.completions.create(request)` resolves to
   * the completion, or with `stream: true` to an async iterator of chunks.
   */
  get chat() {
    return { completions: { create: (request) => this.#create('chat', request) } };
  }

  /** OpenAI-style plain completions: `completions.create({ prompt, ... })`. */
  get completions() {
    return { create: (request) => this.#create('text', request) };
  }

  #create(endpoint, request) {
    if (!request?.stream) return this.#call('complete', { endpoint, request }).promise;
    return Promise.resolve(tokenStream((onToken) => {
      const { id, promise } = this.#call('complete', { endpoint, request }, { onToken });
      return { result: promise, cancel: () => this.#call('cancel', { target: id }).promise };
    }));
  }

  /** Stops the running generation between two tokens (finishReason "abort"). */
  abort() {
    return this.#call('abort').promise;
  }

  /** Forgets the conversation: the next call starts from an empty KV cache. */
  reset() {
    return this.#call('reset').promise;
  }

  /**
   * The conversation as bytes (a Uint8Array: its tokens and KV cache rows, with `note`, any
   * JSON value kept beside them), as engine.saveConversation gives them.
   */
  saveConversation(note) {
    return this.#call('saveConversation', { note }).promise;
  }

  /**
   * Restores what saveConversation gave: the next call continues that conversation without
   * reading it again. Resolves to { positions, note }.
   */
  restoreConversation(bytes) {
    return this.#call('restoreConversation', { bytes }).promise;
  }

  /**
   * Embeds a text or an array of texts: one Float32Array per text (options: pooling 'mean',
   * 'last' or 'cls'; normalize, default true), as engine.embed gives them.
   */
  embed(texts, options = {}) {
    return this.#call('embed', { texts, options }).promise;
  }

  /** The OpenAI-style embeddings API, as on the engine: `embeddings.create({ input, ... })`. */
  get embeddings() {
    return { create: (request) => this.#call('embeddingsCreate', { request }).promise };
  }

  /** The adapter, its limits, the model and the context length (EngineInfo). */
  info() {
    return this.#call('info').promise;
  }

  /** The prompt's token ids, as engine.tokenize gives them (options: special, addBos). */
  tokenize(text, options = {}) {
    return this.#call('tokenize', { text, options }).promise;
  }

  /** engine.counters(): what the engine did since its device was created. */
  counters() {
    return this.#call('counters').promise;
  }

  /** Frees the model (GPU buffers and bytes); the worker stays for another load. */
  free() {
    return this.#call('free').promise;
  }

  /** Destroys the GPU device as a driver reset would (for tests). */
  destroyDeviceForTest() {
    return this.#call('destroyDeviceForTest').promise;
  }

  /**
   * The files `load(url, { cache })` kept in the store `cache` (the private file system and
   * the Cache API): [{ url, bytes, total, storage, complete }] (a split set's parts each under
   * its own URL; `complete: false` for a download cut off part-way, which the next load
   * resumes). No model needs to be loaded.
   */
  listStored(cache) {
    return this.#call('listStored', { cache }).promise;
  }

  /**
   * Deletes `url` (resolved against this page) from the store `cache` (both media), with every
   * other part when it is a split set's first part. Resolves to the number of files deleted.
   */
  deleteStored(url, cache) {
    return this.#call('deleteStored', { url: new URL(url, document.baseURI).href, cache }).promise;
  }

  /** The emberlm version. */
  version() {
    return this.#call('version').promise;
  }

  /** Stops the worker; pending calls reject. */
  terminate() {
    this.worker.terminate();
    const error = Object.assign(new Error('Worker: the engine was terminated'), { kind: 'Worker' });
    this.failure = error;
    for (const call of this.calls.values()) call.reject(error);
    this.calls.clear();
  }
}
