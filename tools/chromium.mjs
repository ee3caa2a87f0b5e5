// How every Playwright-driven page (the end-to-end tests and the browser bench) launches
// Debian's Chromium: headless, with WebGPU (SwiftShader on machines without a GPU) and without
// anything that reaches the network on its own. webdriver.json gives wasm-pack the same flags.

/** The Chromium binary (`CHROMIUM` overrides it). */
export const CHROMIUM = process.env.CHROMIUM ?? '/usr/bin/chromium';

/** Command-line flags for every launch. */
export const CHROMIUM_ARGS = [
  '--enable-unsafe-webgpu',
  '--no-sandbox',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
  '--no-first-run',
  '--disable-quic',
  '--disable-dev-shm-usage',
];
