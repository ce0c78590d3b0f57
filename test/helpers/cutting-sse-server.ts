/**
 * A small HTTP server that speaks ebb's resumable-stream protocol for chat, completions and the
 * Responses API, with scripted answers, and cuts its streams where a test says: in the middle of an
 * event, between events, by ending the body early, with the hand-on error event, or with any event
 * a test writes. It keeps every stream a client asked to keep (`x-ebb-resumable: 1`) and serves
 * resumes (`GET …/{id}?stream=true` with `Last-Event-ID` or `starting_after`) from the event after,
 * or refuses them as a test says. It serves under a path prefix (`/lb/v1`) so a client that resumes
 * anywhere but its own base URL finds nothing.
 */
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';

export type Api = 'chat' | 'completions' | 'responses';

/** How one connection of a stream is cut, after `after` whole events of that connection. */
export type Cut =
  /** `hold`: the connection stalls there, open, until the client leaves. */
  | { after: number; kind: 'mid-event' | 'between-events' | 'ended' | 'hand-on' | 'hold' }
  /** Writes the event `text` makes (an error event's shape under test), then ends the body. */
  | { after: number; kind: 'event'; text: (stream: { api: Api; id: string; last: number }) => string };

/** What a resume gets: the stream from after its point, or a refusal. */
export type ResumeAnswer = 'serve' | 404 | 503;

export interface StreamPlan {
  /** One per connection of the stream in order (the POST's, then each resume's); none: served whole. */
  cuts?: Cut[];
  /** One per resume in order; past the list, served. */
  resumes?: ResumeAnswer[];
  /** A resume skips the first event it owes (a store that lost one): the client must not hand on the gap. */
  gap?: boolean;
  /** false: the stream is not kept even when the client asks (a server that does not keep streams). */
  keep?: boolean;
}

export interface SeenRequest {
  method: string;
  /** Path and query. */
  url: string;
  headers: IncomingMessage['headers'];
}

export interface CuttingServer {
  /** The base URL an SDK is given: `http://127.0.0.1:PORT/lb/v1`. */
  baseURL: string;
  /** The plan for the streams started from now on. */
  plan: StreamPlan;
  /** A new plan for a kept stream's connections from now on (a retrieve of a background response). */
  replan(id: string, plan: StreamPlan): void;
  seen: SeenRequest[];
  /** The resumes asked for: `GET` requests of a stream. */
  resumes(): SeenRequest[];
  close(): Promise<void>;
}

const PREFIX = '/lb/v1/';
const MODEL = 'm1';
/** Tokens with two- to four-byte UTF-8 characters, so a cut in the middle of an event can split one. */
export const TOKENS = ['The', ' tide', ' turns', ' twice', ' a', ' day', ':', ' naïve', ' ☃', ' café', ' 🌊', '.'];
const SECOND_TOKENS = ['Moon', ' and', ' sun', ' pull', ' the', ' sea', ' 月', '.'];
const WEATHER_ARGS = ['{"', 'city', '": "', 'Par', 'is', '", "', 'days', '": ', '3', ', "unit": "', 'c', '"}'];
const TIME_ARGS = ['{"tz"', ': "', 'CET', '"}'];

interface KeptStream {
  api: Api;
  id: string;
  /** Every event's text after its `id:` line (`event:` and `data:` lines and the blank line). */
  events: string[];
  kept: boolean;
  /** The cuts of its next connections, the next first. */
  cuts: Cut[];
  resumes: ResumeAnswer[];
  gap: boolean;
}

