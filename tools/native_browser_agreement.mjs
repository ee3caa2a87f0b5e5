// Writes tests/fixtures/native_browser_agreement.json: greedy continuations of a few prompts on
// the tiny fixtures, as the native CLI produces them. tests/engine/native_browser_agreement.rs (native
// Session) and tests/web/engine.rs (the JavaScript Engine in the browser) both check against
// this file, so native and browser generation agree with each other; correctness is held to the
// float64 goldens in tests/fixtures/golden/. `cpu_cases` hold the CPU backend's continuations,
// which tests/engine/native_browser_agreement.rs and tests/web/cpu.rs check the same way.
//
//   cargo build --bin emberlm && node tools/native_browser_agreement.mjs
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const MAX_NEW_TOKENS = 16;
const CASES = [
  { model: 'tiny-llama-q4_1.gguf', prompt: 'The software is provided' },
  { model: 'tiny-gpt2-f32.gguf', prompt: 'Permission is hereby granted, free of charge, to any person' },
  { model: 'tiny-llama-spm-f32.gguf', prompt: 'The software is provided' },
  { model: 'tiny-llama-q4_1.gguf', prompt: [{ role: 'user', content: 'Permission is hereby granted' }] },
];

/** Every case through the CLI, on the backend `device` names. */
const run = (device) => CASES.map(({ model, prompt }) => {
  const chat = Array.isArray(prompt);
  const text = chat ? prompt[0].content : prompt;
  const args = [
    'generate', '--model', `tests/fixtures/${model}`, '--prompt', text,
    '--temperature', '0', '--max-new-tokens', String(MAX_NEW_TOKENS), '--json',
    ...(chat ? ['--chat'] : []),
    '--device', device,
  ];
  const out = JSON.parse(execFileSync('target/debug/emberlm', args, { encoding: 'utf8' }));
  const [seq] = out.sequences;
  console.log(`${device} ${model} ${JSON.stringify(prompt)}: ${JSON.stringify(seq.text)} (${seq.finish_reason})`);
  return {
    model,
    prompt,
    prompt_tokens: out.prompt_tokens,
    tokens: seq.tokens,
    text: seq.text,
    finish_reason: seq.finish_reason,
  };
});

/** The CPU backend's perplexity of TEXT on each model through the CLI: WebAssembly must give the
 * same bits (the transcendental functions go through one implementation, src/math.rs). */
const PERPLEXITY_MODELS = ['tiny-llama-q4_1.gguf', 'tiny-gpt2-f32.gguf', 'tiny-gemma3-f32.gguf'];
const PERPLEXITY_TEXT = 'Permission is hereby granted, free of charge, to any person obtaining a copy '
  + 'of this software and associated documentation files, to deal in the Software without restriction.';
/** A double's IEEE bits as 16 hex digits (JSON numbers may not survive every parser exactly). */
const f64Bits = (x) => {
  const b = Buffer.alloc(8);
  b.writeDoubleBE(x);
  return b.toString('hex');
};
const perplexity = () => {
  const dir = mkdtempSync(join(tmpdir(), 'emberlm-agreement-'));
  const file = join(dir, 'text.txt');
  writeFileSync(file, PERPLEXITY_TEXT);
  try {
    return PERPLEXITY_MODELS.map((model) => {
      const args = ['perplexity', '--model', `tests/fixtures/${model}`, '--file', file, '--device', 'cpu'];
      const out = JSON.parse(execFileSync('target/debug/emberlm', args, { encoding: 'utf8' }));
      console.log(`cpu perplexity ${model}: ${JSON.stringify(out)}`);
      return { model, text: PERPLEXITY_TEXT, tokens: out.tokens, nll: out.nll, nll_bits: f64Bits(out.nll) };
    });
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
};

const agreement = {
  about: 'Greedy continuations by `emberlm generate --model tests/fixtures/MODEL --prompt TEXT '
    + `--temperature 0 --max-new-tokens ${MAX_NEW_TOKENS} --json` + '` (with --chat for a one-message '
    + 'conversation); written by tools/native_browser_agreement.mjs; native and browser generation '
    + 'must reproduce them (an agreement check: correctness is held to the float64 goldens in golden/); '
    + '`cases` run with `--device gpu` (the adapter, a software one included), `cpu_cases` with '
    + '`--device cpu` (the CPU backend, native and WebAssembly); `cpu_perplexity`: `emberlm perplexity '
    + '--device cpu` of TEXT, whose mean NLL (its bits in `nll_bits`) native and WebAssembly must reproduce bit for bit',
  max_new_tokens: MAX_NEW_TOKENS,
  cases: run('gpu'),
  cpu_cases: run('cpu'),
  cpu_perplexity: perplexity(),
};
writeFileSync('tests/fixtures/native_browser_agreement.json', `${JSON.stringify(agreement, null, 2)}\n`);
