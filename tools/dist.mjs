// Builds the distributable forms of emberlm from www/ and the wasm-bindgen output in www/pkg/
// (`./build.sh build` makes it):
//   dist/emberlm-demo.html  the chat page as one file that works from file://: styles, the
//                           worker (a Blob URL) and the wasm (gzip, base64) all inlined
//   dist/npm/               the npm package `emberlm`: engine glue, wasm, EngineClient, worker
//                           and the token stream both use (www/token_stream.js)
//
//   node tools/dist.mjs
import { copyFileSync, mkdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { gzipSync } from 'node:zlib';

const PKG = 'www/pkg';
const OUT = 'dist';

const read = (path) => readFileSync(path, 'utf8');
const kib = (bytes) => `${(bytes / 1024).toFixed(0)} KiB`;

/** `text` with `from` replaced by `to`; fails when `from` is missing, so a changed source is noticed. */
function replaceOnce(text, from, to, where) {
  if (!text.includes(from)) throw new Error(`${where}: expected to find ${JSON.stringify(from)}`);
  return text.replace(from, () => to);
}

/** Version from Cargo.toml's [package] section. */
function crateVersion() {
  const m = /^\[package\][^[]*?^version\s*=\s*"([^"]+)"/ms.exec(read('Cargo.toml'));
  if (!m) throw new Error('Cargo.toml: no package version');
  return m[1];
}

// The glue imports the www/ modules the Rust side names (`#[wasm_bindgen(module = "/www/...")]`)
// from the copies wasm-bindgen writes under pkg/snippets/.
const SNIPPET_IMPORT = /^import \* as (\w+) from "(\.\/snippets\/[\w-]+\/www\/([\w-]+\.js))";?$/gm;
// The chat page imports the store of its conversation from next to it.
const SAVED_CHAT_IMPORT = "import { forgetConversation, keepConversation, restoreConversation } from './saved_chat.js';\n";
// EngineClient imports the token stream from next to it.
const CLIENT_IMPORT = "import { tokenStream } from './token_stream.js';\n";

/** The www/ files the glue imports, by the file name in www/. */
function snippets(glue) {
  return [...glue.matchAll(SNIPPET_IMPORT)].map((m) => m[3]);
}

/**
 * The glue with its www/ imports read from `./FILE` instead (the package keeps one copy); the
 * wasm's import module names (`"./snippets/...": import1`) stay as they are.
 */
function sideBySide(glue) {
  return glue.replaceAll(SNIPPET_IMPORT, (line, _alias, path, file) => line.replace(path, `./${file}`));
}

/** A www/ module inlined into a classic script as the namespace object the glue imported. */
function namespace(alias, file) {
  const names = [...read(`www/${file}`).matchAll(/^export (?:async function|function|class|const|let) (\w+)/gm)].map((m) => m[1]);
  return `const ${alias} = (() => {\n${unexported(file)}\nreturn { ${names.join(', ')} };\n})();`;
}

/** A www/ module inlined into a script: its `export`s removed; it must import nothing. */
function unexported(file) {
  const text = read(`www/${file}`);
  if (/^\s*import\s/m.test(text)) throw new Error(`www/${file} imports other files; cannot inline`);
  const inlined = text.replace(/^export (class|function|const|let|async function) /gm, '$1 ');
  if (/^export\s/m.test(inlined)) throw new Error(`www/${file}: module syntax left`);
  return `// www/${file}\n${inlined}`;
}

// The worker imports the glue from ./pkg/ in www/; in the package both sit side by side.
const WORKER_IMPORT = /^import init, \{ ([\w, ]+) \} from '\.\/pkg\/emberlm\.js';$/m;

// ... and the SIMD feature test from next to it ...
const WORKER_SIMD_IMPORT = "import { whySimdMissing, relaxedSimdSupported } from './simd.js';\n";
// ... and finds the wasm module there too.
const WASM_URL = /^const wasmUrl = \(\) => new URL\('\.\/pkg\/emberlm_bg\.wasm', import\.meta\.url\);$/m;

// ... and the threaded build in ./pkg-threads/, which only the served page has: its pool
// workers import the glue by URL, which neither the single-file demo nor a bundler keeps.
const THREADED_BUILD = /^const threadedBuild = \(\) => \(\{\n  glue: new URL\('\.\/pkg-threads\/emberlm\.js', import\.meta\.url\)\.href,\n  wasm: new URL\('\.\/pkg-threads\/emberlm_bg\.wasm', import\.meta\.url\),\n\}\);$/m;
const RELAXED_SINGLE_BUILD = /^const relaxedSingleBuild = \(\) => \(\{\n  glue: new URL\('\.\/pkg-relaxed\/emberlm\.js', import\.meta\.url\)\.href,\n  wasm: new URL\('\.\/pkg-relaxed\/emberlm_bg\.wasm', import\.meta\.url\),\n\}\);$/m;
const RELAXED_BUILD = /^const relaxedBuild = \(\) => \(\{\n  glue: new URL\('\.\/pkg-threads-relaxed\/emberlm\.js', import\.meta\.url\)\.href,\n  wasm: new URL\('\.\/pkg-threads-relaxed\/emberlm_bg\.wasm', import\.meta\.url\),\n\}\);$/m;

