import { EbbError } from '../../protocol/errors.js';

/** OpenAI's list pages: 20 items unless asked, at most 100. */
const DEFAULT_LIMIT = 20;
const MAX_LIMIT = 100;

/** A list endpoint's query as OpenAI's take it: `after` (an id), `limit`, `order`; `metadata[key]=value` filters (the SDKs' bracket form). */
export interface Listing {
  after?: string | undefined;
  limit: number;
  order: 'asc' | 'desc';
  metadata?: Record<string, string> | undefined;
}

/** Reads a list's query, each bad value a 400 naming it. `order` defaults to `defaultOrder` (OpenAI's differs per list). */
export function listing(query: Record<string, unknown>, defaultOrder: 'asc' | 'desc'): Listing {
  const one = (name: string): string | undefined => {
    const v = query[name];
    if (v === undefined) return undefined;
    if (typeof v !== 'string') throw new EbbError('invalid_request', `${name} must be given once`, { param: name });
    return v;
  };
  const rawLimit = one('limit');
  const limit = rawLimit === undefined ? DEFAULT_LIMIT : Number(rawLimit);
  if (!Number.isInteger(limit) || limit < 1 || limit > MAX_LIMIT) throw new EbbError('invalid_request', `Invalid 'limit': expected an integer from 1 to ${MAX_LIMIT}, but got ${JSON.stringify(rawLimit)} instead.`, { param: 'limit' });
  const order = one('order') ?? defaultOrder;
  if (order !== 'asc' && order !== 'desc') throw new EbbError('invalid_request', `Invalid value for 'order': ${JSON.stringify(order)}. Supported values are: 'asc' and 'desc'.`, { param: 'order' });
  let metadata: Record<string, string> | undefined;
  for (const key of Object.keys(query)) {
    const m = /^metadata\[(.*)\]$/.exec(key);
    if (m === null) continue;
    metadata ??= {};
    metadata[m[1]!] = one(key)!;
  }
  return { after: one('after'), limit, order, metadata };
}

/** A page of items as OpenAI's lists answer it. */
export function listPage<T extends { id: string }>(data: T[], hasMore: boolean) {
  return { object: 'list', data, first_id: data[0]?.id ?? null, last_id: data[data.length - 1]?.id ?? null, has_more: hasMore };
}

/** One page of `items` (all of them at hand) after `after`, in `order` (items are given oldest first). */
export function pageOf<T extends { id: string }>(items: readonly T[], q: Listing) {
  const all = q.order === 'desc' ? [...items].reverse() : items;
  let from = 0;
  if (q.after !== undefined) {
    from = all.findIndex((i) => i.id === q.after) + 1;
    if (from === 0) throw new EbbError('invalid_request', `after: no item ${q.after} to list after`, { param: 'after' });
  }
  const data = all.slice(from, from + q.limit);
  return listPage(data, from + q.limit < all.length);
}
