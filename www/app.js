// The chat page: a model picker, sampling settings and a conversation with the model, which runs
// in a Worker (client.js / worker.js) on WebGPU.
//
// Element ids and data-* attributes are stable, the page tests rely on them:
//   #status[data-state = loading | ready | generating | error], #prompt, #send, #stop, #reset,
//   #messages[data-kept] > .message.user / .message.assistant (.content; data-finish, data-tokens;
//   pre.parsed[data-valid] under a reply with #json-output on, #json-schema its schema),
//   #load-progress, #load-phase, #cache-note[data-cached], #error[data-kind], #retry.
// #status is `idle` while an offline page waits for a model file.
//
// globalThis.EMBERLM_OFFLINE (set by the single-file build, tools/dist.mjs) keeps only the file
// picker and drag-and-drop: a page opened from file:// cannot fetch the files next to it.
// globalThis.EMBERLM_WORKER_URL and EMBERLM_WORKER_TYPE, when set, are the worker script to start
// and its type ('module' or 'classic').
import { EngineClient } from './client.js';
import { forgetConversation, keepConversation, restoreConversation } from './saved_chat.js';

const OFFLINE = globalThis.EMBERLM_OFFLINE === true;

const DEFAULT_MODEL = 'models/SmolLM2-135M-Instruct.Q4_1.gguf';
const MODEL_CACHE = 'emberlm-models-v1';

const $ = (id) => document.getElementById(id);

/** @type {EngineClient | null} */
let client = null;
/** The conversation sent with every turn; the engine reuses the KV cache of the common prefix. */
let history = [];
let loaded = false;
/** The loaded model's name (and picked template's): what its conversation is kept under. */
let modelName = null;
let generating = false;
let unusable = false;

function refreshControls() {
  const idle = loaded && !generating && !unusable;
  $('prompt').disabled = !idle;
  $('send').disabled = !idle;
  $('reset').disabled = !idle;
  $('stop').disabled = !generating;
  $('load').disabled = generating || unusable;
}

function setStatus(state, text) {
  const status = $('status');
  status.dataset.state = state;
  status.textContent = text;
  refreshControls();
}

const mb = (bytes) => `${(bytes / 1e6).toFixed(1)} MB`;
const mib = (bytes) => `${Math.round(bytes / 2 ** 20)} MiB`;

/** The error's kind: the `kind` field, or the message's prefix up to the first colon. */
function kindOf(e) {
  return e?.kind ?? /^(\w+):/.exec(e?.message ?? '')?.[1] ?? 'Error';
}

/** The message without its `Kind: ` prefix. */
function detailOf(e) {
  return String(e?.message ?? e).replace(/^\w+: /, '');
}

const NO_WEBGPU = 'This browser offers no WebGPU, which emberlm needs to run the model on your GPU. '
  + 'Use a recent Chrome or Edge (version 113 or later) on Windows, macOS or ChromeOS. On Linux, '
  + 'open chrome://flags, enable "Unsafe WebGPU Support" and "Vulkan", and restart the browser. '
  + 'Firefox 141+ has WebGPU on Windows (elsewhere set dom.webgpu.enabled in about:config); '
  + 'Safari 26 has it on (Safari 18: Develop > Feature Flags > WebGPU).';

/** The error in plain words. */
function explain(e) {
  const detail = detailOf(e);
  switch (kindOf(e)) {
    case 'NoAdapter':
    case 'RequestDevice':
      return `${NO_WEBGPU} (The browser said: ${detail})`;
    case 'Limit':
      if (e.limit === 'wasm32 address space') {
        return `This model is too big for the CPU backend in a browser: ${e.what ?? 'the model'} needs `
          + `${mib(e.needed)}, and WebAssembly can address at most ${mib(e.allowed)}. Try a smaller or `
          + 'more strongly quantized model, a shorter context, or a browser with WebGPU.';
      }
      return `This model is too big for this GPU: ${e.what ?? 'a buffer'} needs ${mib(e.needed)}, but `
        + `this GPU allows at most ${mib(e.allowed)} (${e.limit}). Try a smaller or more strongly `
        + 'quantized model, or a shorter context.';
    case 'OutOfMemory':
      return `The GPU ran out of memory while loading this model: ${detail}.`;
    case 'Format':
    case 'Unsupported':
      return `This file is not a model emberlm can run: ${detail}. emberlm reads GGUF files of `
        + 'Llama-family and GPT-2 models (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K).';
    case 'DeviceLost':
      return 'The GPU stopped working for this page (the device was lost: a driver reset, or the '
        + 'tab stayed in the background too long). The engine kept the model and re-creates the GPU '
        + 'device on the next try; the conversation is kept. Press Retry.';
    case 'Io':
      return `The model could not be read or downloaded: ${detail}`;
    case 'InvalidArgument':
      return `A setting is not valid: ${detail}`;
    case 'NoWasmSimd':
      return `${detail.charAt(0).toUpperCase()}${detail.slice(1)}. Update the browser, or use another one.`;
    case 'Panic':
    case 'Worker':
      return `The engine stopped on an internal error; reload the page to start again. (${detail})`;
    default:
      return detail;
  }
}

