// The demo page, built by `./build.sh build`, opened in headless Chromium with WebGPU:
// the wasm module must load and report a real WebGPU adapter, with no console errors.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium } from 'playwright-core';
import { startServer } from '../../tools/serve.mjs';

const CHROMIUM = process.env.CHROMIUM ?? '/usr/bin/chromium';
export const CHROMIUM_ARGS = [
  '--enable-unsafe-webgpu',
  '--no-sandbox',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
  '--no-first-run',
  '--disable-quic',
  '--disable-dev-shm-usage',
];

test('demo page loads the wasm module and shows the WebGPU adapter', async (t) => {
  const { server, url } = await startServer('www');
  t.after(() => server.close());
  const browser = await chromium.launchPersistentContext(mkdtempSync(join(tmpdir(), 'emberlm-e2e-')), {
    executablePath: CHROMIUM,
    headless: true,
    args: CHROMIUM_ARGS,
  });
  t.after(() => browser.close());
  const page = await browser.newPage();
  const problems = [];
  page.on('console', (m) => { if (m.type() === 'error') problems.push(m.text()); });
  page.on('pageerror', (e) => problems.push(String(e)));

  await page.goto(url);
  await page.waitForSelector('#status[data-state]', { timeout: 120_000 });
  const state = await page.getAttribute('#status', 'data-state');
  const status = await page.textContent('#status');
  assert.equal(state, 'ready', `page status: ${status}`);
  const rows = Object.fromEntries(await page.$$eval('#adapter tr', (trs) =>
    trs.map((tr) => [tr.cells[0].textContent, tr.cells[1].textContent])));
  console.log(`page adapter: ${rows.Adapter} | backend: ${rows.Backend} | subgroups: ${rows.Subgroups}`);
  assert.match(rows.Backend, /^webgpu/);
  assert.ok(rows.Adapter && !rows.Adapter.startsWith('('), `the adapter has a name: ${rows.Adapter}`);
  assert.deepEqual(problems, [], 'no console errors');
});