/** www/worker.js without the threaded builds (the distributable forms have none). */
function workerSource() {
  const source = read('www/worker.js');
  if (!WORKER_IMPORT.test(source)) throw new Error('www/worker.js: the import of ./pkg/emberlm.js changed');
  if (!WASM_URL.test(source)) throw new Error('www/worker.js: the wasm URL (wasmUrl) changed');
  if (!THREADED_BUILD.test(source)) throw new Error('www/worker.js: the threaded build (threadedBuild) changed');
  if (!RELAXED_BUILD.test(source)) throw new Error('www/worker.js: the relaxed-SIMD build (relaxedBuild) changed');
  if (!RELAXED_SINGLE_BUILD.test(source)) throw new Error('www/worker.js: the single-threaded relaxed-SIMD build (relaxedSingleBuild) changed');
  return source
    .replace(THREADED_BUILD, 'const threadedBuild = null;')
    .replace(RELAXED_BUILD, 'const relaxedBuild = null;')
    .replace(RELAXED_SINGLE_BUILD, 'const relaxedSingleBuild = null;');
}

/**
 * The worker as one classic script (a page on file:// cannot start module workers): the glue,
 * its exports removed, in place of the worker's import line, then the wasm module, gzipped and
 * base64-encoded; globalThis.EMBERLM_WASM decodes it for the worker's init().
 */
function inlineWorker(wasm) {
  const glue = read(`${PKG}/emberlm.js`).replaceAll(SNIPPET_IMPORT, (_, alias, _path, file) => namespace(alias, file));
  if (/^\s*import\s/m.test(glue)) throw new Error(`${PKG}/emberlm.js imports files other than www/ snippets`);
  const init = /^export default (\w+);$/m.exec(glue)?.[1] ?? /^export \{[^}]*\b(\w+) as default\b/m.exec(glue)?.[1];
  if (!init) throw new Error(`${PKG}/emberlm.js: no default export`);
  const classic = glue
    .replace(/^export \{[^}]*\};?$/m, '')
    .replace(/^export default \w+;$/m, '')
    .replace(/^export (class|function|const|let|async function) /gm, '$1 ')
    // Only reached without EMBERLM_WASM, which is always set here.
    .replaceAll('import.meta.url', 'self.location.href');
  if (/^export\s/m.test(classic) || /import\.meta/.test(classic)) throw new Error(`${PKG}/emberlm.js: module syntax left`);
  const base64 = gzipSync(wasm, { level: 9 }).toString('base64');
  const decode = [
    '// The wasm module (gzip, base64), decoded when the worker asks for it.',
    'globalThis.EMBERLM_WASM = () => {',
    `  const text = atob('${base64}');`,
    '  const bytes = new Uint8Array(text.length);',
    '  for (let i = 0; i < text.length; i++) bytes[i] = text.charCodeAt(i);',
    "  const unzipped = new Blob([bytes]).stream().pipeThrough(new DecompressionStream('gzip'));",
    '  return new Response(unzipped).arrayBuffer();',
    '};',
  ].join('\n');
  const inlined = `// wasm-bindgen glue (www/pkg/emberlm.js)\n${classic}\nconst init = ${init};\n${decode}\n`;
  const source = replaceOnce(workerSource(), WORKER_SIMD_IMPORT, `${unexported('simd.js')}\n`, 'www/worker.js')
    .replace(WORKER_IMPORT, () => inlined)
    // never called: EMBERLM_WASM is set (and a classic script has no import.meta)
    .replace(WASM_URL, "const wasmUrl = () => { throw new Error('the single-file demo inlines its wasm'); };");
  return { source, base64Bytes: base64.length };
}

/** A module's source as a JS string literal that is safe inside <script>. */
function scriptString(text) {
  return JSON.stringify(text).replace(/<\/(script)/gi, '<\\/$1').replace(/<!--/g, '<\\!--');
}

/** Page code inlined as it is: it must not end the <script> element early. */
function checkInlineCode(text, where) {
  if (/<\/script|<!--/i.test(text)) throw new Error(`${where}: contains </script or <!--; cannot inline`);
  return text;
}