function showError(e, { retry = false } = {}) {
  console.error(e);
  const box = $('error');
  box.dataset.kind = kindOf(e);
  $('error-text').textContent = explain(e);
  $('retry').hidden = !retry;
  box.hidden = false;
}

function hideError() {
  $('error').hidden = true;
  delete $('error').dataset.kind;
}

function row(label, value) {
  const tr = document.createElement('tr');
  const th = document.createElement('th');
  const td = document.createElement('td');
  th.textContent = label;
  td.textContent = value;
  tr.append(th, td);
  return tr;
}

/** The loaded model's facts; `templateName`: the chat template file picked for it, if any. */
function showInfo(info, templateName) {
  keepPresets(info);
  const m = info.model;
  $('model-info').tBodies[0].replaceChildren(
    row('Model', m.name),
    row('Architecture', `${m.arch}, ${m.layers} layers, d ${m.hiddenSize}, ${m.heads} heads (${m.kvHeads} KV)`),
    row('Vocabulary', String(m.vocab)),
    row('Weights', mb(m.weightBytes)),
    row('Context', `${info.contextLength} (trained: ${m.contextLength})`),
    row('Chat template', templateName ? `${templateName} (picked)` : info.hasChatTemplate ? 'the model\'s own' : 'none (a plain fallback)'),
  );
  $('adapter').tBodies[0].replaceChildren(
    row('Runs on', info.runsOn === 'cpu'
      ? `CPU (WebAssembly${{ simd128: ' SIMD', 'simd128+relaxed': ' relaxed SIMD' }[info.cpuInstructions] ?? ''}, ${info.threads} thread${info.threads === 1 ? '' : 's'})${info.backendNotice ? `: ${info.backendNotice}` : ''}${info.threadsNotice ? `; one thread: ${info.threadsNotice}` : ''}`
      : `GPU (WebGPU)${info.backendNotice ? `: ${info.backendNotice}` : ''}`),
    row('Adapter', info.adapter || '(not disclosed by the browser)'),
    row('Backend', `${info.backend} (${info.deviceType})`),
    row('Subgroups', info.subgroups ? 'used' : 'no'),
    row('shader-f16', info.shaderF16 ? 'yes' : 'no'),
    row('Largest storage binding', mib(info.limits.maxStorageBufferBindingSize)),
    row('Largest buffer', mib(info.limits.maxBufferSize)),
    row('Adapter features', info.adapterFeatures.join(', ') || 'none'),
  );
}

/** What the model picker points at: { source, cache, label }. */
function pickedSource() {
  const kind = document.querySelector('input[name="model-source"]:checked').value;
  if (kind === 'file') {
    // Several files are the parts of a split GGUF set (NAME-00001-of-0000N.gguf, ...).
    const files = Array.from($('model-file').files);
    if (!files.length) throw Object.assign(new Error('Io: choose a .gguf file first'), { kind: 'Io' });
    const label = files.length > 1 ? `${files[0].name} (${files.length} files)` : files[0].name;
    return { source: files.length > 1 ? files : files[0], cache: undefined, label };
  }
  const url = kind === 'url' ? $('model-url').value.trim() : DEFAULT_MODEL;
  if (!url) throw Object.assign(new Error('Io: type the URL of a .gguf file first'), { kind: 'Io' });
  return { source: url, cache: MODEL_CACHE, label: url.split('/').pop() };
}

/**
 * What the model store holds for `url`: `{ complete, bytes, total, storage }`, or null (nothing,
 * or no store in this browser).
 */
async function storedCopy(url) {
  try {
    const href = new URL(url, document.baseURI).href;
    return (await client.listStored(MODEL_CACHE)).find((f) => f.url === href) ?? null;
  } catch {
    return null;
  }
}

