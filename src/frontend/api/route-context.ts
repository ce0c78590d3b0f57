import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { Logger } from 'pino';
import type { GenerateBody } from '../../protocol/request-plane.js';
import type { ServiceTier } from '../admission/ticket.js';
import type { Spend } from '../limits/limiter.js';
import type { TenantLimits } from '../limits/tenant-limits.js';
import type { WorkerPool } from '../routing/worker-pool.js';
import type { Relay } from '../relay/relay.js';
import type { Shutdown } from '../shutdown.js';
import type { StreamStore } from '../streams/stream-store.js';
import type { WorkerRecord } from '../../discovery/discovery.js';
import type { TokenAnswer } from '../routing/worker-tokenize.js';
import type { CompletionStore } from './completion-store.js';
import type { FieldPolicy } from './field-policy.js';
import type { ResponseStore } from './response-store.js';
import type { Served } from './served-model.js';
import type { Room, StreamOut } from './stream-out.js';
import type { StreamPlan } from './stream-plan.js';

/** What every generating route of the public API is given (createOpenAIServer makes it once). */
export interface RouteContext {
  app: FastifyInstance;
  pool: WorkerPool;
  relay: Relay;
  out: StreamOut;
  shutdown: Shutdown;
  log: Logger;
  /** Kept streams (resumes); none with --stream-store none. */
  streams?: StreamStore | undefined;
  /** The Responses API's records (background, retrieve, cancel, previous_response_id); none without kept streams. */
  responses?: ResponseStore | undefined;
  /** Stored chat completions (store: true); none without kept streams. */
  completions?: CompletionStore | undefined;
  /** A worker's tokens of a request's prompt (POST /tokenize on its request plane); undefined: the body has no prompt. */
  tokenize?: ((worker: WorkerRecord, body: GenerateBody) => Promise<TokenAnswer | undefined>) | undefined;
  /**
   * Declares the methods a URL answers (405 for the rest, OPTIONS with CORS). `idPrefix`: the kind
   * of id its `:id` is (resp_, chatcmpl-); another path there is unknown (404), not a wrong method.
   */
  methods(url: string, allowed: Array<'GET' | 'POST' | 'DELETE'>, idPrefix?: string): void;
  /** A model somebody serves (or an adapter some worker can load), and fields the fleet can honour. */
  admit(body: { model: string }, table: FieldPolicy): Served;
  /**
   * The queue's ticket on each generate body; the tier the answer says. `client`: the request's
   * signal, so a queued request whose client left leaves the queue at once (none: a background response).
   */
  ticket(gens: readonly GenerateBody[], tier: unknown, req: FastifyRequest, client: AbortSignal | undefined, spend?: Spend): ServiceTier;
  /**
   * The request's reservation of its tenant's limits (--limits-file), taken before it runs: `tokens`
   * says what it reserves under the tenant's limits (and may bound its max_tokens). Undefined: its
   * tenant has no limits. Throws the 429 of a limit it would cross. Its OpenAI x-ratelimit-* headers
   * are set on the answer.
   */
  limit(req: FastifyRequest, reply: FastifyReply, tokens: (limits: TenantLimits) => number): Promise<Spend | undefined>;
  /**
   * Room for a request's sequences, held until its response is done (a kept stream: until its
   * generation is); its reservation (`spend`) settles then.
   */
  holdLanes(reply: FastifyReply, model: string, count: number, n: number, spend?: Spend): Room;
  /** A fresh response id's random part (with --processes N, it names this process). */
  newId(): string;
  /** The request, passed to the process that holds `id` when another one does (undefined: served here). */
  toHolder(id: string, req: FastifyRequest, reply: FastifyReply, body?: unknown): Promise<void> | undefined;
  /** Who asks: the API key's name (--api-key-file); '' when the API has no keys. Kept responses are theirs alone. */
  tenantOf(req: FastifyRequest): string;
  /** Whether the request's stream is kept for resumption: its client says it will come back (x-ebb-resumable: 1), or the operator keeps all. */
  keeps(req: FastifyRequest): boolean;
  /** How a tool request's answers are parsed: the model's call syntax, and the key its call ids come from. */
  toolParsing(gen: GenerateBody): NonNullable<StreamPlan['tools']>;
}
