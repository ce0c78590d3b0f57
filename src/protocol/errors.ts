/**
 * The closed catalogue of error codes ebb puts on the wire (request plane, Admin APIs, the public
 * OpenAI-compatible API), each with the one HTTP status and error type it is answered with. Worker
 * and frontend both read codes from here: a code that is not in this table cannot be sent. What the
 * frontend does with each code when a worker answers with it is in worker-answers.ts.
 *
 * Types are OpenAI's, so its SDKs and clients read them as they read OpenAI's own answers:
 * `invalid_request_error` for 4xx, `requests` for a 429 (its code `rate_limit_exceeded`), and
 * `server_error` for every 5xx. The codes OpenAI gives a body that fails its schema (an integer
 * below its minimum, a missing parameter, ...) are here too, under OpenAI's names.
 */

export const ERROR_CODES = {
  // Client errors
  invalid_request: { status: 400, type: 'invalid_request_error' },
  // A body that fails the route's schema: OpenAI's codes, each naming the field at fault in `param` (schema-errors.ts).
  invalid_type: { status: 400, type: 'invalid_request_error' },
  invalid_value: { status: 400, type: 'invalid_request_error' },
  missing_required_parameter: { status: 400, type: 'invalid_request_error' },
  integer_below_min_value: { status: 400, type: 'invalid_request_error' },
  integer_above_max_value: { status: 400, type: 'invalid_request_error' },
  decimal_below_min_value: { status: 400, type: 'invalid_request_error' },
  decimal_above_max_value: { status: 400, type: 'invalid_request_error' },
  empty_array: { status: 400, type: 'invalid_request_error' },
  array_below_min_length: { status: 400, type: 'invalid_request_error' },
  array_above_max_length: { status: 400, type: 'invalid_request_error' },
  empty_string: { status: 400, type: 'invalid_request_error' },
  string_below_min_length: { status: 400, type: 'invalid_request_error' },
  string_above_max_length: { status: 400, type: 'invalid_request_error' },
  /** A response_format JSON Schema whose guided generation would cost more than ebb bounds it to (schema-bounds.ts). */
  invalid_json_schema: { status: 400, type: 'invalid_request_error' },
  /** A tool's parameters schema likewise. */
  invalid_function_parameters: { status: 400, type: 'invalid_request_error' },
  /** A field the route's schema does not allow (where it allows none it does not know). */
  unknown_parameter: { status: 400, type: 'invalid_request_error' },
  /** No Authorization: Bearer header where one is needed. */
  unauthorized: { status: 401, type: 'invalid_request_error' },
  /** A client API key (--api-key-file) that is not one of the keys: OpenAI's answer, which its SDKs raise as AuthenticationError. */
  invalid_api_key: { status: 401, type: 'invalid_request_error' },
  forbidden: { status: 403, type: 'invalid_request_error' },
  not_found: { status: 404, type: 'invalid_request_error' },
  model_not_found: { status: 404, type: 'invalid_request_error' },
  worker_not_found: { status: 404, type: 'invalid_request_error' },
  kv_transfer_not_found: { status: 404, type: 'invalid_request_error' },
  /** A LoRA adapter this worker cannot load (the Admin API's adapter routes, a request plane call naming one). */
  adapter_not_found: { status: 404, type: 'invalid_request_error' },
  /** A resume or retrieve of a response id this frontend never kept (or another process of a fleet without a shared store). */
  response_not_found: { status: 404, type: 'invalid_request_error' },
  /** A response kept once, past its resume window (or over the store's bounds): it can no longer be streamed. */
  response_expired: { status: 404, type: 'invalid_request_error' },
  method_not_allowed: { status: 405, type: 'invalid_request_error' },
  request_timeout: { status: 408, type: 'invalid_request_error' },
  shutdown_in_progress: { status: 409, type: 'invalid_request_error' },
  /** The frontend admin API: another scale-down of the model is choosing and draining its victims. */
  scale_down_in_progress: { status: 409, type: 'invalid_request_error' },
  payload_too_large: { status: 413, type: 'invalid_request_error' },
  unsupported_media_type: { status: 415, type: 'invalid_request_error' },
  header_fields_too_large: { status: 431, type: 'invalid_request_error' },
  /**
   * The frontend's admission queue shed the request: its model's queue is full (or a flex request's
   * wait would pass the queue timeout), or it waited the whole --queue-timeout and no worker could
   * take it. The message says which; retry after Retry-After. OpenAI's code and type for a 429.
   */
  rate_limit_exceeded: { status: 429, type: 'requests', retryable: true },
  /**
   * The tenant's token budget for the day or the month (--limits-file) is spent, or the request asks
   * for more than is left of it: OpenAI's answer to a spent quota, which a retry within the period
   * does not help (x-should-retry: false); Retry-After says when the period turns.
   */
  insufficient_quota: { status: 429, type: 'insufficient_quota' },
  /** A request field no worker of the model can honour (its engines do not declare the capability). */
  unsupported_parameter: { status: 400, type: 'invalid_request_error' },
  /** The prompt (with the tokens asked for) does not fit the engine's context; OpenAI's code for it. */
  context_length_exceeded: { status: 400, type: 'invalid_request_error' },
  // Refusals: retryable on another worker (or shortly), the work was never started
  worker_draining: { status: 503, type: 'server_error', retryable: true },
  worker_overloaded: { status: 503, type: 'server_error', retryable: true },
  no_serving_worker: { status: 503, type: 'server_error', retryable: true },
  server_closing: { status: 503, type: 'server_error', retryable: true },
  /** The frontend is at its file-descriptor budget (client connections and worker sockets): retry shortly. */
  frontend_overloaded: { status: 503, type: 'server_error', retryable: true },
  /** Every connection of a listener is busy: only probes are answered on the extra ones. */
  listener_busy: { status: 503, type: 'server_error', retryable: true },
  /** The worker's engine is still loading (a model can take minutes); it is not in discovery yet. */
  worker_loading: { status: 503, type: 'server_error', retryable: true },
  /** A continuation (stream migration) sent to a worker whose engine cannot continue a sequence. */
  continuation_unsupported: { status: 503, type: 'server_error', retryable: true },
  /** The fleet's shared limits (--limits-file, counted in the --stream-store Redis) cannot be read and the frontend fails closed (--limits-store-down closed). */
  limits_unavailable: { status: 503, type: 'server_error', retryable: true },
  /** The stream store (Redis) cannot be reached: resumes are refused until it is back; new streams run unkept. */
  stream_store_unavailable: { status: 503, type: 'server_error', retryable: true },
  /** The fleet's copy of a stream is missing events (the store lost some): never served with a gap; its frontend rewrites it whole. */
  stream_copy_incomplete: { status: 503, type: 'server_error', retryable: true },
  /** A non-streaming request handed off at a drain deadline: nothing was returned, retry elsewhere. */
  request_handed_off: { status: 503, type: 'server_error', retryable: true },
  /** The request's LoRA adapter is draining on this worker (its in-flight finishing before an unload): retry on another. */
  adapter_draining: { status: 503, type: 'server_error', retryable: true },
  /** Every adapter slot of this worker holds an adapter with requests in flight: none can be evicted for this one now. */
  adapter_slots_busy: { status: 503, type: 'server_error', retryable: true },
  // Server-side failures
  internal_error: { status: 500, type: 'server_error' },
  engine_error: { status: 500, type: 'server_error' },
  discovery_unavailable: { status: 502, type: 'server_error' },
  worker_unreachable: { status: 502, type: 'server_error' },
  worker_identity_mismatch: { status: 502, type: 'server_error' },
  kv_transfer_failed: { status: 502, type: 'server_error' },
  /** The engine failed to load a LoRA adapter (a bad path, the engine server refused it). */
  adapter_load_failed: { status: 502, type: 'server_error' },
  /** A worker answered in a way the request plane does not allow (frontend and worker disagree on the protocol). */
  worker_protocol_error: { status: 502, type: 'server_error' },
  /**
   * Workers died, went silent or had their engine fail under this request one after the other
   * (frontend/relay/worker-losses.ts): it is not sent to another, as the request itself may be what
   * breaks them. Not retryable as it is.
   */
  request_broke_workers: { status: 500, type: 'server_error' },
  // Only ever inside an already-committed stream (SSE error event or NDJSON terminal line)
  worker_failed_mid_stream: { status: 502, type: 'server_error' },
  worker_shut_down: { status: 503, type: 'server_error' },
  /** A stream that broke (or was handed off) and that no other worker could continue. */
  migration_failed: { status: 502, type: 'server_error' },
  /** A kept stream this frontend let go of (its shutdown, a lost lease): the error carries where to resume it, at any frontend. */
  stream_interrupted: { status: 503, type: 'server_error', retryable: true },
  /** A stream followed at another frontend that cannot go on (its copy expired, is incomplete, or could not be continued). */
  stream_lost: { status: 502, type: 'server_error' },
  /** A kept stream whose client left and that nobody resumed within the grace: its generation was stopped. */
  stream_abandoned: { status: 503, type: 'server_error' },
  /** A background response cancelled by its client. */
  cancelled: { status: 499, type: 'invalid_request_error' },
} as const satisfies Record<string, { status: number; type: string; retryable?: boolean }>;

