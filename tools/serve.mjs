// Static file server for www/ on 127.0.0.1, used by `./build.sh serve` and the page tests.
// Serves .wasm as application/wasm (required for streaming compilation) and never caches.
// Every response allows any origin (CORS), so the browser tests, on the test runner's own
// origin, can fetch models from it. With `{ isolated: true }` (or `--isolated` on the command
// line) pages are also cross-origin isolated (COOP same-origin + COEP require-corp), which
// SharedArrayBuffer and so multi-threaded wasm (wllama's, in tools/bench_browser.mjs) need.
// A `Range: bytes=N-` (or N-M) request gets `206` with `Content-Range`, and the headers a
// resumed download reads are exposed across origins. For the download tests, a file's query may
// ask for faults: `?drop=N&id=X&times=K` breaks the connection once byte N of the file is sent,
// on the first K responses whose span holds byte N (at once when it starts there) among requests carrying `id=X` (K = 1 when
// absent), among responses to whole-file or `bytes=N-` requests (downloads; closed spans
// `bytes=A-B` too with `spans=1`); `norange=1` answers every request with the whole file (a
// server without ranges).
// Requests carrying `id=X` are counted: `GET /__served?id=X` answers
// `{ requests, bytes }` (responses started, body bytes they were to send).
import { createServer } from 'node:http';
import { createReadStream } from 'node:fs';
import { Transform } from 'node:stream';
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
/** Faults already served, per `id`. */
const dropped = new Map();

/** Responses started and body bytes they were to send, per `id`. */
const served = new Map();

/** The span `Range: bytes=A-B` asks of a file of `size` bytes, or null to send it whole. */
function askedSpan(header, size) {
  const m = /^bytes=(\d+)-(\d*)$/.exec(header ?? '');
  if (!m) return null;
  const first = Number(m[1]);
  const last = m[2] === '' ? size - 1 : Math.min(Number(m[2]), size - 1);
  return first <= last ? { first, last } : { first, last: -1 };
}

/** A stream that passes `count` bytes on and then breaks the connection of `res`. */
function breakAfter(count, res) {
  let left = count;
  return new Transform({
    transform(chunk, _enc, done) {
      if (left <= 0) return done();
      if (chunk.length < left) {
        left -= chunk.length;
        return done(null, chunk);
      }
      this.push(chunk.subarray(0, left));
      left = 0;
      // let the bytes out, then cut the connection mid-body
      setTimeout(() => res.socket?.destroy(), 50);
      return done();
    },
  });
}

export function startServer(root, port = 0, { isolated = false } = {}) {
  const base = resolve(root);
  const server = createServer(async (req, res) => {
    res.setHeader('Access-Control-Allow-Origin', '*');
    res.setHeader(
      'Access-Control-Expose-Headers',
      'Content-Range, Content-Length, Accept-Ranges, ETag, Last-Modified',
    );
    if (isolated) {
      res.setHeader('Cross-Origin-Opener-Policy', 'same-origin');
      res.setHeader('Cross-Origin-Embedder-Policy', 'require-corp');
      res.setHeader('Cross-Origin-Resource-Policy', 'cross-origin');
    }
    try {
      const requested = new URL(req.url, 'http://x');
      const path = decodeURIComponent(requested.pathname);
      if (path === '/__served') {
        const counts = served.get(requested.searchParams.get('id') ?? '') ?? { requests: 0, bytes: 0 };
        res.writeHead(200, { 'Content-Type': 'application/json', 'Cache-Control': 'no-store' });
        res.end(JSON.stringify(counts));
        return;
      }
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
      const q = requested.searchParams;
      const type = TYPES[extname(file)] ?? 'application/octet-stream';
      const common = {
        'Content-Type': type,
        'Cache-Control': 'no-cache',
        'Last-Modified': info.mtime.toUTCString(),
        ETag: `"${info.size.toString(16)}-${Math.floor(info.mtimeMs).toString(16)}"`,
      };
      let span = q.get('norange') === '1' ? null : askedSpan(req.headers.range, info.size);
      if (span && span.last < 0) {
        res.writeHead(416, { ...common, 'Content-Range': `bytes */${info.size}` }).end();
        return;
      }
      if (span) {
        res.writeHead(206, {
          ...common,
          'Accept-Ranges': 'bytes',
          'Content-Range': `bytes ${span.first}-${span.last}/${info.size}`,
          'Content-Length': span.last - span.first + 1,
        });
      } else {
        span = { first: 0, last: info.size - 1 };
        res.writeHead(200, {
          ...common,
          'Accept-Ranges': q.get('norange') === '1' ? 'none' : 'bytes',
          'Content-Length': info.size,
        });
      }
      const id = q.get('id') ?? '';
      if (id !== '') {
        const counts = served.get(id) ?? { requests: 0, bytes: 0 };
        counts.requests += 1;
        if (req.method !== 'HEAD') counts.bytes += span.last - span.first + 1;
        served.set(id, counts);
      }
      if (req.method === 'HEAD') {
        res.end();
        return;
      }
      const body = createReadStream(file, { start: span.first, end: span.last });
      const drop = q.has('drop') ? Number(q.get('drop')) : NaN;
      const times = q.has('times') ? Number(q.get('times')) : 1;
      const faults = dropped.get(id) ?? 0;
      // faults break downloads (the whole file, or its rest from a byte on: `bytes=N-`); a
      // closed span (`bytes=A-B`, a header or tensors read by range) breaks only with `spans=1`
      const closed = /^bytes=\d+-\d+$/.test(req.headers.range ?? '');
      const breaks = !closed || q.get('spans') === '1';
      if (breaks && drop >= span.first && drop <= span.last && faults < times) {
        dropped.set(id, faults + 1);
        if (drop === span.first) {
          // broken before the first byte of the body
          res.flushHeaders();
          setTimeout(() => res.socket?.destroy(), 50);
          return;
        }
        body.pipe(breakAfter(drop - span.first, res)).pipe(res);
      } else {
        body.pipe(res);
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
