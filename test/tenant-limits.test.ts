/**
 * Tenants' limits (issue 48 items 1, 2 and 4): reserved before a request runs, exact in memory for
 * one frontend and across frontends sharing a Redis, refunded to what the answer used, answered
 * with OpenAI's 429s and x-ratelimit-* headers, followed when their file changes, and shown by
 * `ebb tenants`.
 */
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, renameSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import OpenAI from 'openai';
import { MemoryLimits } from '../src/frontend/limits/memory-limits.js';
import { RedisLimits } from '../src/frontend/limits/redis-limits.js';
import { dayEnd, dayOf, MINUTE_MS, monthEnd, monthOf } from '../src/frontend/limits/periods.js';
import { parseLimits, type TenantLimits } from '../src/frontend/limits/tenant-limits.js';
import { limitKeys } from '../src/frontend/limits/limits-lua.js';
import { resetText } from '../src/frontend/limits/rate-headers.js';
import { frontendSeesWorkers, metricValue, runEbb, startFrontend, startWorker, tempDiscoveryUrl, type EbbProcess, type FrontendHandle, type WorkerHandle } from './helpers/processes.js';
import { redisSkipReason, startRedis, type RedisServer } from './helpers/redis.js';

const started: EbbProcess[] = [];
after(async () => {
  await Promise.all(started.map((p) => p.stop()));
});

function tempFile(name: string, text: string): string {
  const path = join(mkdtempSync(join(tmpdir(), 'ebb-test-limits-')), name);
  writeFileSync(path, text);
  return path;
}

/** A prompt the mocker counts as `words` tokens and the limits estimate at as many: three-letter words, four characters each with its space. */
const prompt = (words: number, word = 'tid') => Array.from({ length: words }, () => word).join(' ');

