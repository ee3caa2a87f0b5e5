// tokenStream: one generation's token events as an async iterator, whose return value
// (`done: true`) is the generation's result. Both `Engine.stream()` (the wasm module imports
// this file) and `EngineClient.stream()` (www/client.js, over worker messages) are built on it.

/**
 * Starts a generation and returns its TokenStream.
 *
 * `begin(onToken)` starts (or queues) the generation: it calls `onToken(event)` for each token
 * event, in order, and returns `{ result, cancel }`: `result` is a promise of the generation's
 * result, `cancel()` stops this generation (whether running or still waiting its turn) and may
 * return a promise. Events are queued until asked for (nothing waits on the reader); a failure
 * of the generation (or of `begin` itself) rejects the `next()` after the events before it;
 * `return()` (leaving a `for await` loop early) cancels the generation and drops what is queued.
 */
export function tokenStream(begin) {
  const queue = [];
  const waiting = [];
  let end = null; // { ok: true, result } or { ok: false, error }, once the generation settled
  let over = false; // the end was handed out, or return() was called
  const deliver = (event) => {
    if (over) return;
    const step = { value: event, done: false };
    if (waiting.length) waiting.shift().resolve(step);
    else queue.push(step);
  };
  const settle = (outcome) => {
    if (end) return;
    end = outcome;
    // Only the first waiting next() gets the outcome; any others see the end.
    while (waiting.length) {
      const { resolve, reject } = waiting.shift();
      if (over) {
        resolve({ value: undefined, done: true });
        continue;
      }
      over = true;
      if (outcome.ok) resolve({ value: outcome.result, done: true });
      else reject(outcome.error);
    }
  };
  let cancel = () => undefined;
  try {
    const started = begin(deliver);
    cancel = started.cancel;
    Promise.resolve(started.result).then(
      (result) => settle({ ok: true, result }),
      (error) => settle({ ok: false, error }),
    );
  } catch (error) {
    settle({ ok: false, error });
  }
  return {
    next() {
      if (queue.length) return Promise.resolve(queue.shift());
      if (over) return Promise.resolve({ value: undefined, done: true });
      if (end) {
        over = true;
        return !end.ok ? Promise.reject(end.error) : Promise.resolve({ value: end.result, done: true });
      }
      return new Promise((resolve, reject) => waiting.push({ resolve, reject }));
    },
    async return(value) {
      const running = !end;
      over = true;
      queue.length = 0;
      while (waiting.length) waiting.shift().resolve({ value: undefined, done: true });
      if (running) await cancel();
      return { value, done: true };
    },
    [Symbol.asyncIterator]() {
      return this;
    },
  };
}
