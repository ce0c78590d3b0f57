/*
 * A shared stream's keys and the atomic steps every frontend of a fleet takes on them (Lua, one
 * round trip each). All keys of one stream share a hash tag, so each step runs on one node of a
 * Redis Cluster too.
 *
 * meta (hash): holder (the writer's fence token), next (the next batch's number), bytes, state
 *   (live | handed_on | ended | stopped | overflow), plan (how to continue it), tenant.
 * lease: the holder's token, with a short TTL: set while its writer is alive.
 * events (a Redis stream): one entry per batch: `b` its number, `e` its SSE events, `p` where each
 *   sequence stood after them (StreamProgress); `r` on a rewrite of the whole copy, `end` / `x` on
 *   the last (ended / stopped: its `e` is the end or the error), `h` at a hand-on, `o` when the copy
 *   outgrew its bound.
 * followed: set (short TTL) while clients at other frontends follow the stream.
 *
 * The fence: a writer's every step checks that `holder` is still its token, so a writer that lost
 * its lease (paused past it while another frontend took the stream over) writes nothing more, and
 * learns it. Batch numbers make the copy contiguous: a batch whose number is not `next` (one was
 * lost: Redis restarted, a write was refused at maxmemory, a failover dropped it) is refused with
 * `resync`, and the writer rewrites the whole copy from its own memory.
 */

export const streamKeys = (id: string) => {
  const tag = `ebb:{${id}}`;
  return { meta: `${tag}:meta`, lease: `${tag}:lease`, events: `${tag}:events`, followed: `${tag}:followed` } as const;
};

/** A finished Responses API response (or stored chat completion) kept for retrieval: its object, its conversation, its tenant. */
export const storedKey = (id: string) => `ebb:{${id}}:stored`;

/** Fleet notices: a background response to cancel; a stream handed on, for another frontend to take over. */
export const CANCEL_CHANNEL = 'ebb:responses:cancel';
export const HANDED_ON_CHANNEL = 'ebb:streams:handed-on';

/** What a step answers. */
export type StepAnswer = 'ok' | 'lost' | 'resync' | 'overflow' | 'ended' | 'stopped' | 'handed_on';

/**
 * OPEN (meta, lease; token, leaseMs, ttlMs, plan, tenant): a new stream, held by `token`. Sent alone
 * only when a stream is handed on before it wrote anything; else its first APPEND or FINISH carries
 * it (`opening`): the store has nothing of a stream until its first batch, then the stream fenced
 * and whole.
 */
export const OPEN = `
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'holder', ARGV[1], 'next', 0, 'bytes', 0, 'state', 'live', 'plan', ARGV[4], 'tenant', ARGV[5])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
return 'ok'`;

/**
 * A stream's first step opens it (as OPEN does) when it names the stream's plan and tenant: one
 * script where there were two. In Lua: `meta` the meta key, `a` the step's arguments, the plan and
 * tenant at `at` and after it.
 */
const opening = (meta: string, a: string, at: number) => `
if ${a}[${at}] then
  redis.call('DEL', ${meta})
  redis.call('HSET', ${meta}, 'holder', ${a}[1], 'next', 0, 'bytes', 0, 'state', 'live', 'plan', ${a}[${at}], 'tenant', ${a}[${at + 1}])
end`;

/** One stream's APPEND (its keys m, l, e; `a` its arguments), a function: APPEND runs it once, APPEND_MANY once per stream. */
const appendStep = `
local function append(m, l, e, a)
${opening('m', 'a', 8)}
local s = redis.call('HMGET', m, 'holder', 'next', 'bytes', 'state')
if not s[1] then return 'resync' end
if s[1] ~= a[1] then return 'lost' end
if s[4] ~= 'live' then return s[4] end
if tonumber(s[2]) ~= tonumber(a[4]) then return 'resync' end
local bytes = tonumber(s[3]) + string.len(a[6])
if bytes > tonumber(a[5]) then
  redis.call('HSET', m, 'state', 'overflow')
  redis.call('XADD', e, '*', 'o', '1')
  redis.call('PEXPIRE', m, a[3])
  redis.call('PEXPIRE', e, a[3])
  return 'overflow'
end
redis.call('XADD', e, '*', 'b', a[4], 'e', a[6], 'p', a[7])
redis.call('HSET', m, 'next', tonumber(a[4]) + 1, 'bytes', bytes)
redis.call('SET', l, a[1], 'PX', a[2])
redis.call('PEXPIRE', m, a[3])
redis.call('PEXPIRE', e, a[3])
return 'ok'
end`;

