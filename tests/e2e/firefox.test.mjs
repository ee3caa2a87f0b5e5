// The chat page in Firefox (Debian's firefox-esr, headless, through geckodriver): the browser
// suite runs in Chromium, and this smoke test checks that the page works where WebGPU is off or
// partial, as in most Firefox installs. Served cross-origin isolated (as `./build.sh serve`
// does), the page loads SmolLM2 on the CPU backend on the threaded build, one thread per core,
// and a greedy reply equals the native CLI's on the CPU (which the Chromium tests hold equal to
// Chromium's). Served without isolation, it runs on one thread and says why.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { Firefox, FIREFOX } from '../../tools/firefox.mjs';
import { startServer } from '../../tools/serve.mjs';

const MODEL = 'SmolLM2-135M-Instruct.Q4_1.gguf';
const PROMPT = 'What is the capital of France?';
const MAX_TOKENS = 8;
const CLI = 'target/debug/emberlm';

async function nativeReply() {
  const xdg = mkdtempSync(join(tmpdir(), 'emberlm-xdg-'));
  const { stdout } = await promisify(execFile)(CLI, [
    'generate', '--model', `models/${MODEL}`, '--chat', '--prompt', PROMPT,
    '--temperature', '0', '--max-new-tokens', String(MAX_TOKENS), '--json', '--device', 'cpu',
  ], { env: { ...process.env, XDG_RUNTIME_DIR: xdg }, maxBuffer: 1 << 20 });
  return JSON.parse(stdout).sequences[0];
}

function linkModel() {
  assert.ok(existsSync(`models/${MODEL}`), `models/${MODEL} is missing: run ./build.sh setup`);
  mkdirSync('www/models', { recursive: true });
  if (!existsSync(`www/models/${MODEL}`)) symlinkSync(`../../models/${MODEL}`, `www/models/${MODEL}`);
}

/** Waits until the page is ready (or failed, which fails the test with its message). */
async function waitReady(ff, timeout) {
  const state = await ff.waitFor(() => {
    const s = document.getElementById('status')?.dataset.state;
    return s === 'ready' || s === 'error' ? s : null;
  }, { timeout, what: 'the page to be ready' });
  const message = await ff.evaluate(() => `${document.getElementById('status').textContent} ${document.getElementById('error-text')?.textContent ?? ''}`);
  assert.equal(state, 'ready', message);
}

/** The rows of the page's adapter table, by their first cell. */
const adapterRows = (ff) => ff.evaluate(() => Object.fromEntries([...document.querySelectorAll('#adapter tr')]
  .map((tr) => [tr.cells[0].textContent, tr.cells[1].textContent])));

/** Sends PROMPT greedily and returns the reply's text and finish reason. */
async function greedyReply(ff) {
  await ff.fill({ temperature: '0', 'max-tokens': String(MAX_TOKENS), prompt: PROMPT });
  await ff.evaluate(() => document.getElementById('send').click());
  await ff.waitFor(() => document.getElementById('status').dataset.state === 'generating'
    || document.querySelector('#messages .message.assistant:last-child')?.dataset.finish, { timeout: 10_000, what: 'generation to start' });
  await waitReady(ff, 600_000);
  return ff.evaluate(() => {
    const last = document.querySelector('#messages .message.assistant:last-child');
    return { text: last.querySelector('.content').textContent, finish: last.dataset.finish };
  });
}

test('the chat page in Firefox: the CPU backend on threads, greedy reply equal to the CLI on the CPU', async (t) => {
  assert.ok(existsSync(FIREFOX), `${FIREFOX} is missing: run ./build.sh setup`);
  assert.ok(existsSync('www/pkg/emberlm.js'), 'www/pkg is missing: run ./build.sh build');
  assert.ok(existsSync(CLI), `${CLI} is missing: run cargo build --bin emberlm`);
  linkModel();
  const expected = nativeReply();
  expected.catch(() => {});
  const { server, url } = await startServer('www', 0, { isolated: true });
  t.after(() => server.close());
  const plain = await startServer('www');
  t.after(() => plain.server.close());
  const ff = await Firefox.launch();
  t.after(() => ff.close());
  console.log(`Firefox ${ff.capabilities.browserVersion}`);

  let since = performance.now();
  await ff.goto(url);
  await waitReady(ff, 300_000);
  const seconds = () => ((performance.now() - since) / 1000).toFixed(1);
  const rows = await adapterRows(ff);
  console.log(`loaded in ${seconds()} s; runs on: ${rows['Runs on']}`);
  const gpu = await ff.evaluate(async () => (navigator.gpu ? (await navigator.gpu.requestAdapter()) !== null : false));
  const cores = await ff.evaluate(() => Math.min(navigator.hardwareConcurrency, 8));
  assert.equal(await ff.evaluate(() => self.crossOriginIsolated), true, 'served cross-origin isolated');
  if (gpu) {
    console.log('this Firefox offers a WebGPU adapter; the backend is what `auto` chose');
  } else {
    // Firefox validates relaxed SIMD too: the threaded build with the CPU backend's tiles
    assert.match(rows['Runs on'], new RegExp(`^CPU \\(WebAssembly relaxed SIMD, ${cores} threads\\)`));
  }

  since = performance.now();
  const reply = await greedyReply(ff);
  const native = await expected;
  console.log(`reply in ${seconds()} s: ${JSON.stringify(reply.text)} (${reply.finish}); native CLI on the CPU: ${JSON.stringify(native.text)}`);
  if (!gpu) {
    assert.equal(reply.text, native.text, 'Firefox on the CPU replies as the native CLI on the CPU does');
    assert.equal(reply.finish, native.finish_reason);
  }

  // not isolated: one thread, and the page says why
  since = performance.now();
  await ff.goto(`${plain.url}?backend=cpu`);
  await waitReady(ff, 300_000);
  const single = await adapterRows(ff);
  console.log(`without isolation, loaded in ${seconds()} s; runs on: ${single['Runs on']}`);
  assert.match(single['Runs on'], /^CPU \(WebAssembly relaxed SIMD, 1 thread\).*one thread/);
  const again = await greedyReply(ff);
  assert.equal(again.text, reply.text, 'one thread gives the same bits as several');
});
