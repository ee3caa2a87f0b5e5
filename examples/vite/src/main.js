// Vite bundles EngineClient's worker (emberlm/worker) and emits the wasm as an asset.
import { EngineClient } from 'emberlm/client';

const $ = (id) => document.getElementById(id);
const client = new EngineClient();

$('model').addEventListener('change', async () => {
  const info = await client.load($('model').files[0], {
    onProgress: ({ phase, loaded, total }) => { $('status').textContent = `${phase} ${loaded}/${total}`; },
  });
  $('status').textContent = `${info.model.name} on ${info.adapter || info.backend}`;
  $('send').disabled = false;
});

$('send').addEventListener('click', async () => {
  $('output').textContent = '';
  const result = await client.generate($('prompt').value, { maxNewTokens: 128 }, (event) => {
    $('output').textContent += event.text;
  });
  $('status').textContent = `${result.finishReason}, ${result.stats.decodeTokPerS.toFixed(1)} tok/s`;
});