describe('limits counted in memory: exact, on a clock the test holds', () => {
  const ask = (limits: TenantLimits, tokens: number, id = `r${Math.random()}`) => ({ id, tenant: 't', limits, tokens, stream: limits.concurrent_streams !== undefined });

  it('a request frees its share of the minute exactly one minute after it was taken: Retry-After is when, to the millisecond', () => {
    let now = Date.UTC(2030, 0, 10, 12, 0, 0);
    const m = new MemoryLimits(() => now);
    const limits = { requests_per_minute: 2, tokens_per_minute: 300 };
    assert.equal(m.reserveNow(ask(limits, 100)).ok, true);
    now += 10_000;
    assert.equal(m.reserveNow(ask(limits, 150)).ok, true);
    now += 5_000;
    const third = m.reserveNow(ask(limits, 10));
    assert.deepEqual([third.ok, !third.ok && third.limit, !third.ok && third.retryMs], [false, 'requests_per_minute', 45_000], 'the first request leaves the minute 45 s from now');
    now += 45_000 - 1;
    assert.equal(m.reserveNow(ask(limits, 10)).ok, false, 'a millisecond before, still refused');
    now += 1;
    assert.equal(m.reserveNow(ask(limits, 10)).ok, true, 'then admitted');
  });

  it('tokens per minute: refused until enough of the minute\'s tokens have left it; more than the limit is never admitted (no Retry-After)', () => {
    let now = Date.UTC(2030, 0, 10, 12, 0, 0);
    const m = new MemoryLimits(() => now);
    const limits = { tokens_per_minute: 600 };
    for (const [t, tokens] of [[0, 200], [1000, 300], [2000, 100]] as const) {
      now = Date.UTC(2030, 0, 10, 12, 0, 0) + t;
      assert.equal(m.reserveNow(ask(limits, tokens)).ok, true);
    }
    now += 1000;
    const r = m.reserveNow(ask(limits, 350));
    // 600 taken; 350 fit once the first 200 and the next 300 have left: at 1000 + 60000.
    assert.deepEqual([r.ok, !r.ok && r.limit, !r.ok && r.retryMs], [false, 'tokens_per_minute', 1000 + MINUTE_MS - 3000]);
    const huge = m.reserveNow(ask(limits, 601));
    assert.deepEqual([huge.ok, !huge.ok && huge.retryMs], [false, null]);
  });

  it('a settle refunds what the answer did not use (and charges an overrun); the budget of a day turns at UTC midnight, a month\'s at its first', async () => {
    let now = Date.UTC(2030, 11, 31, 23, 59, 0);
    const m = new MemoryLimits(() => now);
    const limits = { tokens_per_day: 1000, tokens_per_month: 1500 };
    const a = m.reserveNow(ask(limits, 600, 'a'));
    assert.equal(a.ok, true);
    assert.equal(m.reserveNow(ask(limits, 600)).ok, false, 'a second 600 would cross the day');
    await m.settle({ id: 'a', tenant: 't', reserved: 600, used: 50, periods: a.usage.periods });
    const b = m.reserveNow(ask(limits, 600, 'b'));
    assert.equal(b.ok, true, 'the 550 it did not use are back');
    const over = m.reserveNow(ask(limits, 400));
    assert.deepEqual([over.ok, !over.ok && over.limit, !over.ok && over.retryMs], [false, 'tokens_per_day', 60_000], 'refused until midnight, a minute away');
    now += 60_000;
    assert.equal(m.reserveNow(ask(limits, 400)).ok, true, 'a new day (and a new month: 2031-01)');
    assert.equal((await m.usage('t')).day, 400);
    assert.equal(dayEnd(dayOf(Date.UTC(2031, 0, 1))), Date.UTC(2031, 0, 2));
    assert.equal(monthEnd(monthOf(Date.UTC(2030, 11, 15))), Date.UTC(2031, 0, 1));
    assert.equal(monthEnd(monthOf(Date.UTC(2032, 1, 29, 23))), Date.UTC(2032, 2, 1));
  });

  it('concurrent streams: taken with the request, given back while it waits, taken again at its turn', async () => {
    const m = new MemoryLimits();
    const limits = { concurrent_streams: 1 };
    assert.equal(m.reserveNow(ask(limits, 0, 'a')).ok, true);
    const b = m.reserveNow(ask(limits, 0, 'b'));
    assert.deepEqual([b.ok, !b.ok && b.limit, !b.ok && b.retryMs], [false, 'concurrent_streams', null]);
    await m.releaseStream('t', 'a');
    assert.equal(m.reserveNow(ask(limits, 0, 'c')).ok, true);
    assert.equal(await m.takeStream('t', 'a', 1), false, "a's turn: c holds the one stream");
  });

  it('a limits file: JSON or YAML, unknown limits and bad counts named', () => {
    const t = parseLimits('acme:\n  tokens_per_minute: 600\n"*":\n  requests_per_minute: 10\n', 'f.yaml');
    assert.deepEqual([t.tenants.get('acme'), t.any], [{ tokens_per_minute: 600 }, { requests_per_minute: 10 }]);
    assert.throws(() => parseLimits('{"acme": {"tokens_per_hour": 1}}', 'f.json'), /f\.json: tenant "acme": unknown limit "tokens_per_hour"/);
    assert.throws(() => parseLimits('{"acme": {"tokens_per_day": 1.5}}', 'f.json'), /tokens_per_day must be a whole number/);
    assert.equal(resetText(59_500), '59.5s');
    assert.equal(resetText(360_000), '6m0s');
  });
});

describe('limits counted in Redis: the same rules, in Redis time', { skip: redisSkipReason() }, () => {
  let redis: RedisServer;
  let client: Redis;
  before(async () => {
    redis = await startRedis();
    client = new Redis(redis.url);
  });
  after(async () => {
    client?.disconnect();
    await redis?.stop();
  });

  it('requests per minute, a month\'s budget and the periods a reservation is counted in, as MemoryLimits counts them', async () => {
    const store = new RedisLimits(client);
    const tenant = `t{}${Date.now()}`;
    const ask = (limits: TenantLimits, tokens: number, id: string) => store.reserve({ id, tenant, limits, tokens, stream: false });
    const first = Date.now();
    assert.equal((await ask({ requests_per_minute: 1 }, 5, 'a')).ok, true);
    const [, at] = await client.zrange(limitKeys(tenant)[0], 0, 0, 'WITHSCORES');
    const before = Date.now();
    const r = await ask({ requests_per_minute: 1 }, 5, 'b');
    const after = Date.now();
    assert.equal(r.ok, false);
    assert.ok(!r.ok && r.retryMs !== null && Number(at) + MINUTE_MS - r.retryMs >= before && Number(at) + MINUTE_MS - r.retryMs <= after, `refused until ${Number(at) + MINUTE_MS}: retry ${!r.ok && r.retryMs} ms from a moment in [${before}, ${after}]`);
    assert.ok(Number(at) >= first - 1 && Number(at) <= before + 1, 'stamped by Redis at the reservation');
    const budget = await ask({ tokens_per_month: 10 }, 8, 'c');
    assert.equal(budget.ok, false, '5 + 8 would cross 10 this month');
    assert.ok(!budget.ok && budget.limit === 'tokens_per_month' && Math.abs(Date.now() + budget.retryMs! - monthEnd(monthOf(Date.now()))) < 1000, 'until the next UTC month');
    assert.deepEqual([budget.usage.periods.day, budget.usage.periods.month], [dayOf(Date.now()), monthOf(Date.now())], 'the Lua calendar is the TypeScript one');
    await store.settle({ id: 'a', tenant, reserved: 5, used: 1, periods: budget.usage.periods });
    assert.deepEqual([(await store.usage(tenant)).tokens, (await store.usage(tenant)).month], [1, 1], 'settled to what it used, in the minute and the month');
  });
});