export async function startCuttingServer(): Promise<CuttingServer> {
  const streams = new Map<string, KeptStream>();
  const seen: SeenRequest[] = [];
  let counter = 0;
  const server = createServer((req, res) => {
    let body = '';
    req.setEncoding('utf8');
    req.on('data', (c: string) => (body += c));
    req.on('end', () => {
      seen.push({ method: req.method ?? '', url: req.url ?? '', headers: req.headers });
      const url = new URL(req.url ?? '/', 'http://x');
      if (!url.pathname.startsWith(PREFIX)) return refuse(res, 404, 'not_found', `no route ${url.pathname}`);
      const path = url.pathname.slice(PREFIX.length);
      if (req.method === 'POST') return post(path, body, req, res);
      if (req.method === 'GET') return get(path, url, req, res);
      refuse(res, 405, 'method_not_allowed', 'no such method');
    });
  });

  function post(path: string, text: string, req: IncomingMessage, res: ServerResponse): void {
    const api: Api | undefined = path === 'chat/completions' ? 'chat' : path === 'completions' ? 'completions' : path === 'responses' ? 'responses' : undefined;
    if (api === undefined) return refuse(res, 404, 'not_found', `no route ${path}`);
    const request = JSON.parse(text) as Record<string, unknown>;
    counter++;
    const id = api === 'chat' ? `chatcmpl-${counter}` : api === 'completions' ? `cmpl-${counter}` : `resp_${counter}`;
    if (request.stream !== true) return json(res, 200, wholeAnswer(api, id));
    const stream: KeptStream = {
      api,
      id,
      events: script(api, id, request),
      kept: handle.plan.keep !== false && (req.headers['x-ebb-resumable'] === '1' || request.background === true),
      cuts: [...(handle.plan.cuts ?? [])],
      resumes: [...(handle.plan.resumes ?? [])],
      gap: handle.plan.gap === true,
    };
    if (stream.kept) streams.set(id, stream);
    void serve(stream, 0, res);
  }

  function get(path: string, url: URL, req: IncomingMessage, res: ServerResponse): void {
    const match = /^(chat\/completions|completions|responses)\/([^/]+)$/.exec(path);
    if (match === null) return refuse(res, 404, 'not_found', `no route ${path}`);
    const stream = streams.get(decodeURIComponent(match[2] as string));
    if (stream === undefined) return refuse(res, 404, 'response_not_found', 'no such response');
    if (url.searchParams.get('stream') !== 'true') return json(res, 200, wholeAnswer(stream.api, stream.id));
    const answer = stream.resumes.shift() ?? 'serve';
    if (answer === 404) return refuse(res, 404, 'response_expired', 'the response is no longer kept');
    if (answer === 503) return refuse(res, 503, 'stream_store_unavailable', 'the stream store cannot be reached');
    const header = req.headers['last-event-id'];
    const after = Number(typeof header === 'string' ? header : (url.searchParams.get('starting_after') ?? -1));
    void serve(stream, after + 1 + (stream.gap ? 1 : 0), res);
  }

  /** Writes a stream's events from `from` on this connection, cut as its plan says. */
  async function serve(stream: KeptStream, from: number, res: ServerResponse): Promise<void> {
    const cut = stream.cuts.shift();
    res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache', ...(stream.kept ? { 'x-ebb-resumable': '1' } : {}) });
    const write = (text: string | Buffer) => new Promise<void>((resolve) => res.write(text, () => resolve()));
    // A comment first (as a keep-alive would be): the headers are out before any cut, and clients pass comments by.
    await write(': stream\n\n');
    let written = 0;
    for (let n = from; n < stream.events.length; n++) {
      const text = `${stream.kept ? `id: ${n}\n` : ''}${stream.events[n]}`;
      if (cut !== undefined && written === cut.after) {
        const last = n - 1;
        if (cut.kind === 'mid-event') {
          const bytes = Buffer.from(text);
          await write(bytes.subarray(0, Math.ceil(bytes.length / 2)));
          res.socket?.destroy();
        } else if (cut.kind === 'between-events') {
          res.socket?.destroy();
        } else if (cut.kind === 'ended') {
          res.end();
        } else if (cut.kind === 'hold') {
          // Nothing more until the client goes.
        } else if (cut.kind === 'event') {
          res.end(cut.text({ api: stream.api, id: stream.id, last }));
        } else {
          res.end(handOnEvent(stream.api, stream.id, last));
        }
        return;
      }
      await write(text);
      written++;
    }
    res.end();
  }

  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as { port: number }).port;
  const handle: CuttingServer = {
    baseURL: `http://127.0.0.1:${port}/lb/v1`,
    plan: {},
    replan(id, plan) {
      const stream = streams.get(id);
      if (stream === undefined) throw new Error(`no kept stream ${id}`);
      Object.assign(stream, { cuts: [...(plan.cuts ?? [])], resumes: [...(plan.resumes ?? [])], gap: plan.gap === true });
    },
    seen,
    resumes: () => seen.filter((r) => r.method === 'GET'),
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
  return handle;
}

