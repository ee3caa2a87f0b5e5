// The single-file demo, built by `./build.sh dist`, opened from file:// in headless Chromium with
// WebGPU: a model picked with the file input loads, a greedy reply streams in and equals the
// native CLI's, and nothing is requested from the network. Then the same demo in Firefox ESR
// (through geckodriver), on the CPU backend: the reply equals the native CLI's on the CPU.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { promisify } from 'node:util';
import { chromium } from 'playwright-core';
import { CHROMIUM, CHROMIUM_ARGS } from '../../tools/chromium.mjs';
import { Firefox, FIREFOX } from '../../tools/firefox.mjs';

const DEMO = 'dist/emberlm-demo.html';
const MODEL = 'tests/fixtures/tiny-llama-q4_1.gguf';
const PROMPT = 'Permission is hereby granted';
const MAX_TOKENS = 16;
const CLI = process.env.EMBERLM_CLI ?? 'target/debug/emberlm';

/** The native CLI's greedy reply to PROMPT as a one-message chat, as the page sends it, on the
 * backend `device` names. */
async function nativeReply(device = 'gpu') {
  const xdg = mkdtempSync(join(tmpdir(), 'emberlm-xdg-'));
  const { stdout } = await promisify(execFile)(CLI, [
    'generate', '--model', MODEL, '--chat', '--prompt', PROMPT,
    '--temperature', '0', '--max-new-tokens', String(MAX_TOKENS), '--json', '--device', device,
  ], { env: { ...process.env, XDG_RUNTIME_DIR: xdg }, maxBuffer: 1 << 20 });
  return JSON.parse(stdout).sequences[0];
}

test('single-file demo from file://: pick a model, greedy reply equal to the CLI, no network', async (t) => {
  assert.ok(existsSync(DEMO), `${DEMO} is missing: run ./build.sh dist`);
  assert.ok(existsSync(CLI), `${CLI} is missing: run cargo build --bin emberlm`);
  const expected = nativeReply();
  expected.catch(() => {}); // awaited below

  const browser = await chromium.launchPersistentContext(mkdtempSync(join(tmpdir(), 'emberlm-e2e-')), {
    executablePath: CHROMIUM,
    headless: true,
    args: CHROMIUM_ARGS,
  });
  t.after(() => browser.close());
  // Every request of the context, the worker's included.
  const requests = [];
  browser.on('request', (r) => requests.push(r.url()));
  const page = await browser.newPage();
  const problems = [];
  page.on('console', (m) => { if (m.type() === 'error') problems.push(m.text()); });
  page.on('pageerror', (e) => problems.push(String(e)));
  page.on('request', (r) => requests.push(r.url()));

  const status = () => page.textContent('#status');
  const since = performance.now();
  // the adapter (SwiftShader here), as the CLI above: `auto` would time it against the CPU
  await page.goto(`${pathToFileURL(resolve(DEMO)).href}?backend=webgpu`);
  await page.waitForSelector('#status[data-state="idle"], #status[data-state="error"]', { timeout: 60_000 });
  assert.equal(await page.getAttribute('#status', 'data-state'), 'idle', await status());
  assert.ok(await page.isVisible('#offline-note'), 'the offline explanation shows');
  assert.ok(!(await page.isVisible('#model-url')), 'no URL field offline');

  await page.fill('#context', '128'); // the tiny model's whole context
  await page.setInputFiles('#model-file', MODEL);
  await page.waitForSelector('#status[data-state="ready"], #status[data-state="error"]', { timeout: 120_000 });
  assert.equal(await page.getAttribute('#status', 'data-state'), 'ready',
    `${await status()} ${await page.textContent('#error-text')}`);
  console.log(`loaded in ${((performance.now() - since) / 1000).toFixed(1)} s: ${await status()}`);

  await page.fill('#temperature', '0');
  await page.fill('#max-tokens', String(MAX_TOKENS));
  await page.evaluate(() => {
    window.snapshots = [];
    new MutationObserver(() => {
      const last = document.querySelector('#messages .message.assistant:last-child .content');
      if (last && last.textContent !== window.snapshots.at(-1)) window.snapshots.push(last.textContent);
    }).observe(document.getElementById('messages'), { subtree: true, childList: true, characterData: true });
  });
  await page.fill('#prompt', PROMPT);
  await page.click('#send');
  await page.waitForSelector('#messages .message.assistant[data-state="done"], #error:not([hidden])', { timeout: 120_000 });
  const reply = await page.textContent('#messages .message.assistant:last-child .content');
  const finish = await page.getAttribute('#messages .message.assistant:last-child', 'data-finish');
  const snapshots = await page.evaluate(() => window.snapshots);
  const native = await expected;
  console.log(`page: ${JSON.stringify(reply)} (${finish}); native CLI: ${JSON.stringify(native.text)}`);
  assert.equal(reply, native.text, 'the page replies as the native CLI does');
  assert.equal(finish, native.finish_reason);
  assert.ok(snapshots.length >= 2, `the reply streamed in pieces: ${JSON.stringify(snapshots)}`);

  // Dropping a .gguf on the page loads it too (the same file, sent as bytes through a drop).
  const bytes = readFileSync(MODEL).toString('base64');
  await page.evaluate((b64) => {
    const data = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
    const dataTransfer = new DataTransfer();
    dataTransfer.items.add(new File([data], 'dropped.gguf'));
    document.body.dispatchEvent(new DragEvent('drop', { dataTransfer, bubbles: true, cancelable: true }));
  }, bytes);
  await page.waitForSelector('#status[data-state="ready"]:has-text("dropped.gguf"), #status[data-state="error"]', { timeout: 120_000 });
  assert.match(await status(), /Ready: dropped\.gguf/, await page.textContent('#error-text'));

  const remote = requests.filter((url) => !/^(file|blob|data):/.test(url));
  assert.deepEqual(remote, [], 'no request left the page');
  assert.deepEqual(problems, [], 'no console errors');
});