/** APPEND (meta, lease, events; token, leaseMs, ttlMs, batch, maxBytes, events, progress[, plan, tenant: opening it]). */
export const APPEND = `${appendStep}
return append(KEYS[1], KEYS[2], KEYS[3], ARGV)`;

/**
 * APPEND_MANY (each stream's meta, lease, events; each stream's APPEND arguments, always 9, plan ''
 * when it does not open the stream): one flush's batches of several streams in one script, each
 * fenced and numbered on its own; answers one StepAnswer per stream, in order. Only where one Redis
 * holds every key (not a Cluster: each stream's keys are in their own slot).
 */
export const APPEND_MANY = `${appendStep}
local out = {}
for i = 0, #KEYS / 3 - 1 do
  local a = {}
  for j = 1, 9 do a[j] = ARGV[i * 9 + j] end
  if a[8] == '' then a[8] = nil end
  out[i + 1] = append(KEYS[i * 3 + 1], KEYS[i * 3 + 2], KEYS[i * 3 + 3], a)
end
return out`;

/**
 * REWRITE (meta, lease, events; token, leaseMs, ttlMs, maxBytes, plan, tenant, events, progress, last):
 * the whole copy again, from the writer's memory, as one entry (`last`: '', 'end' or 'x' when it is
 * also the stream's last). Refused only to a writer another frontend took the stream from.
 */
export const REWRITE = `
local holder = redis.call('HGET', KEYS[1], 'holder')
if holder and holder ~= ARGV[1] then return 'lost' end
if string.len(ARGV[7]) > tonumber(ARGV[4]) then
  redis.call('HSET', KEYS[1], 'holder', ARGV[1], 'state', 'overflow', 'plan', ARGV[5], 'tenant', ARGV[6])
  redis.call('XADD', KEYS[3], '*', 'o', '1')
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  redis.call('PEXPIRE', KEYS[3], ARGV[3])
  return 'overflow'
end
redis.call('DEL', KEYS[3])
local state = 'live'
if ARGV[9] == 'end' then
  state = 'ended'
  redis.call('XADD', KEYS[3], '*', 'b', '0', 'e', ARGV[7], 'p', ARGV[8], 'r', '1', 'end', '1')
elseif ARGV[9] == 'x' then
  state = 'stopped'
  redis.call('XADD', KEYS[3], '*', 'b', '0', 'e', ARGV[7], 'p', ARGV[8], 'r', '1', 'x', '1')
else
  redis.call('XADD', KEYS[3], '*', 'b', '0', 'e', ARGV[7], 'p', ARGV[8], 'r', '1')
end
redis.call('HSET', KEYS[1], 'holder', ARGV[1], 'next', 1, 'bytes', string.len(ARGV[7]), 'state', state, 'plan', ARGV[5], 'tenant', ARGV[6])
if state == 'live' then redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2]) else redis.call('DEL', KEYS[2]) end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PEXPIRE', KEYS[3], ARGV[3])
return 'ok'`;

/** RENEW (meta, lease, events; token, leaseMs, ttlMs): the writer is alive; its keys live on. */
export const RENEW = `
local holder = redis.call('HGET', KEYS[1], 'holder')
if not holder then return 'resync' end
if holder ~= ARGV[1] then return 'lost' end
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PEXPIRE', KEYS[3], ARGV[3])
return 'ok'`;