/**
 * Asks the browser to keep the model store under storage pressure (only a page can ask, not its
 * worker); resolves to the answer, or null where it cannot be asked.
 */
async function askPersist() {
  try {
    return await navigator.storage?.persist?.() ?? null;
  } catch {
    return null;
  }
}

async function load() {
  hideError();
  loaded = false;
  let picked;
  try {
    picked = pickedSource();
  } catch (e) {
    showError(e);
    setStatus('error', 'No model loaded.');
    return;
  }
  const stored = picked.cache ? await storedCopy(picked.source) : null;
  const fromCache = stored?.complete === true;
  // Asked without waiting for the answer: Firefox asks the user in a prompt, which may never
  // be answered (and never is in a headless browser); the load goes on meanwhile.
  let persisted = null;
  if (picked.cache) askPersist().then((answer) => { persisted = answer; });
  setStatus('loading', `Loading ${picked.label}…`);
  const note = $('cache-note');
  note.textContent = '';
  delete note.dataset.cached;
  const bar = $('load-progress');
  const phase = $('load-phase');
  const reading = typeof picked.source === 'string'
    ? (fromCache ? 'Reading from this browser\'s storage'
      : stored ? `Resuming the download (${mb(stored.bytes ?? 0)} kept from an earlier visit)` : 'Downloading')
    : 'Reading the file';
  const onProgress = ({ phase: p, loaded: done, total }) => {
    const fraction = total > 0 ? done / total : 0;
    // Download, parse and upload (or load, for the CPU) share the bar: 80%, 5%, 15%.
    const [start, width, label] = {
      download: [0, 0.8, reading],
      parse: [0.8, 0.05, 'Parsing'],
      upload: [0.85, 0.15, 'Uploading to the GPU'],
      load: [0.85, 0.15, 'Reading the weights into memory'],
    }[p];
    bar.value = start + width * fraction;
    phase.textContent = p === 'parse'
      ? `${label}…`
      : `${label}: ${mb(done)}${total ? ` of ${mb(total)}` : ''}`;
  };
  const started = performance.now();
  try {
    const contextLength = Number($('context').value) || undefined;
    const template = $('chat-template').files[0];
    const chatTemplate = template ? await template.text() : undefined;
    // `?backend=webgpu|cpu|auto` in the page's address picks the backend (default auto)
    const backend = new URLSearchParams(location.search).get('backend') || undefined;
    const info = await client.load(picked.source, { contextLength, cache: picked.cache, backend, chatTemplate, onProgress });
    bar.value = 1;
    const seconds = ((performance.now() - started) / 1000).toFixed(1);
    phase.textContent = `Loaded in ${seconds} s`;
    const where = info.storage === 'opfs' ? 'this browser\'s private file system' : 'the browser cache';
    const kept = persisted === false ? ' (the browser may clear it when space runs low)' : '';
    if (info.loadedFromCache) {
      note.textContent = `Loaded from cache: ${where} kept this model from an earlier visit, nothing was downloaded.`;
      note.dataset.cached = 'true';
    } else if (info.storedInCache) {
      const resumed = stored ? `, resuming where an earlier visit stopped (${mb(info.bytesDownloaded)} downloaded now)` : '';
      note.textContent = `Downloaded${resumed} and saved in ${where}: the next visit loads it from there${kept}.`;
      note.dataset.cached = 'false';
    } else if (info.storageNotice) {
      note.textContent = `Downloaded, but not saved: ${info.storageNotice}`;
      note.dataset.cached = 'false';
    }
    showInfo(info, template?.name);
    refreshStored();
    newChat();
    // a conversation belongs to the model and the chat template it was rendered with
    modelName = template ? `${info.model.name} with ${template.name}` : info.model.name;
    // the conversation kept from an earlier visit with this model goes on
    const restored = await restoreConversation(client, modelName);
    if (restored) {
      history = restored;
      for (const m of restored) addMessage(m.role, m.content);
    }
    // a new model comes without the previous one's draft
    $('draft-file').value = '';
    $('draft-name').textContent = 'none loaded';
    if ($('speculative').value === 'draft') $('speculative').value = '';
    loaded = true;
    setStatus('ready', `Ready: ${info.model.name} on ${info.adapter || info.backend}.`);
  } catch (e) {
    phase.textContent = '';
    bar.value = 0;
    showError(e);
    setStatus('error', 'The model did not load.');
  }
}

