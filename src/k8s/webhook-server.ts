import Fastify, { type FastifyError, type FastifyInstance, type FastifyReply } from 'fastify';
import { watch, type FSWatcher } from 'node:fs';
import { readFile } from 'node:fs/promises';
import type { Server as HttpsServer } from 'node:https';
import type { AddressInfo } from 'node:net';
import { dirname } from 'node:path';
import { createSecureContext } from 'node:tls';
import type { Logger } from 'pino';
import { answerClientError } from '../common/http-server.js';
import { EbbError, errorBody, type ErrorCode } from '../protocol/errors.js';
import { admissionResponse, parseAdmissionReview, type AdmissionRequest, type Verdict } from './admission-review.js';

/**
 * The HTTPS listener the API server calls (webhooks are HTTPS only): POST a review to
 * EVICTION_PATH, get the verdict; /live and /health for the kubelet's probes. The certificate and
 * key are read again when their files change (a Secret volume swaps its files on renewal, e.g. by
 * cert-manager), so a renewed certificate is served without a restart.
 */

export const EVICTION_PATH = '/validate/pods-eviction';

export interface WebhookServerOptions {
  host: string;
  port: number;
  certFile: string;
  keyFile: string;
  review: (req: AdmissionRequest) => Promise<Verdict>;
}

export interface WebhookServer {
  url: string;
  close(): Promise<void>;
}

/** AdmissionReviews for an eviction are a few KB; the API server never sends more than an object's 3 MiB. */
const BODY_LIMIT = 3 * 1024 * 1024;

async function readPair(certFile: string, keyFile: string): Promise<{ cert: Buffer; key: Buffer }> {
  const [cert, key] = await Promise.all([readFile(certFile), readFile(keyFile)]);
  return { cert, key };
}

export async function startWebhookServer(opts: WebhookServerOptions, log: Logger): Promise<WebhookServer> {
  let pair: { cert: Buffer; key: Buffer };
  try {
    pair = await readPair(opts.certFile, opts.keyFile);
    createSecureContext(pair); // a key that does not match its certificate fails here, not at the first handshake
  } catch (err) {
    throw new Error(`cannot load the TLS certificate ${opts.certFile} and key ${opts.keyFile}: ${(err as Error).message}`);
  }
  const app: FastifyInstance<HttpsServer> = Fastify({
    https: pair,
    logger: false,
    bodyLimit: BODY_LIMIT,
    requestTimeout: 30_000,
    keepAliveTimeout: 65_000, // the API server keeps its connections to a webhook open
    clientErrorHandler: answerClientError,
    frameworkErrors: (err, _req, reply) => void (reply as FastifyReply).code(400).send(errorBody('invalid_request', err.message)),
  });
  app.setNotFoundHandler((req, reply) => void reply.code(404).send(errorBody('not_found', `no route for ${req.method} ${req.url}`)));
  app.setErrorHandler((err: FastifyError | EbbError, _req, reply) => {
    if (err instanceof EbbError) return reply.code(err.status).send(err.body());
    const status = err.statusCode && err.statusCode >= 400 && err.statusCode < 600 ? err.statusCode : 500;
    const code: ErrorCode = status === 400 ? 'invalid_request' : status === 415 ? 'unsupported_media_type' : status === 413 ? 'payload_too_large' : 'internal_error';
    return reply.code(status).send(errorBody(code, err.message));
  });
  app.get('/live', async () => ({ status: 'ok' }));
  app.get('/health', async () => ({ status: 'ok' }));
  app.post(EVICTION_PATH, async (req) => {
    const request = parseAdmissionReview(req.body);
    return admissionResponse(request.uid, await opts.review(request));
  });

  // Reload on change: watch the directories, since a Secret volume replaces its files by swapping a
  // symlink (..data), which a watch on the file itself misses.
  let reloading = false;
  let again = false;
  const reload = async () => {
    if (reloading) {
      again = true;
      return;
    }
    reloading = true;
    try {
      do {
        again = false;
        let next: { cert: Buffer; key: Buffer };
        try {
          next = await readPair(opts.certFile, opts.keyFile);
        } catch {
          continue; // mid-swap: the next change event comes
        }
        if (next.cert.equals(pair.cert) && next.key.equals(pair.key)) continue;
        try {
          app.server.setSecureContext(next);
          pair = next;
          log.info({ event: 'tls_reloaded', cert: opts.certFile }, `TLS certificate reloaded from ${opts.certFile}`);
        } catch (err) {
          // The certificate written before its key (or the reverse): keep serving the old pair until both match.
          log.warn({ event: 'tls_reload_failed', err: (err as Error).message }, `TLS files changed but do not load as a pair yet: ${(err as Error).message}`);
        }
      } while (again);
    } finally {
      reloading = false;
    }
  };
  const watchers: FSWatcher[] = [...new Set([dirname(opts.certFile), dirname(opts.keyFile)])].map((dir) =>
    watch(dir, () => void reload()).on('error', (err) => log.warn({ event: 'tls_watch_failed', dir, err: err.message }, `cannot watch ${dir} for certificate renewals: ${err.message}`)),
  );

  await app.listen({ host: opts.host, port: opts.port });
  const addr = app.server.address() as AddressInfo;
  const url = `https://${addr.family === 'IPv6' ? `[${addr.address}]` : addr.address}:${addr.port}`;
  return {
    url,
    close: async () => {
      for (const w of watchers) w.close();
      await app.close();
    },
  };
}
