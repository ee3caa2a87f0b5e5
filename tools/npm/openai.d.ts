// Types of emberlm/openai: a fetch function that answers OpenAI API calls from an emberlm
// engine in the page (or an EngineClient), for the official `openai` client or any code written
// for the OpenAI HTTP API.

/** What `openaiFetch` needs: an `Engine` or an `EngineClient` (both have these). */
export interface OpenAiEngine {
  chat: { completions: { create(request: object): Promise<any> } };
  completions: { create(request: object): Promise<any> };
  /** `POST /v1/embeddings` is answered where the engine has it (both have). */
  embeddings?: { create(request: object): Promise<any> };
}

/** Options of `openaiFetch`. */
export interface OpenAiFetchOptions {
  /** The model id `GET /v1/models` lists (default "emberlm"). */
  model?: string;
}

/**
 * A `fetch` serving `POST /v1/chat/completions`, `POST /v1/completions` (server-sent events
 * with `stream: true`), `POST /v1/embeddings` and `GET /v1/models` from `engine`:
 * `new OpenAI({ apiKey: 'unused', baseURL: 'https://emberlm.local/v1', fetch: openaiFetch(engine),
 * dangerouslyAllowBrowser: true })`. A bad request answers 400 with an OpenAI error body naming
 * the field; an unknown path 404.
 */
export function openaiFetch(
  engine: OpenAiEngine,
  options?: OpenAiFetchOptions,
): (input: RequestInfo | URL, init?: RequestInit) => Promise<Response>;
