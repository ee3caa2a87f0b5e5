// The engine in a dedicated module Worker, so that loading and generation never block the page.
// www/client.js (EngineClient) is the other end of this protocol:
//   page -> worker: { id, op, ...args }     op: load | generate | stream | complete | cancel |
//                                               abort | reset | saveConversation |
//                                               restoreConversation | embed |
//                                               embeddingsCreate | info | free |
//                                               destroyDeviceForTest | version | loadDraft |
//                                               unloadDraft | tokenize | counters
//   worker -> page: { id, progress } | { id, token } | { id, result } | { id, error }
import init, { Engine, version, noteOneThread } from './pkg/emberlm.js';
import { whySimdMissing, relaxedSimdSupported } from './simd.js';

// The module comes in four builds from the same source, all with WebAssembly SIMD (the CPU
// backend's integer dot products use it): single-threaded, and threaded (shared memory, its own
// glue) for cross-origin isolated pages, where the CPU backend's kernels run on a pool of
// workers; each also with relaxed SIMD (its matrix products in tiles, the same bits), taken
// where the engine validates relaxed SIMD.
// Where the single-threaded build sits, next to the glue (bundlers see this URL and emit the
// file).
const wasmUrl = () => new URL('./pkg/emberlm_bg.wasm', import.meta.url);
// Where the threaded build sits (the single-file demo and the npm package have none:
// tools/dist.mjs sets this to null there).
const threadedBuild = () => ({
  glue: new URL('./pkg-threads/emberlm.js', import.meta.url).href,
  wasm: new URL('./pkg-threads/emberlm_bg.wasm', import.meta.url),
});
// ... and with relaxed SIMD (tools/dist.mjs sets this to null where there is no threaded build).
const relaxedBuild = () => ({
  glue: new URL('./pkg-threads-relaxed/emberlm.js', import.meta.url).href,
  wasm: new URL('./pkg-threads-relaxed/emberlm_bg.wasm', import.meta.url),
});
// ... and the single-threaded one with relaxed SIMD (its own glue; null where tools/dist.mjs
// inlines the single-threaded build).
const relaxedSingleBuild = () => ({
  glue: new URL('./pkg-relaxed/emberlm.js', import.meta.url).href,
  wasm: new URL('./pkg-relaxed/emberlm_bg.wasm', import.meta.url),
});
// Whether to try a relaxed-SIMD build first: the engine validates relaxed SIMD, and the
// worker's URL does not say `?simd=plain` (which keeps the plain build, to compare them).
function relaxedWanted(build) {
  if (!build || !relaxedSimdSupported()) return false;
  return new URL(self.location.href).searchParams.get('simd') !== 'plain';
}
// The wasm module: fetched next to the glue unless a build that inlines it (the single-file
// demo, tools/dist.mjs) set globalThis.EMBERLM_WASM to its bytes (or a promise of them), or to
// a function returning them.
function wasmSource() {
  const inlined = globalThis.EMBERLM_WASM;
  if (typeof inlined === 'function') return inlined();
  if (inlined) return inlined;
  return wasmUrl();
}

// Threads for the CPU backend: one per core, at most 8; `?threads=N` on the worker's URL
// asks for another count (1: the single-threaded build).
function threadsWanted() {
  const asked = Number(new URL(self.location.href).searchParams.get('threads'));
  if (Number.isInteger(asked) && asked > 0) return Math.min(asked, 8);
  return Math.min(navigator.hardwareConcurrency || 1, 8);
}

// Why the CPU backend cannot have threads here (null when it can).
function whyOneThread(threads) {
  if (threads < 2) return 'one thread was asked for (or the device reports one core)';
  if (!threadedBuild || globalThis.EMBERLM_WASM) return 'this build of the engine has no threads';
  if (!self.crossOriginIsolated || typeof SharedArrayBuffer === 'undefined') {
    return 'the page is not cross-origin isolated (it needs the headers Cross-Origin-Opener-Policy: ' +
      'same-origin and Cross-Origin-Embedder-Policy: require-corp), so workers cannot share memory';
  }
  return null;
}

