// The official `openai` npm client against emberlm: `emberlm serve-api` over HTTP, and the
// page's Engine (the WebAssembly build on its CPU backend, run here in Node) through the
// `openaiFetch` shim of www/openai_fetch.js. Both give the documented response shapes, honour
// a JSON schema, stream, and report bad requests as API errors naming the field. The worker
// client (`EngineClient`) answers the same API in headless Chromium.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { resolve } from 'node:path';
import OpenAI from 'openai';

const MODEL = resolve('tests/fixtures/tiny-llama-f32.gguf');
const BINARY = resolve(process.env.EMBERLM_BIN ?? 'target/debug/emberlm');

const SCHEMA = {
  type: 'object',
  properties: {
    name: { type: 'string', pattern: '^[a-z]{1,8}$' },
    n: { type: 'integer', minimum: 0, maximum: 99 },
  },
  required: ['name', 'n'],
  additionalProperties: false,
};

function checkRecord(text) {
  const value = JSON.parse(text);
  assert.deepEqual(Object.keys(value).sort(), ['n', 'name'], text);
  assert.match(value.name, /^[a-z]{1,8}$/, text);
  assert.ok(Number.isInteger(value.n) && value.n >= 0 && value.n <= 99, text);
}

// The same checks for any client: a schema-constrained chat (n = 2), a stream, a plain
// completion, the models list and a refused request.
async function exercise(client) {
  const models = await client.models.list();
  assert.equal(models.data[0].object, 'model');

  const chat = await client.chat.completions.create({
    model: 'tiny',
    messages: [{ role: 'user', content: 'A record, please' }],
    n: 2,
    seed: 5,
    max_tokens: 60,
    response_format: { type: 'json_schema', json_schema: { name: 'record', schema: SCHEMA, strict: true } },
  });
  assert.equal(chat.object, 'chat.completion');
  assert.match(chat.id, /^chatcmpl-/);
  assert.equal(chat.model, 'tiny');
  assert.equal(typeof chat.created, 'number');
  assert.equal(chat.choices.length, 2);
  for (const [i, choice] of chat.choices.entries()) {
    assert.equal(choice.index, i);
    assert.equal(choice.message.role, 'assistant');
    assert.equal(choice.finish_reason, 'stop');
    checkRecord(choice.message.content);
  }
  assert.equal(chat.usage.total_tokens, chat.usage.prompt_tokens + chat.usage.completion_tokens);

  const stream = await client.chat.completions.create({
    messages: [{ role: 'user', content: 'A record, please' }],
    seed: 5,
    max_tokens: 60,
    stream: true,
    stream_options: { include_usage: true },
    response_format: { type: 'json_schema', json_schema: { name: 'record', schema: SCHEMA } },
  });
  let text = '';
  const chunks = [];
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'chat.completion.chunk');
    chunks.push(chunk);
    text += chunk.choices[0]?.delta?.content ?? '';
  }
  assert.equal(chunks[0].choices[0].delta.role, 'assistant');
  assert.equal(chunks.at(-2).choices[0].finish_reason, 'stop');
  assert.equal(chunks.at(-1).usage.completion_tokens > 0, true);
  checkRecord(text);
  assert.equal(text, chat.choices[0].message.content, 'streamed and whole agree (same seed)');

  const plain = await client.completions.create({ model: 'tiny', prompt: 'Once upon', max_tokens: 5, temperature: 0 });
  assert.equal(plain.object, 'text_completion');
  assert.equal(plain.choices[0].finish_reason, 'length');
  assert.equal(plain.usage.completion_tokens, 5);

  await assert.rejects(
    client.chat.completions.create({ messages: [{ role: 'user', content: 'x' }], temprature: 1 }),
    (error) => error instanceof OpenAI.BadRequestError && /temprature/.test(error.message),
  );

  // embeddings: the client asks for base64 unless told (and decodes it); both are the same f32s
  const texts = ['Permission is hereby granted', 'THE SOFTWARE IS PROVIDED'];
  const packed = await client.embeddings.create({ model: 'tiny', input: texts });
  const floats = await client.embeddings.create({ model: 'tiny', input: texts, encoding_format: 'float' });
  assert.equal(floats.object, 'list');
  assert.equal(floats.model, 'tiny');
  assert.ok(floats.usage.prompt_tokens > 4, JSON.stringify(floats.usage));
  assert.equal(floats.data.length, 2);
  for (const [i, item] of floats.data.entries()) {
    assert.equal(item.index, i);
    assert.equal(item.embedding.length, 64, 'the model width');
    const length = Math.hypot(...item.embedding);
    assert.ok(Math.abs(length - 1) < 1e-5, `unit length: ${length}`);
    assert.deepEqual(Array.from(packed.data[i].embedding), item.embedding.map(Math.fround));
  }
  await assert.rejects(
    client.embeddings.create({ model: 'tiny', input: 'x', dimensions: 3 }),
    (error) => error instanceof OpenAI.BadRequestError && /dimensions/.test(error.message),
  );
}

