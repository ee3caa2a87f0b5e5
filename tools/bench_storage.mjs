// Where a page keeps a downloaded model, measured: `Engine.load(url, { cache, storage })` in
// headless Chromium with the store in the Origin Private File System (`storage: 'opfs'`) and
// in the Cache API (`storage: 'cacheApi'`), alternating (opfs, cacheApi, opfs, ...). Each run
// starts from an empty store and loads twice, the first visit (download and store) and the
// second (read from the store), each in a fresh page. For every load: the time, whether it came
// from the store, and the peak resident memory of the largest Chromium process (the renderer
// that holds the page's wasm memory and JavaScript heap), sampled every 50 ms from /proc. Loads
// on the CPU backend (`backend: 'cpu'`, the model in wasm memory), which is where the store's
// extra copy shows: the Cache API path copies the whole file to JavaScript to store it.
//
//   node tools/bench_storage.mjs --model PATH [--runs N] [--out PATH]
//
// Writes bench/results/<YYYY-MM-DD>-browser-storage.json (or --out) and prints a table.
import { mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';
import { CHROMIUM, CHROMIUM_ARGS } from './chromium.mjs';
import { startServer } from './serve.mjs';
import { freshResultPath } from './result_path.mjs';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..');

function usage(message) {
  if (message) console.error(`bench_storage: ${message}`);
  console.error('usage: node tools/bench_storage.mjs --model PATH [--runs N] [--out PATH]');
  process.exit(2);
}

function parseArgs(argv) {
  const o = { model: null, runs: 2, out: null };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const next = () => argv[++i] ?? usage(`${a} needs a value`);
    if (a === '--model') o.model = next();
    else if (a === '--runs') o.runs = Number(next());
    else if (a === '--out') o.out = next();
    else usage(`unknown argument ${a}`);
  }
  if (!o.model) usage('--model is required');
  if (!Number.isInteger(o.runs) || o.runs < 1) usage('--runs needs a whole number >= 1');
  return o;
}

/** Resident bytes of every process below `root` (itself included), by pid. */
function residentBelow(root) {
  const children = new Map();
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const stat = readFileSync(`/proc/${name}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      if (!children.has(ppid)) children.set(ppid, []);
      children.get(ppid).push(Number(name));
    } catch {
      // gone
    }
  }
  const out = new Map();
  const todo = [root];
  while (todo.length) {
    const pid = todo.pop();
    try {
      const status = readFileSync(`/proc/${pid}/status`, 'utf8');
      const kb = Number(/VmRSS:\s+(\d+)/.exec(status)?.[1] ?? 0);
      out.set(pid, kb * 1024);
    } catch {
      // gone
    }
    todo.push(...(children.get(pid) ?? []));
  }
  return out;
}

/** Samples the largest process's resident memory below `root` until `stop()`; the peak. */
function samplePeak(root) {
  let peak = 0;
  const timer = setInterval(() => {
    for (const bytes of residentBelow(root).values()) peak = Math.max(peak, bytes);
  }, 50);
  return () => {
    clearInterval(timer);
    return peak;
  };
}

async function main() {
  const o = parseArgs(process.argv.slice(2));
  const model = resolve(o.model);
  const size = statSync(model).size;
  const { server, url } = await startServer(ROOT, 0);
  const modelUrl = `${url}${relative(ROOT, model)}`;
  const profile = mkdtempSync(join(tmpdir(), 'emberlm-storage-'));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM, headless: true, args: CHROMIUM_ARGS,
  });
  // the browser's own process: the launcher's child named chromium
  const browserPid = (() => {
    const mine = residentBelow(process.pid);
    return Math.min(...[...mine.keys()].filter((p) => p !== process.pid));
  })();
  const loadOnce = async (storage, store) => {
    const page = await context.newPage();
    await page.goto(`${url}www/bench.html`);
    const stop = samplePeak(browserPid);
    const r = await page.evaluate(async ({ modelUrl, storage, store }) => {
      const ember = await import('./pkg/emberlm.js');
      await ember.default();
      const started = performance.now();
      const engine = await ember.Engine.load(modelUrl, {
        cache: store, storage, backend: 'cpu', contextLength: 64,
      });
      const ms = performance.now() - started;
      const info = engine.info();
      engine.free();
      return {
        ms, loadedFromCache: info.loadedFromCache, storedInCache: info.storedInCache,
        storage: info.storage, bytesDownloaded: info.bytesDownloaded, notice: info.storageNotice,
      };
    }, { modelUrl, storage, store });
    const peak = stop();
    await page.close();
    return { ...r, peakRssBytes: peak };
  };
  const rows = [];
  for (let run = 0; run < o.runs; run++) {
    for (const storage of ['opfs', 'cacheApi']) {
      const store = `bench-${storage}-${run}-${Date.now()}`;
      const first = await loadOnce(storage, store);
      const second = await loadOnce(storage, store);
      // empty the store again: the next run starts from nothing
      const page = await context.newPage();
      await page.goto(`${url}www/bench.html`);
      await page.evaluate(async ({ modelUrl, store }) => {
        const ember = await import('./pkg/emberlm.js');
        await ember.default();
        await ember.Engine.deleteStored(modelUrl, store);
      }, { modelUrl, store });
      await page.close();
      for (const [visit, r] of [['first', first], ['second', second]]) {
        rows.push({ run, storage, visit, ...r });
        console.log(`${storage.padEnd(8)} run ${run} ${visit.padEnd(6)} ${(r.ms / 1000).toFixed(1).padStart(6)} s  `
          + `peak ${(r.peakRssBytes / 2 ** 20).toFixed(0).padStart(5)} MiB  `
          + `fromStore ${r.loadedFromCache} stored ${r.storedInCache} downloaded ${r.bytesDownloaded}${r.notice ? ` (${r.notice})` : ''}`);
      }
    }
  }
  await context.close();
  server.close();
  rmSync(profile, { recursive: true, force: true });
  const median = (xs) => {
    const s = [...xs].sort((a, b) => a - b);
    return s[Math.floor((s.length - 1) / 2)];
  };
  const summary = {};
  for (const storage of ['opfs', 'cacheApi']) {
    for (const visit of ['first', 'second']) {
      const these = rows.filter((r) => r.storage === storage && r.visit === visit);
      summary[`${storage}_${visit}`] = {
        median_s: median(these.map((r) => r.ms)) / 1000,
        median_peak_mib: median(these.map((r) => r.peakRssBytes)) / 2 ** 20,
      };
    }
  }
  console.log(JSON.stringify(summary, null, 1));
  const day = new Date().toISOString().slice(0, 10);
  const out = o.out ?? freshResultPath(join(ROOT, 'bench/results'), `${day}-browser-storage`);
  mkdirSync(dirname(out), { recursive: true });
  writeFileSync(out, `${JSON.stringify({
    tool: 'tools/bench_storage.mjs', date: new Date().toISOString(), model: basename(model),
    model_bytes: size, backend: 'cpu', runs: o.runs, browser: { executable: CHROMIUM, args: CHROMIUM_ARGS },
    summary, rows,
  }, null, 1)}\n`);
  console.log(`wrote ${out}`);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
