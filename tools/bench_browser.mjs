// The browser half of `./build.sh bench`: emberlm (WebGPU, www/pkg/) and wllama (llama.cpp
// compiled to wasm, @wllama/wllama from npm in .cache/bench/wllama/) in the same headless
// Chromium, on the same GGUF and the same prompt, greedy, the same token counts, in alternating
// runs (emberlm, wllama, emberlm, wllama, ...). Prints a table and writes
// bench/results/<YYYY-MM-DD>-browser-<adapter>.json (a file of its own, beside the native one).
//
//   node tools/bench_browser.mjs [--model PATH] [--quick] [--runs N] [--out PATH]
//                                [--wllama-threads N] [--wllama-gpu-layers N] [--kernels SPEC]
//                                [--ember-backend webgpu|cpu] [--ember-threads N]
//                                [--ember-simd auto|plain] [--prefill N[,N...]] [--decode N]
//                                [--no-wllama]
//
// --ember-backend cpu runs emberlm's CPU backend (WebAssembly, in the engine worker as on the
// chat page, on --ember-threads threads: 1 by default, more with the threaded build) in place
// of WebGPU, for the comparison with wllama on the CPU at equal threads (`--wllama-threads`);
// the GPU-only parts (profile, batched decoding) are left out then. --ember-simd plain keeps
// the threaded build without relaxed SIMD (by default the worker takes the relaxed-SIMD build
// where the browser validates it; `info.cpuInstructions` in the results names the one run).
// --kernels forces emberlm's kernel variants (as Engine.load's `kernels`); without it the plan
// measured (or reused) on the adapter runs. The first emberlm run also profiles the kernels
// (engine.profile()) and the table prints the plan and the profile.
//
// Full settings: prompts of 128 and 512 tokens, 128 generated tokens after the 128-token one.
// --quick: a 32-token prompt and 8 generated tokens (minutes on a software adapter).
// --prefill / --decode set the prompt lengths and the generated count by hand (for the large
// shapes, whose full settings take long); --no-wllama runs emberlm alone (a model wllama cannot
// hold, or emberlm's own figures between two changes).
// Each run loads the engine (timed), generates `decode` tokens after the first prompt (its
// prefill and time to first token count for that prompt length) and prefills every other prompt
// with one generated token; then frees it. A peer that fails is reported as NOT RUN with the
// reason and the rest goes on.
//
// The prompt: a fixed English text (the native bench's) repeated and cut at a word boundary
// where emberlm's tokenizer gives exactly N tokens. emberlm gets those ids; wllama 3.8.1's
// completion call takes text only (a token-id prompt crashes its worker), so it gets the text,
// and every run checks that its tokenizer made the same number of prompt tokens. Greedy
// agreement (how many of the generated tokens are the same) is recorded, never enforced.
import { existsSync, lstatSync, mkdirSync, mkdtempSync, rmSync, statSync, symlinkSync, unlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';
import { CHROMIUM, CHROMIUM_ARGS } from './chromium.mjs';
import { startServer } from './serve.mjs';
import { freshResultPath } from './result_path.mjs';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const WWW = join(ROOT, 'www');
const WLLAMA_ESM = join(ROOT, '.cache/bench/wllama/node_modules/@wllama/wllama/esm');
// The native bench's prompt text (src/bin/emberlm/bench.rs).
const TEXT = 'The history of computing is a story of machines that became smaller, '
  + 'faster and cheaper, and of the people who learned to program them. ';

function usage(message) {
  if (message) console.error(`bench_browser: ${message}`);
  console.error('usage: node tools/bench_browser.mjs [--model PATH] [--quick] [--runs N] [--out PATH] '
    + '[--wllama-threads N] [--wllama-gpu-layers N] [--kernels SPEC] [--ember-backend webgpu|cpu] [--ember-threads N] [--ember-simd auto|plain] '
    + '[--prefill N[,N...]] [--decode N] [--no-wllama]');
  process.exit(2);
}

function parseArgs(argv) {
  const o = {
    model: 'models/SmolLM2-135M-Instruct.Q4_1.gguf', quick: false, runs: 3, out: null,
    wllamaThreads: null, wllamaGpuLayers: 0, kernels: null, emberBackend: 'webgpu', emberThreads: 1,
    emberSimd: 'auto', prefill: null, decode: null, wllama: true,
  };
  const int = (flag, v, min) => {
    const n = Number(v);
    if (!Number.isInteger(n) || n < min) usage(`${flag} needs a whole number >= ${min}`);
    return n;
  };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const next = () => {
      if (i + 1 >= argv.length) usage(`${a} needs a value`);
      return argv[++i];
    };
    if (a === '--model') o.model = next();
    else if (a === '--quick') o.quick = true;
    else if (a === '--runs') o.runs = int(a, next(), 1);
    else if (a === '--out') o.out = next();
    else if (a === '--wllama-threads') o.wllamaThreads = int(a, next(), 1);
    else if (a === '--wllama-gpu-layers') o.wllamaGpuLayers = int(a, next(), 0);
    else if (a === '--kernels') o.kernels = next();
    else if (a === '--ember-threads') o.emberThreads = int(a, next(), 1);
    else if (a === '--prefill') o.prefill = next().split(',').map((n) => int('--prefill', n, 1));
    else if (a === '--decode') o.decode = int(a, next(), 1);
    else if (a === '--no-wllama') o.wllama = false;
    else if (a === '--ember-simd') {
      o.emberSimd = next();
      if (!['auto', 'plain'].includes(o.emberSimd)) usage(`--ember-simd: '${o.emberSimd}' is not auto or plain`);
    }
    else if (a === '--ember-backend') {
      o.emberBackend = next();
      if (!['webgpu', 'cpu'].includes(o.emberBackend)) usage('--ember-backend is webgpu or cpu');
    }
    else if (a === '-h' || a === '--help') usage();
    else usage(`unknown argument ${a}`);
  }
  o.prefill ??= o.quick ? [32] : [128, 512];
  o.decode ??= o.quick ? 8 : 128;
  return o;
}

