import type { FastifyInstance, FastifyRequest } from 'fastify';
import { readFileSync } from 'node:fs';
import { isLoopback } from '../../common/admin-auth.js';
import { allowOnly } from '../../common/http-server.js';
import { packageFile } from '../../common/package-files.js';

/**
 * The fleet dashboard: one hand-written page (HTML, CSS and JS in one file, no build step, nothing
 * fetched from elsewhere), served from the package by the frontend's admin listener at GET /. It
 * reads GET /workers/events with fetch (not EventSource, which cannot send a header: the admin token
 * goes as a bearer header, never in a URL) and sends drain and resume the same way. GET
 * /dashboard/info tells it whether it needs the token. The page loads without the token; its data
 * does not: on a listener without a token (loopback only) it comes with the fleet as it is embedded
 * (the snapshot the stream would send first), so its first paint shows the workers before the
 * stream opens; with a token it carries no fleet and asks for the token first.
 */

/** The page, in the source tree (it has no build step). */
export const DASHBOARD_FILE = packageFile('src', 'frontend', 'admin', 'dashboard', 'index.html');

/** The placeholder the page's embedded snapshot replaces (a JSON script element, never executed). */
const INITIAL = '<script type="application/json" id="initial">null</script>';

/** A favicon, so a browser's request for one is not a 404 in the listener's log. */
const FAVICON = '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16"><rect width="16" height="16" rx="3" fill="#3560b5"/><path d="M2 11c2-3 4-3 6 0s4 3 6 0" stroke="#fff" stroke-width="2" fill="none"/></svg>';

/** What the admin listener serves without its token: the page, whether it needs one, its icon. */
export const DASHBOARD_OPEN_PATHS: readonly string[] = ['/', '/dashboard/info', '/favicon.svg', '/favicon.ico'];

export interface DashboardOptions {
  tokenRequired: boolean;
  /** The stream's first event (GET /workers and the per-model minute), embedded in the page. */
  snapshot: () => Promise<unknown>;
}

export function addDashboard(app: FastifyInstance, opts: DashboardOptions): void {
  // Read once, at start: the page is part of the package, and a missing file is a broken install.
  const page = readFileSync(DASHBOARD_FILE, 'utf8');
  if (!page.includes(INITIAL)) throw new Error(`${DASHBOARD_FILE} has no ${INITIAL}`);
  const info = (req: FastifyRequest) => ({
    // With a token the page asks for it; without one the listener is loopback-only (bind rule), so the page may act.
    admin_auth: opts.tokenRequired ? 'bearer' : 'none',
    writable: opts.tokenRequired || isLoopback(req.socket.localAddress ?? ''),
  });

  allowOnly(app, '/', ['GET']);
  app.get('/', async (req, reply) => {
    // The fleet is the token holders' to read: a page served to anyone who reaches the listener carries none.
    const initial = { at: new Date().toISOString(), info: info(req), snapshot: opts.tokenRequired ? null : await opts.snapshot() };
    // `<` escaped: no text from a worker can close the script element.
    const embedded = INITIAL.replace('null', () => JSON.stringify(initial).replaceAll('<', '\\u003c'));
    return reply
      .header('content-type', 'text/html; charset=utf-8')
      .header('cache-control', 'no-cache')
      // Everything the page needs is in it or on this origin.
      .header('content-security-policy', "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
      .header('x-content-type-options', 'nosniff')
      .send(page.replace(INITIAL, () => embedded));
  });

  allowOnly(app, '/dashboard/info', ['GET']);
  app.get('/dashboard/info', async (req: FastifyRequest) => info(req));

  for (const path of ['/favicon.svg', '/favicon.ico']) {
    allowOnly(app, path, ['GET']);
    app.get(path, async (_req, reply) => reply.header('content-type', 'image/svg+xml').header('cache-control', 'max-age=86400').send(FAVICON));
  }
}
