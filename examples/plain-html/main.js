// EngineClient straight from the package folder: no bundler, the browser resolves the worker
// and the wasm next to client.js.
import { EngineClient } from '../../dist/npm/client.js';

const $ = (id) => document.getElementById(id);
const client = new EngineClient();

$('model').addEventListener('change', async () => {
  const file = $('model').files[0];
  if (!file) return;
  $('send').disabled = true;
  try {
    const info = await client.load(file, {
      onProgress: ({ phase, loaded, total }) => {
        $('status').textContent = `${phase} ${total ? Math.round((100 * loaded) / total) : loaded}%`;
      },
    });
    $('status').textContent = `${info.model.name} on ${info.adapter || info.backend}`;
    $('send').disabled = false;
  } catch (e) {
    $('status').textContent = e.message;
  }
});

$('send').addEventListener('click', async () => {
  $('output').textContent = '';
  $('send').disabled = true;
  $('stop').disabled = false;
  try {
    // A one-message chat: the model's chat template is applied.
    const messages = [{ role: 'user', content: $('prompt').value }];
    const stream = client.stream(messages, { temperature: 0.7, maxNewTokens: 200 });
    for await (const event of stream) $('output').textContent += event.text;
  } catch (e) {
    $('output').textContent += `\n[${e.message}]`;
  } finally {
    $('send').disabled = false;
    $('stop').disabled = true;
  }
});

// abort() ends the reply between two tokens; the stream finishes normally.
$('stop').addEventListener('click', () => client.abort());
