// Static file server for www/ on 127.0.0.1, used by `./build.sh serve` and the page tests.
// Serves .wasm as application/wasm (required for streaming compilation) and never caches.
// Every response allows any origin (CORS), so the browser tests, on the test runner's own
// origin, can fetch models from it. With `{ isolated: true }` (or `--isolated` on the command
// line) pages are also cross-origin isolated (COOP same-origin + COEP require-corp), which
// SharedArrayBuffer and so multi-threaded wasm (wllama's, in tools/bench_browser.mjs) need.
import { createServer } from 'node:http';
import { createReadStream } from 'node:fs';
import { stat } from 'node:fs/promises';
import { extname, join, normalize, resolve, sep } from 'node:path';
import { fileURLToPath } from 'node:url';

const TYPES = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.mjs': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.json': 'application/json',
  '.wasm': 'application/wasm',
  '.ts': 'text/plain; charset=utf-8',
  '.png': 'image/png',
  '.svg': 'image/svg+xml',
  '.gguf': 'application/octet-stream',
};

/**
 * Starts serving `root`; resolves to { server, url } once listening. Port 0 picks a free one.
 * `options.isolated` adds the cross-origin isolation headers.
 */
export function startServer(root, port = 0, { isolated = false } = {}) {
  const base = resolve(root);
  const server = createServer(async (req, res) => {
    res.setHeader('Access-Control-Allow-Origin', '*');
    if (isolated) {
      res.setHeader('Cross-Origin-Opener-Policy', 'same-origin');
      res.setHeader('Cross-Origin-Embedder-Policy', 'require-corp');
      res.setHeader('Cross-Origin-Resource-Policy', 'cross-origin');
    }
    try {
      const path = decodeURIComponent(new URL(req.url, 'http://x').pathname);
      let file = normalize(join(base, path));
      if (file !== base && !file.startsWith(base + sep)) {
        res.writeHead(403).end('forbidden');
        return;
      }
      let info = await stat(file);
      if (info.isDirectory()) {
        file = join(file, 'index.html');
        info = await stat(file);
      }
      res.writeHead(200, {
        'Content-Type': TYPES[extname(file)] ?? 'application/octet-stream',
        'Content-Length': info.size,
        'Cache-Control': 'no-cache',
      });
      if (req.method === 'HEAD') {
        res.end();
      } else {
        createReadStream(file).pipe(res);
      }
    } catch {
      res.writeHead(404, { 'Content-Type': 'text/plain' }).end('not found');
    }
  });
  return new Promise((ok, fail) => {
    server.once('error', fail);
    server.listen(port, '127.0.0.1', () => {
      ok({ server, url: `http://127.0.0.1:${server.address().port}/` });
    });
  });
}

if (process.argv[1] && fileURLToPath(import.meta.url) === resolve(process.argv[1])) {
  const args = process.argv.slice(2);
  const isolated = args.includes('--isolated');
  const [root = 'www', port = '8080'] = args.filter((a) => a !== '--isolated');
  const { url } = await startServer(root, Number(port), { isolated });
  console.log(`serving ${root}/ at ${url}  (Ctrl-C stops)`);
}
