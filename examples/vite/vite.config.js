import { defineConfig } from 'vite';

export default defineConfig({
  // Serve the package as it is in dev, so its worker and wasm resolve next to client.js.
  optimizeDeps: { exclude: ['emberlm'] },
  // The engine's worker is an ES module.
  worker: { format: 'es' },
});
