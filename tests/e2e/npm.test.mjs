// The npm package built by `./build.sh dist` (dist/npm/, packed to dist/emberlm-VERSION.tgz):
// the tarball holds only the package files; installed into a scratch project, its entry points
// import in Node with the expected names and its types check with tsc; the Vite example builds
// with the worker and the wasm emitted, and the built example runs in Firefox (Debian's
// firefox-esr, where the engine's worker runs the CPU backend): a model picked in its file input
// loads, and a reply streams in.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { copyFileSync, existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { promisify } from 'node:util';
import { Firefox, FIREFOX } from '../../tools/firefox.mjs';
import { startServer } from '../../tools/serve.mjs';

const run = promisify(execFile);
const ROOT = resolve('.');
const VERSION = /^\[package\][^[]*?^version\s*=\s*"([^"]+)"/ms.exec(readFileSync('Cargo.toml', 'utf8'))[1];
const TARBALL = resolve(`dist/emberlm-${VERSION}.tgz`);
const PACKAGE_FILES = [
  'README.md', 'client.d.ts', 'client.js', 'emberlm.d.ts', 'emberlm.js', 'emberlm_bg.wasm',
  'openai.d.ts', 'openai.js', 'package.json', 'simd.js', 'token_stream.js', 'worker.d.ts', 'worker.js',
];
const npm = (args, cwd) => run('npm', [...args, '--no-audit', '--no-fund', '--loglevel=error'], { cwd, maxBuffer: 1 << 24 });

test('npm pack lists only the package files', async () => {
  assert.ok(existsSync('dist/npm/package.json'), 'dist/npm is missing: run ./build.sh dist');
  const { stdout } = await npm(['pack', '--dry-run', '--json'], 'dist/npm');
  const [pack] = JSON.parse(stdout);
  assert.equal(pack.name, 'emberlm');
  assert.equal(pack.version, VERSION);
  assert.deepEqual(pack.files.map((f) => f.path).sort(), PACKAGE_FILES);
  const manifest = JSON.parse(readFileSync('dist/npm/package.json', 'utf8'));
  assert.equal(manifest.license, 'Apache-2.0');
  assert.equal(manifest.type, 'module');
  console.log(`${pack.filename}: ${pack.size} bytes packed, ${pack.unpackedSize} unpacked`);
});

