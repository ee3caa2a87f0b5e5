// www/token_stream.js, the async iterator behind Engine.stream and EngineClient.stream, driven
// by a scripted generation: events in order then the result, early `break` cancels, failures
// are rethrown after the events before them.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { tokenStream } from '../../www/token_stream.js';

/** A generation the test drives: `emit(event)`, `finish(result)`, `fail(error)`. */
function scripted() {
  const g = { cancelled: 0 };
  g.stream = tokenStream((onToken) => {
    g.emit = onToken;
    const result = new Promise((resolve, reject) => {
      g.finish = resolve;
      g.fail = reject;
    });
    return { result, cancel: () => { g.cancelled += 1; } };
  });
  return g;
}

test('events arrive in order, queued or awaited, then the result', async () => {
  const g = scripted();
  assert.equal(g.stream[Symbol.asyncIterator](), g.stream);
  g.emit({ text: 'a' });
  g.emit({ text: 'b' });
  const waiting = g.stream.next();
  const seen = [];
  const first = await g.stream.next();
  seen.push(first.value.text);
  setTimeout(() => {
    g.emit({ text: 'c' });
    g.finish({ text: 'abc' });
  }, 0);
  seen.unshift((await waiting).value.text);
  const rest = [];
  for (;;) {
    const step = await g.stream.next();
    if (step.done) {
      assert.deepEqual(step.value, { text: 'abc' });
      break;
    }
    rest.push(step.value.text);
  }
  assert.deepEqual([...seen, ...rest], ['a', 'b', 'c']);
  assert.deepEqual(await g.stream.next(), { value: undefined, done: true });
  assert.equal(g.cancelled, 0);
});

test('leaving a for-await loop early cancels the generation', async () => {
  const g = scripted();
  g.emit({ text: 'a' });
  g.emit({ text: 'b' });
  for await (const event of g.stream) {
    assert.equal(event.text, 'a');
    break;
  }
  assert.equal(g.cancelled, 1);
  g.emit({ text: 'late' });
  g.finish({ text: 'ab' });
  assert.deepEqual(await g.stream.next(), { value: undefined, done: true });
});

test('a failure is rethrown after the events before it', async () => {
  const g = scripted();
  g.emit({ text: 'a' });
  g.fail(new Error('DeviceLost: gone'));
  const seen = [];
  await assert.rejects(async () => {
    for await (const event of g.stream) seen.push(event.text);
  }, /DeviceLost/);
  assert.deepEqual(seen, ['a']);
  assert.deepEqual(await g.stream.next(), { value: undefined, done: true });
});

test('a generation that cannot start rejects the first next()', async () => {
  const stream = tokenStream(() => {
    throw new Error('InvalidArgument: top_k');
  });
  await assert.rejects(stream.next(), /top_k/);
});
