import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { resumableFetch } from '@ebb/client';
import { freePort } from '../src/engine/engine-process.js';
import { frontendSeesWorkers, startFrontend, startWorker, tempDiscoveryUrl, type EbbProcess, type FrontendHandle } from './helpers/processes.js';
import { nginxSkipReason, startNginx, type Nginx } from './helpers/nginx.js';
import { redisSkipReason, startRedis, type RedisServer } from './helpers/redis.js';
import { runSdk, type Ask, type Sdk, type SdkRun } from './helpers/sdk-streams.js';

/**
 * A frontend restart that client code never notices (issue 43's "Done means"): nginx, configured
 * from deploy/load-balancer/nginx.conf, in front of frontends sharing one Redis; plain SDK code
 * (the openai SDK, the AI SDK, LangChain) and the same code with `@ebb/client`'s resumableFetch.
 */

/** A fetch that tells when each response started, and measures the longest pause between two body chunks the SDK got. */
function watched(inner: typeof fetch = fetch) {
  const stats = { started: 0, longestPauseMs: 0 };
  let onStart: () => void = () => undefined;
  const f: typeof fetch = async (input, init) => {
    const res = await inner(input, init);
    stats.started++;
    onStart();
    if (res.body === null) return res;
    let last: number | undefined;
    const timed = res.body.pipeThrough(
      new TransformStream<Uint8Array, Uint8Array>({
        transform(chunk, ctl) {
          const now = performance.now();
          if (last !== undefined) stats.longestPauseMs = Math.max(stats.longestPauseMs, now - last);
          last = now;
          ctl.enqueue(chunk);
        },
      }),
    );
    return new Response(timed, { status: res.status, statusText: res.statusText, headers: res.headers });
  };
  /** Resolves once `n` responses have started. */
  const startedAll = (n: number) =>
    new Promise<void>((resolve) => {
      onStart = () => {
        if (stats.started >= n) resolve();
      };
      onStart();
    });
  return { fetch: f, stats, startedAll };
}

const skip = redisSkipReason() ?? nginxSkipReason();