test('single-file demo from file:// in Firefox: the CPU backend, greedy reply equal to the CLI on the CPU', async (t) => {
  assert.ok(existsSync(DEMO), `${DEMO} is missing: run ./build.sh dist`);
  assert.ok(existsSync(FIREFOX), `${FIREFOX} is missing: run ./build.sh setup`);
  const expected = nativeReply('cpu');
  expected.catch(() => {});
  const ff = await Firefox.launch();
  t.after(() => ff.close());
  const state = (wanted) => ff.waitFor((w) => {
    const s = document.getElementById('status').dataset.state;
    return w.includes(s) || s === 'error' ? s : null;
  }, { timeout: 120_000, what: `the demo to be ${wanted.join(' or ')}` }, wanted);
  const failure = () => ff.evaluate(() => `${document.getElementById('status').textContent} ${document.getElementById('error-text').textContent}`);
  await ff.goto(pathToFileURL(resolve(DEMO)).href);
  assert.equal(await state(['idle']), 'idle', await failure());
  await ff.fill({ context: '128' }); // the tiny model's whole context
  await ff.setInputFile('#model-file', resolve(MODEL));
  assert.equal(await state(['ready']), 'ready', await failure());
  await ff.fill({ temperature: '0', 'max-tokens': String(MAX_TOKENS), prompt: PROMPT });
  await ff.evaluate(() => document.getElementById('send').click());
  await ff.waitFor(() => document.querySelector('#messages .message.assistant[data-state="done"]')
    || !document.getElementById('error').hidden, { timeout: 120_000, what: 'the reply' });
  const reply = await ff.evaluate(() => {
    const last = document.querySelector('#messages .message.assistant:last-child');
    return { text: last.querySelector('.content').textContent, finish: last.dataset.finish };
  });
  const native = await expected;
  console.log(`Firefox ${ff.capabilities.browserVersion}: ${JSON.stringify(reply.text)} (${reply.finish}); native CLI on the CPU: ${JSON.stringify(native.text)}`);
  assert.equal(reply.text, native.text, 'the demo in Firefox replies as the native CLI on the CPU does');
  assert.equal(reply.finish, native.finish_reason);
});