/**
 * The protocol's hand-on error event (no `id:` line): a chat or completions `error` object with
 * `resume`; for the Responses API an `error` event with `resume` and the nested `error` object.
 * Its `url` is the frontend's own path, without the load balancer's prefix: a client resumes at its base URL.
 */
export function handOnEvent(api: Api, id: string, last: number, { sequenceNumber = true } = {}): string {
  const path = api === 'chat' ? 'chat/completions' : api === 'completions' ? 'completions' : 'responses';
  const resume = { response_id: id, last_event_id: last, url: `/v1/${path}/${id}?stream=true&starting_after=${last}` };
  const message = 'this frontend is shutting down; resume the stream (another frontend continues it)';
  if (api !== 'responses') return `data: ${JSON.stringify({ error: { message, type: 'server_error', param: null, code: 'stream_interrupted', resume } })}\n\n`;
  // sequence_number: the AI SDK reads an error event as one only with it (test/sdk-probes); the resume point's, so a
  // client that takes it for the last one seen skips nothing. Without it, the protocol's shape as first decided.
  const error = { type: 'server_error', code: 'stream_interrupted', message, param: null };
  const numbered = sequenceNumber ? { sequence_number: last } : {};
  return `event: error\ndata: ${JSON.stringify({ type: 'error', ...numbered, code: 'stream_interrupted', message, param: null, resume, error })}\n\n`;
}

function refuse(res: ServerResponse, status: number, code: string, message: string): void {
  json(res, status, { error: { message, type: status >= 500 ? 'server_error' : 'invalid_request_error', param: null, code } });
}

function json(res: ServerResponse, status: number, body: unknown): void {
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(JSON.stringify(body));
}

const CREATED = 1_800_000_000;
const data = (value: unknown) => `data: ${JSON.stringify(value)}\n\n`;

function wholeAnswer(api: Api, id: string): unknown {
  const text = TOKENS.join('');
  if (api === 'chat') return { id, object: 'chat.completion', created: CREATED, model: MODEL, choices: [{ index: 0, message: { role: 'assistant', content: text }, logprobs: null, finish_reason: 'stop' }], usage: usage(api) };
  if (api === 'completions') return { id, object: 'text_completion', created: CREATED, model: MODEL, choices: [{ index: 0, text, logprobs: null, finish_reason: 'stop' }], usage: usage(api) };
  return responseObject(id, 'completed', text);
}

function usage(api: Api) {
  return api === 'responses'
    ? { input_tokens: 4, input_tokens_details: { cached_tokens: 0 }, output_tokens: TOKENS.length, output_tokens_details: { reasoning_tokens: 0 }, total_tokens: 4 + TOKENS.length }
    : { prompt_tokens: 4, completion_tokens: TOKENS.length, total_tokens: 4 + TOKENS.length };
}

