// The chat page, built by `./build.sh build`, in headless Chromium with WebGPU (SwiftShader on
// machines without a GPU, where SmolLM2 runs at seconds per token: the replies are kept short).
// Timeouts are generous because a shared CI machine can be several times slower than an idle
// one; on an idle 2-core machine the whole test takes about two minutes.
// One browser, in order: the default model loads and is stored in the Cache API; a greedy reply
// streams in and equals the native CLI's; Stop ends a longer reply with finish "abort"; after a
// reload (on the CPU backend) the model comes from the cache, with no download; the stored model is
// listed with its size and deleted from the list. A screenshot goes to
// target/e2e/chat.png. A second browser without WebGPU runs the page on the CPU backend: served
// cross-origin isolated (as `./build.sh serve` does), on the threaded build, one thread per core;
// then (SIMD made to look absent) it says the browser lacks WebAssembly SIMD; then, served
// without isolation, on one thread with a notice saying why.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { chromium } from 'playwright-core';
import { CHROMIUM, CHROMIUM_ARGS } from '../../tools/chromium.mjs';
import { startServer } from '../../tools/serve.mjs';

const MODEL = 'SmolLM2-135M-Instruct.Q4_1.gguf';
const PROMPT = 'What is the capital of France?';
const MAX_TOKENS = 8;
const CLI = 'target/debug/emberlm';

/** The native CLI's greedy reply to PROMPT as a one-message chat (no system message), on the
 * backend `device` names, with `extra` flags. */
async function nativeReply(device = 'gpu', extra = []) {
  const xdg = mkdtempSync(join(tmpdir(), 'emberlm-xdg-'));
  const { stdout } = await promisify(execFile)(CLI, [
    'generate', '--model', `models/${MODEL}`, '--chat', '--prompt', PROMPT,
    '--temperature', '0', '--max-new-tokens', String(MAX_TOKENS), '--json', '--device', device, ...extra,
  ], { env: { ...process.env, XDG_RUNTIME_DIR: xdg }, maxBuffer: 1 << 20 });
  return JSON.parse(stdout).sequences[0];
}

/** www/models/ holds the default model, as `./build.sh serve` arranges. */
function linkModel() {
  assert.ok(existsSync(`models/${MODEL}`), `models/${MODEL} is missing: run ./build.sh setup`);
  mkdirSync('www/models', { recursive: true });
  if (!existsSync(`www/models/${MODEL}`)) symlinkSync(`../../models/${MODEL}`, `www/models/${MODEL}`);
}

const seconds = (since) => ((performance.now() - since) / 1000).toFixed(1);

/** How many files the page's store holds in the Origin Private File System (run in the page). */
const opfsEntries = async (page) => page.evaluate(async () => {
  try {
    const root = await navigator.storage.getDirectory();
    const store = await (await root.getDirectoryHandle('emberlm')).getDirectoryHandle('emberlm-models-v1');
    let n = 0;
    for await (const [, handle] of store.entries()) n += handle.kind === 'directory' ? 1 : 0;
    return n;
  } catch {
    return 0;
  }
});