/** Two frontends on one Redis, one key limited to 600 tokens a minute (the Done means). */
describe('two frontends sharing Redis: one tenant\'s limits for the whole fleet', { skip: redisSkipReason() }, () => {
  let redis: RedisServer;
  let admin: Redis;
  let a: FrontendHandle;
  let b: FrontendHandle;
  const KEY = 'sk-acme-1';
  before(async () => {
    redis = await startRedis();
    admin = new Redis(redis.url);
    admin.on('error', () => undefined);
    const discovery = tempDiscoveryUrl();
    started.push(await startWorker(['--discovery', discovery, '--model', 'm1', '--mocker-itl-ms', '1', '--mocker-ttft-ms', '0']));
    const keys = tempFile('keys', `acme:${KEY}\nother:sk-other-1\n`);
    const limits = tempFile('limits.json', JSON.stringify({ acme: { tokens_per_minute: 600, requests_per_minute: 1000 } }));
    const common = ['--stream-store', redis.url, '--api-key-file', keys, '--limits-file', limits];
    // One fails open, one closed: what each does while Redis is gone is the last case.
    [a, b] = (await Promise.all([startFrontend(discovery, [...common, '--limits-store-down', 'open']), startFrontend(discovery, [...common, '--limits-store-down', 'closed'])])) as [FrontendHandle, FrontendHandle];
    started.push(a, b);
    await Promise.all([a, b].map((f) => frontendSeesWorkers(f, 1)));
  });
  after(async () => {
    admin?.disconnect();
    await redis?.stop();
  });

  /** A completion of exactly 100 tokens: 20 of prompt (as estimated and as the mocker counts), 80 generated. */
  const hundred = (f: FrontendHandle, key = KEY) =>
    fetch(`${f.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${key}` }, body: JSON.stringify({ model: 'm1', prompt: prompt(20), max_tokens: 80 }) });

  it('20 concurrent requests of 100 tokens split across both admit exactly 6; the rest are 429 with a Retry-After right to the second; the remaining counts add up', async () => {
    const sent = Date.now();
    const answers = await Promise.all(Array.from({ length: 20 }, async (_, i) => {
      const res = await hundred(i % 2 === 0 ? a : b);
      return { res, body: (await res.json()) as any, at: Date.now() };
    }));
    const ok = answers.filter((x) => x.res.status === 200);
    const refused = answers.filter((x) => x.res.status === 429);
    assert.equal(ok.length, 6, `6 of 600 tokens' worth admitted in all, not 6 per frontend (statuses ${answers.map((x) => x.res.status).join(' ')})`);
    assert.equal(refused.length, 14);
    assert.ok(ok.every((x) => x.body.usage.total_tokens === 100), 'each used what it reserved (nothing refunded into the minute)');
    assert.deepEqual(ok.map((x) => Number(x.res.headers.get('x-ratelimit-remaining-tokens'))).sort((x, y) => x - y), [0, 100, 200, 300, 400, 500], 'the six remaining counts, whichever frontend answered, step down by 100 from 600');
    assert.ok(ok.every((x) => x.res.headers.get('x-ratelimit-limit-tokens') === '600' && x.res.headers.get('x-ratelimit-limit-requests') === '1000'));
    // The minute frees when its oldest reservation leaves it: Redis' own stamp of it.
    const [, oldest] = await admin.zrange(limitKeys('acme')[0], 0, 0, 'WITHSCORES');
    const frees = Number(oldest) + MINUTE_MS;
    for (const x of refused) {
      assert.deepEqual([x.body.error.code, x.body.error.type, x.body.error.limit], ['rate_limit_exceeded', 'tokens', 'tokens_per_minute']);
      assert.match(x.body.error.message, /tenant "acme" on tokens per minute \(tokens_per_minute\): limit 600, used 600, requested 100/);
      const ms = Number(x.res.headers.get('retry-after-ms'));
      assert.ok(frees - ms >= sent - 1 && frees - ms <= x.at + 1, `retry-after-ms ${ms} counts to ${frees} from the moment of refusal (within [${sent}, ${x.at}])`);
      assert.equal(x.res.headers.get('retry-after'), String(Math.ceil(ms / 1000)), 'Retry-After: those milliseconds, in whole seconds up');
      assert.equal(x.res.headers.get('x-ratelimit-remaining-tokens'), '0');
    }
    assert.equal(await metricValue(a.url, 'ebb_frontend_tenant_limit_hits_total', 'tenant="acme",limit="tokens_per_minute"') + (await metricValue(b.url, 'ebb_frontend_tenant_limit_hits_total', 'tenant="acme",limit="tokens_per_minute"')), 14);
    // The SDK reads the same: a RateLimitError, not retried by hand here.
    const sdk = new OpenAI({ baseURL: `${a.url}/v1`, apiKey: KEY, maxRetries: 0 });
    await assert.rejects(sdk.completions.create({ model: 'm1', prompt: prompt(20), max_tokens: 80 }), (err: unknown) => err instanceof OpenAI.RateLimitError && (err.error as { limit?: string }).limit === 'tokens_per_minute');
    // Another key has no limits: none of this touches it, and its answers carry no rate headers.
    const other = await hundred(b, 'sk-other-1');
    assert.equal(other.status, 200);
    assert.equal(other.headers.get('x-ratelimit-limit-tokens'), null);
  });

  it('Redis gone: the frontend that fails closed answers 503 limits_unavailable; the one that fails open counts alone, and says so', async () => {
    await redis.kill();
    await Promise.all([a, b].map((f) => f.waitForEvent('stream_store_unavailable')));
    const closed = await hundred(b);
    assert.equal(closed.status, 503);
    assert.equal(((await closed.json()) as any).error.code, 'limits_unavailable');
    const open = await hundred(a);
    assert.equal(open.status, 200, 'counted in this frontend alone: its own minute is empty');
    assert.equal(open.headers.get('x-ratelimit-remaining-tokens'), '500');
    await open.text();
    const said = await a.waitForEvent('limits_store_unavailable');
    assert.equal(said.mode, 'open');
    assert.equal(await metricValue(b.url, 'ebb_frontend_limits_store_unavailable_total', 'mode="closed"'), 1);
  });
});

