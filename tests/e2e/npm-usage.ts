// Type-checked (tsc --noEmit) against the installed package by tests/e2e/npm.test.mjs: every
// option, event and result type of EngineClient and the engine.
import init, { Engine, version } from 'emberlm';
import type {
  ChatCompletion,
  ChatCompletionRequest,
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
import { openaiFetch } from 'emberlm/openai';
import type { EngineError, FinishReason, TokenStream } from 'emberlm/client';

const loadOptions: LoadOptions = {
  contextLength: 512,
  cache: 'emberlm-models-v1',
  name: 'model.gguf',
  onProgress: (p: LoadProgress) => {
    const phase: 'download' | 'parse' | 'upload' | 'load' = p.phase;
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
  topLogprobs: 0,
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
  const best: number | undefined = event.topLogprobs?.[0]?.logprob;
  console.log(event.text, id, logprob, event.sequence, event.prompt, best, event.topLogprobs?.map((t) => t.id));
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
  const viaWorker = await client.chat.completions.create({
    messages: [{ role: 'user', content: 'Hi' }],
    response_format: { type: 'json_object' },
  });
  if ('object' in viaWorker) console.log(viaWorker.choices[0].message.content);
  const workerFetch = openaiFetch(client);
  console.log((await workerFetch('https://emberlm.local/v1/models')).status);
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
  const structured: GenerationResult = await engine.generate('A record', {
    responseFormat: { type: 'json_schema', json_schema: { schema: { type: 'object' }, strict: true } },
  });
  console.log(structured.text, structured.stats.constrainedSteps, structured.stats.constraintMs);
  const request: ChatCompletionRequest = {
    messages: [{ role: 'user', content: 'Hi' }],
    max_tokens: 16,
    response_format: { type: 'regex', regex: '[0-9]+' },
  };
  const completion = await engine.chat.completions.create(request);
  if ('object' in completion && completion.object === 'chat.completion') {
    const whole: ChatCompletion = completion;
    console.log(whole.choices[0].message.content, whole.usage.total_tokens);
  }
  const chunks = await engine.chat.completions.create({ ...request, stream: true });
  if (Symbol.asyncIterator in chunks) {
    for await (const chunk of chunks) console.log(chunk.choices[0]?.finish_reason);
  }
  const text = await engine.completions.create({ prompt: 'Once', max_tokens: 4 });
  if ('object' in text && text.object === 'text_completion') console.log(text.choices[0].text);
  const fetcher: (input: RequestInfo | URL, init?: RequestInit) => Promise<Response> = openaiFetch(engine, { model: 'smol' });
  const reply: Response = await fetcher('https://emberlm.local/v1/chat/completions', {
    method: 'POST',
    body: JSON.stringify(request),
  });
  console.log(reply.status, await reply.json());
  engine.free();
}