describe('a frontend restart client code never notices: nginx, two frontends, one Redis', { skip }, () => {
  const started: EbbProcess[] = [];
  let redis: RedisServer;
  let discovery: string;
  let ports: number[];
  let a: FrontendHandle;
  let b: FrontendHandle;
  let nginx: Nginx;
  const references = new Map<string, SdkRun>();
  before(async () => {
    redis = await startRedis();
    discovery = tempDiscoveryUrl();
    // Streams of several seconds: each answer is the rest of a 200-token context, a token every 25 ms.
    started.push(...(await Promise.all([0, 1].map(() => startWorker(['--discovery', discovery, '--model', 'm1', '--mocker-itl-ms', '25', '--mocker-ttft-ms', '0', '--mocker-max-context', '200'])))));
    ports = await Promise.all([0, 1].map(() => freePort()));
    [a, b] = (await Promise.all(ports.map((p) => frontend(p)))) as [FrontendHandle, FrontendHandle];
    nginx = await startNginx(ports);
  });
  after(async () => {
    await nginx?.stop();
    await Promise.all(started.map((p) => p.stop()));
    await redis?.stop();
  });

  async function frontend(port: number, args: string[] = []): Promise<FrontendHandle> {
    const f = await startFrontend(discovery, ['--port', String(port), '--admin-port', '0', '--stream-store', redis.url, ...args]);
    started.push(f);
    await frontendSeesWorkers(f, 2);
    return f;
  }
  /** Stops frontend `a` (the signal given), and starts it again on its port with `args`, once it exited. */
  async function restartA(args: string[]): Promise<void> {
    if (a.proc.exitCode === null && a.proc.signalCode === null) {
      a.proc.kill('SIGTERM');
      await a.exited;
    }
    a = await frontend(ports[0]!, args);
  }
  /** What an undisturbed run assembles, asked of b directly. */
  async function reference(sdk: Sdk, ask: Ask): Promise<SdkRun> {
    const key = `${sdk}/${ask}`;
    if (!references.has(key)) references.set(key, await runSdk(sdk, ask, `${b.url}/v1`));
    return references.get(key)!;
  }
  const plainMix: Array<[Sdk, Ask]> = [
    ['openai', 'chat'],
    ['openai', 'responses'],
    ['ai-sdk', 'chat'],
    ['ai-sdk', 'responses'],
    ['langchain', 'chat'],
    ['langchain', 'responses'],
  ];

  it('plain SDK code, a frontend SIGTERMed with default settings mid-stream: every stream identical', async () => {
    await restartA([]);
    const w = watched();
    const runs = plainMix.flatMap((m) => [m, m]).map(([sdk, ask]) => runSdk(sdk, ask, `${nginx.url}/v1`, w.fetch).then((run) => ({ sdk, ask, run })));
    await w.startedAll(runs.length);
    a.proc.kill('SIGTERM');
    for (const { sdk, ask, run } of await Promise.all(runs)) {
      assert.equal(run.error, undefined, `${sdk} ${ask}: no error (${String(run.error)})`);
      assert.deepEqual(run.assembled, (await reference(sdk, ask)).assembled, `${sdk} ${ask}: identical`);
    }
    assert.equal(await a.exited, 0, 'every open stream finished before its deadline');
  });

  it('plain SDK code, a frontend with a 1 s shutdown timeout: every stream identical or an error the SDK raises; no short answer, no TypeError', async () => {
    await restartA(['--shutdown-grace-ms', '0', '--shutdown-timeout-ms', '1000']);
    const w = watched();
    const runs = plainMix.flatMap((m) => [m, m]).map(([sdk, ask]) => runSdk(sdk, ask, `${nginx.url}/v1`, w.fetch).then((run) => ({ sdk, ask, run })));
    await w.startedAll(runs.length);
    a.proc.kill('SIGTERM');
    let raised = 0;
    for (const { sdk, ask, run } of await Promise.all(runs)) {
      if (run.error === undefined) assert.deepEqual(run.assembled, (await reference(sdk, ask)).assembled, `${sdk} ${ask}: without an error, identical (never short)`);
      else {
        raised++;
        assert.ok(!(run.error instanceof TypeError), `${sdk} ${ask}: an error the SDK raises, not a TypeError: ${String(run.error)}`);
      }
    }
    assert.ok(raised > 0, 'the streams at the stopped frontend were cut (its deadline passed)');
  });

  /** Every kind of stream through every SDK that can ask it, 30 in all, with resumableFetch: all identical whatever happens to frontend `a`. */
  async function thirtyThrough(stop: (f: FrontendHandle) => void) {
    const mix: Array<[Sdk, Ask]> = [
      ['openai', 'chat'],
      ['openai', 'chat-tools'],
      ['openai', 'chat-logprobs'],
      ['openai', 'chat-n2'],
      ['openai', 'responses'],
      ['openai', 'completions'],
      ['ai-sdk', 'chat'],
      ['ai-sdk', 'chat-tools'],
      ['ai-sdk', 'responses'],
      ['langchain', 'chat'],
      ['langchain', 'chat-tools'],
      // LangChain runs the two choices' text together in the order their chunks came (not each choice's own), so n: 2 goes through the openai SDK.
      ['openai', 'chat-n2'],
      ['langchain', 'responses'],
      ['openai', 'chat'],
      ['langchain', 'chat-logprobs'],
    ];
    const w = watched(resumableFetch());
    const runs = [...mix, ...mix].map(([sdk, ask]) => runSdk(sdk, ask, `${nginx.url}/v1`, w.fetch).then((run) => ({ sdk, ask, run })));
    assert.equal(runs.length, 30);
    await w.startedAll(runs.length);
    stop(a);
    for (const { sdk, ask, run } of await Promise.all(runs)) {
      assert.equal(run.error, undefined, `${sdk} ${ask}: no error (${String(run.error)})`);
      assert.deepEqual(run.assembled, (await reference(sdk, ask)).assembled, `${sdk} ${ask}: identical`);
    }
    return w.stats;
  }

  it('with resumableFetch, a frontend SIGTERMed mid-stream: 30 of 30 streams identical (tools, logprobs, n: 2, Responses)', async (t) => {
    await restartA(['--shutdown-grace-ms', '0', '--shutdown-timeout-ms', '500']);
    const stats = await thirtyThrough((f) => f.proc.kill('SIGTERM'));
    t.diagnostic(`longest pause between two chunks an SDK got: ${Math.round(stats.longestPauseMs)} ms`);
  });

  it('with resumableFetch, a frontend SIGKILLed mid-stream: 30 of 30 streams identical (tools, logprobs, n: 2, Responses)', async (t) => {
    await restartA([]);
    const stats = await thirtyThrough((f) => f.proc.kill('SIGKILL'));
    t.diagnostic(`longest pause between two chunks an SDK got: ${Math.round(stats.longestPauseMs)} ms`);
  });
});

