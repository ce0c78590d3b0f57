import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { call } from './helpers/http.js';
import { frontendSeesWorkers, startFrontend, startWorker, tempDiscoveryUrl, type EbbProcess, type FrontendHandle } from './helpers/processes.js';
import { redisSkipReason, startRedis, type RedisServer } from './helpers/redis.js';

/** Two frontends sharing one Redis stream store (--stream-store redis://...), two mocker workers. */
describe('resumable streams across frontends: the Redis stream store', { skip: redisSkipReason() }, () => {
  const started: EbbProcess[] = [];
  let redis: RedisServer;
  let a: FrontendHandle;
  let b: FrontendHandle;
  before(async () => {
    redis = await startRedis();
    const discovery = tempDiscoveryUrl();
    started.push(...(await Promise.all([0, 1].map(() => startWorker(['--discovery', discovery, '--model', 'm1', '--mocker-itl-ms', '20', '--mocker-ttft-ms', '0', '--mocker-max-context', '100000'])))));
    [a, b] = await Promise.all([0, 1].map(() => startFrontend(discovery, ['--stream-store', redis.url]))) as [FrontendHandle, FrontendHandle];
    started.push(a, b);
    await Promise.all([frontendSeesWorkers(a, 2), frontendSeesWorkers(b, 2)]);
  });
  after(async () => {
    await Promise.all(started.map((p) => p.stop()));
    await redis?.stop();
  });

  const body = (maxTokens: number, seed: number) => JSON.stringify({ model: 'm1', messages: [{ role: 'user', content: 'tell me about the tides' }], max_tokens: maxTokens, seed, stream: true });

  /** Raw SSE events of a response, stopping (and closing) after the event `stopAt` when given. */
  async function events(res: Response, stopAt?: number, controller?: AbortController, onEvent: (e: string) => void = () => undefined): Promise<string[]> {
    const out: string[] = [];
    let buf = '';
    try {
      for await (const chunk of res.body as AsyncIterable<Uint8Array>) {
        buf += Buffer.from(chunk).toString('utf8');
        let end: number;
        while ((end = buf.indexOf('\n\n')) >= 0) {
          out.push(buf.slice(0, end));
          buf = buf.slice(end + 2);
          onEvent(out.at(-1)!);
          if (stopAt !== undefined && out.at(-1)!.startsWith(`id: ${stopAt}\n`)) {
            controller?.abort();
            return out;
          }
        }
      }
    } catch (err) {
      if (!controller?.signal.aborted) throw err;
    }
    return out;
  }
  const idOf = (e: string[]) => /"id":"(chatcmpl-[0-9a-f]+)"/.exec(e[0]!)![1]!;

  it('a client cut at one frontend resumes at the other while the first still generates: the missed events byte for byte, one [DONE]', async () => {
    const cut = new AbortController();
    const first = await events(await fetch(`${a.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: body(80, 1), signal: cut.signal }), 20, cut);
    const id = idOf(first);
    const rest = await events(await fetch(`${b.url}/v1/chat/completions/${id}?stream=true&starting_after=20`));
    assert.ok(rest[0]!.startsWith('id: 21\n'), rest[0]);
    assert.equal(rest.filter((e) => e.endsWith('data: [DONE]')).length, 1);
    const whole = await events(await fetch(`${a.url}/v1/chat/completions/${id}?stream=true`));
    assert.deepEqual([...first, ...rest], whole, 'what the cut client had, then what the other frontend sent: the whole stream');
    // Ended, it is still in the store for the window: another resume there replays it.
    assert.deepEqual(await events(await fetch(`${b.url}/v1/chat/completions/${id}?stream=true&starting_after=40`)), whole.slice(41));
  });

  it('a stream whose frontend is killed: its followers at the other frontend get an error event saying so, never a silent cut', async () => {
    const cut = new AbortController();
    const first = await events(await fetch(`${a.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: body(100_000, 2), signal: cut.signal }), 3, cut);
    // Once b relays the live stream (its first event came), the frontend running it dies.
    const got = await events(await fetch(`${b.url}/v1/chat/completions/${idOf(first)}?stream=true&starting_after=3`), undefined, undefined, () => {
      if (a.proc.exitCode === null && a.proc.signalCode === null) a.proc.kill('SIGKILL');
    });
    assert.match(got.at(-1)!, /"code":"server_closing"/, 'the last event says the frontend is gone');
    assert.match(got.at(-1)!, /is gone; it cannot be continued/);
  });

  it('Redis gone: streams run on unkept there, nothing admitted is lost; a resume that needs Redis is a 503 stream_store_unavailable', async () => {
    const running = fetch(`${b.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: body(60, 3) }).then((r) => events(r));
    const mark = b.mark();
    await redis.kill();
    await b.waitForEvent('stream_store_unavailable', () => true, { after: mark });
    const done = await running;
    assert.ok(done.at(-1)!.endsWith('data: [DONE]'), 'the stream running when Redis went away completed');
    assert.equal(done.filter((e) => e.includes('"delta":{"content"')).length, 60);
    const fresh = await events(await fetch(`${b.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: body(5, 4) }));
    assert.ok(fresh.at(-1)!.endsWith('data: [DONE]'), 'a new stream is served');
    const elsewhere = await call('GET', `${b.url}/v1/chat/completions/chatcmpl-0123456789abcdef?stream=true`);
    assert.equal(elsewhere.status, 503);
    assert.equal(elsewhere.body.error.code, 'stream_store_unavailable');
    // Its own streams are still resumable from its memory.
    assert.equal((await fetch(`${b.url}/v1/chat/completions/${idOf(fresh)}?stream=true`)).status, 200);
  });
});
