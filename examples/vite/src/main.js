// Vite bundles EngineClient's worker (emberlm/worker) and emits the wasm as an asset.
import { EngineClient } from 'emberlm/client';

const $ = (id) => document.getElementById(id);
const client = new EngineClient();

$('model').addEventListener('change', async () => {
  const file = $('model').files[0];
  if (!file) return;
  $('send').disabled = true;
  try {
    const info = await client.load(file, {
      onProgress: ({ phase, loaded, total }) => { $('status').textContent = `${phase} ${loaded}/${total}`; },
    });
    $('status').textContent = `${info.model.name} on ${info.adapter || info.backend}`;
    $('send').disabled = false;
  } catch (e) {
    // a file that is not a model, or one this browser cannot hold, says why
    $('status').textContent = `Error: ${e.message}`;
  }
});

$('send').addEventListener('click', async () => {
  $('output').textContent = '';
  $('send').disabled = true;
  try {
    // An instruct model answers a chat turn (its template added); a bare string is continued
    // as plain text, which such a model may end at once.
    const messages = [{ role: 'user', content: $('prompt').value }];
    const result = await client.generate(messages, { maxNewTokens: 128 }, (event) => {
      $('output').textContent += event.text;
    });
    $('status').textContent = `${result.finishReason}, ${result.stats.decodeTokPerS.toFixed(1)} tok/s`;
  } catch (e) {
    $('status').textContent = `Error: ${e.message}`;
  } finally {
    $('send').disabled = false;
  }
});
