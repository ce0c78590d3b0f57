import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { sseEvents } from './helpers/http.js';
import { Redis } from 'ioredis';
import { frontendSeesWorkers, startFrontend, startWorker, tempDiscoveryUrl, type EbbProcess, type FrontendHandle } from './helpers/processes.js';
import { redisSkipReason, startRedis, type RedisServer } from './helpers/redis.js';

/**
 * One writer per shared stream, and copies whole or not at all (issue 42, items 1 to 4): frontends
 * sharing one Redis, mocker workers; a frontend paused past its lease, a follower at another
 * frontend when its grace ends, a takeover with nothing copied, writes refused and Redis restarted.
 */
describe('shared streams: one writer, whole copies', { skip: redisSkipReason() }, () => {
  const started: EbbProcess[] = [];
  let redis: RedisServer;
  let discovery: string;
  let b: FrontendHandle;
  before(async () => {
    redis = await startRedis();
    discovery = tempDiscoveryUrl();
    started.push(...(await Promise.all([0, 1].map(() => startWorker(['--discovery', discovery, '--model', 'm1', '--mocker-itl-ms', '20', '--mocker-ttft-ms', '0', '--mocker-max-context', '100000'])))));
    b = await startFrontend(discovery, ['--stream-store', redis.url]);
    started.push(b);
    await frontendSeesWorkers(b, 2);
  });
  after(async () => {
    await Promise.all(started.map((p) => p.stop()));
    await redis?.stop();
  });

  const frontend = async (args: string[] = []) => {
    const f = await startFrontend(discovery, ['--stream-store', redis.url, ...args]);
    started.push(f);
    await frontendSeesWorkers(f, 2);
    return f;
  };
  const KEPT = { 'content-type': 'application/json', 'x-ebb-resumable': '1' };
  const body = (maxTokens: number, seed: number) => JSON.stringify({ model: 'm1', messages: [{ role: 'user', content: 'tell me about the tides' }], max_tokens: maxTokens, seed, stream: true });
  const post = (f: FrontendHandle, maxTokens: number, seed: number, signal?: AbortSignal) => fetch(`${f.url}/v1/chat/completions`, { method: 'POST', headers: KEPT, body: body(maxTokens, seed), signal });

  /** Raw SSE events, each `onEvent`'d as it comes; `stopAt` (an id) ends the read there, closing the connection. */
  async function events(res: Response, opts: { stopAt?: number; controller?: AbortController; onEvent?: (e: string) => void } = {}): Promise<string[]> {
    return sseEvents(res, (e) => {
      opts.onEvent?.(e);
      return opts.stopAt !== undefined && e.startsWith(`id: ${opts.stopAt}\n`);
    }, { controller: opts.controller });
  }
  const idOf = (e: string[]) => /"id":"(chatcmpl-[0-9a-f]+)"/.exec(e.join('\n'))![1]!;
  const idsOf = (e: string[]) => e.map((x) => /^id: (\d+)$/m.exec(x)?.[1]).filter((x) => x !== undefined).map(Number);
  const text = (e: string[]) => e.map((x) => /"delta":\{"content":("(?:[^"\\]|\\.)*")/.exec(x)?.[1]).filter((x) => x !== undefined).map((x) => JSON.parse(x!) as string).join('');
  const reference = async (maxTokens: number, seed: number) => text(await events(await post(b, maxTokens, seed)));
  const resumeAt = (f: FrontendHandle, id: string, after: number) => fetch(`${f.url}/v1/chat/completions/${id}?stream=true`, { headers: { 'last-event-id': String(after) } });

  it('a frontend paused past its lease while a client follows at another: the other takes the stream over, the paused one wakes to find it lost and writes nothing more: every event once, as undisturbed', async () => {
    const a = await frontend();
    const expected = await reference(200, 21);
    const atA = new AbortController();
    let followerStarted!: () => void;
    const followed = new Promise<void>((resolve) => (followerStarted = resolve));
    let id = '';
    // The client at A reads on (its connection stays open across the pause).
    const first = events(await post(a, 200, 21, atA.signal), {
      onEvent: (e) => {
        id ||= /"id":"(chatcmpl-[0-9a-f]+)"/.exec(e)?.[1] ?? '';
        if (e.startsWith('id: 10\n')) followerStarted();
      },
    });
    await followed;
    const bMark = b.mark();
    let following!: () => void;
    const isFollowing = new Promise<void>((resolve) => (following = resolve));
    const follower = resumeAt(b, id, 10).then((r) => events(r, { onEvent: () => following() }));
    // Once b relays it, A is paused (GC, throttling) past its 5 s lease: b takes the stream over.
    await isFollowing;
    a.proc.kill('SIGSTOP');
    await b.waitForEvent('stream_taken_over', (l) => l.response_id === id, { after: bMark, boundMs: 30_000 });
    const aMark = a.mark();
    a.proc.kill('SIGCONT');
    const rest = await follower;
    // A woke to a lease another frontend holds: its generation stopped, and its client was told where to resume.
    await a.waitForEvent('stream_lease', (l) => l.response_id === id && l.to === 'lost', { after: aMark });
    const atAEvents = await first;
    const last = atAEvents.at(-1)!;
    assert.match(last, /"code":"stream_interrupted"/, `A's client is told to resume elsewhere: ${last}`);
    const ids = idsOf(rest);
    assert.deepEqual(ids, Array.from({ length: ids.length }, (_, i) => 11 + i), 'the follower got each event once, in order, from 11');
    assert.equal(rest.filter((x) => x.endsWith('data: [DONE]')).length, 1, 'one end');
    const whole = await events(await resumeAt(b, id, -1));
    assert.deepEqual(idsOf(whole), idsOf(whole).map((_, i) => i), "the fleet's copy holds each event once");
    assert.equal(text(whole), expected, 'the copy is the undisturbed answer');
    // A's client resumes at b from where it stopped: the rest, as undisturbed.
    const lastId = Math.max(...idsOf(atAEvents));
    assert.equal(text(atAEvents) + text(await events(await resumeAt(b, id, lastId))), expected, "A's client, resumed, has the whole answer");
  });

  it("a client that resumed at another frontend is not cut when the first frontend's grace ends: it follows to the end", async () => {
    const a = await frontend(['--resume-grace-ms', '300']);
    const expected = await reference(120, 22);
    const cut = new AbortController();
    const first = await events(await post(a, 120, 22, cut.signal), { stopAt: 5, controller: cut });
    const rest = await events(await resumeAt(b, idOf(first), 5));
    assert.ok(rest.at(-1)!.endsWith('data: [DONE]'), `followed to its end, not cut at A's grace: ${rest.at(-1)}`);
    assert.equal(text(first) + text(rest), expected);
  });

  it('a frontend killed before its first batch reached the store: the stream taken over starts afresh, its role chunk once, ids from 0, as undisturbed', async () => {
    const a = await frontend();
    const expected = await events(await post(b, 30, 23));
    // Killed the moment its first events reach the client: within the 10 ms before the store would have them.
    const first: string[] = [];
    await events(await post(a, 30, 23), {
      onEvent: (e) => {
        first.push(e);
        if (a.proc.exitCode === null && a.proc.signalCode === null) a.proc.kill('SIGKILL');
      },
    }).catch(() => undefined);
    assert.ok(first.length > 0, 'the client had its first events');
    const lastId = Math.max(...idsOf(first));
    const rest = await events(await resumeAt(b, idOf(first), lastId));
    const all = [...first, ...rest];
    assert.deepEqual(idsOf(all), idsOf(all).map((_, i) => i), 'ids from 0, each once');
    assert.equal(all.filter((x) => x.includes('"role":"assistant"')).length, 1, 'one role chunk');
    assert.equal(all.filter((x) => x.endsWith('data: [DONE]')).length, 1, 'one end');
    assert.equal(text(all), text(expected));
  });

  it('no client is ever ahead of the copy: while Redis answers nothing, the stream waits for it; once the writer gives up on the batch it runs on, and the copy is rewritten whole', async () => {
    const a = await frontend();
    const expected = await reference(150, 26);
    let id = '';
    let frozenAt = Infinity;
    const arrivals: number[] = [];
    let at10!: () => void;
    const ten = new Promise<void>((resolve) => (at10 = resolve));
    const aMark = a.mark();
    const atA = events(await post(a, 150, 26), {
      onEvent: (e) => {
        id ||= /"id":"(chatcmpl-[0-9a-f]+)"/.exec(e)?.[1] ?? '';
        arrivals.push(Date.now());
        if (e.startsWith('id: 10\n')) at10();
      },
    });
    await ten;
    redis.freeze();
    frozenAt = Date.now();
    try {
      // The batch in flight at the freeze fails at the command timeout: only then (its log line first) do events go out uncopied.
      const gaveUp = Date.parse((await a.waitForEvent('stream_lease', (l) => l.response_id === id && l.to === 'rewrite', { after: aMark, boundMs: 30_000 })).time as string);
      // At 20 ms a token, ~100 were made while Redis answered nothing; only those copied before it froze may have reached the client.
      const early = arrivals.filter((t) => t > frozenAt && t < gaveUp).length;
      assert.ok(gaveUp - frozenAt > 500, `the writer gave up on the frozen store at its command timeout, not at once: ${gaveUp - frozenAt} ms`);
      assert.ok(early <= 5, `at most the events copied before the freeze reached the client before the writer gave up on the store: ${early}`);
    } finally {
      redis.thaw();
    }
    await a.waitForEvent('stream_lease', (l) => l.response_id === id && l.to === 'held' && l.from === 'rewrite', { after: aMark, boundMs: 30_000 });
    assert.equal(text(await atA), expected, 'the stream ran on, whole');
    assert.equal(text(await events(await resumeAt(b, id, -1))), expected, 'the rewritten copy is whole');
  });

  it('writes refused at maxmemory: a follower elsewhere waits, never served a gap; the writer rewrites its copy whole once the store takes writes again', async () => {
    const a = await frontend();
    const expected = await reference(150, 24);
    const admin = new Redis(redis.url);
    try {
      let id = '';
      let refused!: () => void;
      const writesRefused = new Promise<void>((resolve) => (refused = resolve));
      const atA = events(await post(a, 150, 24), {
        onEvent: (e) => {
          id ||= /"id":"(chatcmpl-[0-9a-f]+)"/.exec(e)?.[1] ?? '';
          if (e.startsWith('id: 20\n')) void admin.config('SET', 'maxmemory', '1').then(() => refused());
        },
      });
      await writesRefused;
      const aMark = a.mark();
      const follower = resumeAt(b, id, 0).then((r) => events(r));
      await a.waitForEvent('stream_lease', (l) => l.response_id === id && l.to === 'rewrite', { after: aMark });
      await admin.config('SET', 'maxmemory', '0');
      const rest = await follower;
      const mine = await atA;
      assert.equal(text(mine), expected, 'the client at A was never held up');
      assert.deepEqual(idsOf(rest), idsOf(rest).map((_, i) => i + 1), 'the follower got every event after 0, none missing');
      assert.equal(rest.filter((x) => x.endsWith('data: [DONE]')).length, 1);
    } finally {
      await admin.config('SET', 'maxmemory', '0').catch(() => undefined);
      admin.disconnect();
    }
  });

  it('Redis restarted empty mid-stream: the writer rewrites its copy whole, and a client following at another frontend reads on: every event once, as undisturbed', async () => {
    const a = await frontend();
    const expected = await reference(200, 25);
    let id = '';
    let at10!: () => void;
    const ten = new Promise<void>((resolve) => (at10 = resolve));
    const atA = events(await post(a, 200, 25), {
      onEvent: (e) => {
        id ||= /"id":"(chatcmpl-[0-9a-f]+)"/.exec(e)?.[1] ?? '';
        if (e.startsWith('id: 10\n')) at10();
      },
    });
    await ten;
    let following!: () => void;
    const isFollowing = new Promise<void>((resolve) => (following = resolve));
    const follower = resumeAt(b, id, 10).then((r) => events(r, { onEvent: () => following() }));
    await isFollowing;
    const aMark = a.mark();
    await redis.restart();
    await a.waitForEvent('stream_lease', (l) => l.response_id === id && l.to === 'held' && l.from === 'rewrite', { after: aMark, boundMs: 30_000 });
    const rest = await follower;
    assert.equal(text(await atA), expected);
    assert.deepEqual(idsOf(rest), idsOf(rest).map((_, i) => i + 11), 'from 11, each once, none missing');
    assert.equal(rest.filter((x) => x.endsWith('data: [DONE]')).length, 1, `one end: ${rest.at(-1)}`);
    assert.equal(text(await events(await resumeAt(b, id, -1))), expected, 'the rewritten copy is whole');
  });
});
