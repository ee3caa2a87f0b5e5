// The engine's worker script: start it with `new Worker(url, { type: 'module' })` (EngineClient
// does). It exports nothing.
export {};