/** Median, min and max, as the native bench reports them. */
function spread(values) {
  const v = values.filter((x) => Number.isFinite(x)).sort((a, b) => a - b);
  if (v.length === 0) return { median: 0, min: 0, max: 0, runs: 0 };
  const mid = Math.floor(v.length / 2);
  const median = v.length % 2 ? v[mid] : (v[mid - 1] + v[mid]) / 2;
  return { median, min: v[0], max: v[v.length - 1], runs: v.length };
}

const slug = (s) => s.toLowerCase().replace(/[^a-z0-9]+/g, '-').replace(/^-+|-+$/g, '');
const fmt = (s, d = 3) => `${s.median.toFixed(d).padStart(10)}  (min ${s.min.toFixed(d)}, max ${s.max.toFixed(d)}, n=${s.runs})`;
const seconds = (since) => ((performance.now() - since) / 1000).toFixed(0);

/** Replaces a symlink at `link` (never a real file or folder) with one to `target`. */
function link(target, linkPath) {
  mkdirSync(dirname(linkPath), { recursive: true });
  try {
    const st = lstatSync(linkPath);
    if (!st.isSymbolicLink()) return existsSync(linkPath);
    unlinkSync(linkPath);
  } catch {
    // absent
  }
  symlinkSync(target, linkPath);
  return true;
}

/**
 * The prefix of TEXT repeated, ending at a word boundary (else inside the nearest words), that
 * emberlm's tokenizer turns into exactly `n` tokens (no BOS); `null` when no cut gives n.
 */
