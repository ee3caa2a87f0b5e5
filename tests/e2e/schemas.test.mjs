// Structured output on SmolLM2 in the browser: for each JSON schema of tests/fixtures/schemas.json
// (the native test tests/engine/constrain/schemas.rs uses the same, with 20 samples each: the
// breadth is there), the greedy answer and 4 seeded samples (the `balanced` preset; the first 4
// of those 20) from the page's engine in its worker (EngineClient, CPU backend: the threaded
// WebAssembly build in Chromium, served cross-origin isolated as `./build.sh serve` serves it, so
// the engine runs on a thread per core) all finish and validate with an independent validator
// (Ajv). Needs `./build.sh build` and models/ (`./build.sh setup`).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, readFileSync, symlinkSync } from 'node:fs';
import Ajv from 'ajv';
import { chromium } from 'playwright-core';
import { CHROMIUM, CHROMIUM_ARGS } from '../../tools/chromium.mjs';
import { startServer } from '../../tools/serve.mjs';

const MODEL = 'SmolLM2-135M-Instruct.Q4_1.gguf';
const SAMPLES = 4;
const { schemas } = JSON.parse(readFileSync('tests/fixtures/schemas.json', 'utf8'));

test('SmolLM2 in the browser: greedy and 4 seeded samples per JSON schema all validate', async (t) => {
  assert.ok(existsSync('www/pkg/emberlm.js'), 'www/pkg is missing: run ./build.sh build');
  assert.ok(existsSync(`models/${MODEL}`), `models/${MODEL} is missing: run ./build.sh setup`);
  mkdirSync('www/models', { recursive: true });
  if (!existsSync(`www/models/${MODEL}`)) symlinkSync(`../../models/${MODEL}`, `www/models/${MODEL}`);
  const { server, url } = await startServer('www', 0, { isolated: true });
  t.after(() => server.close());
  const browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: CHROMIUM_ARGS });
  t.after(() => browser.close());
  const page = await browser.newPage();
  await page.goto(`${url}token_stream.js`);
  await page.evaluate(async (model) => {
    const { EngineClient } = await import('/client.js');
    globalThis.client = new EngineClient();
    // a prompt of about 150 tokens and at most 256 generated: the sequences' KV caches of 512
    // positions fit the wasm memory (20 of 4,096 would not)
    globalThis.info = await globalThis.client.load(`/models/${model}`, { backend: 'cpu', contextLength: 512 });
  }, MODEL);
  const info = await page.evaluate(() => globalThis.info);
  console.log(`SmolLM2 on the CPU backend (${info.cpuInstructions}, ${info.threads} thread(s))`);
  const ajv = new Ajv({ allErrors: true });
  for (const { name, schema } of schemas) {
    const validate = ajv.compile(schema);
    const check = (text, what) => {
      let value;
      assert.doesNotThrow(() => { value = JSON.parse(text); }, `${name}, ${what}: ${JSON.stringify(text)} is not JSON`);
      assert.ok(validate(value), `${name}, ${what}: ${text} does not satisfy the schema: ${ajv.errorsText(validate.errors)}`);
    };
    const since = performance.now();
    const out = await page.evaluate(async ({ schema, samples }) => {
      const prompt = [{ role: 'user', content: `Reply with JSON for this schema: ${JSON.stringify(schema)}` }];
      const responseFormat = { type: 'json_schema', json_schema: { schema, strict: true } };
      const greedy = await globalThis.client.generate(prompt, { temperature: 0, maxNewTokens: 256, responseFormat });
      const sampled = await globalThis.client.generate(prompt, {
        preset: 'balanced', seed: 2026, maxNewTokens: 256, numReturnSequences: samples, responseFormat,
      });
      return { greedy, sampled };
    }, { schema, samples: SAMPLES });
    for (const [what, g] of [['greedy', out.greedy], ['samples', out.sampled]]) {
      assert.deepEqual(g.warnings ?? [], [], `${name}, ${what}: warnings`);
      for (const [i, s] of g.sequences.entries()) {
        assert.equal(s.finishReason, 'stop', `${name}, ${what} ${i}: ${JSON.stringify(s.text)} ended by ${s.finishReason}`);
        check(s.text, `${what} ${i}`);
      }
    }
    assert.equal(out.sampled.sequences.length, SAMPLES);
    const distinct = new Set(out.sampled.sequences.map((s) => s.text)).size;
    console.log(`${name}: greedy ${out.greedy.sequences[0].text}; ${SAMPLES} samples valid (${distinct} distinct, `
      + `${out.sampled.stats.generatedTokens} tokens) in ${((performance.now() - since) / 1000).toFixed(1)} s`);
    assert.ok(distinct > 1, `${name}: the samples are all the same`);
  }
  await page.evaluate(() => globalThis.client.terminate());
});