test('chat page: load, greedy reply equal to the CLI, stop, reload from the cache', async (t) => {
  assert.ok(existsSync('www/pkg/emberlm.js'), 'www/pkg is missing: run ./build.sh build');
  assert.ok(existsSync(CLI), `${CLI} is missing: run cargo build --bin emberlm`);
  linkModel();
  const expected = nativeReply();
  expected.catch(() => {}); // awaited below; keeps an early failure from going unhandled

  const { server, url } = await startServer('www');
  t.after(() => server.close());
  // Counted at the server: the worker's fetches are what matter.
  const modelRequests = [];
  server.on('request', (req) => { if (req.url.endsWith('.gguf')) modelRequests.push(req.url); });
  const browser = await chromium.launchPersistentContext(mkdtempSync(join(tmpdir(), 'emberlm-e2e-')), {
    executablePath: CHROMIUM,
    headless: true,
    args: CHROMIUM_ARGS,
    viewport: { width: 1200, height: 900 },
  });
  t.after(() => browser.close());
  const page = await browser.newPage();
  const problems = [];
  page.on('console', (m) => { if (m.type() === 'error') problems.push(m.text()); });
  page.on('pageerror', (e) => problems.push(String(e)));
  const status = () => page.textContent('#status');
  const waitState = async (state, timeout) => {
    await page.waitForSelector(`#status[data-state="${state}"]`, { timeout });
  };
  const waitLoaded = async () => {
    await page.waitForSelector('#status[data-state="ready"], #status[data-state="error"]', { timeout: 300_000 });
    const state = await page.getAttribute('#status', 'data-state');
    assert.equal(state, 'ready', `${await status()} ${await page.textContent('#error-text')}`);
  };

  let since = performance.now();
  // the adapter (SwiftShader here): `auto` would time it against the CPU backend
  await page.goto(`${url}?backend=webgpu`);
  await waitLoaded();
  console.log(`loaded from the network in ${seconds(since)} s: ${await status()}`);
  assert.equal(await page.getAttribute('#cache-note', 'data-cached'), 'false', 'stored in the cache');
  assert.ok(modelRequests.length > 0, 'the first load downloads the model');
  // the stored model is listed with its size (client.listStored)
  await page.waitForSelector('#stored-list li', { state: 'attached' });
  assert.match(await page.textContent('#stored-list'), /SmolLM2-135M-Instruct\.Q4_1\.gguf\s+\d+\.\d MB/);
  // kept in the private file system, written as it downloaded
  assert.equal(await opfsEntries(page), 1, 'the model is in the private file system');
  const rows = Object.fromEntries(await page.$$eval('#adapter tr', (trs) =>
    trs.map((tr) => [tr.cells[0].textContent, tr.cells[1].textContent])));
  console.log(`adapter: ${rows.Adapter} | backend: ${rows.Backend}`);
  assert.match(rows.Backend, /^webgpu/);

  // A preset fills temperature, top-k and top-p with the engine's own values (info.presets).
  // (The menu is in the closed "Advanced sampling" panel: chosen as a script would.)
  const choose = (name) => page.evaluate((value) => {
    const menu = document.getElementById('preset');
    menu.value = value;
    menu.dispatchEvent(new Event('change'));
    return ['temperature', 'top-k', 'top-p'].map((id) => document.getElementById(id).value);
  }, name);
  assert.deepEqual(await choose('creative'), ['1.3', '100', '0.95']);
  await choose('balanced');

  // A greedy reply, streamed: record every state of the reply's text as it grows.
  await page.fill('#temperature', '0');
  await page.fill('#max-tokens', String(MAX_TOKENS));
  await page.evaluate(() => {
    window.snapshots = [];
    new MutationObserver(() => {
      const last = document.querySelector('#messages .message.assistant:last-child .content');
      if (last && last.textContent !== window.snapshots.at(-1)) window.snapshots.push(last.textContent);
    }).observe(document.getElementById('messages'), { subtree: true, childList: true, characterData: true });
  });
  since = performance.now();
  await page.fill('#prompt', PROMPT);
  await page.click('#send');
  await waitState('generating', 10_000);
  await waitState('ready', 900_000);
  const reply = await page.textContent('#messages .message.assistant:last-child .content');
  const finish = await page.getAttribute('#messages .message.assistant:last-child', 'data-finish');
  const snapshots = await page.evaluate(() => window.snapshots);
  const stats = await page.textContent('#stats');
  console.log(`reply in ${seconds(since)} s: ${JSON.stringify(reply)} (${finish}); ${stats.replace(/\s+/g, ' ')}`);
  const native = await expected;
  console.log(`native CLI: ${JSON.stringify(native.text)} (${native.finish_reason})`);
  assert.equal(reply, native.text, 'the page replies as the native CLI does');
  assert.equal(finish, native.finish_reason);
  assert.ok(snapshots.length >= 2, `the reply streamed in pieces: ${JSON.stringify(snapshots)}`);
  assert.match(await page.textContent('#tps'), /tok\/s/);

  // Stop during a longer reply, speculating (prompt lookup): the stats report the drafts.
  await page.click('details:has(#advanced) > summary');
  await page.selectOption('#speculative', 'lookup');
  await page.fill('#max-tokens', '200');
  since = performance.now();
  await page.fill('#prompt', 'Tell me a long story about a dragon.');
  await page.click('#send');
  await page.waitForFunction(() => {
    const last = document.querySelector('#messages .message.assistant:last-child .content');
    return last && last.textContent.length > 0;
  }, null, { timeout: 600_000 });
  await page.click('#stop');
  await waitState('ready', 300_000);
  const stopped = await page.getAttribute('#messages .message.assistant:last-child', 'data-finish');
  const tokens = Number(await page.getAttribute('#messages .message.assistant:last-child', 'data-tokens'));
  console.log(`stopped after ${tokens} tokens, ${seconds(since)} s`);
  assert.equal(stopped, 'abort');
  assert.ok(tokens < 200, `${tokens} tokens`);
  assert.match(await page.textContent('#spec'), /drafts accepted/);

  mkdirSync('target/e2e', { recursive: true });
  await page.screenshot({ path: 'target/e2e/chat.png', fullPage: true });

  // A reload reads the model from the Cache API. It reloads on the CPU backend: the cache does
  // not depend on the backend, and on WebGPU the load compiles every pipeline again (42 s of
  // SwiftShader here; the first load above covers that path).
  modelRequests.length = 0;
  since = performance.now();
  await page.goto(`${url}?backend=cpu`);
  await waitLoaded();
  console.log(`reloaded in ${seconds(since)} s: ${await page.textContent('#cache-note')}`);
  assert.equal(await page.getAttribute('#cache-note', 'data-cached'), 'true');
  assert.match(await page.textContent('#cache-note'), /loaded from cache/i);
  assert.deepEqual(modelRequests, [], 'no download after the reload');
  // Delete empties the list (client.deleteStored), and the Cache API no longer holds the model
  await page.click('#stored-box > summary');
  await page.click('#stored-list li button');
  await page.waitForFunction(() => !document.getElementById('stored-empty').hidden);
  assert.equal(await page.$$eval('#stored-list li', (items) => items.length), 0);
  assert.equal(await page.evaluate(async () => (await (await caches.open('emberlm-models-v1')).keys()).length), 0);
  assert.equal(await opfsEntries(page), 0, 'the private file system no longer holds it');
  assert.deepEqual(problems, [], 'no console errors');
});