async function promptOf(page, n) {
  const long = TEXT.repeat(Math.ceil((n * 8) / TEXT.length) + 2);
  const cuts = [];
  for (let i = 1; i <= long.length; i++) if (i === long.length || long[i] === ' ') cuts.push(i);
  const count = (cut) => page.evaluate((t) => bench.emberTokenize(t), long.slice(0, cut));
  let lo = 0;
  let hi = cuts.length - 1;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if ((await count(cuts[mid])).length < n) lo = mid + 1;
    else hi = mid;
  }
  for (let k = Math.max(0, lo - 2); k < Math.min(cuts.length, lo + 3); k++) {
    const ids = await count(cuts[k]);
    if (ids.length === n) return { text: long.slice(0, cuts[k]), ids };
  }
  // no word boundary gives n (a word of two tokens straddles it): cut inside that word
  const from = cuts[Math.max(0, lo - 2)];
  const to = cuts[Math.min(cuts.length - 1, lo + 2)];
  for (let cut = from; cut <= to; cut++) {
    const ids = await count(cut);
    if (ids.length === n) return { text: long.slice(0, cut), ids };
  }
  return null;
}

/** How many of emberlm's generated tokens wllama generated too (same text, from the start). */
function agreement(pieces, theirText) {
  let text = '';
  let n = 0;
  for (const p of pieces) {
    text += p;
    if (!theirText.startsWith(text)) break;
    n++;
  }
  return n;
}

