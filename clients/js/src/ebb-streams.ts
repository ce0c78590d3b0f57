/**
 * What ebb's resumable streams look like from a client: which requests stream (chat, completions,
 * the Responses API), where a stream is resumed, how it ends, and the hand-on error event a frontend
 * sends when it passes a stream on to another.
 */
import type { SseEvent } from './sse-events.js';

export type Api = 'chat' | 'completions' | 'responses';

/** The request header that asks ebb to keep a stream, and the answer's header that says it did. */
export const RESUMABLE_HEADER = 'x-ebb-resumable';

/** A streamed generation request, as this fetch sees it on its way out. */
export interface StreamTarget {
  readonly api: Api;
  /** The stream's id when the request names it (a GET of a kept response's stream). */
  readonly responseId: string | undefined;
  /** The event a GET starts after (`starting_after`), when it says. */
  readonly startingAfter: string | undefined;
  /** Where the stream with this id is resumed: the request's own origin and base path, so a load balancer picks a frontend. */
  resumeUrl(responseId: string): string;
}

/** `…/chat/completions`, `…/completions`, `…/responses`, and after it a response id for a GET (the shortest base first: `chat/` is the endpoint's). */
const ENDPOINT = /^(.*?\/)(chat\/completions|completions|responses)(?:\/([^/]+))?$/;
const API_OF: Record<string, Api> = { 'chat/completions': 'chat', completions: 'completions', responses: 'responses' };

/**
 * The stream a request asks for, or undefined when it asks for none of ebb's: a POST with
 * `"stream": true` to a generation endpoint, or a GET of `…/{id}?stream=true`.
 */
export function streamTargetOf(method: string, url: URL, body: string | undefined): StreamTarget | undefined {
  const match = ENDPOINT.exec(url.pathname);
  if (match === null) return undefined;
  const [, prefix, endpoint, id] = match as unknown as [string, string, string, string | undefined];
  const api = API_OF[endpoint];
  if (api === undefined) return undefined;
  if (method === 'POST' && id === undefined) {
    if (!asksToStream(body)) return undefined;
  } else if (method === 'GET' && id !== undefined) {
    if (url.searchParams.get('stream') !== 'true') return undefined;
  } else {
    return undefined;
  }
  return {
    api,
    responseId: id === undefined ? undefined : decodeURIComponent(id),
    startingAfter: method === 'GET' ? (url.searchParams.get('starting_after') ?? undefined) : undefined,
    resumeUrl(responseId) {
      const to = new URL(url);
      to.pathname = `${prefix}${endpoint}/${encodeURIComponent(responseId)}`;
      // The point to start after goes in Last-Event-ID; the original's starting_after would contradict it.
      to.searchParams.delete('starting_after');
      to.searchParams.set('stream', 'true');
      return to.href;
    },
  };
}

function asksToStream(body: string | undefined): boolean {
  if (body === undefined) return false;
  try {
    const parsed = JSON.parse(body) as unknown;
    return typeof parsed === 'object' && parsed !== null && (parsed as { stream?: unknown }).stream === true;
  } catch {
    return false;
  }
}

/**
 * What an event means for the stream: an `output` event is the answer's; `end` is its last
 * (`[DONE]`, or the Responses API's completed, incomplete or failed); `error_end` an error the
 * stream ends with, which the client must see; `hand_on` the error event that says where to resume.
 */
export type EventRole = 'output' | 'end' | 'error_end' | 'hand_on';

const RESPONSES_ENDS = new Set(['response.completed', 'response.incomplete', 'response.failed']);

export function roleOf(api: Api, event: SseEvent): EventRole {
  if (event.data === '[DONE]') return 'end';
  if (api === 'responses') {
    const type = event.event ?? typeOf(event.data);
    if (type !== undefined && RESPONSES_ENDS.has(type)) return 'end';
    if (type !== 'error') return 'output';
    const parsed = parse(event.data);
    return parsed?.resume !== undefined || errorOf(parsed)?.resume !== undefined ? 'hand_on' : 'error_end';
  }
  // Chat and completions: an error is an event whose data has an `error` object. Only data that
  // holds the key "error" is parsed (a token's text has its quotes escaped, so it never matches).
  if (event.event === 'error') return errorOf(parse(event.data))?.resume !== undefined ? 'hand_on' : 'error_end';
  if (!event.data.includes('"error"')) return 'output';
  const error = errorOf(parse(event.data));
  if (error === undefined) return 'output';
  return error.resume !== undefined ? 'hand_on' : 'error_end';
}

/** The response id an event names, if it does: a chunk's `id`, a Responses event's `response.id`. */
export function responseIdOf(api: Api, event: SseEvent): string | undefined {
  if (event.data === '' || event.data === '[DONE]') return undefined;
  const parsed = parse(event.data);
  const id = api === 'responses' ? (parsed?.response as { id?: unknown } | undefined)?.id : parsed?.id;
  return typeof id === 'string' && id !== '' ? id : undefined;
}

/** The response id a hand-on event names (`resume.response_id`), for a stream cut before it said its own. */
export function handOnResponseId(api: Api, event: SseEvent): string | undefined {
  const parsed = parse(event.data);
  const resume = (api === 'responses' ? (parsed?.resume ?? errorOf(parsed)?.resume) : errorOf(parsed)?.resume) as { response_id?: unknown } | undefined;
  return typeof resume?.response_id === 'string' ? resume.response_id : undefined;
}

type Json = Record<string, unknown>;

function parse(data: string): Json | undefined {
  try {
    const parsed = JSON.parse(data) as unknown;
    return typeof parsed === 'object' && parsed !== null ? (parsed as Json) : undefined;
  } catch {
    return undefined;
  }
}

function errorOf(parsed: Json | undefined): Json | undefined {
  const error = parsed?.error;
  return typeof error === 'object' && error !== null ? (error as Json) : undefined;
}

function typeOf(data: string): string | undefined {
  const type = parse(data)?.type;
  return typeof type === 'string' ? type : undefined;
}