export type ErrorCode = keyof typeof ERROR_CODES;

/** Every error body ebb serves has this one shape (OpenAI's): `param` is always there, null when no one field is at fault. */
export interface ErrorBody {
  error: { message: string; type: string; param: string | null; code: ErrorCode; retryable?: boolean; [extra: string]: unknown };
}

export function isErrorCode(code: unknown): code is ErrorCode {
  return typeof code === 'string' && Object.hasOwn(ERROR_CODES, code);
}

export function errorBody(code: ErrorCode, message: string, extra: Record<string, unknown> = {}): ErrorBody {
  const entry: { type: string; retryable?: boolean } = ERROR_CODES[code];
  const body: ErrorBody = { error: { message, type: entry.type, param: null, code, ...extra } };
  if (entry.retryable) body.error.retryable = true;
  return body;
}

/** An error answered with its catalogue code's status; `headers` are set on the response too. */
export class EbbError extends Error {
  readonly status: number;
  headers?: Record<string, string>;
  /** The request field at fault (OpenAI's `param`), for a client error about one field. */
  readonly param: string | undefined;

  constructor(
    readonly code: ErrorCode,
    message: string,
    opts: { headers?: Record<string, string>; cause?: unknown; param?: string } = {},
  ) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.status = ERROR_CODES[code].status;
    if (opts.headers) this.headers = opts.headers;
    this.param = opts.param;
  }

  body(): ErrorBody {
    return errorBody(this.code, this.message, this.param === undefined ? {} : { param: this.param });
  }
}

/** The code of an error body read off the wire; undefined for anything not in the catalogue. */
export function codeOf(body: unknown): ErrorCode | undefined {
  const code = (body as { error?: { code?: unknown } } | undefined)?.error?.code;
  return isErrorCode(code) ? code : undefined;
}
