import { randomUUID } from 'node:crypto';

/** What a caller's own X-Request-Id may be to be kept: an id, not text to log (no spaces, no control bytes). */
const SANE = /^[\w.:@/+=-]{1,128}$/;

/**
 * The id every answer of the public API carries as `x-request-id` (OpenAI's answers have one;
 * clients, proxies and support tickets log it): the caller's own when it sent a sane one (a gateway
 * in front propagates its id), else a new `req_...`.
 */
export function requestIdOf(sent: string | string[] | undefined): string {
  return typeof sent === 'string' && SANE.test(sent) ? sent : `req_${randomUUID().replaceAll('-', '')}`;
}
