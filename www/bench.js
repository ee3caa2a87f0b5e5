// The browser bench page: emberlm (WebGPU) and wllama (llama.cpp compiled to wasm) in the same
// page, driven by tools/bench_browser.mjs through `window.bench`. Each function does one
// measured step and returns plain data; the driver decides the order (alternating runs), the
// prompts (token ids) and the statistics.
//
// Both engines get the same token ids, greedy decoding and the end-of-sequence tokens banned, so
// that every run generates exactly the number of tokens asked for.
// wllama is served from ./wllama/ (the npm package's esm/ folder, linked there by the driver):
// nothing is fetched from elsewhere.

const status = document.getElementById('status');
const logEl = document.getElementById('log');
function log(line) {
  logEl.textContent += `${line}\n`;
}

/** @type {import('./pkg/emberlm.js') | null} */
let ember = null;
/** @type {any} the emberlm Engine */
let engine = null;
/** @type {any} the wllama module */
let wllamaModule = null;
/** @type {any} the Wllama instance */
let wllama = null;

const now = () => performance.now();

async function fetchBlob(url) {
  const res = await fetch(url);
  if (!res.ok) throw new Error(`${url}: HTTP ${res.status}`);
  return res.blob();
}

const bench = {
  /** What the page offers: cross-origin isolation decides wllama's threads. */
  environment() {
    return {
      userAgent: navigator.userAgent,
      hardwareConcurrency: navigator.hardwareConcurrency,
      crossOriginIsolated: self.crossOriginIsolated,
      webgpu: 'gpu' in navigator,
    };
  },

  // emberlm

  /**
   * Loads emberlm's wasm module and the model on `backend` (`'webgpu'` by default: the bench
   * measures the backend it names, never `auto`'s choice); returns the load time and
   * `engine.info()`. The CPU backend runs as on the chat page, in the engine worker, on
   * `threads` threads (1: the single-threaded SIMD build; more: the threaded build, which
   * needs this page cross-origin isolated; with relaxed SIMD where the browser has it, unless
   * `simd` is `'plain'`); WebGPU runs in this page.
   */
  async emberLoad(url, { contextLength, kernels, backend = 'webgpu', threads = 1, simd = 'auto' } = {}) {
    if (engine) bench.emberFree();
    if (backend === 'cpu') {
      const { EngineClient } = await import('./client.js');
      const client = new EngineClient(new URL(`./worker.js?threads=${threads}&simd=${simd}`, import.meta.url));
      const start = now();
      let info;
      try {
        info = await client.load(url, { contextLength, backend });
      } catch (e) {
        client.terminate();
        throw e;
      }
      const ms = now() - start;
      // The engine's calls that the runs below make, through the worker.
      engine = {
        info: () => info,
        tokenize: (text, options) => client.tokenize(text, options),
        reset: () => client.reset(),
        counters: () => client.counters(),
        generate: (prompt, options, onToken) => client.generate(prompt, options, onToken),
        free: () => client.terminate(),
      };
      return { ms, info, version: await client.version() };
    }
    if (!ember) {
      ember = await import('./pkg/emberlm.js');
      // the single-threaded build, which the page's worker loads without cross-origin isolation
      await ember.default({ module_or_path: new URL('./pkg/emberlm_bg.wasm', import.meta.url) });
    }
    const start = now();
    engine = await ember.Engine.load(url, { contextLength, kernels: kernels ?? undefined, backend });
    const ms = now() - start;
    return { ms, info: engine.info(), version: ember.version() };
  },

  /** Token ids of `text`, without BOS and without special tokens. */
  async emberTokenize(text) {
    return Array.from(await engine.tokenize(text, { special: false, addBos: false }));
  },

  /**
   * One greedy generation of `maxNew` tokens from `ids` on an empty KV cache, with the
   * end-of-sequence tokens banned; returns the engine's timings, the tokens and what the GPU
   * counters moved.
   */
  async emberRun(ids, maxNew) {
    await engine.reset();
    const info = engine.info();
    const logitBias = {};
    for (const id of info.model.eosIds) logitBias[id] = -100;
    const before = await engine.counters();
    const pieces = [];
    const onToken = (e) => {
      if (e.id !== null) pieces.push(e.text);
    };
    const start = now();
    const g = await engine.generate(ids, { maxNewTokens: maxNew, temperature: 0, logitBias }, onToken);
    const wallMs = now() - start;
    const after = await engine.counters();
    const counters = {};
    for (const [k, v] of Object.entries(after)) {
      if (typeof v === 'number' && typeof before[k] === 'number') counters[k] = v - before[k];
    }
    return {
      wallMs,
      stats: g.stats,
      tokens: g.tokens,
      text: g.text,
      pieces,
      finishReason: g.finishReason,
      counters,
      memory: after.memory,
      nodes: after.nodes,
      prefillChunk: after.prefillChunk,
    };
  },

  /**
   * Batched decoding: `b` one-token prompts (distinct ids) generated together, `maxNew`
   * tokens each, greedy with the end-of-sequence tokens banned. The sequences decode side by
   * side, so the aggregate rate is every decode step's tokens over the longest decode time.
   */
  async emberBatch(b, maxNew) {
    await engine.reset();
    const info = engine.info();
    const logitBias = {};
    for (const id of info.model.eosIds) logitBias[id] = -100;
    const prompts = Array.from({ length: b }, (_, i) => [(17 + 31 * i) % info.model.vocab]);
    const start = now();
    const results = await engine.generateBatch(prompts, { maxNewTokens: maxNew, temperature: 0, logitBias, maxBatch: b });
    const wallMs = now() - start;
    const decodeMs = Math.max(...results.map((r) => r.stats.decodeMs));
    const steps = results.reduce((n, r) => n + r.tokens.length - 1, 0);
    return { batch: b, wallMs, decodeMs, stepMs: decodeMs / Math.max(maxNew - 1, 1), aggregateTokS: steps / (decodeMs / 1000) };
  },

  /** engine.profile(): time per kernel of a decode step and a prefill chunk, and the plan. */
  async emberProfile() {
    return engine.profile({ decodePos: 32, promptTokens: 32 });
  },

  emberFree() {
    engine?.free();
    engine = null;
  },

  // wllama

  /**
   * Loads wllama and the model (fetched here into a Blob, as emberlm fetches it). `threads`
   * defaults to navigator.hardwareConcurrency; `gpuLayers` 0 keeps wllama on the CPU (wasm
   * SIMD), its default (all layers) uses its WebGPU backend.
   */
  async wllamaLoad(url, { threads, nCtx, gpuLayers } = {}) {
    if (!wllamaModule) wllamaModule = await import('./wllama/index.js');
    if (wllama) await bench.wllamaExit();
    const start = now();
    const blob = await fetchBlob(url);
    const instance = new wllamaModule.Wllama(
      { default: new URL('./wllama/wasm/wllama.wasm', location.href).href },
      { suppressNativeLog: true },
    );
    const params = { n_ctx: nCtx, n_threads: threads ?? navigator.hardwareConcurrency };
    if (gpuLayers !== undefined) params.n_gpu_layers = gpuLayers;
    await instance.loadModel([blob], params);
    const ms = now() - start;
    wllama = instance;
    let libllama = null;
    try {
      libllama = wllamaModule.Wllama.getLibllamaVersion();
    } catch {
      // Older builds lack it.
    }
    return {
      ms,
      threads: wllama.getNumThreads(),
      multithread: wllama.isMultithread(),
      webgpu: gpuLayers !== 0 && wllama.isSupportWebGPU(),
      libllama,
      context: wllama.getLoadedContextInfo().n_ctx,
      batch: wllama.getLoadedContextInfo().n_batch,
      addBos: wllama.mustAddBosToken(),
      eog: wllama.getLoadedContextInfo().list_tokens_eog,
    };
  },

  /**
   * One greedy completion of `maxNew` tokens from `prompt` (text: wllama 3.8.1's completion
   * call does not take token ids) with the
   * prompt cache off (every run prefills the whole prompt) and end-of-generation ignored;
   * returns wllama's own timings (llama.cpp's server timings) and the wall time.
   */
  async wllamaRun(prompt, maxNew, { cachePrompt = false } = {}) {
    const start = now();
    const r = await wllama.createCompletion({
      prompt,
      max_tokens: maxNew,
      temperature: 0,
      top_k: 1,
      ignore_eos: true,
      cache_prompt: cachePrompt,
      return_tokens: true,
    });
    const wallMs = now() - start;
    const choice = r?.choices?.[0] ?? {};
    return {
      wallMs,
      timings: r?.timings ?? null,
      usage: r?.usage ?? null,
      text: choice.text ?? r?.content ?? '',
      tokens: r?.tokens ?? choice.tokens ?? null,
      finishReason: choice.finish_reason ?? null,
      keys: Object.keys(r ?? {}),
    };
  },

  async wllamaExit() {
    const w = wllama;
    wllama = null;
    await w?.exit();
  },
};

window.bench = bench;
status.textContent = 'ready';
status.dataset.state = 'ready';
log('ready: window.bench');