test('the openai client talks to emberlm serve-api', async (t) => {
  assert.ok(existsSync(BINARY), `${BINARY} is missing: cargo build --bin emberlm`);
  const server = spawn(BINARY, ['serve-api', '--device', 'cpu', '--port', '0', '--model', MODEL], {
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  t.after(() => server.kill());
  const url = await new Promise((resolveUrl, reject) => {
    let out = '';
    server.stdout.on('data', (data) => {
      out += data;
      const match = /http:\/\/[^\s]+\/v1\//.exec(out);
      if (match) resolveUrl(match[0]);
    });
    server.on('exit', (code) => reject(new Error(`serve-api exited (${code}): ${out}`)));
  });
  await exercise(new OpenAI({ apiKey: 'unused', baseURL: url, maxRetries: 0 }));
});

test('the openai client talks to the page engine through openaiFetch', async () => {
  const { default: init, Engine } = await import(resolve('www/pkg/emberlm.js'));
  const { openaiFetch } = await import(resolve('www/openai_fetch.js'));
  await init({ module_or_path: readFileSync(resolve('www/pkg/emberlm_bg.wasm')) });
  const engine = await Engine.load(readFileSync(MODEL), { backend: 'cpu', name: 'tiny' });
  const client = new OpenAI({
    apiKey: 'unused',
    baseURL: 'https://emberlm.local/v1',
    fetch: openaiFetch(engine, { model: 'tiny' }),
    maxRetries: 0,
  });
  await exercise(client);
});

test('EngineClient (the engine in a worker) answers chat.completions in the browser', async (t) => {
  const { chromium } = await import('playwright-core');
  const { CHROMIUM, CHROMIUM_ARGS } = await import('../../tools/chromium.mjs');
  const { startServer } = await import('../../tools/serve.mjs');
  const { server, url } = await startServer('www');
  t.after(() => server.close());
  const browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: CHROMIUM_ARGS });
  t.after(() => browser.close());
  const page = await browser.newPage();
  await page.goto(`${url}token_stream.js`);
  const model = [...readFileSync(MODEL)];
  const out = await page.evaluate(async ({ model, schema }) => {
    const { EngineClient } = await import('/client.js');
    const client = new EngineClient();
    await client.load(new Uint8Array(model), { backend: 'cpu', name: 'tiny' });
    const request = {
      messages: [{ role: 'user', content: 'A record' }],
      seed: 2,
      max_tokens: 60,
      response_format: { type: 'json_schema', json_schema: { schema } },
    };
    const whole = await client.chat.completions.create(request);
    let streamed = '';
    const chunks = [];
    for await (const chunk of await client.chat.completions.create({ ...request, stream: true })) {
      chunks.push(chunk);
      streamed += chunk.choices[0]?.delta?.content ?? '';
    }
    const text = await client.completions.create({ prompt: 'Once', max_tokens: 3, temperature: 0 });
    const vectors = await client.embed(['Once', 'upon a time'], { pooling: 'last' });
    const shaped = await client.embeddings.create({ input: 'Once', encoding_format: 'float', pooling: 'last' });
    client.terminate();
    const embedded = {
      kinds: vectors.map((v) => v.constructor.name),
      widths: vectors.map((v) => v.length),
      first: Array.from(vectors[0]),
      shaped: shaped.data[0].embedding,
    };
    return { whole, streamed, chunks, text, embedded };
  }, { model, schema: SCHEMA });
  assert.equal(out.whole.object, 'chat.completion');
  checkRecord(out.whole.choices[0].message.content);
  assert.equal(out.streamed, out.whole.choices[0].message.content);
  assert.equal(out.chunks[0].choices[0].delta.role, 'assistant');
  assert.equal(out.chunks.at(-1).choices[0].finish_reason, 'stop');
  assert.equal(out.text.object, 'text_completion');
  assert.equal(out.text.choices[0].finish_reason, 'length');
  assert.deepEqual(out.embedded.kinds, ['Float32Array', 'Float32Array']);
  assert.deepEqual(out.embedded.widths, [64, 64]);
  // the same vector both ways
  assert.deepEqual(out.embedded.shaped.map(Math.fround), out.embedded.first);
});
