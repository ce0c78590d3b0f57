import type { FastifyInstance, FastifyRequest } from 'fastify';
import { isLoopbackAddress } from './admin-auth.js';
import { EbbError } from '../protocol/errors.js';

/**
 * The browser boundary of both admin listeners (a worker's system server, the frontend's admin
 * listener). A web page in the operator's browser can reach a loopback listener: without this, a
 * cross-origin POST with no body drains a token-less worker, and a DNS-rebinding page
 * (`Origin: http://evil:PORT`, `Host: evil:PORT`) is same-origin with the listener and reads or
 * drives it at will. The rules, in order:
 *
 * - Probes (GET /live, /health, /ready) are exempt: they reveal nothing, and a probe must never fail on them.
 * - No admin token: only requests addressed to a loopback name (`Host: localhost`, 127.0.0.0/8,
 *   [::1]) are answered; a rebinding page's requests carry the attacker's host name.
 * - A request with an `Origin` (every browser POST has one) must come from an allowed origin: the
 *   listener's own (`http(s)://<Host>`, the dashboard) or one listed in EBB_ADMIN_ORIGINS.
 *   `Origin: null` (sandboxed frames, some redirects) is never allowed.
 * - Mutations (anything but GET/HEAD/OPTIONS) from a browser (an Origin) must be
 *   `Content-Type: application/json`, which no page can send cross-origin without a CORS preflight
 *   (never granted here), and any mutation with a body must be JSON. A body-less POST without an
 *   Origin (curl -X POST, the CLI) stays a plain call.
 *
 * With a token, the bearer header is what guards mutations (a page cannot add it cross-origin
 * without a preflight either); the Host rule is off, so such listeners serve any name they are
 * reached under.
 *
 * - Reads too: with a token, every GET but the listener's open paths (probes, scrapes, the
 *   dashboard's page) needs it. A fleet view names every worker and its internal URLs, an audit
 *   trail who drained what: whoever reaches an admin port off loopback must not read them.
 */

/** Extra origins (comma-separated) allowed to drive the admin listeners: a dashboard behind a reverse proxy. */
export const ADMIN_ORIGINS_ENV = 'EBB_ADMIN_ORIGINS';

/** Paths answered whatever the boundary says: probes must not depend on how they are addressed. */
export const PROBE_PATHS: readonly string[] = ['/live', '/health', '/ready'];

export interface AdminBoundaryOptions {
  /** Whether mutations need an admin token (the listener may then be off loopback). */
  tokenRequired: boolean;
  /**
   * Checks a read (GET, HEAD) of any path but `openReads` when a token is configured: throws the
   * 401 or 403 to answer. Undefined: reads are open (no token: the listener is loopback-only).
   */
  guardRead?: ((authorization: string | undefined) => unknown) | undefined;
  /** GET paths answered without a token besides the probes: a scrape, the dashboard's page. */
  openReads?: readonly string[] | undefined;
  /** Origins allowed besides the listener's own; default: EBB_ADMIN_ORIGINS. */
  allowedOrigins?: readonly string[] | undefined;
}

/** `localhost`, 127.0.0.0/8 or ::1: names only this machine resolves to itself (no `*.localhost`: a resolver may send those to DNS). */
export function isLoopbackHostName(name: string): boolean {
  const h = name.toLowerCase().replace(/^\[(.*)\]$/, '$1');
  // Only the name localhost itself: a Host header is what the page's origin says, not what was dialled.
  return h === 'localhost' || isLoopbackAddress(h);
}

