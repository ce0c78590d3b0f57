import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { isDeepStrictEqual } from 'node:util';
import { handOnEvent, startCuttingServer, type Api, type Cut, type CuttingServer } from './helpers/cutting-sse-server.js';
import { runSdk, type Sdk, type SdkRun } from './helpers/sdk-streams.js';

/**
 * SDK probes: PLAIN SDK code (no resumableFetch) reading a stream that ends, after 5 events, with
 * an event of a given shape. Which shapes make each SDK raise, and which leave the code a short
 * answer (the worst outcome: nothing says it is short) or a TypeError in its own chunk handling.
 * The openai SDK and LangChain raise by throwing; the AI SDK's streamText by an error part (its
 * onError, finishReason "error"). Pinned to the SDK versions in package-lock.json.
 */
let server: CuttingServer;
before(async () => {
  server = await startCuttingServer();
});
after(async () => {
  await server.close();
});

const SDKS: Sdk[] = ['openai', 'ai-sdk', 'langchain'];
const APIS = ['chat', 'completions', 'responses'] as const;

/** What one SDK made of a stream: raised (with the error's code, else its name), returned short, or a TypeError. */
function outcome(run: SdkRun, whole: SdkRun): string {
  if (run.error === undefined) return isDeepStrictEqual(run.assembled, whole.assembled) ? 'whole' : 'returned short';
  if (run.error instanceof TypeError) return 'TypeError';
  const e = run.error as { code?: unknown; error?: { code?: unknown }; name?: unknown };
  const code = e.code ?? e.error?.code;
  return `raised ${typeof code === 'string' ? code : String(e.name)}`;
}

/** Every SDK and API through a stream that ends with `cut`; `apis` limits it to the APIs a shape is for. */
async function probe(cut: Cut, apis: readonly Api[] = APIS): Promise<Record<string, string>> {
  const seen: Record<string, string> = {};
  for (const sdk of SDKS) {
    for (const api of apis) {
      server.plan = {};
      const whole = await runSdk(sdk, api, server.baseURL);
      assert.equal(whole.error, undefined, `${sdk} ${api} uncut: ${String(whole.error)}`);
      server.plan = { cuts: [cut] };
      seen[`${sdk} ${api}`] = outcome(await runSdk(sdk, api, server.baseURL), whole);
    }
  }
  return seen;
}

/** The same outcome for every SDK and API, but where `except` says. */
function expect(all: string, except: Record<string, string> = {}, apis: readonly Api[] = APIS): Record<string, string> {
  const out: Record<string, string> = {};
  for (const sdk of SDKS) for (const api of apis) out[`${sdk} ${api}`] = except[`${sdk} ${api}`] ?? all;
  return out;
}

describe('SDK probes: which error events make plain SDK code raise', () => {
  it('the hand-on event as the protocol first decided it raises in every SDK; the AI SDK\'s Responses reader fails it as a malformed chunk (no sequence_number)', async () => {
    const cut: Cut = { after: 5, kind: 'event', text: ({ api, id, last }) => handOnEvent(api, id, last, { sequenceNumber: false }) };
    assert.deepEqual(await probe(cut), expect('raised stream_interrupted', { 'ai-sdk responses': 'raised AI_TypeValidationError' }));
  });

  it('with sequence_number in the Responses error event, every SDK raises stream_interrupted itself', async () => {
    const cut: Cut = { after: 5, kind: 'event', text: ({ api, id, last }) => handOnEvent(api, id, last) };
    assert.deepEqual(await probe(cut), expect('raised stream_interrupted'));
  });

  it('the Responses error event without the nested error object (OpenAI\'s documented shape) leaves the openai SDK and LangChain a short answer', async () => {
    const flat: Cut = {
      after: 5,
      kind: 'event',
      text: ({ last }) => `event: error\ndata: ${JSON.stringify({ type: 'error', sequence_number: last, code: 'stream_interrupted', message: 'cut', param: null })}\n\n`,
    };
    assert.deepEqual(await probe(flat, ['responses']), expect('returned short', { 'ai-sdk responses': 'raised stream_interrupted' }, ['responses']));
  });

  it('a body that ends without its end event returns short in every SDK (what resumableFetch and the hand-on event are for)', async () => {
    assert.deepEqual(await probe({ after: 5, kind: 'ended' }), expect('returned short'));
  });

  it('the ebb.resume event (the hand-on before the protocol): a TypeError, a malformed chunk, or a short answer', async () => {
    const cut: Cut = {
      after: 5,
      kind: 'event',
      text: ({ id, last }) => `retry: 1000\nevent: ebb.resume\ndata: ${JSON.stringify({ type: 'ebb.resume', response_id: id, last_event_id: last })}\n\n`,
    };
    assert.deepEqual(
      await probe(cut),
      expect('returned short', {
        'openai chat': 'TypeError',
        'openai completions': 'TypeError',
        'ai-sdk chat': 'raised AI_TypeValidationError',
        'ai-sdk completions': 'raised AI_TypeValidationError',
        'langchain completions': 'TypeError',
      }),
    );
  });
});
