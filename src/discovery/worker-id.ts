/**
 * What a worker id may be. An id is a path segment of every admin route (`/workers/{id}/drain`), a
 * discovery key and a column of `ebb workers`: an id over Fastify's parameter bound was listed yet
 * could not be addressed (414), and `..` could not be acted on from the dashboard (the browser
 * resolves it away). So ids are checked where a worker takes one (`--worker-id`) and where a
 * record is read from discovery (a record with a bad id is ignored, as a malformed one is).
 */

/** A Kubernetes pod name (253 bytes), the deploy example's `--worker-id=$(POD_NAME)`, fits. */
export const MAX_WORKER_ID_BYTES = 253;

/** Why `id` is not a worker id, or undefined when it is one. */
export function workerIdProblem(id: string): string | undefined {
  if (id === '') return 'a worker id cannot be empty';
  if (Buffer.byteLength(id, 'utf8') > MAX_WORKER_ID_BYTES) return `a worker id has at most ${MAX_WORKER_ID_BYTES} bytes (UTF-8)`;
  if (id === '.' || id === '..') return `a worker id cannot be "${id}" (a path segment that URLs resolve away)`;
  // Controls, format characters (bidi overrides), whitespace and line separators: an id is printed raw-safe and typed by operators.
  if (/[\p{C}\p{Z}]/u.test(id)) return 'a worker id cannot hold control, format or whitespace characters';
  if (/[/\\]/.test(id)) return 'a worker id cannot hold "/" or "\\"';
  return undefined;
}

export function isWorkerId(id: unknown): id is string {
  return typeof id === 'string' && workerIdProblem(id) === undefined;
}
