import Fastify, { type FastifyError, type FastifyInstance, type FastifyReply, type FastifyRequest } from 'fastify';
import { watch, type FSWatcher } from 'node:fs';
import { readFile } from 'node:fs/promises';
import type { Server as HttpsServer } from 'node:https';
import type { AddressInfo } from 'node:net';
import { dirname } from 'node:path';
import { createSecureContext, type TLSSocket } from 'node:tls';
import type { Logger } from 'pino';
import { answerClientError } from '../common/http-server.js';
import { EbbError, errorBody, type ErrorCode } from '../protocol/errors.js';
import { admissionResponse, parseAdmissionReview, type AdmissionRequest, type Verdict } from './admission-review.js';

/**
 * The HTTPS listener the API server calls (webhooks are HTTPS only): POST a review to
 * EVICTION_PATH, get the verdict; /live and /health for the kubelet's probes. The certificate and
 * key are read again when their files change (a Secret volume swaps its files on renewal, e.g. by
 * cert-manager), so a renewed certificate is served without a restart.
 *
 * Only the API server may post reviews: a review names the requester and makes the guard annotate
 * pods, so a forged one from any pod could drain workers. The API server presents a client
 * certificate (its AdmissionConfiguration's kubeconfig for this webhook); the review path answers
 * 401 without one and 403 with one the client CA did not sign, before the body is read. The probes
 * stay open: the kubelet has no client certificate.
 */

export const EVICTION_PATH = '/validate/pods-eviction';

export interface WebhookServerOptions {
  host: string;
  port: number;
  certFile: string;
  keyFile: string;
  /** PEM CA(s) that sign the API server's client certificate; re-read with the certificate. */
  clientCaFile: string;
  review: (req: AdmissionRequest) => Promise<Verdict>;
}

export interface WebhookServer {
  url: string;
  close(): Promise<void>;
}

/** AdmissionReviews for an eviction are a few KB; the API server never sends more than an object's 3 MiB. */
const BODY_LIMIT = 3 * 1024 * 1024;

interface TlsFiles {
  cert: Buffer;
  key: Buffer;
  ca: Buffer;
}

async function readTls(opts: WebhookServerOptions): Promise<TlsFiles> {
  const [cert, key, ca] = await Promise.all([readFile(opts.certFile), readFile(opts.keyFile), readFile(opts.clientCaFile)]);
  return { cert, key, ca };
}

const sameTls = (a: TlsFiles, b: TlsFiles) => a.cert.equals(b.cert) && a.key.equals(b.key) && a.ca.equals(b.ca);

/** 401 without a client certificate, 403 with one the client CA did not sign: the review is never read. */
async function requireClientCert(req: FastifyRequest, reply: FastifyReply): Promise<void> {
  const socket = req.raw.socket as TLSSocket;
  if (socket.authorized) return;
  const presented = Object.keys(socket.getPeerCertificate()).length > 0;
  const [status, code, message]: [number, ErrorCode, string] = presented
    ? [403, 'forbidden', `client certificate not accepted: ${String(socket.authorizationError)}`]
    : [401, 'unauthorized', 'a client certificate signed by the --client-ca-file CA is required (the API server presents one)'];
  await reply.code(status).send(errorBody(code, message));
}

export async function startWebhookServer(opts: WebhookServerOptions, log: Logger): Promise<WebhookServer> {
  let pair: TlsFiles;
  try {
    pair = await readTls(opts);
    createSecureContext(pair); // a key that does not match its certificate, or a CA file that is no PEM, fails here, not at the first handshake
  } catch (err) {
    throw new Error(`cannot load the TLS certificate ${opts.certFile}, key ${opts.keyFile} and client CA ${opts.clientCaFile}: ${(err as Error).message}`);
  }
  const app: FastifyInstance<HttpsServer> = Fastify({
    // The client certificate is asked for, not required by the handshake: the probes have none,
    // and a caller without one gets a 401 it can read rather than a reset connection.
    https: { ...pair, requestCert: true, rejectUnauthorized: false },
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
  app.post(EVICTION_PATH, { onRequest: requireClientCert }, async (req) => {
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
        let next: TlsFiles;
        try {
          next = await readTls(opts);
        } catch {
          continue; // mid-swap: the next change event comes
        }
        if (sameTls(next, pair)) continue;
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
  const watchers: FSWatcher[] = [...new Set([opts.certFile, opts.keyFile, opts.clientCaFile].map((f) => dirname(f)))].map((dir) =>
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
