/**
 * The admission queue's own cost per admission, in process (issue 42: tenant entries kept while the
 * queue is busy made each admission slower, 57 -> 213 us). One model, one routable worker: every
 * admission gives the next waiter its turn, and each admitted request is replaced by a new one, so
 * the queue stays `--queued` deep. Two runs:
 *   (a) a few tenants (`--tenants`) share the queue;
 *   (b) one tenant keeps the queue busy while `--passing` others come and go, one request each;
 *       the cost is read over the last admissions, when they have all passed through.
 * Times are CPU time of this process (process.cpuUsage), so a machine shared with other work does
 * not inflate them; the queue logs to a silent logger.
 *
 *   npm run build --silent && node dist/bench/admission-queue-cost.js [--queued 64] [--tenants 8] [--admissions 20000] [--passing 40000]
 */
import pino from 'pino';
import { Registry } from 'prom-client';
import { EbbError } from '../src/protocol/errors.js';
import type { GenerateBody } from '../src/protocol/request-plane.js';
import { AdmissionQueue } from '../src/frontend/admission/admission-queue.js';
import { createQueueMetrics } from '../src/frontend/admission/queue-metrics.js';
import { tagTickets } from '../src/frontend/admission/ticket.js';
import { arg } from './cli-arg.js';

const o = {
  queued: Number(arg('queued', '64')),
  tenants: Number(arg('tenants', '8')),
  admissions: Number(arg('admissions', '20000')),
  passing: Number(arg('passing', '40000')),
};

const cpu = (from: NodeJS.CpuUsage) => {
  const d = process.cpuUsage(from);
  return d.user + d.system;
};

/** Runs `total` admissions through a queue kept `o.queued` deep; the tenant of the i-th request is `tenantOf(i)`. Returns CPU us per admission over the last `measured`. */
async function run(total: number, measured: number, tenantOf: (i: number) => string): Promise<number> {
  const queue = new AdmissionQueue({ timeoutMs: 600_000, depth: o.queued * 2, log: pino({ level: 'silent' }) }, { routable: () => 1, prospects: async () => true }, createQueueMetrics(new Registry()));
  const cause = new EbbError('no_serving_worker', 'none');
  let entered = 0;
  let admitted = 0;
  let from: NodeJS.CpuUsage | undefined;
  let done!: () => void;
  const finished = new Promise<void>((resolve) => (done = resolve));
  const enter = async (): Promise<void> => {
    const i = entered++;
    const body = { model: 'm1', prompt: 'x'.repeat(400), max_tokens: 16 } as GenerateBody;
    tagTickets([body], undefined, { 'x-ebb-tenant': tenantOf(i) }, undefined);
    const place = await queue.enter(body, new AbortController().signal, cause, '', new Set());
    await place.turn();
    place.admitted();
    if (++admitted === total - measured) from = process.cpuUsage();
    if (admitted === total) return done();
    if (entered < total) void enter();
  };
  for (let i = 0; i < o.queued; i++) void enter();
  await finished;
  return cpu(from!) / measured;
}

const few = await run(o.admissions, o.admissions / 2, (i) => `t${i % o.tenants}`);
// Every other request of the first 2 x passing is another tenant's only one; the rest are steady's.
const passing = await run(2 * o.passing + o.admissions, o.admissions / 2, (i) => (i % 2 === 0 || i >= 2 * o.passing ? 'steady' : `p${i}`));
console.log(`(a) ${o.tenants} tenants, ${o.queued} queued: ${few.toFixed(1)} us CPU per admission`);
console.log(`(b) one tenant busy while ${o.passing} others pass, ${o.queued} queued: ${passing.toFixed(1)} us CPU per admission (the last ${o.admissions / 2})`);
console.log(JSON.stringify({ bench: 'admission-queue-cost', ...o, few_tenants_us: Number(few.toFixed(1)), after_passing_us: Number(passing.toFixed(1)) }));
