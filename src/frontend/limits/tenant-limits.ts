import { load } from 'js-yaml';

/** What a tenant may spend (--limits-file), each optional: a limit not named does not apply. */
export const LIMIT_NAMES = ['requests_per_minute', 'tokens_per_minute', 'concurrent_streams', 'tokens_per_day', 'tokens_per_month'] as const;
export type LimitName = (typeof LIMIT_NAMES)[number];
export type TenantLimits = Partial<Record<LimitName, number>>;

/** The limits file's key for every tenant it does not name. */
export const ANY_TENANT = '*';

/** Tenants a file may name at most: each is a set of keys in the fleet's store, and a label in the metrics' top list. */
export const MAX_TENANTS = 10_000;

/** The largest limit a file may set: past it a count in Lua (a double) is no longer exact. */
const MAX_LIMIT = 2 ** 50;

/** Tenant names as the queue bounds them (ticket.ts): a name longer than this is cut there too. */
const MAX_TENANT_CHARS = 64;

/** The limits a file sets, by tenant; `any`: for tenants it does not name. */
export interface LimitsTable {
  readonly tenants: ReadonlyMap<string, TenantLimits>;
  readonly any: TenantLimits | undefined;
}

export const NO_LIMITS: LimitsTable = { tenants: new Map(), any: undefined };

/** `tenant`'s limits: its own, else the file's `*`, else none (undefined: nothing is counted for it). */
export function limitsOf(table: LimitsTable, tenant: string): TenantLimits | undefined {
  return table.tenants.get(tenant) ?? table.any;
}

/** Whether `limits` counts tokens (the request's estimate is then reserved, and its max_tokens bounded). */
export function countsTokens(limits: TenantLimits): boolean {
  return limits.tokens_per_minute !== undefined || limits.tokens_per_day !== undefined || limits.tokens_per_month !== undefined;
}

/**
 * A limits file's text (JSON, or YAML, which holds JSON): `{ "<tenant>": { "<limit>": n, ... } }`,
 * each limit a whole number >= 0 (0: none of it is allowed). Throws naming what is wrong: an
 * unknown limit, a value that is not a count, a tenant that is not an object.
 */
export function parseLimits(text: string, where: string): LimitsTable {
  let doc: unknown;
  try {
    doc = load(text);
  } catch (err) {
    throw new Error(`${where}: not JSON or YAML: ${(err as Error).message.split('\n')[0]}`);
  }
  if (doc === undefined || doc === null) return NO_LIMITS;
  if (typeof doc !== 'object' || Array.isArray(doc)) throw new Error(`${where}: expected an object of tenants, { "<tenant>": { "tokens_per_minute": 600, ... } }`);
  const entries = Object.entries(doc as Record<string, unknown>);
  if (entries.length > MAX_TENANTS) throw new Error(`${where}: ${entries.length} tenants; at most ${MAX_TENANTS}`);
  const tenants = new Map<string, TenantLimits>();
  let any: TenantLimits | undefined;
  for (const [tenant, value] of entries) {
    if (tenant === '' || tenant.length > MAX_TENANT_CHARS) throw new Error(`${where}: tenant "${tenant.slice(0, 80)}": a name of 1 to ${MAX_TENANT_CHARS} characters`);
    if (typeof value !== 'object' || value === null || Array.isArray(value)) throw new Error(`${where}: tenant "${tenant}": expected an object of limits (${LIMIT_NAMES.join(', ')})`);
    const limits: TenantLimits = {};
    for (const [name, n] of Object.entries(value as Record<string, unknown>)) {
      if (!(LIMIT_NAMES as readonly string[]).includes(name)) throw new Error(`${where}: tenant "${tenant}": unknown limit "${name}" (limits: ${LIMIT_NAMES.join(', ')})`);
      if (n === null) continue;
      if (typeof n !== 'number' || !Number.isInteger(n) || n < 0 || n > MAX_LIMIT) throw new Error(`${where}: tenant "${tenant}": ${name} must be a whole number from 0 to 2^50, not ${JSON.stringify(n)}`);
      limits[name as LimitName] = n;
    }
    if (tenant === ANY_TENANT) any = limits;
    else tenants.set(tenant, limits);
  }
  return { tenants, any };
}
