/**
 * Open-loop load for the fleet benches (admission, lora): requests arrive at a set rate whatever
 * the answers do, as a fleet's many clients do (a closed loop would slow down with the fleet and
 * hide what capacity shrinking costs), each recorded as its client saw it.
 */
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import { streamCompletion } from '../test/helpers/sse.js';
import { percentile } from './percentile.js';

/** One request as its client saw it. `ok`: HTTP 200, every token asked for, [DONE], no error event. */
export interface Sample {
  /** The caller's label: a tier, a tenant, an adapter. */
  label: string;
  sentAt: number;
  endedAt: number;
  ok: boolean;
  status: number;
  /** The error's code (its JSON body's or the stream's error event's), `cut` for a stream that ended short, `client` for a failed fetch. */
  code?: string;
  ttftMs?: number;
  workerId: string | null;
}

/** A streamed chat completion through the frontend (`body` has max_tokens), timed to its first content token. */
export async function timedCompletion(url: string, label: string, body: Record<string, unknown> & { max_tokens: number }, headers: Record<string, string> = {}): Promise<Sample> {
  const sentAt = performance.now();
  let ttftMs: number | undefined;
  try {
    const o = await streamCompletion(url, body, () => (ttftMs = performance.now() - sentAt), undefined, headers);
    const ok = o.status === 200 && o.done && o.error === undefined && o.tokens === body.max_tokens;
    let code = o.errorCode;
    if (o.status !== 200) code = errorCode(o.error) ?? `http_${o.status}`;
    else if (!ok && code === undefined) code = 'cut';
    return { label, sentAt, endedAt: performance.now(), ok, status: o.status, ...(ok ? {} : { code }), ...(ok ? { ttftMs } : {}), workerId: o.workerId };
  } catch {
    return { label, sentAt, endedAt: performance.now(), ok: false, status: 0, code: 'client', workerId: null };
  }
}

function errorCode(text: string | undefined): string | undefined {
  try {
    return (JSON.parse(text ?? '') as { error?: { code?: string } }).error?.code;
  } catch {
    return undefined;
  }
}

/**
 * Arrivals at `ratePerS`, evenly spaced (no arrival noise: a 10 % effect shows in a short run),
 * each `send(i)`, until `stop()`, which resolves with every sample once the last request ended.
 * A late timer (a loaded machine) sends every arrival that is due at once, so the rate holds.
 */
export function openLoop(ratePerS: number, send: (i: number) => Promise<Sample>): { samples: Sample[]; stop(): Promise<Sample[]> } {
  const samples: Sample[] = [];
  const pending = new Set<Promise<void>>();
  const gapMs = 1000 / ratePerS;
  const t0 = performance.now();
  let sent = 0;
  let stopped = false;
  const arrivals = (async () => {
    while (!stopped) {
      while (!stopped && t0 + sent * gapMs <= performance.now()) {
        const p = send(sent++).then((s) => void samples.push(s));
        pending.add(p);
        void p.finally(() => pending.delete(p));
      }
      await sleep(Math.max(0, t0 + sent * gapMs - performance.now()));
    }
  })();
  return {
    samples,
    async stop() {
      stopped = true;
      await arrivals;
      await Promise.all(pending);
      return samples;
    },
  };
}


export interface Summary {
  requests: number;
  ok: number;
  errors: number;
  /** Errors by code. */
  codes: Record<string, number>;
  ttft_p50_ms: number;
  ttft_p99_ms: number;
}

export function summarize(samples: Sample[]): Summary {
  const codes: Record<string, number> = {};
  for (const s of samples) if (!s.ok) codes[s.code ?? 'unknown'] = (codes[s.code ?? 'unknown'] ?? 0) + 1;
  const ttfts = samples.flatMap((s) => (s.ttftMs === undefined ? [] : [s.ttftMs]));
  const ok = samples.filter((s) => s.ok).length;
  return { requests: samples.length, ok, errors: samples.length - ok, codes, ttft_p50_ms: Math.round(percentile(ttfts, 50)), ttft_p99_ms: Math.round(percentile(ttfts, 99)) };
}

/** Zipf popularity over `n` items (item i has weight 1/(i+1)^s): a picker driven by `random` (a seeded prng). */
export function zipf(n: number, s: number, random: () => number): () => number {
  const weights = Array.from({ length: n }, (_, i) => 1 / (i + 1) ** s);
  const total = weights.reduce((a, b) => a + b, 0);
  let acc = 0;
  const cdf = weights.map((w) => (acc += w / total));
  return () => {
    const r = random();
    const i = cdf.findIndex((c) => r < c);
    return i < 0 ? n - 1 : i;
  };
}