test('the tarball installs; entry points import in Node; tsc accepts the usage file', async (t) => {
  assert.ok(existsSync(TARBALL), `${TARBALL} is missing: run ./build.sh dist`);
  const dir = mkdtempSync(join(tmpdir(), 'emberlm-npm-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  writeFileSync(join(dir, 'package.json'), JSON.stringify({ private: true, type: 'module' }));
  await npm(['install', '--offline', TARBALL], dir);

  const check = `
    import { readFileSync } from 'node:fs';
    import init, { Engine, version, initSync, gpuInfo } from 'emberlm';
    import { EngineClient } from 'emberlm/client';
    import { openaiFetch } from 'emberlm/openai';
    // The fetch answers from any engine-shaped object: here one that echoes the request.
    const fake = { create: async (r) => ({ object: 'chat.completion', echoed: r.messages[0].content }) };
    const fetch = openaiFetch({ chat: { completions: fake }, completions: fake }, { model: 'm' });
    const models = await (await fetch('https://x.local/v1/models')).json();
    const reply = await fetch('https://x.local/v1/chat/completions', {
      method: 'POST', body: JSON.stringify({ messages: [{ role: 'user', content: 'hi' }] }),
    });
    const missing = await fetch('https://x.local/v1/embeddings', { method: 'POST', body: '{}' });
    const out = {
      openai: [models.data[0].id, (await reply.json()).echoed, missing.status],
      init: typeof init, Engine: typeof Engine, load: typeof Engine.load, version: typeof version,
      gpuInfo: typeof gpuInfo, EngineClient: typeof EngineClient,
      methods: ['load', 'generate', 'stream', 'abort', 'reset', 'info', 'free', 'version', 'terminate']
        .filter((m) => typeof EngineClient.prototype[m] !== 'function'),
    };
    // The wasm instantiates in Node too (no GPU is touched): version() is the crate's.
    const wasm = readFileSync(new URL(import.meta.resolve('emberlm/emberlm_bg.wasm')));
    initSync({ module: wasm });
    out.crateVersion = version();
    console.log(JSON.stringify(out));
  `;
  writeFileSync(join(dir, 'check.mjs'), check);
  const { stdout } = await run(process.execPath, ['check.mjs'], { cwd: dir });
  assert.deepEqual(JSON.parse(stdout), {
    init: 'function', Engine: 'function', load: 'function', version: 'function',
    gpuInfo: 'function', EngineClient: 'function', methods: [], crateVersion: VERSION,
    openai: ['m', 'hi', 404],
  });

  copyFileSync('tests/e2e/npm-usage.ts', join(dir, 'usage.ts'));
  writeFileSync(join(dir, 'tsconfig.json'), JSON.stringify({
    compilerOptions: {
      target: 'es2022', module: 'nodenext', moduleResolution: 'nodenext', strict: true,
      lib: ['es2022', 'esnext.disposable', 'dom', 'dom.iterable'], types: [], noEmit: true, skipLibCheck: false,
    },
    files: ['usage.ts'],
  }));
  try {
    await run(join(ROOT, 'node_modules/.bin/tsc'), ['--noEmit', '-p', 'tsconfig.json'], { cwd: dir });
  } catch (e) {
    assert.fail(`tsc found errors:\n${e.stdout}${e.stderr}`);
  }
});

test('the Vite example builds with the worker and the wasm emitted', async () => {
  const dir = 'examples/vite';
  const manifest = JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8'));
  assert.equal(manifest.dependencies.emberlm, `file:../../dist/emberlm-${VERSION}.tgz`);
  // A fresh copy of the tarball each time: npm keeps an installed file: tarball otherwise.
  rmSync(join(dir, 'node_modules/emberlm'), { recursive: true, force: true });
  await npm(['install', '--no-package-lock'], dir);
  rmSync(join(dir, 'dist'), { recursive: true, force: true });
  await run(join(ROOT, dir, 'node_modules/.bin/vite'), ['build', '--logLevel', 'warn'], { cwd: dir });
  const assets = readdirSync(join(dir, 'dist/assets'));
  console.log(`vite output: ${assets.join(', ')}`);
  assert.ok(existsSync(join(dir, 'dist/index.html')), 'index.html');
  assert.ok(assets.some((f) => f.endsWith('.wasm')), 'a .wasm asset');
  const worker = assets.find((f) => /^worker.*\.js$/.test(f));
  assert.ok(worker, 'the worker chunk');
  assert.match(readFileSync(join(dir, 'dist/assets', worker), 'utf8'), /\.wasm/, 'the worker refers to the wasm');
});

test('the built Vite example runs in Firefox: a picked model loads in the worker and a reply streams', async (t) => {
  const dist = 'examples/vite/dist';
  const model = resolve('models/SmolLM2-135M-Instruct.Q4_1.gguf');
  assert.ok(existsSync(join(dist, 'index.html')), `${dist} is missing: the Vite build test above makes it`);
  assert.ok(existsSync(model), `${model} is missing: run ./build.sh setup`);
  assert.ok(existsSync(FIREFOX), `${FIREFOX} is missing: run ./build.sh setup`);
  const { server, url } = await startServer(dist);
  t.after(() => server.close());
  const ff = await Firefox.launch();
  t.after(() => ff.close());
  const text = (id) => ff.evaluate((i) => document.getElementById(i).textContent, id);
  await ff.goto(url);
  await ff.setInputFile('#model', model);
  // the status names the model and where it runs once loaded, or the error
  const loaded = await ff.waitFor(() => {
    const status = document.getElementById('status').textContent;
    return !document.getElementById('send').disabled || status.startsWith('Error') ? status : null;
  }, { timeout: 180_000, what: 'the model to load' })
    .catch(async (e) => assert.fail(`${e.message}; status: ${await text('status')}`));
  assert.match(loaded, /^SmolLM2-135M-Instruct\.Q4_1\.gguf on CPU \(WebAssembly/, 'loaded on the CPU backend in the worker');
  await ff.evaluate(() => document.getElementById('send').click());
  const done = await ff.waitFor(() => {
    const status = document.getElementById('status').textContent;
    return /tok\/s$/.test(status) || status.startsWith('Error') ? status : null;
  }, { timeout: 300_000, what: 'the reply to finish' }).catch(async (e) => assert.fail(`${e.message}; status: ${await text('status')}`));
  const streamed = await text('output');
  console.log(`Firefox ${ff.capabilities.browserVersion}, the Vite example: ${loaded}; ${done}; ${JSON.stringify(streamed.slice(0, 80))}`);
  assert.match(done, /^(stop|length), \d+(\.\d)? tok\/s$/);
  assert.ok(streamed.trim().length > 0, 'the reply streamed into the page');
});
