import type { FastifyInstance, FastifyRequest } from 'fastify';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { isLoopback } from '../../common/admin-auth.js';
import { allowOnly } from '../../common/http-server.js';

/**
 * The fleet dashboard: one hand-written page (HTML, CSS and JS in one file, no build step, nothing
 * fetched from elsewhere), served from the package by the frontend's admin listener at GET /. It
 * reads GET /workers/events with EventSource (the stream is read-only and as open as GET /workers,
 * so no credential has to travel in a URL) and sends drain and resume with fetch, the admin token
 * as a bearer header. GET /dashboard/info tells it whether it may act.
 */

/** The page, next to this file in the source tree (dist/src/frontend -> src/frontend/dashboard). */
export const DASHBOARD_FILE = fileURLToPath(new URL('../../../../src/frontend/admin/dashboard/index.html', import.meta.url));

export function addDashboard(app: FastifyInstance, opts: { tokenRequired: boolean }): void {
  // Read once, at start: the page is part of the package, and a missing file is a broken install.
  const page = readFileSync(DASHBOARD_FILE, 'utf8');

  allowOnly(app, '/', ['GET']);
  app.get('/', async (_req, reply) =>
    reply
      .header('content-type', 'text/html; charset=utf-8')
      .header('cache-control', 'no-cache')
      // Everything the page needs is in it or on this origin.
      .header('content-security-policy', "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
      .header('x-content-type-options', 'nosniff')
      .send(page),
  );

  allowOnly(app, '/dashboard/info', ['GET']);
  app.get('/dashboard/info', async (req: FastifyRequest) => ({
    // With a token the page asks for it; without one the listener is loopback-only (bind rule), so the page may act.
    admin_auth: opts.tokenRequired ? 'bearer' : 'none',
    writable: opts.tokenRequired || isLoopback(req.socket.localAddress ?? ''),
  }));
}
