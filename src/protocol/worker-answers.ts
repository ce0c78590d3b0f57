import { isErrorCode, type ErrorCode } from './errors.js';

/**
 * What the frontend does with each error a worker can answer a request-plane call with, before
 * anything reached the client: as a non-200 answer or as the terminal line of a stream that had no
 * token yet. The frontend consults only this table.
 *
 * - `retry_elsewhere`: the worker (or the fleet around it) is at fault, not the request: another
 *   worker may serve it. `hold` keeps the worker out of routing for a while; `keep` leaves it
 *   eligible for this request (the worker is fine, what it needed is gone: prefill again); `follow`:
 *   the refusal holds nothing, but only the worker can say when it ends (an adapter's slot frees on
 *   the worker, maybe by another frontend's stream): the frontend follows its status stream.
 * - `pass_to_client`: the answer is about the request itself; every worker of the model would give
 *   it. The client gets the worker's code, status and message after one attempt.
 * - `bad_gateway`: an answer the request plane does not allow (frontend and worker disagree on the
 *   protocol): the client gets 502 `worker_protocol_error`, nothing is retried.
 */
export type WorkerAnswerAction = 'retry_elsewhere' | 'pass_to_client' | 'bad_gateway';

export interface WorkerAnswer {
  action: WorkerAnswerAction;
  hold?: 'draining' | 'overloaded' | 'unreachable';
  keep?: true;
  follow?: true;
}

const retry: WorkerAnswer = { action: 'retry_elsewhere' };
const pass: WorkerAnswer = { action: 'pass_to_client' };
const bad: WorkerAnswer = { action: 'bad_gateway' };

export const WORKER_ANSWERS: Record<ErrorCode, WorkerAnswer> = {
  // The request itself: the engine refused it (a prompt longer than its context, a field it rejects).
  invalid_request: pass,
  invalid_type: pass,
  invalid_value: pass,
  missing_required_parameter: pass,
  integer_below_min_value: pass,
  integer_above_max_value: pass,
  decimal_below_min_value: pass,
  decimal_above_max_value: pass,
  empty_array: pass,
  array_below_min_length: pass,
  array_above_max_length: pass,
  empty_string: pass,
  string_below_min_length: pass,
  string_above_max_length: pass,
  unknown_parameter: pass,
  invalid_json_schema: pass,
  invalid_function_parameters: pass,
  context_length_exceeded: pass,
  payload_too_large: pass,
  // The fleet, not the client: a worker mid-rotation of the request-plane token, or a decode worker
  // whose discovery view does not yet trust the prefill worker. Another worker may take it.
  unauthorized: { action: 'retry_elsewhere', hold: 'unreachable' },
  forbidden: { action: 'retry_elsewhere', hold: 'unreachable' },
  // Stale discovery: the worker at that address serves another model, or lacks the capability its record declares.
  model_not_found: { action: 'retry_elsewhere', hold: 'unreachable' },
  unsupported_parameter: retry,
  // The worker timed out reading the body or is shutting its server down.
  request_timeout: retry,
  shutdown_in_progress: retry,
  // Refusals: the work never started.
  worker_draining: { action: 'retry_elsewhere', hold: 'draining' },
  worker_overloaded: { action: 'retry_elsewhere', hold: 'overloaded' },
  listener_busy: { action: 'retry_elsewhere', hold: 'overloaded' },
  no_serving_worker: retry,
  server_closing: retry,
  worker_loading: { action: 'retry_elsewhere', hold: 'unreachable' },
  continuation_unsupported: retry,
  request_handed_off: retry,
  // The adapter, not the worker: other requests still go to it (its discovery record says the rest).
  adapter_draining: { action: 'retry_elsewhere', follow: true },
  adapter_slots_busy: { action: 'retry_elsewhere', follow: true },
  // Stale discovery (the adapter was removed there) or an engine that could not load it.
  adapter_not_found: retry,
  adapter_load_failed: retry,
  // The worker's or its engine's failure, not the request's.
  internal_error: retry,
  engine_error: retry,
  discovery_unavailable: retry,
  worker_unreachable: retry,
  worker_identity_mismatch: retry,
  // An admin-listener answer; a worker's request plane never sends it.
  scale_down_in_progress: retry,
  worker_failed_mid_stream: retry,
  worker_shut_down: retry,
  migration_failed: retry,
  worker_protocol_error: retry,
  // A decode worker could not pull the prompt's KV: the worker is fine, the KV is gone.
  kv_transfer_failed: { action: 'retry_elsewhere', keep: true },
  // Not request-plane answers to /generate or /prefill: a worker sending them disagrees on the protocol.
  not_found: bad,
  worker_not_found: bad,
  kv_transfer_not_found: bad,
  method_not_allowed: bad,
  unsupported_media_type: bad,
  header_fields_too_large: bad,
  frontend_overloaded: bad,
  rate_limit_exceeded: bad,
  // The frontend's tenant limits (--limits-file); a worker never counts them.
  insufficient_quota: bad,
  limits_unavailable: bad,
  // The frontend's own answers: to a client's key (a worker's request plane has its own token), and its verdict on a request that broke workers.
  invalid_api_key: bad,
  request_broke_workers: bad,
  // The frontend's own resume answers; never a worker's.
  response_not_found: bad,
  response_expired: bad,
  stream_store_unavailable: bad,
  stream_copy_incomplete: bad,
  stream_interrupted: bad,
  stream_lost: bad,
  stream_abandoned: bad,
  cancelled: bad,
};

/** An answer with no catalogue code (a proxy's page, a non-JSON body): not a worker speaking, so not the client's answer. */
const UNKNOWN: WorkerAnswer = retry;

/** The row for a worker's error code (undefined or off-catalogue: the unknown row). */
export function workerAnswer(code: unknown): WorkerAnswer {
  return isErrorCode(code) ? WORKER_ANSWERS[code] : UNKNOWN;
}