test('chat page without WebGPU: the CPU backend loads the model, greedy reply equal to the CLI on the CPU', async (t) => {
  assert.ok(existsSync('www/pkg/emberlm.js'), 'www/pkg is missing: run ./build.sh build');
  assert.ok(existsSync(CLI), `${CLI} is missing: run cargo build --bin emberlm`);
  linkModel();
  const expected = nativeReply('cpu');
  expected.catch(() => {});
  // Isolated, as `./build.sh serve` serves it (threads); the plain server for the page without
  const { server, url } = await startServer('www', 0, { isolated: true });
  t.after(() => server.close());
  const plain = await startServer('www');
  t.after(() => plain.server.close());
  const browser = await chromium.launchPersistentContext(mkdtempSync(join(tmpdir(), 'emberlm-e2e-')), {
    executablePath: CHROMIUM,
    headless: true,
    args: [...CHROMIUM_ARGS.filter((a) => a !== '--enable-unsafe-webgpu'), '--disable-features=WebGPU'],
  });
  t.after(() => browser.close());
  const page = await browser.newPage();
  const problems = [];
  page.on('pageerror', (e) => problems.push(String(e)));
  let since = performance.now();
  await page.goto(url);
  assert.equal(await page.evaluate(() => 'gpu' in navigator && navigator.gpu !== undefined
    ? navigator.gpu.requestAdapter().then((a) => a !== null) : false), false, 'WebGPU is off');
  await page.waitForSelector('#status[data-state="ready"], #status[data-state="error"]', { timeout: 300_000 });
  assert.equal(await page.getAttribute('#status', 'data-state'), 'ready',
    `${await page.textContent('#status')} ${await page.textContent('#error-text')}`);
  console.log(`loaded on the CPU in ${seconds(since)} s`);
  const rows = Object.fromEntries(await page.$$eval('#adapter tr', (trs) =>
    trs.map((tr) => [tr.cells[0].textContent, tr.cells[1].textContent])));
  console.log(`runs on: ${rows['Runs on']}`);
  // Chromium has WebAssembly SIMD and relaxed SIMD, and the page is cross-origin isolated: the
  // worker loaded the threaded build with relaxed SIMD (the CPU backend's tiles) and started
  // one thread per core (at most 8); the reply below is still the CLI's, bit for bit
  const cores = await page.evaluate(() => Math.min(navigator.hardwareConcurrency, 8));
  assert.ok(cores >= 2, 'the machine has at least two cores');
  assert.match(rows['Runs on'], new RegExp(`^CPU \\(WebAssembly relaxed SIMD, ${cores} threads\\): no usable WebGPU`));
  assert.doesNotMatch(rows['Runs on'], /one thread:/);

  await page.fill('#temperature', '0');
  await page.fill('#max-tokens', String(MAX_TOKENS));
  since = performance.now();
  await page.fill('#prompt', PROMPT);
  await page.click('#send');
  await page.waitForSelector('#status[data-state="generating"]', { timeout: 10_000 });
  await page.waitForSelector('#status[data-state="ready"]', { timeout: 600_000 });
  const reply = await page.textContent('#messages .message.assistant:last-child .content');
  const finish = await page.getAttribute('#messages .message.assistant:last-child', 'data-finish');
  console.log(`reply on the CPU in ${seconds(since)} s: ${JSON.stringify(reply)} (${finish})`);
  const native = await expected;
  console.log(`native CLI on the CPU: ${JSON.stringify(native.text)} (${native.finish_reason})`);
  assert.equal(reply, native.text, 'the page on the CPU replies as the native CLI on the CPU does');
  assert.equal(finish, native.finish_reason);

  // A draft model picked on the page (SmolLM2 drafting for itself: every draft stands) speeds
  // up the same greedy reply in a new chat
  await page.click('details:has(#advanced) > summary');
  await page.setInputFiles('#draft-file', `models/${MODEL}`);
  await page.waitForSelector('#draft-name[data-loaded="true"]', { timeout: 120_000 });
  assert.equal(await page.inputValue('#speculative'), 'draft');
  await page.click('#reset');
  await page.fill('#prompt', PROMPT);
  await page.click('#send');
  await page.waitForSelector('#status[data-state="generating"]', { timeout: 10_000 });
  await page.waitForSelector('#status[data-state="ready"]', { timeout: 600_000 });
  const drafted = await page.textContent('#messages .message.assistant:last-child .content');
  const spec = await page.textContent('#spec');
  console.log(`with the draft model: ${JSON.stringify(drafted)}; ${spec}`);
  assert.equal(drafted, native.text, 'speculative decoding replies as plain greedy decoding does');
  assert.match(spec, /drafts accepted \(100%\)/);
  await page.selectOption('#speculative', '');

  // JSON output with a schema: the reply is shown parsed, and it satisfies the schema
  await page.click('summary:has-text("Structured output")');
  await page.check('#json-output');
  await page.fill('#json-schema', JSON.stringify({
    type: 'object',
    properties: { city: { type: 'string', maxLength: 20 }, rainy: { type: 'boolean' } },
    required: ['city', 'rainy'],
    additionalProperties: false,
  }));
  await page.fill('#max-tokens', '60');
  since = performance.now();
  await page.fill('#prompt', 'Name a city and say whether it is rainy.');
  await page.click('#send');
  await page.waitForSelector('#status[data-state="generating"]', { timeout: 10_000 });
  await page.waitForSelector('#status[data-state="ready"]', { timeout: 600_000 });
  const parsed = await page.$('#messages .message.assistant:last-child pre.parsed');
  assert.ok(parsed, 'the reply is shown parsed');
  assert.equal(await parsed.getAttribute('data-valid'), 'true', await parsed.textContent());
  const value = JSON.parse(await parsed.textContent());
  console.log(`JSON reply on the CPU in ${seconds(since)} s: ${JSON.stringify(value)}`);
  assert.deepEqual(Object.keys(value).sort(), ['city', 'rainy']);
  assert.equal(typeof value.city, 'string');
  assert.equal(typeof value.rainy, 'boolean');

  // The conversation is kept across a reload: the messages come back, and the next reply reuses
  // the restored KV cache (saveConversation / restoreConversation through the private file
  // system) instead of reading the conversation again
  const shown = await page.$$eval('#messages .message', (m) => m.map((e) => e.className));
  await page.waitForSelector(`#messages[data-kept="${shown.length}"]`, { timeout: 60_000 });
  await page.reload();
  await page.waitForSelector('#status[data-state="ready"], #status[data-state="error"]', { timeout: 300_000 });
  assert.equal(await page.getAttribute('#status', 'data-state'), 'ready', await page.textContent('#error-text'));
  assert.deepEqual(await page.$$eval('#messages .message', (m) => m.map((e) => e.className)), shown,
    'the messages are back after the reload');
  await page.fill('#temperature', '0');
  await page.fill('#max-tokens', '4');
  await page.fill('#prompt', 'And tomorrow?');
  await page.click('#send');
  await page.waitForSelector('#status[data-state="generating"]', { timeout: 10_000 });
  await page.waitForSelector('#status[data-state="ready"]', { timeout: 600_000 });
  const cachedAfterReload = Number((await page.textContent('#cached')).split(' ')[0]);
  console.log(`after the reload: ${shown.length} messages back, ${cachedAfterReload} tokens reused`);
  assert.ok(cachedAfterReload > 20, `the restored conversation was reused: ${cachedAfterReload} tokens`);

  // A browser without WebAssembly SIMD (simulated: the worker's feature test is made to fail)
  // cannot run the module: the page says so, naming the missing feature, instead of loading
  const noSimd = await browser.newPage();
  noSimd.on('pageerror', (e) => problems.push(String(e)));
  await noSimd.route('**/worker.js', async (route) => {
    const response = await route.fetch();
    const body = `WebAssembly.validate = () => false;\n${await response.text()}`;
    await route.fulfill({ response, body });
  });
  await noSimd.goto(url);
  await noSimd.waitForSelector('#status[data-state="ready"], #status[data-state="error"]', { timeout: 300_000 });
  assert.equal(await noSimd.getAttribute('#status', 'data-state'), 'error', 'a browser without SIMD loaded the model');
  const noSimdError = await noSimd.textContent('#error-text');
  console.log(`without SIMD: ${noSimdError}`);
  assert.match(noSimdError, /no WebAssembly SIMD \(fixed-width, 128-bit\), which emberlm needs/);
  await noSimd.close();

  // A browser with no WebGPU API at all (Firefox or Safari where it is off: no navigator.gpu in
  // the page or in the worker) loads the model on the CPU too; served without cross-origin
  // isolation, the page runs it on one thread (the single-threaded relaxed-SIMD build) and says
  // why
  const bare = await browser.newPage();
  bare.on('pageerror', (e) => problems.push(String(e)));
  await bare.addInitScript(() => { delete Navigator.prototype.gpu; });
  await bare.route('**/worker.js', async (route) => {
    const response = await route.fetch();
    await route.fulfill({ response, body: `delete WorkerNavigator.prototype.gpu;\n${await response.text()}` });
  });
  await bare.goto(plain.url);
  assert.equal(await bare.evaluate(() => 'gpu' in navigator), false);
  assert.equal(await bare.evaluate(() => self.crossOriginIsolated), false);
  await bare.waitForSelector('#status[data-state="ready"], #status[data-state="error"]', { timeout: 300_000 });
  assert.equal(await bare.getAttribute('#status', 'data-state'), 'ready', await bare.textContent('#error-text'));
  const bareRows = Object.fromEntries(await bare.$$eval('#adapter tr', (trs) =>
    trs.map((tr) => [tr.cells[0].textContent, tr.cells[1].textContent])));
  console.log(`no WebGPU API: ${bareRows['Runs on']}`);
  // (relaxed SIMD on one thread too: the single-threaded build with the CPU backend's tiles)
  assert.match(bareRows['Runs on'], /^CPU \(WebAssembly relaxed SIMD, 1 thread\): no usable WebGPU.*; one thread: the page is not cross-origin isolated/);

  // A chat template picked on the page (Gemma 3's, as its GGUF has none) replaces the model's
  // own: the reply is the native CLI's with --chat-template
  const template = 'tests/fixtures/templates/gemma3.jinja';
  const expectedTemplated = nativeReply('cpu', ['--chat-template', template]);
  expectedTemplated.catch(() => {});
  const templ = await browser.newPage();
  templ.on('pageerror', (e) => problems.push(String(e)));
  await templ.goto(url);
  await templ.waitForSelector('#status[data-state="ready"], #status[data-state="error"]', { timeout: 300_000 });
  await templ.setInputFiles('#chat-template', template);
  await templ.click('#load');
  await templ.waitForFunction(() => document.querySelector('#model-info')?.textContent.includes('(picked)'),
    null, { timeout: 300_000 });
  await templ.waitForSelector('#status[data-state="ready"]', { timeout: 300_000 });
  await templ.fill('#temperature', '0');
  await templ.fill('#max-tokens', String(MAX_TOKENS));
  await templ.fill('#prompt', PROMPT);
  await templ.click('#send');
  await templ.waitForSelector('#status[data-state="generating"]', { timeout: 10_000 });
  await templ.waitForSelector('#status[data-state="ready"]', { timeout: 600_000 });
  const templated = await templ.textContent('#messages .message.assistant:last-child .content');
  const nativeTemplated = await expectedTemplated;
  console.log(`with gemma3.jinja: ${JSON.stringify(templated)}; native CLI: ${JSON.stringify(nativeTemplated.text)}`);
  assert.equal(templated, nativeTemplated.text);
  assert.notEqual(nativeTemplated.text, native.text, 'the template changed the prompt');
  assert.deepEqual(problems, [], 'no page errors');
});