// Loads the threaded build and starts its worker pool where the page allows it, otherwise the
// single-threaded build; resolves to the module's exports in use, or rejects (every request
// then fails with the reason) where the browser lacks WebAssembly SIMD.
async function loadModule() {
  const missing = whySimdMissing();
  if (missing) throw Object.assign(new Error(`NoWasmSimd: ${missing}`), { kind: 'NoWasmSimd' });
  const threads = threadsWanted();
  let reason = whyOneThread(threads);
  if (!reason) {
    let threaded = null;
    // relaxed SIMD first where the engine has it; the plain threaded build if that fails
    for (const build of [relaxedWanted(relaxedBuild) ? relaxedBuild() : null, threadedBuild()]) {
      if (!build || threaded) continue;
      try {
        threaded = await import(build.glue);
        await threaded.default({ module_or_path: build.wasm });
      } catch (e) {
        threaded = null;
        reason = `the threaded build did not load: ${e?.message ?? e}`;
      }
    }
    if (threaded) {
      // A pool that does not start leaves this build on one thread; it records why.
      await threaded.startThreads(threads).catch(() => {});
      return threaded;
    }
  }
  // one thread: relaxed SIMD where the engine has it, the plain build if that fails
  if (relaxedWanted(relaxedSingleBuild) && !globalThis.EMBERLM_WASM) {
    const build = relaxedSingleBuild();
    try {
      const relaxed = await import(build.glue);
      await relaxed.default({ module_or_path: build.wasm });
      relaxed.noteOneThread(reason);
      return relaxed;
    } catch {
      // the plain single-threaded build below
    }
  }
  await init({ module_or_path: wasmSource() });
  noteOneThread(reason);
  return { Engine, version };
}
const ready = loadModule();
// A module that cannot load (no WebAssembly SIMD) fails every request with the reason; the
// promise itself must not count as an unhandled rejection.
ready.catch(() => {});
/** The exports of the build in use. */
let api = null;
/** @type {Engine | null} */
let engine = null;
/** Running streams by call id, so that `cancel` can end them early. */
const streams = new Map();

// Errors do not keep their extra fields through postMessage: copy them into a plain object.
function plainError(e) {
  const out = { message: String(e?.message ?? e), name: e?.name ?? 'Error' };
  for (const key of ['kind', 'option', 'what', 'limit', 'needed', 'allowed']) {
    if (e && e[key] !== undefined) out[key] = e[key];
  }
  return out;
}

// Posts every item of the async iterator `it` as a token message of call `id` (cancellable by
// id meanwhile) and resolves to its return value.
async function relay(id, it) {
  streams.set(id, it);
  try {
    for (;;) {
      const step = await it.next();
      if (step.done) return step.value;
      postMessage({ id, token: step.value });
    }
  } finally {
    streams.delete(id);
  }
}

function requireEngine() {
  if (!engine) throw Object.assign(new Error('NoModel: load a model first'), { kind: 'NoModel' });
  return engine;
}

const ops = {
  async load(id, { source, options = {} }) {
    if (engine) {
      engine.free();
      engine = null;
    }
    engine = await api.Engine.load(source, {
      ...options,
      onProgress: (progress) => postMessage({ id, progress }),
    });
    return engine.info();
  },
  async loadDraft(id, { source, options = {} }) {
    await requireEngine().loadDraft(source, options);
    return requireEngine().info();
  },
  async unloadDraft() {
    await requireEngine().unloadDraft();
    return requireEngine().info();
  },
  async generate(id, { prompt, options }) {
    return requireEngine().generate(prompt, options, (token) => postMessage({ id, token }));
  },
  async stream(id, { prompt, options }) {
    return relay(id, requireEngine().stream(prompt, options));
  },
  // The OpenAI-style API: `endpoint` 'chat' or 'text'; a streamed request posts each chunk as
  // a token message and resolves to the whole completion.
  async complete(id, { endpoint, request }) {
    const engine = requireEngine();
    const api = endpoint === 'chat' ? engine.chat.completions : engine.completions;
    const answer = await api.create(request);
    return request?.stream ? relay(id, answer) : answer;
  },
  async cancel(id, { target }) {
    await streams.get(target)?.return();
  },
  async abort() {
    engine?.abort();
  },
  async reset() {
    await requireEngine().reset();
  },
  async saveConversation(id, { note }) {
    return requireEngine().saveConversation(note);
  },
  async restoreConversation(id, { bytes }) {
    return requireEngine().restoreConversation(bytes);
  },
  async embed(id, { texts, options }) {
    return requireEngine().embed(texts, options);
  },
  async embeddingsCreate(id, { request }) {
    return requireEngine().embeddings.create(request);
  },
  async info() {
    return requireEngine().info();
  },
  async tokenize(id, { text, options }) {
    return Array.from(await requireEngine().tokenize(text, options));
  },
  async counters() {
    return requireEngine().counters();
  },
  // The Cache API store: no model needed.
  async listStored(id, { cache }) {
    return api.Engine.listStored(cache);
  },
  async deleteStored(id, { url, cache }) {
    return api.Engine.deleteStored(new URL(url, self.location.href).href, cache);
  },
  async free() {
    engine?.free();
    engine = null;
  },
  async destroyDeviceForTest() {
    await requireEngine().destroyDeviceForTest();
  },
  async version() {
    return api.version();
  },
};

self.onmessage = async ({ data }) => {
  const { id, op } = data;
  try {
    api = await ready;
    const run = ops[op];
    if (!run) throw new Error(`unknown operation ${op}`);
    const result = await run(id, data);
    postMessage({ id, result });
  } catch (e) {
    postMessage({ id, error: plainError(e) });
  }
};