/** A split set's later parts (`NAME-0000k-of-0000N.gguf`, k > 1) fold into its first part's row. */
const LATER_PART = /-(\d{5,})-of-(\d{5,})\.gguf(?:[?#].*)?$/;

/**
 * Lists the models kept in the store (`client.listStored`: the private file system and the
 * Cache API), each with its size and a Delete button; a split set is one row, its first part's
 * name and every part's bytes; a download cut off part-way says how much of it is kept. Under
 * the list, what the browser grants this site (`navigator.storage.estimate()`).
 */
async function refreshStored() {
  let files;
  try {
    files = await client.listStored(MODEL_CACHE);
  } catch {
    $('stored-box').hidden = true;
    return;
  }
  const rows = new Map();
  for (const { url, bytes, total, complete } of files) {
    const part = url.match(LATER_PART);
    const first = part && Number(part[1]) > 1
      ? url.replace(LATER_PART, (m, k, n) => m.replace(`-${k}-of-`, `-${'1'.padStart(k.length, '0')}-of-`))
      : url;
    const row = rows.get(first) ?? { url: first, bytes: 0, total: 0, files: 0, complete: true };
    row.bytes += bytes ?? 0;
    row.total += total ?? bytes ?? 0;
    row.files += 1;
    row.complete &&= complete !== false;
    rows.set(first, row);
  }
  const list = $('stored-list');
  list.replaceChildren(...[...rows.values()].map((row) => {
    const item = document.createElement('li');
    const name = document.createElement('span');
    name.className = 'stored-name';
    name.textContent = row.url.split(/[?#]/)[0].split('/').pop();
    name.title = row.url;
    const size = document.createElement('span');
    size.className = 'stored-size';
    size.textContent = row.complete
      ? ` ${mb(row.bytes)}${row.files > 1 ? ` in ${row.files} files` : ''} `
      : ` ${mb(row.bytes)} of ${row.total ? mb(row.total) : '?'} (cut off: the next load resumes) `;
    const remove = document.createElement('button');
    remove.type = 'button';
    remove.textContent = 'Delete';
    remove.addEventListener('click', async () => {
      remove.disabled = true;
      try {
        await client.deleteStored(row.url, MODEL_CACHE);
      } catch (e) {
        showError(e);
      }
      refreshStored();
    });
    item.append(name, size, remove);
    return item;
  }));
  $('stored-empty').hidden = rows.size > 0;
  try {
    const { usage, quota } = await navigator.storage.estimate();
    $('stored-quota').textContent = `This site uses ${mb(usage)} of the ${mb(quota)} the browser allows it.`;
  } catch {
    $('stored-quota').textContent = '';
  }
}

/** Loads the picked draft model beside the model, for speculative decoding. */
async function loadDraft() {
  const file = $('draft-file').files[0];
  if (!file || !client || !loaded || generating) return;
  hideError();
  const name = $('draft-name');
  name.textContent = `loading ${file.name}…`;
  delete name.dataset.loaded;
  try {
    const info = await client.loadDraft(file, { name: file.name });
    name.textContent = `${info.draft} loaded`;
    name.dataset.loaded = 'true';
    $('speculative').value = 'draft';
  } catch (e) {
    name.textContent = 'none loaded';
    showError(e);
  }
}

function addMessage(role, text) {
  const div = document.createElement('div');
  div.className = `message ${role}`;
  const who = document.createElement('span');
  who.className = 'role';
  who.textContent = role === 'user' ? 'You' : 'Model';
  const content = document.createElement('div');
  content.className = 'content';
  content.textContent = text;
  div.append(who, content);
  $('messages').append(div);
  div.scrollIntoView({ block: 'end' });
  return div;
}

/** Under a JSON reply: the parsed value, or why the text is not complete JSON. */
function showParsed(bubble, result) {
  const box = document.createElement('pre');
  box.className = 'parsed';
  try {
    box.textContent = JSON.stringify(JSON.parse(result.text), null, 2);
    box.dataset.valid = 'true';
  } catch {
    box.textContent = result.warnings?.join('\n') || `not complete JSON (finish: ${result.finishReason})`;
    box.dataset.valid = 'false';
  }
  bubble.append(box);
}

function number(id) {
  return Number($(id).value);
}

/** The sampling settings as GenerateOptions. */
function options() {
  const o = {
    temperature: number('temperature'),
    topP: number('top-p'),
    topK: number('top-k'),
    maxNewTokens: number('max-tokens'),
    minP: number('min-p'),
    typicalP: number('typical-p'),
    repetitionPenalty: number('repetition-penalty'),
    presencePenalty: number('presence-penalty'),
    frequencyPenalty: number('frequency-penalty'),
  };
  const seed = $('seed').value.trim();
  if (seed !== '') o.seed = Number(seed);
  const stop = $('stop-strings').value.split('\n').filter((s) => s.length > 0);
  if (stop.length) o.stop = stop;
  o.penaltyLastN = number('penalty-last-n');
  o.numBeams = number('num-beams');
  o.lengthPenalty = number('length-penalty');
  o.earlyStopping = $('early-stopping').checked;
  // Ids and biases go to the engine as typed: it names a bad one in its error.
  const ids = $('stop-token-ids').value.split(',').map((s) => s.trim()).filter((s) => s !== '');
  if (ids.length) o.stopTokenIds = ids.map(Number);
  const bias = {};
  for (const line of $('logit-bias').value.split('\n')) {
    const [id, value] = line.split('=').map((s) => s.trim());
    if (id) bias[id] = Number(value);
  }
  if (Object.keys(bias).length) o.logitBias = bias;
  if ($('json-output').checked) {
    const schema = $('json-schema').value.trim();
    if (schema === '') {
      o.responseFormat = { type: 'json_object' };
    } else {
      let parsed;
      try {
        parsed = JSON.parse(schema);
      } catch (e) {
        throw new Error(`The JSON schema is not valid JSON: ${e.message}`);
      }
      o.responseFormat = { type: 'json_schema', json_schema: { schema: parsed } };
    }
  }
  if ($('speculative').value) {
    o.speculative = {
      method: $('speculative').value,
      k: number('spec-k'),
      adaptive: $('spec-adaptive').checked,
    };
  }
  return o;
}

/** The presets' temperature, top-k and top-p, from the engine's own table (`info.presets`). */
let PRESETS = {};

/** Keeps the loaded engine's presets for the preset menu. */
function keepPresets(info) {
  PRESETS = Object.fromEntries((info.presets ?? []).map((p) => [
    p.name, { temperature: p.temperature, 'top-k': p.topK, 'top-p': p.topP },
  ]));
}

$('preset').addEventListener('change', () => {
  const preset = PRESETS[$('preset').value];
  if (!preset) return;
  for (const [id, value] of Object.entries(preset)) $(id).value = String(value);
});

function setStat(id, text) {
  $(id).textContent = text;
}

async function send() {
  const text = $('prompt').value.trim();
  if (!text || !loaded || generating) return;
  hideError();
  $('prompt').value = '';
  history.push({ role: 'user', content: text });
  const userBubble = addMessage('user', text);
  const bubble = addMessage('assistant', '');
  bubble.dataset.state = 'generating';
  const content = bubble.querySelector('.content');
  generating = true;
  setStatus('generating', 'Generating…');
  const system = $('system').value.trim();
  const messages = system ? [{ role: 'system', content: system }, ...history] : [...history];
  const sent = performance.now();
  let first = null;
  let count = 0;
  let drafted = 0;
  setStat('spec', $('speculative').value ? '…' : 'off');
  setStat('ttft', '…');
  setStat('tps', '…');
  setStat('tokens', '0');
  try {
    const result = await client.generate(messages, options(), (event) => {
      if (event.beam) {
        // beam search: the leading beam so far
        content.textContent = event.beam.text;
        bubble.scrollIntoView({ block: 'end' });
        return;
      }
      content.textContent += event.text;
      if (event.id === null) return;
      count += 1;
      if (event.drafted) drafted += 1;
      if (event.drafted !== undefined) {
        setStat('spec', `${((100 * drafted) / count).toFixed(0)}% of tokens drafted`);
      }
      const now = performance.now();
      if (first === null) {
        first = now;
        setStat('ttft', `${((now - sent) / 1000).toFixed(2)} s`);
      } else {
        setStat('tps', `${((count - 1) / ((now - first) / 1000)).toFixed(2)} tok/s`);
      }
      setStat('tokens', String(count));
      bubble.scrollIntoView({ block: 'end' });
    });
    content.textContent = result.text;
    if ($('json-output').checked) showParsed(bubble, result);
    bubble.dataset.finish = result.finishReason;
    bubble.dataset.tokens = String(result.tokens.length);
    bubble.dataset.state = 'done';
    if (result.finishReason === 'abort') {
      const stopped = document.createElement('span');
      stopped.className = 'finish';
      stopped.textContent = 'stopped';
      bubble.append(stopped);
    }
    history.push({ role: 'assistant', content: result.text });
    // #messages[data-kept] says how many messages the private file system holds once written
    const keeping = history.length;
    keepConversation(client, modelName, history).then((kept) => {
      $('messages').dataset.kept = kept ? String(keeping) : 'no';
    });
    const s = result.stats;
    setStat('ttft', `${(s.timeToFirstTokenMs / 1000).toFixed(2)} s`);
    setStat('tps', s.decodeTokPerS > 0 ? `${s.decodeTokPerS.toFixed(2)} tok/s` : '–');
    setStat('tokens', `${s.generatedTokens} (prompt ${s.promptTokens})`);
    setStat('cached', `${s.cachedTokens} tokens`);
    const sp = s.speculative;
    setStat('spec', sp
      ? `${sp.accepted}/${sp.drafted} drafts accepted (${(100 * sp.acceptanceRate).toFixed(0)}%), `
        + `${sp.targetSteps} model steps`
      : 'off');
    generating = false;
    setStatus('ready', 'Ready.');
  } catch (e) {
    // Undo the turn and give the text back, so Retry (or Send) asks again.
    history.pop();
    userBubble.remove();
    bubble.remove();
    $('prompt').value = text;
    generating = false;
    const kind = kindOf(e);
    unusable = kind === 'Panic' || kind === 'Worker';
    showError(e, { retry: !unusable });
    setStatus(unusable ? 'error' : 'ready', unusable ? 'The engine stopped.' : 'Ready (the last reply failed).');
  }
}

function newChat() {
  history = [];
  delete $('messages').dataset.kept;
  $('messages').replaceChildren();
  for (const id of ['ttft', 'tps', 'tokens', 'cached', 'spec']) setStat(id, '–');
}

async function main() {
  $('default-model-name').textContent = DEFAULT_MODEL.split('/').pop();
  $('chat').addEventListener('submit', (event) => {
    event.preventDefault();
    send();
  });
  $('prompt').addEventListener('keydown', (event) => {
    if (event.key === 'Enter' && !event.shiftKey) {
      event.preventDefault();
      send();
    }
  });
  $('stop').addEventListener('click', () => client?.abort());
  $('reset').addEventListener('click', async () => {
    hideError();
    newChat();
    await client.reset();
    if (modelName) await forgetConversation(modelName);
  });
  $('retry').addEventListener('click', () => {
    hideError();
    send();
  });
  $('load').addEventListener('click', () => load());
  $('draft-file').addEventListener('change', () => loadDraft());
  $('model-file').addEventListener('change', () => {
    document.querySelector('input[name="model-source"][value="file"]').checked = true;
  });
  $('model-url').addEventListener('input', () => {
    document.querySelector('input[name="model-source"][value="url"]').checked = true;
  });
  // A .gguf dropped anywhere on the page (or every part of a split one) becomes the picked
  // file and loads.
  document.addEventListener('dragover', (event) => event.preventDefault());
  document.addEventListener('drop', (event) => {
    event.preventDefault();
    const files = event.dataTransfer?.files;
    if (!files?.length || !client || generating || unusable) return;
    $('model-file').files = files;
    document.querySelector('input[name="model-source"][value="file"]').checked = true;
    load();
  });
  if (OFFLINE) {
    for (const el of document.querySelectorAll('.online-only')) el.hidden = true;
    $('offline-note').hidden = false;
    document.querySelector('input[name="model-source"][value="file"]').checked = true;
    // Picking a file is enough: no Load click needed.
    $('model-file').addEventListener('change', () => {
      if ($('model-file').files.length && !generating && !unusable) load();
    });
  }

  // A browser without WebGPU (no navigator.gpu) still runs the model: the engine falls back to
  // the CPU backend and the "Runs on" row says why.
  client = new EngineClient(globalThis.EMBERLM_WORKER_URL, { type: globalThis.EMBERLM_WORKER_TYPE });
  client.version().then((v) => { $('version').textContent = `v${v}`; }, () => {});
  if (!OFFLINE) refreshStored();
  if (OFFLINE) setStatus('idle', 'Pick a GGUF model file (or drop one on this page).');
  else await load();
}

main().catch((e) => {
  showError(e);
  setStatus('error', 'The page failed to start.');
});
