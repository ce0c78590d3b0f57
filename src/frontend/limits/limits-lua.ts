/*
 * A tenant's limits in the fleet's Redis, and the atomic steps every frontend takes on them (Lua,
 * one round trip each). Time is Redis' own (TIME), so frontends whose clocks differ count one
 * window. All keys of a tenant share a hash tag: each step runs on one node of a Redis Cluster.
 *
 * log (sorted set): the minute's reservations, scored by when they were taken (ms).
 * amounts (hash): each reservation's tokens; field `#` their sum.
 * streams (sorted set): the tenant's concurrent streams, scored by when their frontend's lease on
 *   them lapses (a frontend renews what it holds; a dead one's lapse).
 * budget (hash): tokens used per calendar period, `d<day>` and `m<month>` (UTC; periods.ts).
 *
 * The same rules as MemoryLimits, line for line: an entry at t counts until t + 1 min; limits are
 * checked in the order requests, tokens per minute, per day, per month, concurrent streams.
 */

/** The keys of `tenant`'s counts (its name URI-encoded: no brace can break the hash tag). */
export function limitKeys(tenant: string): [log: string, amounts: string, streams: string, budget: string] {
  const tag = `ebb:limits:{${encodeURIComponent(tenant)}}`;
  return [`${tag}:log`, `${tag}:amounts`, `${tag}:streams`, `${tag}:budget`];
}

/** How long a frontend's hold on a stream slot lasts unless renewed; it renews every third of it. */
export const STREAM_LEASE_MS = 30_000;

/** Budget periods are kept this long past their last charge (a month and a settle's margin). */
const BUDGET_TTL_MS = 62 * 86_400_000;

const COMMON = `
local WINDOW = 60000
local DAY = 86400000
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- The UTC month of a day since the epoch, as year * 12 + month - 1 (H. Hinnant's civil_from_days).
local function month_of(days)
  local z = days + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524) - math.floor(doe / 146096)) / 365)
  local y = yoe + era * 400
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local m = mp < 10 and mp + 3 or mp - 9
  if m <= 2 then y = y + 1 end
  return y * 12 + m - 1
end
-- Days since the epoch of a UTC date (days_from_civil).
local function days_of(y, m, d)
  if m <= 2 then y = y - 1 end
  local era = math.floor(y / 400)
  local yoe = y - era * 400
  local mp = m > 2 and m - 3 or m + 9
  local doy = math.floor((153 * mp + 2) / 5) + d - 1
  return era * 146097 + yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy - 719468
end
local function month_end(month)
  local n = month + 1
  return days_of(math.floor(n / 12), n % 12 + 1, 1) * DAY
end
-- The minute's entries that passed leave it, their tokens with them.
local function purge(log, amounts, now)
  local old = redis.call('ZRANGEBYSCORE', log, '-inf', now - WINDOW)
  if #old == 0 then return end
  local freed = 0
  for i = 1, #old, 500 do
    local chunk = {}
    for j = i, math.min(i + 499, #old) do chunk[#chunk + 1] = old[j] end
    for _, v in ipairs(redis.call('HMGET', amounts, unpack(chunk))) do freed = freed + (tonumber(v) or 0) end
    redis.call('HDEL', amounts, unpack(chunk))
  end
  redis.call('HINCRBY', amounts, '#', -freed)
  redis.call('ZREMRANGEBYSCORE', log, '-inf', now - WINDOW)
end
-- The counts after purging: requests, tokens, streams, day and month used, ms until the minute is empty, day, month.
local function counts(now)
  purge(KEYS[1], KEYS[2], now)
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  local day = math.floor(now / DAY)
  local month = month_of(day)
  local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  local reset = 0
  if #newest > 0 then reset = tonumber(newest[2]) + WINDOW - now end
  local b = redis.call('HMGET', KEYS[4], 'd' .. day, 'm' .. month)
  return {
    redis.call('ZCARD', KEYS[1]),
    tonumber(redis.call('HGET', KEYS[2], '#') or '0'),
    redis.call('ZCARD', KEYS[3]),
    tonumber(b[1] or '0'),
    tonumber(b[2] or '0'),
    reset, day, month }
end
`;

/**
 * RESERVE (log, amounts, streams, budget; id, tokens, rpm, tpm, per day, per month, streams, take a
 * stream 0|1, lease ms; a limit of -1 does not apply): checks every limit and takes the request's
 * share of each, or nothing. Answers { taken 1|0, refused limit's index (1-5) or 0, retry ms (-1:
 * none helps), ...counts (after the step when taken) }.
 */