/** One frontend counting in its own memory: budgets, refunds, a file changed under it, streams that wait, `ebb tenants`. */
describe('one frontend: budgets reserved before work starts, refunds, reloads, queued streams', () => {
  let f: FrontendHandle;
  let w: WorkerHandle;
  let limitsPath: string;
  const limits = (budget: number) => ({ budget: { tokens_per_day: budget }, solo: { concurrent_streams: 1 } });
  before(async () => {
    const discovery = tempDiscoveryUrl();
    // Two batch slots, one kept for priority work: one flex stream fills what flex may use.
    w = await startWorker(['--discovery', discovery, '--model', 'm1', '--mocker-itl-ms', '5', '--mocker-ttft-ms', '0', '--mocker-batch-slots', '2', '--priority-reserve-slots', '1']);
    started.push(w);
    limitsPath = tempFile('limits.json', JSON.stringify(limits(1000)));
    f = await startFrontend(discovery, ['--limits-file', limitsPath, '--resume-grace-ms', '0']);
    started.push(f);
    await frontendSeesWorkers(f, 1);
  });

  const complete = (tenant: string, body: Record<string, unknown>, signal?: AbortSignal) =>
    fetch(`${f.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-ebb-tenant': tenant }, body: JSON.stringify({ model: 'm1', seed: 7, ...body }), signal });

  it('a budget of 1,000 tokens: a request that stops early leaves what it did not use; the request that would cross the budget is refused before it runs', async () => {
    // 20 prompt tokens + 380: each reserves 400.
    const probe = (await (await complete('anyone', { prompt: prompt(20, 'ebb'), max_tokens: 380 })).json()) as any;
    const words = (probe.choices[0].text as string).split(' ');
    const early = (await (await complete('budget', { prompt: prompt(20, 'ebb'), max_tokens: 380, stop: [words.slice(4, 6).join(' ')] })).json()) as any;
    assert.equal(early.choices[0].finish_reason, 'stop');
    assert.ok(early.usage.total_tokens < 100, `it stopped early (${early.usage.total_tokens} tokens of the 400 reserved)`);
    const full = async () => complete('budget', { prompt: prompt(20, 'ebb'), max_tokens: 380 });
    const second = await full();
    assert.equal(second.status, 200);
    await second.text();
    const third = await full();
    assert.equal(third.status, 200, `${early.usage.total_tokens} + 400 + 400 fit 1000 only because the first request's unused reservation came back`);
    await third.text();
    const admittedBefore = await metricValue(w.systemUrl, 'ebb_worker_admitted_total');
    const fourth = await full();
    assert.equal(fourth.status, 429);
    const err = ((await fourth.json()) as any).error;
    assert.deepEqual([err.code, err.type, err.limit], ['insufficient_quota', 'insufficient_quota', 'tokens_per_day']);
    assert.equal(fourth.headers.get('x-should-retry'), 'false', "a retry within the day cannot help: the SDKs' own retries are told so");
    const untilMidnight = Number(fourth.headers.get('retry-after'));
    assert.ok(untilMidnight > 0 && untilMidnight <= 86_400, `Retry-After: the next UTC day (${untilMidnight} s)`);
    assert.equal(await metricValue(w.systemUrl, 'ebb_worker_admitted_total'), admittedBefore, 'refused before it ran: no worker saw it');
    const adminUrl = (await f.waitForEvent('admin_ready')).url as string;
    const cli = await runEbb(['tenants', '--frontend', adminUrl], {});
    assert.equal(cli.code, 0, cli.stderr);
    assert.match(cli.stdout, new RegExp(`^budget +own +\\d+ +\\d+ +0 +${early.usage.total_tokens + 800}/1000 +${early.usage.total_tokens + 800} +tokens_per_day 1$`, 'm'), cli.stdout);
  });

  it('the limits file changed under the frontend: the new budget applies without a restart', async () => {
    const mark = f.mark();
    // Replaced whole (an editor's save, a ConfigMap's swap), as operators do.
    const next = `${limitsPath}.next`;
    writeFileSync(next, JSON.stringify(limits(5000)));
    renameSync(next, limitsPath);
    await f.waitForLog((l) => l.event === 'limits_reloaded', 'the limits reloaded', { after: mark });
    const res = await complete('budget', { prompt: prompt(20, 'ebb'), max_tokens: 380 });
    assert.equal(res.status, 200);
    await res.text();
    writeFileSync(limitsPath, '{"budget": {"tokens_per_dya": 1}}');
    await f.waitForLog((l) => l.event === 'limits_reload_failed', 'a bad file refused', { after: mark });
    const still = await complete('budget', { prompt: prompt(20, 'ebb'), max_tokens: 380 });
    assert.equal(still.status, 200, 'a file that does not parse leaves the limits in force');
    await still.text();
  });

  it('concurrent streams count only once admitted: two queued requests of a one-stream tenant both wait, then run one after the other; a third while one runs is refused', async () => {
    const stream = (tenant: string, tier: string, signal?: AbortSignal) => complete(tenant, { prompt: prompt(5), max_tokens: 100_000, stream: true, service_tier: tier }, signal);
    const filler = new AbortController();
    const fill = await stream('anyone', 'flex', filler.signal);
    const fillReader = fill.body!.getReader();
    await fillReader.read();
    const first = new AbortController();
    // One after the other: a request counts from its arrival until it is queued.
    let mark = f.mark();
    const queued = [stream('solo', 'flex', first.signal)];
    await f.waitForLog((l) => l.event === 'request_queued' && l.tenant === 'solo', "solo's first flex request queued", { after: mark });
    mark = f.mark();
    queued.push(complete('solo', { prompt: prompt(5), max_tokens: 5, service_tier: 'flex' }));
    await f.waitForLog((l) => l.event === 'request_queued' && l.tenant === 'solo', "solo's second flex request queued too: the first, waiting, does not count against its one stream", { after: mark });
    filler.abort();
    await fillReader.closed.catch(() => undefined);
    const running = await queued[0]!;
    assert.equal(running.status, 200);
    const reader = running.body!.getReader();
    await reader.read();
    const third = await complete('solo', { prompt: prompt(5), max_tokens: 5 });
    assert.equal(third.status, 429, 'admitted, the first holds the one stream');
    assert.equal(((await third.json()) as any).error.limit, 'concurrent_streams');
    assert.equal(third.headers.get('retry-after'), '1');
    first.abort();
    await reader.closed.catch(() => undefined);
    const second = await queued[1]!;
    assert.equal(second.status, 200, 'the second ran once the first ended');
    await second.text();
  });
});

