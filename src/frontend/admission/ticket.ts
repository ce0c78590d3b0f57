import type { IncomingHttpHeaders } from 'node:http';
import type { AdminGuard } from '../../common/admin-auth.js';
import { promptOf, type EmbedBody, type GenerateBody, type RequestTier } from '../../protocol/request-plane.js';

/** OpenAI's service tiers (the request plane's, which the worker reads), first served first; `auto` is `default`. */
export type ServiceTier = RequestTier;
export const SERVICE_TIERS: readonly ServiceTier[] = ['priority', 'default', 'flex'];

/** A gateway sets the tier for its clients: it overrides the body's service_tier. */
export const TIER_HEADER = 'x-ebb-service-tier';
/** The tenant when the API has no keys (a gateway names its clients). */
export const TENANT_HEADER = 'x-ebb-tenant';
export const ANONYMOUS_TENANT = 'anonymous';
/** What a request without max_tokens is assumed to ask for, in its tenant's share. */
export const UNBOUNDED_COMPLETION_TOKENS = 256;
/** Tenant names are label values and log fields: bounded. */
const MAX_TENANT_CHARS = 64;

/** Who asks, how urgently and for how much: set on a request's generate bodies by the API (tagTickets). */
export interface Ticket {
  tier: ServiceTier;
  tenant: string;
  /** Tokens it asks for: the prompt's estimate plus max_tokens; its weight in its tenant's share. */
  cost: number;
  /**
   * The client's own presence, where it differs from the generation's signal (a kept stream's
   * generation outlives its client by a grace): a queued request whose client left leaves at once,
   * as it has produced nothing to resume. None for a background response (it has no client).
   */
  client?: AbortSignal | undefined;
  /**
   * Its tenant's concurrent-stream slot (--limits-file), where one is counted: given back while it
   * waits (queued requests do not count), taken again when its turn comes (none free: it waits on).
   */
  hold?: StreamHold | undefined;
  /** A flex stream a priority request preempted, coming back: it goes first among flex (and is never shed for a newcomer). */
  preempted?: true;
}

/** A request's concurrent-stream slot as the queue sees it (limits/limiter.ts holds it). */
export interface StreamHold {
  /** It waits in the queue: the slot goes back. */
  queued(): void;
  /** Its turn came: the slot is taken again; false when its tenant has none free (it waits on), rejects when it cannot be told (failing closed). */
  turn(): Promise<boolean>;
}

export function serviceTier(value: unknown): ServiceTier {
  return value === 'priority' || value === 'flex' ? value : 'default';
}

/** Bodies' tickets, made when one waits: bodies the API made carry one; a continuation's body (made by a lane) does not. */
const tickets = new WeakMap<object, () => Ticket>();

/** The ticket of a request body that is about to wait; undefined for a continuation. */
export function ticketOf(body: object): Ticket | undefined {
  return tickets.get(body)?.();
}

/** The tier a request is admitted in: the gateway's header, else the body's service_tier (`auto`: default). */
export function requestTier(bodyTier: unknown, headers: IncomingHttpHeaders): ServiceTier {
  const header = headers[TIER_HEADER];
  return serviceTier(typeof header === 'string' ? header : bodyTier);
}

/**
 * Tags a request's generate bodies with their tier (service_tier: the worker's priority reserve and
 * its engine's queue order read it) and with how to make its ticket for the admission queue: its
 * tier (the header, else the body's service_tier), its tenant (the API key's name, else the tenant
 * header, else anonymous), its cost (about four characters a prompt token, plus max_tokens) and
 * its client's signal. The ticket is made only if the request ever waits: a request a worker takes
 * at once pays for none of it. Returns the tier.
 */
export function tagTickets(gens: readonly GenerateBody[], bodyTier: unknown, headers: IncomingHttpHeaders, apiGuard: AdminGuard | undefined, client?: AbortSignal, hold?: StreamHold): ServiceTier {
  let who: Pick<Ticket, 'tier' | 'tenant'> | undefined;
  const tier = requestTier(bodyTier, headers);
  // Default goes unsaid.
  if (tier !== 'default') for (const gen of gens) gen.service_tier = tier;
  for (const gen of gens) tickets.set(gen, () => ({ ...(who ??= whoAsks(tier, headers, apiGuard)), cost: Math.ceil((promptOf(gen)?.length ?? 0) / 4) + (gen.max_tokens ?? UNBOUNDED_COMPLETION_TOKENS), client, hold }));
  return tier;
}

/**
 * A preempted flex stream's continuation (made by its lane, which has no ticket to give it): it
 * waits as flex, first among flex, with no tenant share to wait in.
 */
export function tagPreempted(continuation: GenerateBody): void {
  tickets.set(continuation, () => PREEMPTED);
}

/** Preempted streams wait apart from every tenant's share (their requests were charged when first admitted). */
export const PREEMPTED_TENANT = '-';
const PREEMPTED: Ticket = { tier: 'flex', tenant: PREEMPTED_TENANT, cost: 0, preempted: true };

/**
 * An embedding request's ticket: it waits in its model's queue as a generation does, in the tier the
 * header gives (OpenAI's embeddings have no service_tier), weighted by its inputs' tokens (about
 * four characters a token; token-id inputs count their ids).
 */
export function tagEmbedTicket(body: EmbedBody, headers: IncomingHttpHeaders, apiGuard: AdminGuard | undefined, hold?: StreamHold): void {
  tickets.set(body, () => ({ ...whoAsks(requestTier(undefined, headers), headers, apiGuard), cost: embedTokens(body), hold }));
}

/** An embedding request's tokens: about four characters a token; token-id inputs count their ids. */
export function embedTokens(body: EmbedBody): number {
  return body.input.reduce<number>((n, x) => n + (typeof x === 'string' ? Math.ceil(x.length / 4) : x.length), 0);
}

/** A request's tier, and its tenant (tenantOf). */
function whoAsks(tier: ServiceTier, headers: IncomingHttpHeaders, apiGuard: AdminGuard | undefined): Pick<Ticket, 'tier' | 'tenant'> {
  return { tier, tenant: tenantOf(headers, apiGuard) };
}

/** Who asks, in the queue's shares and in the limits: the API key's name, else the tenant header, else anonymous (bounded in length). */
export function tenantOf(headers: IncomingHttpHeaders, apiGuard: AdminGuard | undefined): string {
  const named = headers[TENANT_HEADER];
  const tenant = apiGuard !== undefined ? apiGuard(headers.authorization) : typeof named === 'string' && named !== '' ? named : ANONYMOUS_TENANT;
  return tenant.slice(0, MAX_TENANT_CHARS);
}
