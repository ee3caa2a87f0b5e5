// The TypeScript declarations of the wasm module (www/pkg/emberlm.d.ts, written by
// `./build.sh build`): the result and event types are derived from the Rust types (Tsify) and
// declared once each; the hand-written declarations (src/web/typescript.rs, tools/npm/*.d.ts)
// name only types that exist, and tsc accepts them all together without skipLibCheck.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { copyFileSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { promisify } from 'node:util';

const run = promisify(execFile);
const ROOT = resolve('.');
const DTS = 'www/pkg/emberlm.d.ts';
/** Declared by Tsify from the Rust types JavaScript gets back. */
const DERIVED = [
  'TokenEvent', 'FinishReason', 'GenerationResult', 'SequenceResult', 'GenerationStats',
  'EngineInfo', 'ModelInfo', 'EngineLimits', 'EngineCounters', 'EngineMemory', 'BeamProgress',
  'SpeculativeStats',
];

const declarations = (text, name) =>
  [...text.matchAll(new RegExp(`^export (?:interface|type) ${name}\\b`, 'gm'))].length;

test('each derived type is declared once, with camelCase keys', () => {
  assert.ok(existsSync(DTS), `${DTS} is missing: run ./build.sh build`);
  const dts = readFileSync(DTS, 'utf8');
  for (const name of DERIVED) assert.equal(declarations(dts, name), 1, `${name} in ${DTS}`);
  for (const name of ['GenerationResult', 'EngineInfo', 'EngineCounters']) {
    const body = new RegExp(`^export interface ${name} \\{([^}]*)\\}`, 'm').exec(dts)?.[1] ?? '';
    const keys = [...body.matchAll(/^\s*(\w+)\??:/gm)].map((m) => m[1]);
    assert.ok(keys.length > 3, `${name} has keys: ${body}`);
    assert.deepEqual(keys.filter((k) => k.includes('_')), [], `${name} keys are camelCase`);
  }
});

test('tools/npm/*.d.ts import only types the module declares', () => {
  const dts = readFileSync(DTS, 'utf8');
  const client = readFileSync('tools/npm/client.d.ts', 'utf8');
  const names = /import type \{([^}]*)\} from '\.\/emberlm\.js'/.exec(client)?.[1]
    .split(',').map((n) => n.trim()).filter(Boolean);
  assert.ok(names?.length, 'client.d.ts imports types from ./emberlm.js');
  for (const name of names) assert.equal(declarations(dts, name), 1, `${name}, imported by client.d.ts`);
});

test('tsc accepts the module and client declarations together', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'emberlm-types-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  copyFileSync(DTS, join(dir, 'emberlm.d.ts'));
  for (const file of ['client.d.ts', 'worker.d.ts']) copyFileSync(`tools/npm/${file}`, join(dir, file));
  writeFileSync(join(dir, 'tsconfig.json'), JSON.stringify({
    compilerOptions: {
      target: 'es2022', module: 'es2022', moduleResolution: 'bundler', strict: true,
      lib: ['es2022', 'esnext.disposable', 'dom', 'dom.iterable'], types: [], noEmit: true, skipLibCheck: false,
    },
    files: ['emberlm.d.ts', 'client.d.ts', 'worker.d.ts'],
  }));
  try {
    await run(join(ROOT, 'node_modules/.bin/tsc'), ['--noEmit', '-p', 'tsconfig.json'], { cwd: dir });
  } catch (e) {
    assert.fail(`tsc found errors:\n${e.stdout}${e.stderr}`);
  }
});
