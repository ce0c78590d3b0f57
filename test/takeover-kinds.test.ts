import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { sseEvents } from './helpers/http.js';
import OpenAI from 'openai';
import { Redis } from 'ioredis';
import { frontendSeesWorkers, startFrontend, startWorker, tempDiscoveryUrl, type EbbProcess, type FrontendHandle } from './helpers/processes.js';
import { redisSkipReason, startRedis, type RedisServer } from './helpers/redis.js';

/**
 * Every kept stream can be taken over (issue 43 item 5): with tools, logprobs, two choices, and the
 * Responses API with tools, a frontend SIGKILLed mid-stream, and the stream continued at another
 * from what the shared store kept: what the client gets is what an undisturbed run gives. And a
 * hand-on is immediate (item 6): its lease dropped before its client hears where to resume.
 */
describe('takeovers of every kind of stream', { skip: redisSkipReason() }, () => {
  const started: EbbProcess[] = [];
  let redis: RedisServer;
  let discovery: string;
  let b: FrontendHandle;
  before(async () => {
    redis = await startRedis();
    discovery = tempDiscoveryUrl();
    started.push(...(await Promise.all([0, 1].map(() => startWorker(['--discovery', discovery, '--model', 'm1', '--mocker-itl-ms', '25', '--mocker-ttft-ms', '0', '--mocker-max-context', '100000'])))));
    b = await startFrontend(discovery, ['--stream-store', redis.url]);
    started.push(b);
    await frontendSeesWorkers(b, 2);
  });
  after(async () => {
    await Promise.all(started.map((p) => p.stop()));
    await redis?.stop();
  });

  const KEPT = { 'content-type': 'application/json', 'x-ebb-resumable': '1' };
  const tools = [{ type: 'function', function: { name: 'get_tide', description: 'tide times', parameters: { type: 'object', properties: { harbor: { type: 'string', minLength: 40 }, days: { type: 'array', items: { type: 'integer' }, minItems: 6 }, detail: { type: 'string', minLength: 30 } }, required: ['harbor', 'days'] } } }];

  /** Raw SSE events; `onEvent` may return true to stop reading (the connection is then dropped). */
  async function events(res: Response, onEvent: (e: string) => boolean | void = () => undefined): Promise<string[]> {
    // A cut: what came before is what the client had.
    return sseEvents(res, onEvent, { keepOnCut: true });
  }
  const idsOf = (e: string[]) => e.map((x) => /^id: (\d+)$/m.exec(x)?.[1]).filter((x) => x !== undefined).map(Number);
  /** The events as a client assembles them: ids, response ids and creation times aside. */
  const same = (e: string[]) =>
    e
      .map((x) => x.replace(/^id: \d+\n/, ''))
      .map((x) => x.replaceAll(/(chatcmpl|resp|msg)[-_][0-9a-f_]+/g, 'ID').replaceAll(/"(created|created_at)":\d+/g, '"$1":0').replace(/"prompt_tokens_details":\{"cached_tokens":\d+\}/, '').replace(/"cached_tokens":\d+/, ''));

  /**
   * The request at a frontend that is SIGKILLed once `cutAt` says so, resumed at b after the last
   * event the client had: the whole as the client assembles it, and the undisturbed run's.
   */
  async function cutAndResume(path: string, request: Record<string, unknown>, cutAt: (e: string) => boolean, idOf: (e: string[]) => string) {
    const undisturbed = await events(await fetch(`${b.url}${path}`, { method: 'POST', headers: KEPT, body: JSON.stringify(request) }));
    const a = await startFrontend(discovery, ['--stream-store', redis.url]);
    started.push(a);
    await frontendSeesWorkers(a, 2);
    const first = await events(await fetch(`${a.url}${path}`, { method: 'POST', headers: KEPT, body: JSON.stringify(request) }), (e) => {
      if (!cutAt(e)) return;
      a.proc.kill('SIGKILL');
      return true;
    });
    const last = Math.max(...idsOf(first));
    const mark = b.mark();
    const rest = await events(await fetch(`${b.url}${path}/${idOf(first)}?stream=true`, { headers: { 'last-event-id': String(last) } }));
    await b.waitForEvent('stream_taken_over', (l) => l.response_id === idOf(first), { after: mark });
    const all = [...first, ...rest];
    assert.deepEqual(idsOf(all), idsOf(all).map((_, i) => i), 'ids from 0, each once, none missing');
    return { all, undisturbed };
  }
  const chatId = (e: string[]) => /"id":"(chatcmpl-[0-9a-f]+)"/.exec(e.join('\n'))![1]!;

  it('a tool-call stream cut inside its arguments: the call continued at another frontend, its JSON whole and identical', async () => {
    const request = { model: 'm1', messages: [{ role: 'user', content: 'when is high tide?' }], tools, tool_choice: 'required', seed: 3, stream: true, max_tokens: 400 };
    let argPieces = 0;
    const { all, undisturbed } = await cutAndResume('/v1/chat/completions', request, (e) => e.includes('"arguments":"') && ++argPieces === 4, chatId);
    assert.deepEqual(same(all), same(undisturbed));
    const args = all
      .map((x) => /"arguments":("(?:[^"\\]|\\.)*")/.exec(x)?.[1])
      .filter((x) => x !== undefined)
      .map((x) => JSON.parse(x!) as string)
      .join('');
    assert.doesNotThrow(() => JSON.parse(args), `the arguments are whole JSON: ${args}`);
    assert.ok(all.some((x) => x.includes('"finish_reason":"tool_calls"')));
  });

  it('a logprobs stream: the continued tokens carry the logprobs an undisturbed run gives', async () => {
    const request = { model: 'm1', messages: [{ role: 'user', content: 'tell me about the tides' }], logprobs: true, top_logprobs: 3, seed: 4, stream: true, max_tokens: 60 };
    const { all, undisturbed } = await cutAndResume('/v1/chat/completions', request, (e) => e.startsWith('id: 15\n'), chatId);
    assert.deepEqual(same(all), same(undisturbed));
  });

  it('an n: 2 stream with usage: both choices continued, one usage for the whole', async () => {
    const request = { model: 'm1', messages: [{ role: 'user', content: 'tell me about the tides' }], n: 2, seed: 5, stream: true, max_tokens: 50, stream_options: { include_usage: true } };
    const { all, undisturbed } = await cutAndResume('/v1/chat/completions', request, (e) => e.startsWith('id: 30\n'), chatId);
    const choice = (e: string[], i: number) =>
      e
        .map((x) => /^data: (\{.*\})$/m.exec(x)?.[1])
        .filter((x): x is string => x !== undefined)
        .map((x) => (JSON.parse(x) as { choices: Array<{ index: number; delta?: { content?: string } }> }).choices.find((c) => c.index === i)?.delta?.content ?? '')
        .join('');
    for (const i of [0, 1]) assert.equal(choice(all, i), choice(undisturbed, i), `choice ${i}`);
    const usage = (e: string[]) => /"usage":(\{[^}]*\})/.exec(e.join('\n'))?.[1]?.replace(/,"prompt_tokens_details":\{"cached_tokens":\d+/, '');
    assert.equal(usage(all), usage(undisturbed));
  });

  it('a Responses stream with tools: taken over, its items and the final response as undisturbed', async () => {
    const request = { model: 'm1', input: 'when is high tide?', tools: [{ type: 'function', name: 'get_tide', parameters: tools[0]!.function.parameters }], tool_choice: 'required', stream: true, max_output_tokens: 400 };
    let deltas = 0;
    const { all, undisturbed } = await cutAndResume('/v1/responses', request, (e) => e.includes('function_call_arguments.delta') && ++deltas === 3, (e) => /"id":"(resp_[0-9a-f]+)"/.exec(e.join('\n'))![1]!);
    assert.deepEqual(same(all), same(undisturbed));
  });

  it("a hand-on at a frontend's shutdown deadline is immediate: its lease is gone before its client hears where to resume, and the other frontend continues it then", async () => {
    const a = await startFrontend(discovery, ['--stream-store', redis.url, '--shutdown-grace-ms', '0', '--shutdown-timeout-ms', '200']);
    started.push(a);
    await frontendSeesWorkers(a, 2);
    const admin = new Redis(redis.url);
    try {
      let id = '';
      let leaseAtHandOn = -1;
      const first = await events(await fetch(`${a.url}/v1/chat/completions`, { method: 'POST', headers: KEPT, body: JSON.stringify({ model: 'm1', messages: [{ role: 'user', content: 'tides' }], max_tokens: 200, stream: true }) }), (e) => {
        id ||= /"id":"(chatcmpl-[0-9a-f]+)"/.exec(e)?.[1] ?? '';
        if (e.startsWith('id: 3\n')) a.proc.kill('SIGTERM');
      });
      leaseAtHandOn = await admin.exists(`ebb:{${id}}:lease`);
      const last = first.at(-1)!;
      assert.match(last, /"code":"stream_interrupted"/, last);
      assert.equal(leaseAtHandOn, 0, 'the lease was dropped before the client was told: a resume is taken over at once');
      assert.equal(await admin.hget(`ebb:{${id}}:meta`, 'state'), 'handed_on');
      const deadline = await a.waitForEvent('shutdown_deadline', () => true);
      assert.equal(deadline.handed_on, 1, 'the shutdown log names what the client got');
      const resume = (JSON.parse(last.slice('data: '.length)) as { error: { resume: { url: string } } }).error.resume;
      const rest = await events(await fetch(`${b.url}${resume.url}`));
      assert.ok(rest.at(-1)!.endsWith('data: [DONE]'));
      await a.exited;
      assert.ok(!a.logs.some((l) => l.event === 'stream_store_unavailable'), 'a normal stop is no store outage');
    } finally {
      admin.disconnect();
    }
  });

  it('the openai SDK, plain (no resume logic): a frontend shutdown mid-stream raises an error naming stream_interrupted, for chat and for Responses; never a short answer', async () => {
    const a = await startFrontend(discovery, ['--stream-store', redis.url, '--shutdown-grace-ms', '0', '--shutdown-timeout-ms', '200', '--keep-streams', 'all']);
    started.push(a);
    await frontendSeesWorkers(a, 2);
    const client = new OpenAI({ baseURL: `${a.url}/v1`, apiKey: 'unused', maxRetries: 0 });
    const chat = (async () => {
      let n = 0;
      for await (const _ of await client.chat.completions.create({ model: 'm1', messages: [{ role: 'user', content: 'tides' }], max_tokens: 300, stream: true })) if (++n === 3) a.proc.kill('SIGTERM');
    })();
    const responses = (async () => {
      for await (const _ of await client.responses.create({ model: 'm1', input: 'tides', max_output_tokens: 300, stream: true }));
    })();
    // Both awaited at once: the one that fails first must not be an unhandled rejection while the other is awaited.
    await Promise.all(
      ([['chat', chat], ['responses', responses]] as const).map(([what, p]) =>
        assert.rejects(p, (err: unknown) => err instanceof OpenAI.APIError && /stream_interrupted/.test(`${err.code} ${err.message}`), `${what}: the SDK raises`),
      ),
    );
  });
});