export const RESERVE = `${COMMON}
local now = now_ms()
local id, tokens = ARGV[1], tonumber(ARGV[2])
local rpm, tpm, perDay, perMonth, maxStreams = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local take = ARGV[8] == '1'
local c = counts(now)
local function refused(limit, at)
  local retry = -1
  if at >= 0 then retry = math.max(1, at - now) end
  local out = {0, limit, retry}
  for _, v in ipairs(c) do out[#out + 1] = v end
  return out
end
if rpm >= 0 and c[1] + 1 > rpm then
  if rpm == 0 then return refused(1, -1) end
  local e = redis.call('ZRANGE', KEYS[1], c[1] - rpm, c[1] - rpm, 'WITHSCORES')
  return refused(1, tonumber(e[2]) + WINDOW)
end
if tpm >= 0 and c[2] + tokens > tpm then
  if tokens > tpm then return refused(2, -1) end
  local left = c[2]
  local entries = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
  local at = -1
  for i = 1, #entries, 2 do
    left = left - (tonumber(redis.call('HGET', KEYS[2], entries[i]) or '0'))
    if left + tokens <= tpm then at = tonumber(entries[i + 1]) + WINDOW break end
  end
  if at < 0 then at = tonumber(entries[#entries]) + WINDOW end
  return refused(2, at)
end
if perDay >= 0 and c[4] + tokens > perDay then
  if tokens > perDay then return refused(4, -1) end
  return refused(4, (c[7] + 1) * DAY)
end
if perMonth >= 0 and c[5] + tokens > perMonth then
  if tokens > perMonth then return refused(5, -1) end
  return refused(5, month_end(c[8]))
end
if take and maxStreams >= 0 and c[3] >= maxStreams then return refused(3, -1) end
redis.call('ZADD', KEYS[1], now, id)
redis.call('HSET', KEYS[2], id, tokens)
redis.call('HINCRBY', KEYS[2], '#', tokens)
redis.call('PEXPIRE', KEYS[1], WINDOW + 1000)
redis.call('PEXPIRE', KEYS[2], WINDOW + 1000)
redis.call('HINCRBY', KEYS[4], 'd' .. c[7], tokens)
redis.call('HINCRBY', KEYS[4], 'm' .. c[8], tokens)
redis.call('HDEL', KEYS[4], 'd' .. (c[7] - 2), 'm' .. (c[8] - 2))
redis.call('PEXPIRE', KEYS[4], ${BUDGET_TTL_MS})
if take and maxStreams >= 0 then
  redis.call('ZADD', KEYS[3], now + tonumber(ARGV[9]), id)
  redis.call('PEXPIRE', KEYS[3], ARGV[9])
  c[3] = c[3] + 1
end
c[1] = c[1] + 1
c[2] = c[2] + tokens
c[4] = c[4] + tokens
c[5] = c[5] + tokens
c[6] = WINDOW
return {1, 0, -1, c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8]}`;

/**
 * SETTLE (log, amounts, streams, budget; id, reserved, used, day, month): the reservation's tokens
 * become what it used, in the minute (if it is still in it) and in the periods it was counted in
 * (if they are still kept); its stream slot, if any, is freed.
 */
export const SETTLE = `
local delta = tonumber(ARGV[3]) - tonumber(ARGV[2])
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
  redis.call('HINCRBY', KEYS[2], '#', delta)
end
for _, f in ipairs({'d' .. ARGV[4], 'm' .. ARGV[5]}) do
  if redis.call('HEXISTS', KEYS[4], f) == 1 then redis.call('HINCRBY', KEYS[4], f, delta) end
end
redis.call('ZREM', KEYS[3], ARGV[1])
return 1`;

/** TAKE_STREAM (streams; id, limit, lease ms): a slot for a queued request whose turn came; 0 when the tenant is at its limit. */
export const TAKE_STREAM = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 1 end
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1`;

/** RENEW (streams; lease ms, id...): this frontend still holds these slots (re-added if a pause let them lapse). */
export const RENEW = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for i = 2, #ARGV do redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), ARGV[i]) end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1`;

/** USAGE (log, amounts, streams, budget): the counts, as RESERVE reads them. */
export const USAGE = `${COMMON}
return counts(now_ms())`;