/** A Host header value as a URL (`[::1]:80`, `a:80`, `a`); undefined when it is not a bare host[:port]. */
export function parseHost(host: string): URL | undefined {
  if (!/^[^\s/\\@?#]+$/.test(host)) return undefined;
  try {
    return new URL(`http://${host}`);
  } catch {
    return undefined;
  }
}

const defaultPort = (protocol: string): string => (protocol === 'https:' ? '443' : '80');

/** Whether `origin` names the listener a request was addressed to (`Host`), in either scheme (a TLS proxy in front). */
function isOwnOrigin(origin: URL, host: URL): boolean {
  return origin.hostname === host.hostname && (origin.port || defaultPort(origin.protocol)) === (host.port || defaultPort(origin.protocol));
}

/** An origin in its serialized form (scheme://host[:port], default ports dropped); undefined for anything else. */
export function normalizeOrigin(origin: string): string | undefined {
  if (origin === 'null') return undefined;
  try {
    const u = new URL(origin);
    if (u.protocol !== 'http:' && u.protocol !== 'https:') return undefined;
    return u.origin;
  } catch {
    return undefined;
  }
}

export function originsFromEnv(env: NodeJS.ProcessEnv = process.env): string[] {
  const raw = env[ADMIN_ORIGINS_ENV] ?? '';
  return raw
    .split(',')
    .map((s) => s.trim())
    .filter((s) => s !== '')
    .map((s) => {
      const o = normalizeOrigin(s);
      if (o === undefined) throw new Error(`${ADMIN_ORIGINS_ENV}: "${s}" is not an http(s) origin (like https://ops.example.com)`);
      return o;
    });
}

const SAFE_METHODS = new Set(['GET', 'HEAD', 'OPTIONS']);

function isJson(contentType: string | undefined): boolean {
  return (contentType ?? '').split(';', 1)[0]?.trim().toLowerCase() === 'application/json';
}

function hasBody(req: FastifyRequest): boolean {
  const length = req.headers['content-length'];
  return req.headers['transfer-encoding'] !== undefined || (length !== undefined && length !== '0');
}

/** The path of a request URL without its query. */
const pathOf = (url: string): string => url.split('?', 1)[0] as string;

/** Adds the boundary's checks to an admin listener (before routing, so even unknown paths get them). */
export function addAdminBoundary(app: FastifyInstance, opts: AdminBoundaryOptions): void {
  const allowed = new Set(opts.allowedOrigins ?? originsFromEnv());
  const openReads = new Set(opts.openReads ?? []);
  app.addHook('onRequest', async (req) => {
    const method = req.method;
    if ((method === 'GET' || method === 'HEAD') && PROBE_PATHS.includes(pathOf(req.url))) return;

    const host = req.headers.host ?? '';
    const hostUrl = parseHost(host);
    if (!opts.tokenRequired) {
      if (hostUrl === undefined || !isLoopbackHostName(hostUrl.hostname))
        throw new EbbError(
          'forbidden',
          `this admin listener has no admin token, so it answers only requests addressed to a loopback name (localhost, 127.0.0.1, [::1]); got Host: ${JSON.stringify(host.slice(0, 100))}`,
        );
    }

    const origin = req.headers.origin;
    if (origin !== undefined) {
      const o = normalizeOrigin(origin);
      const own = o !== undefined && hostUrl !== undefined && isOwnOrigin(new URL(o), hostUrl);
      if (o === undefined || !(own || allowed.has(o)))
        throw new EbbError('forbidden', `cross-origin admin call from ${JSON.stringify(origin.slice(0, 200))} refused (allowed: this listener's own origin${allowed.size > 0 ? `, ${[...allowed].join(', ')}` : ''}; see ${ADMIN_ORIGINS_ENV})`);
    }

    if (SAFE_METHODS.has(method)) {
      if ((method === 'GET' || method === 'HEAD') && !openReads.has(pathOf(req.url))) opts.guardRead?.(req.headers.authorization);
      return;
    }
    const contentType = req.headers['content-type'];
    if ((origin !== undefined || hasBody(req) || contentType !== undefined) && !isJson(contentType))
      throw new EbbError('unsupported_media_type', `admin ${method}s take a JSON body: send Content-Type: application/json${origin !== undefined ? ' (required from a browser)' : ''}`);
  });
}
