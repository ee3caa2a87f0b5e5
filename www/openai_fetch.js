// openaiFetch: a `fetch` that answers OpenAI API calls from an emberlm Engine in this page, so
// the official `openai` client (or any code written for the OpenAI HTTP API) runs on the
// user's device: `new OpenAI({ apiKey: 'unused', baseURL: 'https://emberlm.local/v1',
// fetch: openaiFetch(engine), dangerouslyAllowBrowser: true })`.
//
// Routes: POST /v1/chat/completions and /v1/completions (server-sent events with
// `stream: true`), POST /v1/embeddings (where the engine has `embeddings`), GET /v1/models. Errors come back as OpenAI error bodies (400 for a bad
// request, naming the field; 404 for an unknown path).

const encoder = new TextEncoder();

function json(status, body) {
  return new Response(JSON.stringify(body), {
    status,
    headers: { 'content-type': 'application/json' },
  });
}

function failure(status, error) {
  const message = error instanceof Error ? error.message : String(error);
  const type = status === 400 ? 'invalid_request_error' : 'server_error';
  return json(status, { error: { message, type, param: null, code: null } });
}

// The chunks of an async iterator as server-sent events, closed by `data: [DONE]`; cancelling
// the body (the client stopped reading) ends the generation.
function eventStream(chunks) {
  const iterator = chunks[Symbol.asyncIterator] ? chunks[Symbol.asyncIterator]() : chunks;
  return new ReadableStream({
    async pull(controller) {
      try {
        const step = await iterator.next();
        if (step.done) {
          controller.enqueue(encoder.encode('data: [DONE]\n\n'));
          controller.close();
          return;
        }
        controller.enqueue(encoder.encode(`data: ${JSON.stringify(step.value)}\n\n`));
      } catch (error) {
        const body = { error: { message: error?.message ?? String(error), type: 'server_error' } };
        controller.enqueue(encoder.encode(`data: ${JSON.stringify(body)}\n\n`));
        controller.close();
      }
    },
    async cancel() {
      await iterator.return?.();
    },
  });
}

/**
 * A fetch function serving the OpenAI API from `engine` (an emberlm `Engine`).
 * @param {{ chat: { completions: { create(request: object): Promise<any> } }, completions: { create(request: object): Promise<any> }, embeddings?: { create(request: object): Promise<any> } }} engine
 * @param {{ model?: string }} [options] `model`: the id `GET /v1/models` lists (default "emberlm").
 */
export function openaiFetch(engine, options = {}) {
  const model = options.model ?? 'emberlm';
  return async function fetch(input, init = {}) {
    const request = input instanceof Request ? input : new Request(input, init);
    const path = new URL(request.url).pathname.replace(/\/+$/, '');
    const method = request.method.toUpperCase();
    if (path.endsWith('/models') && method === 'GET') {
      return json(200, { object: 'list', data: [{ id: model, object: 'model', created: 0, owned_by: 'emberlm' }] });
    }
    const api = path.endsWith('/chat/completions')
      ? engine.chat.completions
      : path.endsWith('/completions')
        ? engine.completions
        : path.endsWith('/embeddings')
          ? engine.embeddings
          : null;
    if (!api) return failure(404, `no endpoint ${path}`);
    if (method !== 'POST') return failure(405, `${method} is not allowed on ${path}`);
    let body;
    try {
      body = JSON.parse(await request.text());
    } catch (error) {
      return failure(400, `the body is not valid JSON: ${error.message}`);
    }
    let answer;
    try {
      answer = await api.create(body);
    } catch (error) {
      return failure(error?.option ? 400 : 500, error);
    }
    if (body.stream) {
      return new Response(eventStream(answer), {
        status: 200,
        headers: { 'content-type': 'text/event-stream' },
      });
    }
    return json(200, answer);
  };
}
