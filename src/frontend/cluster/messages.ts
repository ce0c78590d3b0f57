/**
 * What the processes of one `ebb frontend --processes N` say to each other over node:cluster's IPC
 * channel. Children never talk to each other: everything goes through the primary.
 */
import type { Registry } from 'prom-client';
import type { AdminView } from './admin-view.js';

/** Which child (0..N-1): stable across a replacement, so logs and the response header stay readable. */
export const PROCESS_SLOT_ENV = 'EBB_FRONTEND_PROCESS';
/** The frontend's name on the request plane, the primary's, given to each child (workers count them as one frontend). */
export const FRONTEND_ID_ENV = 'EBB_FRONTEND_ID';

/** [worker id, count] pairs: only the workers whose count changed since the last message. */
export type Counts = Array<[string, number]>;

export type MetricsJson = Awaited<ReturnType<Registry['getMetricsAsJSON']>>;

/** Child to primary. */
export type ChildMessage =
  | { type: 'ebb:ready'; url: string; pid: number; peer_url?: string | undefined }
  /** This child's own in-flight counts, absolute (a lost or repeated message cannot skew a sum). */
  | { type: 'ebb:inflight'; counts: Counts }
  /** A scrape of the public /metrics reached this child: the primary answers with every process's metrics. */
  | { type: 'ebb:scrape'; id: number }
  /** The answer to a metrics request (the heartbeat too): its metrics and its admin view. */
  | { type: 'ebb:metrics'; id: number; metrics: MetricsJson; view: AdminView }
  /** Follow a worker's KV events through the primary's one subscription (see kv-follow / kv-relay). */
  | { type: 'ebb:kv-follow'; worker_id: string; system_url: string; follow: number }
  | { type: 'ebb:kv-unfollow'; worker_id: string; follow: number };

/** Primary to child. */
export type PrimaryMessage =
  /** What the other children have open on each worker (their sum, without the receiver's own). */
  | { type: 'ebb:peer-inflight'; counts: Counts }
  /** Every ready process's loopback listener, by slot: a request for what another process holds goes there. */
  | { type: 'ebb:peers'; urls: Array<[number, string]> }
  | { type: 'ebb:scraped'; id: number; text?: string; error?: string }
  | { type: 'ebb:metrics-req'; id: number }
  /** Drain and exit: the frontend's shutdown (grace, then the deadline) in this child. */
  | { type: 'ebb:stop'; graceMs: number; timeoutMs: number }
  /** A followed worker's KV event (a snapshot of what the primary holds first, then its batches and load events). */
  | { type: 'ebb:kv-event'; worker_id: string; follow: number; event: 'snapshot' | 'kv' | 'load'; data: unknown }
  /** The primary's stream of that worker ended: follow again for a fresh snapshot. */
  | { type: 'ebb:kv-end'; worker_id: string; follow: number; reason: string };

export const isMessage = (m: unknown): m is { type: string } => typeof m === 'object' && m !== null && typeof (m as { type?: unknown }).type === 'string' && (m as { type: string }).type.startsWith('ebb:');