/**
 * FINISH (meta, lease, events; token, windowMs, batch, kind, events, progress[, plan, tenant]): the
 * stream's last entry (kind `end`: its end; `x`: stopped, the events its error), kept for the resume
 * window; with plan and tenant it opens the stream too (one that ended before its first batch went).
 */
export const FINISH = `${opening('KEYS[1]', 'ARGV', 7)}
local m = redis.call('HMGET', KEYS[1], 'holder', 'next', 'state')
if not m[1] then return 'resync' end
if m[1] ~= ARGV[1] then return 'lost' end
if m[3] == 'live' then
  if tonumber(m[2]) ~= tonumber(ARGV[3]) then return 'resync' end
  redis.call('XADD', KEYS[3], '*', 'b', ARGV[3], 'e', ARGV[5], 'p', ARGV[6], ARGV[4], '1')
  redis.call('HSET', KEYS[1], 'next', tonumber(ARGV[3]) + 1)
end
if m[3] == 'live' or m[3] == 'overflow' then
  local state = 'stopped'
  if ARGV[4] == 'end' then state = 'ended' end
  if m[3] == 'overflow' then state = 'overflow' end
  redis.call('HSET', KEYS[1], 'state', state)
end
redis.call('DEL', KEYS[2])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[3], ARGV[2])
return 'ok'`;

/** RELEASE (meta, lease, events; token): lets go of a live stream (its frontend is going away): another frontend takes it over at once. */
export const RELEASE = `
local m = redis.call('HMGET', KEYS[1], 'holder', 'state')
if m[1] ~= ARGV[1] then return 'lost' end
if m[2] == 'live' then
  redis.call('HSET', KEYS[1], 'state', 'handed_on', 'holder', '')
  redis.call('XADD', KEYS[3], '*', 'h', '1')
end
redis.call('DEL', KEYS[2])
return 'ok'`;

/**
 * TAKE (meta, lease, events; token, leaseMs, ttlMs, gone): a stream whose writer is gone (no lease,
 * or a lease still held by `gone`, a writer seen gone: its frontend's connections closed), taken by
 * `token`: one frontend wins. Answers [answer, next batch, plan, tenant].
 */
export const TAKE = `
local holder = redis.call('GET', KEYS[2])
if holder and (ARGV[4] == '' or holder ~= ARGV[4]) then return {'held'} end
local m = redis.call('HMGET', KEYS[1], 'state', 'next', 'plan', 'tenant')
if not m[1] then return {'none'} end
if m[1] ~= 'live' and m[1] ~= 'handed_on' then return {m[1]} end
redis.call('HSET', KEYS[1], 'holder', ARGV[1], 'state', 'live')
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PEXPIRE', KEYS[3], ARGV[3])
return {'taken', m[2], m[3], m[4] or ''}`;

/** What a stream's entries say, in order: the events and progress of each batch, and how the copy ends. */
export interface StreamEntry {
  /** The batch's number (undefined on markers: hand-on, overflow). */
  batch: number | undefined;
  events: Buffer | undefined;
  progress: string | undefined;
  /** The whole copy, rewritten: what came before it is replaced. */
  rewrite: boolean;
  /** ended: `events` is its end; stopped: its error; handed_on: its writer let go; overflow: past its bound, no longer copied. */
  last: 'ended' | 'stopped' | undefined;
  marker: 'handed_on' | 'overflow' | undefined;
}

/** One XREAD/XRANGE entry's fields as a StreamEntry. */
export function parseEntry(fields: Buffer[]): StreamEntry {
  const f = new Map<string, Buffer>();
  for (let i = 0; i + 1 < fields.length; i += 2) f.set(fields[i]!.toString(), fields[i + 1]!);
  const b = f.get('b');
  return {
    batch: b === undefined ? undefined : Number(b.toString()),
    events: f.get('e'),
    progress: f.get('p')?.toString(),
    rewrite: f.has('r'),
    last: f.has('end') ? 'ended' : f.has('x') ? 'stopped' : undefined,
    marker: f.has('h') ? 'handed_on' : f.has('o') ? 'overflow' : undefined,
  };
}