describe("a rolling restart of 3 frontends under steady agent traffic, with the manifests' settings: no stream lost", { skip }, () => {
  const started: EbbProcess[] = [];
  let redis: RedisServer;
  let discovery: string;
  let nginx: Nginx;
  before(async () => {
    redis = await startRedis();
    discovery = tempDiscoveryUrl();
    started.push(...(await Promise.all([0, 1].map(() => startWorker(['--discovery', discovery, '--model', 'm1', '--mocker-itl-ms', '60', '--mocker-ttft-ms', '0', '--mocker-max-context', '200'])))));
  });
  after(async () => {
    await nginx?.stop();
    await Promise.all(started.map((p) => p.stop()));
    await redis?.stop();
  });

  // deploy/kubernetes/frontend.yaml's: a 5 s grace, 300 s for open streams, the shared store.
  const MANIFEST = ['--shutdown-grace-ms', '5000', '--shutdown-timeout-ms', '300000'];
  async function frontend(port: number): Promise<FrontendHandle> {
    const f = await startFrontend(discovery, ['--port', String(port), '--admin-port', '0', '--stream-store', redis.url, ...MANIFEST]);
    started.push(f);
    await frontendSeesWorkers(f, 2);
    return f;
  }

  it('each frontend replaced in turn (a new one first, then the old SIGTERMed) while agents stream tool calls: every stream whole', async () => {
    let ports = await Promise.all([0, 1, 2].map(() => freePort()));
    let frontends = await Promise.all(ports.map(frontend));
    nginx = await startNginx(ports);
    const reference = await runSdk('openai', 'chat-tools', `${frontends[0]!.url}/v1`);
    let rolling = true;
    const results: SdkRun[] = [];
    // Four agents, each streaming one tool-call turn after another for as long as the rollout lasts.
    const agents = Array.from({ length: 4 }, async () => {
      // The SDK's default retries (2): nginx's reload at each step closes idle keep-alive connections, and a
      // request sent on one as it closes gets no answer at all (nothing started: the SDK sends it again).
      while (rolling) results.push(await runSdk('openai', 'chat-tools', `${nginx.url}/v1`, resumableFetch(), 2));
    });
    for (let i = 0; i < 3; i++) {
      const port = await freePort();
      const replacement = await frontend(port);
      const old = frontends[i]!;
      // As a Deployment's surge does: the new one in the balancer, the old one out, then SIGTERMed (its open streams finish there).
      ports = ports.map((p, j) => (j === i ? port : p));
      await nginx.setBackends(ports);
      old.proc.kill('SIGTERM');
      assert.equal(await old.exited, 0, `frontend ${i} finished its streams before its deadline`);
      frontends = frontends.map((f, j) => (j === i ? replacement : f));
    }
    rolling = false;
    await Promise.all(agents);
    assert.ok(results.length >= 8, `agents streamed through the rollout (${results.length} turns)`);
    results.forEach((run, i) => {
      assert.equal(run.error, undefined, `turn ${i}: no error (${String(run.error)})`);
      assert.deepEqual(run.assembled, reference.assembled, `turn ${i}: whole`);
    });
  });
});