function buildDemo(wasm) {
  const { source: worker, base64Bytes } = inlineWorker(wasm);
  let client = replaceOnce(read('www/client.js'), CLIENT_IMPORT, `${unexported('token_stream.js')}\n`, 'www/client.js');
  client = replaceOnce(client, 'export class EngineClient', 'class EngineClient', 'www/client.js');
  let app = replaceOnce(read('www/app.js'), "import { EngineClient } from './client.js';\n", '', 'www/app.js');
  app = replaceOnce(app, SAVED_CHAT_IMPORT, `${unexported('saved_chat.js')}\n`, 'www/app.js');
  const css = read('www/style.css');
  if (/<\/style/i.test(css)) throw new Error('www/style.css contains </style');
  const script = [
    "<script>globalThis.EMBERLM_OFFLINE = true; globalThis.EMBERLM_WORKER_TYPE = 'classic';</script>",
    '<script type="module">',
    '// The engine worker: its whole source (glue and wasm included) as text, started from a Blob URL',
    '// as a classic worker.',
    `const WORKER_SOURCE = ${scriptString(worker)};`,
    "globalThis.EMBERLM_WORKER_URL = URL.createObjectURL(new Blob([WORKER_SOURCE], { type: 'text/javascript' }));",
    '// www/client.js',
    checkInlineCode(client, 'www/client.js'),
    '// www/app.js',
    checkInlineCode(app, 'www/app.js'),
    '</script>',
  ].join('\n');
  let html = read('www/index.html');
  html = replaceOnce(html, '<link rel="stylesheet" href="style.css">', `<style>\n${css}</style>`, 'www/index.html');
  html = replaceOnce(html, '<title>emberlm chat</title>', '<title>emberlm chat (offline)</title>', 'www/index.html');
  html = replaceOnce(html, '<script type="module" src="app.js"></script>', script, 'www/index.html');
  const path = `${OUT}/emberlm-demo.html`;
  writeFileSync(path, html);
  console.log(`${path}: ${kib(statSync(path).size)} (wasm ${kib(wasm.length)}, inlined as ${kib(base64Bytes)} of gzip+base64)`);
}

function buildPackage(version) {
  const dir = `${OUT}/npm`;
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(dir, { recursive: true });
  for (const file of ['emberlm.d.ts', 'emberlm_bg.wasm']) copyFileSync(`${PKG}/${file}`, `${dir}/${file}`);
  // One copy of each www/ module, side by side with the glue and the client that import it.
  const glue = read(`${PKG}/emberlm.js`);
  const shared = new Set(['token_stream.js', 'simd.js', ...snippets(glue)]);
  writeFileSync(`${dir}/emberlm.js`, sideBySide(glue));
  for (const file of shared) copyFileSync(`www/${file}`, `${dir}/${file}`);
  copyFileSync('www/client.js', `${dir}/client.js`);
  copyFileSync('www/openai_fetch.js', `${dir}/openai.js`);
  writeFileSync(`${dir}/worker.js`, workerSource()
    .replace(WORKER_IMPORT, "import init, { $1 } from './emberlm.js';")
    .replace(WASM_URL, (url) => url.replaceAll("'./pkg/", "'./")));
  for (const file of ['client.d.ts', 'worker.d.ts', 'openai.d.ts', 'README.md']) copyFileSync(`tools/npm/${file}`, `${dir}/${file}`);
  const files = ['emberlm.js', 'emberlm.d.ts', 'emberlm_bg.wasm', 'client.js', 'client.d.ts', 'worker.js', 'worker.d.ts',
    'openai.js', 'openai.d.ts', ...shared];
  const manifest = {
    name: 'emberlm',
    version,
    description: 'LLM text generation in the browser on WebGPU: GGUF models, streaming, a Worker client',
    license: 'Apache-2.0',
    type: 'module',
    main: './emberlm.js',
    types: './emberlm.d.ts',
    exports: {
      '.': { types: './emberlm.d.ts', default: './emberlm.js' },
      './client': { types: './client.d.ts', default: './client.js' },
      './worker': { types: './worker.d.ts', default: './worker.js' },
      './openai': { types: './openai.d.ts', default: './openai.js' },
      './emberlm_bg.wasm': './emberlm_bg.wasm',
      './package.json': './package.json',
    },
    files,
    // The worker installs its message handler when it runs.
    sideEffects: ['./worker.js'],
    keywords: ['llm', 'webgpu', 'wasm', 'gguf', 'inference', 'worker'],
  };
  writeFileSync(`${dir}/package.json`, `${JSON.stringify(manifest, null, 2)}\n`);
  const wasm = statSync(`${dir}/emberlm_bg.wasm`).size;
  console.log(`${dir}/: emberlm ${version} (wasm ${kib(wasm)})`);
}

mkdirSync(OUT, { recursive: true });
const wasm = readFileSync(`${PKG}/emberlm_bg.wasm`);
buildDemo(wasm);
buildPackage(crateVersion());
