// Demo page: loads the wasm module and shows which GPU adapter emberlm gets.
import init, { gpuInfo, version } from './pkg/emberlm.js';

const status = document.getElementById('status');
const table = document.getElementById('adapter');

function row(label, value) {
  const tr = document.createElement('tr');
  const th = document.createElement('th');
  const td = document.createElement('td');
  th.textContent = label;
  td.textContent = value;
  tr.append(th, td);
  return tr;
}

async function main() {
  await init();
  document.getElementById('version').textContent = `v${version()}`;
  if (!('gpu' in navigator)) {
    throw new Error('This browser has no WebGPU. Use a recent Chrome or Edge, or Firefox/Safari with WebGPU enabled.');
  }
  const info = await gpuInfo();
  const mib = (b) => `${Math.round(b / 2 ** 20)} MiB`;
  table.tBodies[0].append(
    row('Adapter', info.name || '(not disclosed by the browser)'),
    row('Backend', `${info.backend} (${info.device_type})`),
    row('Subgroups', info.subgroups ? 'used' : (info.adapter_features.includes('subgroups') ? 'offered, not used' : 'no')),
    row('shader-f16', info.shader_f16 ? 'yes' : 'no'),
    row('Largest storage binding', mib(info.limits.max_storage_buffer_binding_size)),
    row('Largest buffer', mib(info.limits.max_buffer_size)),
    row('Adapter features', info.adapter_features.join(', ') || 'none'),
  );
  table.hidden = false;
  status.textContent = 'WebGPU is ready.';
  status.dataset.state = 'ready';
}

main().catch((err) => {
  status.textContent = `Error: ${err.message ?? err}`;
  status.classList.add('error');
  status.dataset.state = 'error';
  console.error(err);
});