async function main() {
  const o = parseArgs(process.argv.slice(2));
  const model = resolve(o.model);
  if (!existsSync(model)) usage(`model not found: ${o.model}`);
  if (!existsSync(join(WWW, 'pkg/emberlm.js'))) {
    console.error('bench_browser: www/pkg is missing: run ./build.sh build');
    process.exit(1);
  }
  const modelName = basename(model);
  link(model, join(WWW, 'models', modelName));
  const wllamaLinked = existsSync(WLLAMA_ESM) && link(WLLAMA_ESM, join(WWW, 'wllama'));
  const notes = [];

  const { server, url } = await startServer(WWW, 0, { isolated: true });
  const profile = mkdtempSync(join(tmpdir(), 'emberlm-bench-'));
  const browser = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM, headless: true, args: CHROMIUM_ARGS,
  });
  const cleanup = async () => {
    await browser.close().catch(() => {});
    server.close();
    rmSync(profile, { recursive: true, force: true });
  };
  try {
    const page = await browser.newPage();
    page.on('pageerror', (e) => console.error(`page error: ${e}`));
    await page.goto(`${url}bench.html`);
    await page.waitForFunction(() => window.bench !== undefined, null, { timeout: 60_000 });
    const environment = await page.evaluate(() => bench.environment());
    const browserVersion = browser.browser()?.version() ?? null;
    const modelUrl = `${url}models/${encodeURIComponent(modelName)}`;
    const context = Math.max(...o.prefill, o.prefill[0] + o.decode) + 8;
    console.error(`bench_browser: ${modelName}, prompts ${o.prefill.join('/')}, decode ${o.decode}, `
      + `${o.runs} runs each, alternating; Chromium ${browserVersion}, `
      + `${environment.hardwareConcurrency} cores, cross-origin isolated ${environment.crossOriginIsolated}`);

    const ours = { runs: [], error: null, info: null, version: null };
    const theirs = {
      runs: [],
      error: !o.wllama ? 'not run (--no-wllama)'
        : wllamaLinked ? null : `@wllama/wllama not installed in ${WLLAMA_ESM}`,
      load: null,
    };
    let prompts = null;
    const started = performance.now();

    for (let run = 0; run < o.runs; run++) {
      // emberlm
      if (!ours.error) {
        try {
          const t0 = performance.now();
          const load = await page.evaluate(([u, c, k, b, t, s]) => bench.emberLoad(u, { contextLength: c, kernels: k, backend: b, threads: t, simd: s }),
            [modelUrl, context, o.kernels, o.emberBackend, o.emberThreads, o.emberSimd]);
          ours.info = load.info;
          ours.version = load.version;
          if (!prompts) {
            prompts = [];
            for (const n of o.prefill) {
              const p = await promptOf(page, n);
              if (!p) throw new Error(`no word boundary of the prompt text gives exactly ${n} tokens`);
              prompts.push(p);
            }
          }
          const rec = { load_ms: load.ms, prefill: [] };
          const d = await page.evaluate(([ids, n]) => bench.emberRun(ids, n), [prompts[0].ids, o.decode]);
          rec.decode = d;
          rec.prefill.push({ tokens: prompts[0].ids.length, ms: d.stats.prefillMs });
          for (const p of prompts.slice(1)) {
            const r = await page.evaluate(([ids]) => bench.emberRun(ids, 1), [p.ids]);
            rec.prefill.push({ tokens: p.ids.length, ms: r.stats.prefillMs, counters: r.counters });
          }
          if (run === 0 && o.emberBackend === 'webgpu') {
            ours.profile = await page.evaluate(() => bench.emberProfile());
            ours.batched = [];
            for (const b of [1, 4, 8, 16]) {
              console.error(`bench_browser: emberlm batched decoding B = ${b}`);
              ours.batched.push(await page.evaluate(([b, n]) => bench.emberBatch(b, n), [b, o.quick ? 4 : 16]));
            }
          }
          await page.evaluate(() => bench.emberFree());
          ours.runs.push(rec);
          console.error(`bench_browser: emberlm run ${run + 1}/${o.runs}: ${seconds(t0)} s `
            + `(prefill ${(prompts[0].ids.length / (d.stats.prefillMs / 1000)).toFixed(2)} tok/s, `
            + `decode ${d.stats.decodeTokPerS.toFixed(3)} tok/s; ${seconds(started)} s in all)`);
        } catch (e) {
          ours.error = String(e?.message ?? e).split('\n')[0];
          console.error(`bench_browser: emberlm failed: ${ours.error}`);
        }
      }
      if (!prompts) break; // nothing to give wllama without the tokenized prompts
      // wllama
      if (!theirs.error) {
        try {
          const t0 = performance.now();
          const load = await page.evaluate(([u, opts]) => bench.wllamaLoad(u, opts), [modelUrl, {
            threads: o.wllamaThreads ?? undefined, nCtx: context, gpuLayers: o.wllamaGpuLayers,
          }]);
          theirs.load = load;
          const rec = { load_ms: load.ms, prefill: [] };
          const d = await page.evaluate(([t, n]) => bench.wllamaRun(t, n), [prompts[0].text, o.decode]);
          rec.decode = d;
          const check = (r, n) => {
            if (!r.timings) throw new Error('wllama returned no timings');
            if (r.timings.cache_n !== 0) throw new Error(`wllama reused ${r.timings.cache_n} cached prompt tokens`);
            return { tokens: n, prompt_n: r.timings.prompt_n, ms: r.timings.prompt_ms };
          };
          rec.prefill.push(check(d, prompts[0].ids.length));
          for (const p of prompts.slice(1)) {
            const r = await page.evaluate(([t]) => bench.wllamaRun(t, 1), [p.text]);
            rec.prefill.push(check(r, p.ids.length));
          }
          await page.evaluate(() => bench.wllamaExit());
          theirs.runs.push(rec);
          const t = d.timings;
          console.error(`bench_browser: wllama run ${run + 1}/${o.runs}: ${seconds(t0)} s `
            + `(prefill ${(t.prompt_n / (t.prompt_ms / 1000)).toFixed(2)} tok/s, `
            + `decode ${((t.predicted_n - 1) / (t.predicted_ms / 1000)).toFixed(3)} tok/s; ${seconds(started)} s in all)`);
        } catch (e) {
          theirs.error = String(e?.message ?? e).split('\n')[0];
          console.error(`bench_browser: wllama failed: ${theirs.error}`);
          await page.evaluate(() => bench.wllamaExit()).catch(() => {});
        }
      }
    }

    // Figures.
    const lengths = o.prefill;
    const oursFig = ours.runs.length === 0 ? null : {
      load_ms: spread(ours.runs.map((r) => r.load_ms)),
      prefill_tok_s: lengths.map((n, i) => ({
        tokens: n, tok_s: spread(ours.runs.map((r) => r.prefill[i].tokens / (r.prefill[i].ms / 1000))),
      })),
      decode_tok_s: spread(ours.runs.map((r) => r.decode.stats.decodeTokPerS)),
      ttft_ms: spread(ours.runs.map((r) => r.decode.stats.timeToFirstTokenMs)),
      decode_run_wall_ms: spread(ours.runs.map((r) => r.decode.wallMs)),
    };
    const theirFig = theirs.runs.length === 0 ? null : {
      load_ms: spread(theirs.runs.map((r) => r.load_ms)),
      prefill_tok_s: lengths.map((n, i) => ({
        tokens: n, tok_s: spread(theirs.runs.map((r) => r.prefill[i].prompt_n / (r.prefill[i].ms / 1000))),
      })),
      decode_tok_s: spread(theirs.runs.map((r) => {
        const t = r.decode.timings;
        return (t.predicted_n - 1) / (t.predicted_ms / 1000);
      })),
      ttft_ms: spread(theirs.runs.map((r) => r.decode.timings.prompt_ms)),
      decode_run_wall_ms: spread(theirs.runs.map((r) => r.decode.wallMs)),
    };
    const lastOurs = ours.runs.at(-1);
    const decodeCounters = lastOurs?.decode.counters;
    const steps = decodeCounters?.forwardSteps || 1;
    const perStep = decodeCounters
      ? Object.fromEntries(Object.entries(decodeCounters).map(([k, v]) => [k, v / steps]))
      : null;
    const pairs = Math.min(ours.runs.length, theirs.runs.length);
    const agree = [];
    for (let i = 0; i < pairs; i++) {
      agree.push(agreement(ours.runs[i].decode.pieces, theirs.runs[i].decode.text));
    }
    const tokenCounts = theirs.runs.flatMap((r) => r.prefill.map((p) => p.prompt_n === p.tokens));
    const ratios = oursFig && theirFig ? {
      prefill: lengths.map((n, i) => ({
        tokens: n,
        ours_over_theirs: oursFig.prefill_tok_s[i].tok_s.median / theirFig.prefill_tok_s[i].tok_s.median,
      })),
      decode: oursFig.decode_tok_s.median / theirFig.decode_tok_s.median,
      load: oursFig.load_ms.median / theirFig.load_ms.median,
    } : null;
    if (o.quick) notes.push('--quick: small counts (a smoke run); pass no --quick for 128/512-token prompts and 128 generated tokens');

    const adapterName = ours.info?.adapter || 'unknown-adapter';
    const result = {
      date: new Date().toISOString(),
      kind: 'browser',
      model: o.model,
      model_bytes: statSync(model).size,
      browser: { name: 'chromium', version: browserVersion, executable: CHROMIUM, args: CHROMIUM_ARGS, ...environment },
      settings: {
        prefill: o.prefill, decode: o.decode, runs: o.runs, quick: o.quick, context,
        order: 'alternating: emberlm then wllama in each run; each run loads, measures and frees its engine',
        sampling: 'greedy; end-of-sequence tokens banned (emberlm: logitBias -100, wllama: ignore_eos)',
      },
      prompt: {
        text_source: 'the native bench text, repeated and cut at a word boundary',
        tokens: prompts?.map((p) => p.ids.length) ?? [],
        ids: prompts?.map((p) => p.ids) ?? [],
        texts: prompts?.map((p) => p.text) ?? [],
        wllama_input: 'text (wllama 3.8.1 completion takes no token ids)',
        same_prompt_token_count_in_wllama: tokenCounts.length ? tokenCounts.every(Boolean) : null,
      },
      emberlm: oursFig ? {
        available: true,
        version: ours.version,
        adapter: ours.info.adapter,
        backend: ours.info.backend,
        device_type: ours.info.deviceType,
        features: ours.info.features,
        ...oursFig,
        timing_source: 'engine stats: prefillMs, decodeTokPerS (decode steps after the first token), timeToFirstTokenMs',
        memory: lastOurs.decode.memory,
        graph_nodes: lastOurs.decode.nodes,
        prefill_chunk: lastOurs.decode.prefillChunk,
        batched: ours.batched ?? null,
        kernels_forced: o.kernels,
        kernel_plan: ours.info.kernelPlan,
        profile: ours.profile ?? null,
        counters_decode_run: decodeCounters,
        counters_per_forward_step_decode_run: perStep,
        error_after_some_runs: ours.error,
        runs: ours.runs,
      } : { available: false, reason: ours.error ?? 'not run' },
      wllama: theirFig ? {
        available: true,
        package: '@wllama/wllama@3.8.1',
        libllama: theirs.load.libllama,
        backend: o.wllamaGpuLayers === 0 ? 'cpu (wasm SIMD)' : `webgpu (${o.wllamaGpuLayers} layers offloaded)`,
        threads: theirs.load.threads,
        multithread: theirs.load.multithread,
        n_ctx: theirs.load.context,
        n_batch: theirs.load.batch,
        ...theirFig,
        timing_source: 'llama.cpp server timings: prompt_ms/prompt_n; decode (predicted_n - 1)/predicted_ms; ttft = prompt_ms',
        error_after_some_runs: theirs.error,
        runs: theirs.runs,
      } : { available: false, reason: theirs.error ?? 'not run' },
      ratios_ours_over_theirs: ratios,
      greedy_agreement: {
        tokens_agreeing_per_run: agree,
        of: o.decode,
        all_identical: agree.length ? agree.every((n) => n === o.decode) : null,
        ours_text: lastOurs?.decode.text ?? null,
        wllama_text: theirs.runs.at(-1)?.decode.text ?? null,
      },
      notes,
    };

    // Table.
    const lines = [];
    lines.push(`emberlm browser bench — ${o.model} — Chromium ${browserVersion}, ${environment.hardwareConcurrency} cores`);
    lines.push(`prompts ${o.prefill.join('/')} tokens, decode ${o.decode} greedy, ${o.runs} alternating runs`);
    const row = (label, s, d) => lines.push(`${label.padEnd(46)}${fmt(s, d)}`);
    for (const [name, f, extra] of [
      ['emberlm', oursFig, oursFig ? (ours.info.runsOn === 'cpu'
        ? `CPU backend (WebAssembly ${ours.info.cpuInstructions}, ${ours.info.threads} thread${ours.info.threads === 1 ? '' : 's'})`
        : `${ours.info.adapter} [${ours.info.backend}]`) : ''],
      ['wllama', theirFig, theirFig ? `${result.wllama.backend}, ${theirs.load.threads} threads, llama.cpp ${theirs.load.libllama}` : ''],
    ]) {
      if (!f) {
        lines.push(`${name}: NOT RUN — ${name === 'emberlm' ? result.emberlm.reason : result.wllama.reason}`);
        continue;
      }
      lines.push(`${name} — ${extra}`);
      row('  load (ms)', f.load_ms, 0);
      for (const p of f.prefill_tok_s) row(`  prefill ${p.tokens} tokens (tok/s)`, p.tok_s);
      row(`  decode ${o.decode} tokens (tok/s)`, f.decode_tok_s);
      row(`  time to first token, ${o.prefill[0]}-token prompt (ms)`, f.ttft_ms, 0);
    }
    if (oursFig && lastOurs.decode.memory && ours.info.runsOn !== 'cpu') {
      const m = lastOurs.decode.memory;
      const mib = (b) => (b / 1048576).toFixed(1);
      lines.push(`emberlm GPU memory: weights ${mib(m.weights)} MiB, KV ${mib(m.kvCache)} MiB, activations ${mib(m.activations)} MiB (total ${mib(m.total)} MiB)`);
      lines.push(`emberlm per forward step (decode run, ${steps} steps): ${perStep.dispatches.toFixed(1)} dispatches, ${perStep.submits.toFixed(1)} submits, ${perStep.readbackWaits.toFixed(1)} readbacks (${perStep.readbackBytes.toFixed(0)} B), ${perStep.buffersCreated.toFixed(1)} buffers created`);
    }
    if (oursFig && ours.info.kernelPlan) {
      const plan = ours.info.kernelPlan;
      lines.push('emberlm kernel plan: ' + Object.entries(plan.choices).map(([f, [v, src]]) => {
        const other = plan.timings.filter((t) => t.family === f)
          .map((t) => `${t.variant} ${(t.seconds * 1e3).toFixed(2)} ms`).join(' / ');
        return `${f}=${v} (${src}${other ? `: ${other}` : ''})`;
      }).join(', ') + (plan.measure_seconds ? `; measured in ${plan.measure_seconds.toFixed(2)} s` : ''));
    }
    if (ours.profile) {
      for (const [name, step] of [['decode', ours.profile.decode], ['prefill', ours.profile.prefill]]) {
        lines.push(`emberlm profile, ${name} (${step.n_tokens} tokens at ${step.pos0}): step ${(step.step_seconds * 1e3).toFixed(2)} ms, kernels alone ${(step.kernels_seconds * 1e3).toFixed(2)} ms`);
        for (const r of step.rows) {
          const share = (100 * r.seconds / step.kernels_seconds).toFixed(1);
          lines.push(`  ${r.kernel.padEnd(32)} ${r.shape.padEnd(22)} ${String(r.variant ?? '-').padEnd(9)} x${String(r.count).padEnd(3)} ${(r.seconds * 1e3).toFixed(3).padStart(9)} ms ${share.padStart(5)}%  ${(r.bytes / 1e6).toFixed(2)} MB`);
        }
      }
    }
    for (const r of ours.batched ?? []) {
      const b1 = ours.batched[0].aggregateTokS;
      lines.push(`emberlm batched decode B = ${String(r.batch).padStart(2)}: ${r.stepMs.toFixed(1)} ms/step, ${r.aggregateTokS.toFixed(2)} tok/s aggregate (${(r.aggregateTokS / b1).toFixed(2)}× B = 1)`);
    }
    if (ratios) {
      for (const p of ratios.prefill) lines.push(`ours/theirs prefill ${p.tokens}: ${p.ours_over_theirs.toFixed(3)}`);
      lines.push(`ours/theirs decode: ${ratios.decode.toFixed(3)}`);
      lines.push(`greedy agreement: ${agree.join(', ')} of ${o.decode} tokens per run; same prompt token count in wllama: ${result.prompt.same_prompt_token_count_in_wllama}`);
    }
    for (const n of notes) lines.push(`note: ${n}`);

    const date = new Date();
    const day = `${date.getFullYear()}-${String(date.getMonth() + 1).padStart(2, '0')}-${String(date.getDate()).padStart(2, '0')}`;
    // The CPU runs name the backend and threads, so that the 1- and 2-thread runs keep a file each.
    const what = o.emberBackend === 'cpu'
      ? `cpu-${o.emberThreads}t${o.emberSimd === 'plain' ? '-plain' : ''}` : slug(adapterName);
    const out = o.out ?? freshResultPath('bench/results', `${day}-browser-${what}`);
    mkdirSync(dirname(resolve(out)), { recursive: true });
    writeFileSync(out, `${JSON.stringify(result, null, 2)}\n`);
    lines.push(`JSON: ${out}`);
    console.log(lines.join('\n'));
    if (!oursFig) process.exitCode = 1;
  } finally {
    await cleanup();
  }
}

await main();