/** The stream's events for a request: text, tool calls, logprobs or two choices, as it asks. */
function script(api: Api, id: string, request: Record<string, unknown>): string[] {
  if (api === 'responses') return responsesScript(id, request);
  if (api === 'completions') {
    const chunk = (text: string, finish: string | null) => data({ id, object: 'text_completion', created: CREATED, model: MODEL, choices: [{ index: 0, text, logprobs: null, finish_reason: finish }] });
    return [...TOKENS.map((t) => chunk(t, null)), chunk('', 'stop'), 'data: [DONE]\n\n'];
  }
  const chunk = (index: number, delta: unknown, finish: string | null = null, logprobs: unknown = null) =>
    data({ id, object: 'chat.completion.chunk', created: CREATED, model: MODEL, service_tier: 'default', choices: [{ index, delta, logprobs, finish_reason: finish }] });
  const events = [chunk(0, { role: 'assistant', content: '' })];
  if (Array.isArray(request.tools)) {
    events.push(chunk(0, { tool_calls: [{ index: 0, id: 'call_weather', type: 'function', function: { name: 'get_weather', arguments: '' } }] }));
    for (const a of WEATHER_ARGS) events.push(chunk(0, { tool_calls: [{ index: 0, function: { arguments: a } }] }));
    events.push(chunk(0, { tool_calls: [{ index: 1, id: 'call_time', type: 'function', function: { name: 'get_time', arguments: '' } }] }));
    for (const a of TIME_ARGS) events.push(chunk(0, { tool_calls: [{ index: 1, function: { arguments: a } }] }));
    events.push(chunk(0, {}, 'tool_calls'));
  } else if (request.n === 2) {
    events.push(chunk(1, { role: 'assistant', content: '' }));
    for (let i = 0; i < Math.max(TOKENS.length, SECOND_TOKENS.length); i++) {
      if (i < TOKENS.length) events.push(chunk(0, { content: TOKENS[i] }));
      if (i < SECOND_TOKENS.length) events.push(chunk(1, { content: SECOND_TOKENS[i] }));
    }
    events.push(chunk(0, {}, 'stop'), chunk(1, {}, 'stop'));
  } else {
    // max_tokens: the text's tokens over and over to that many (a long stream for bench/client-splice).
    const tokens = typeof request.max_tokens === 'number' ? Array.from({ length: request.max_tokens }, (_, i) => TOKENS[i % TOKENS.length] as string) : TOKENS;
    tokens.forEach((t, i) => {
      const logprob = { token: t, logprob: -(i + 1) / 10, bytes: [...Buffer.from(t)], top_logprobs: [{ token: t, logprob: -(i + 1) / 10, bytes: [...Buffer.from(t)] }] };
      events.push(chunk(0, { content: t }, null, request.logprobs === true ? { content: [logprob] } : null));
    });
    events.push(chunk(0, {}, 'stop'));
  }
  if ((request.stream_options as { include_usage?: boolean } | undefined)?.include_usage === true) {
    events.push(data({ id, object: 'chat.completion.chunk', created: CREATED, model: MODEL, service_tier: 'default', choices: [], usage: usage('chat') }));
  }
  events.push('data: [DONE]\n\n');
  return events;
}

function responseObject(id: string, status: string, text: string | undefined, background = false) {
  const output = text === undefined ? [] : [message(text, status === 'completed' ? 'completed' : 'in_progress')];
  return {
    id, object: 'response', created_at: CREATED, status, error: null, incomplete_details: null, background, instructions: null, max_output_tokens: null, model: MODEL,
    service_tier: 'default', output, parallel_tool_calls: true, previous_response_id: null, reasoning: { effort: null, summary: null }, store: true, temperature: 1,
    text: { format: { type: 'text' } }, tool_choice: 'auto', tools: [], top_p: 1, truncation: 'disabled', usage: status === 'completed' ? usage('responses') : null, user: null, metadata: {},
  };
}

const ITEM = 'msg_1';
function message(text: string, status: string) {
  return { id: ITEM, type: 'message', status, role: 'assistant', content: [{ type: 'output_text', text, annotations: [], logprobs: [] }] };
}

function responsesScript(id: string, request: Record<string, unknown>): string[] {
  const background = request.background === true;
  const events: Array<[string, Record<string, unknown>]> = [
    ['response.created', { response: responseObject(id, background ? 'queued' : 'in_progress', undefined, background) }],
    ['response.in_progress', { response: responseObject(id, 'in_progress', undefined, background) }],
    ['response.output_item.added', { output_index: 0, item: { id: ITEM, type: 'message', status: 'in_progress', role: 'assistant', content: [] } }],
    ['response.content_part.added', { item_id: ITEM, output_index: 0, content_index: 0, part: { type: 'output_text', text: '', annotations: [], logprobs: [] } }],
    ...TOKENS.map((t): [string, Record<string, unknown>] => ['response.output_text.delta', { item_id: ITEM, output_index: 0, content_index: 0, logprobs: [], delta: t }]),
  ];
  const text = TOKENS.join('');
  events.push(
    ['response.output_text.done', { item_id: ITEM, output_index: 0, content_index: 0, text, logprobs: [] }],
    ['response.content_part.done', { item_id: ITEM, output_index: 0, content_index: 0, part: { type: 'output_text', text, annotations: [], logprobs: [] } }],
    ['response.output_item.done', { output_index: 0, item: message(text, 'completed') }],
    ['response.completed', { response: responseObject(id, 'completed', text, background) }],
  );
  return events.map(([type, fields], n) => `event: ${type}\n${data({ type, sequence_number: n, ...fields })}`);
}
