// Type-checked (tsc --noEmit) against the installed package by tests/e2e/npm.test.mjs: every
// option, event and result type of EngineClient and the engine.
import init, { Engine, version } from 'emberlm';
import type {
  ChatMessage,
  EngineInfo,
  GenerateOptions,
  GenerationResult,
  LoadOptions,
  LoadProgress,
  Prompt,
  TokenEvent,
} from 'emberlm';
import { EngineClient } from 'emberlm/client';
import type { EngineError, FinishReason, TokenStream } from 'emberlm/client';

const loadOptions: LoadOptions = {
  contextLength: 512,
  cache: 'emberlm-models-v1',
  name: 'model.gguf',
  onProgress: (p: LoadProgress) => {
    const phase: 'download' | 'parse' | 'upload' = p.phase;
    console.log(phase, p.loaded / (p.total || 1));
  },
};

const options: GenerateOptions = {
  maxNewTokens: 32,
  temperature: 0.7,
  topK: 40,
  topP: 0.9,
  minP: 0.05,
  typicalP: 1,
  repetitionPenalty: 1.1,
  presencePenalty: 0,
  frequencyPenalty: 0,
  penaltyLastN: 64,
  logitBias: { 13: -5 },
  seed: 42,
  stop: ['\n\n'],
  stopTokenIds: [2],
  numBeams: 1,
  lengthPenalty: 1,
  earlyStopping: false,
  numReturnSequences: 1,
  special: false,
  strict: false,
  nKeep: 1,
  speculative: { method: 'lookup', k: 4, adaptive: true, disableBelowAccept: 0.2, extraToken: true },
};

function describe(info: EngineInfo): string {
  const m = info.model;
  return `${m.name} (${m.arch}, ${m.layers} layers, vocab ${m.vocab}) on ${info.adapter} ${info.backend} `
    + `${info.deviceType}, ${info.limits.maxBufferSize} B, context ${info.contextLength}, `
    + `template ${info.hasChatTemplate}, cache ${info.loadedFromCache}/${info.storedInCache}`;
}

function report(result: GenerationResult): string {
  const finish: FinishReason = result.finishReason;
  const s = result.stats;
  const seqs = result.sequences.map((q) => `${q.text} ${q.tokens.length} ${q.finishReason} ${q.logprob}`);
  return `${result.text} ${finish} ${result.seed ?? 'greedy'} ${result.warnings.join()} ${seqs.join()} `
    + `${s.promptTokens} ${s.cachedTokens} ${s.generatedTokens} ${s.prefillMs} ${s.decodeMs} `
    + `${s.timeToFirstTokenMs} ${s.decodeTokPerS} ${result.promptTokenIds.length} `
    + `${s.speculative?.acceptanceRate ?? 'plain'} ${s.speculative?.targetSteps ?? 0}`;
}

function onToken(event: TokenEvent): void {
  const id: number | null = event.id;
  const logprob: number | null = event.logprob;
  console.log(event.text, id, logprob, event.sequence, event.prompt);
}

export async function withClient(file: File): Promise<void> {
  const client = new EngineClient();
  const other = new EngineClient(new URL('./worker.js', import.meta.url), { type: 'module' });
  other.terminate();
  console.log(client.worker instanceof Worker, await client.version());
  try {
    console.log(describe(await client.load(file, loadOptions)));
    console.log(describe(await client.load(new Uint8Array(8).buffer)));
  } catch (e) {
    const error = e as EngineError;
    console.log(error.kind, error.option, error.what, error.limit, error.needed, error.allowed);
  }
  const messages: ChatMessage[] = [{ role: 'user', content: 'Hello' }];
  const prompt: Prompt = messages;
  console.log(report(await client.generate(prompt, options, onToken)));
  console.log(report(await client.generate('plain text')));
  const stream: TokenStream = client.stream([1, 2, 3], { maxNewTokens: 4 });
  for await (const event of stream) onToken(event);
  const step = await client.stream('again').next();
  if (step.done) console.log(report(step.value));
  await client.abort();
  await client.reset();
  const withDraft: EngineInfo = await client.loadDraft('draft.gguf');
  console.log(withDraft.draft ?? 'no draft', (await client.unloadDraft()).draft === undefined);
  console.log(describe(await client.info()));
  await client.destroyDeviceForTest();
  await client.free();
  client.terminate();
}

export async function withEngine(bytes: Uint8Array): Promise<void> {
  await init();
  console.log(version());
  const engine = await Engine.load(bytes, loadOptions);
  console.log(describe(engine.info()), report(await engine.generate('Hi', options, onToken)));
  const batch: GenerationResult[] = await engine.generateBatch(
    ['Hi', { prompt: [1, 2, 3], temperature: 0.5, seed: 7 }],
    { maxNewTokens: 8, maxBatch: 4 },
    (e: TokenEvent) => console.log(e.prompt, e.sequence, e.text),
  );
  console.log(batch.map(report));
  engine.free();
}
