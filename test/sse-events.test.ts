import assert from 'node:assert/strict';
import { test } from 'node:test';
import { sseData, sseEvents, type SseEvent } from '../src/common/sse-events.js';
import { readSse } from '../src/common/sse-hub.js';

async function* chunks(...parts: string[]): AsyncGenerator<Buffer> {
  for (const p of parts) yield Buffer.from(p);
}

async function all<T>(it: AsyncIterable<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const x of it) out.push(x);
  return out;
}

test('SSE reader: event names, multi-line data, comments, and every line ending (split anywhere)', async () => {
  const body = ': keep-alive\n\nretry: 1000\n\nevent: status\ndata: {"a":1}\n\ndata: one\ndata:  two\r\n\r\nevent: x\rdata:three\r\rdata\n\n';
  const want: SseEvent[] = [
    { event: 'status', data: '{"a":1}' },
    { event: 'message', data: 'one\n two' },
    { event: 'x', data: 'three' },
    { event: 'message', data: '' },
  ];
  assert.deepEqual(await all(sseEvents(chunks(body))), want);
  // Every split point, the CR of a CRLF and a multi-byte character included, reads the same.
  const utf = 'data: é\r\n\r\n';
  for (let i = 1; i < body.length; i++) assert.deepEqual(await all(sseEvents(chunks(body.slice(0, i), body.slice(i)))), want, `split at ${i}`);
  const bytes = Buffer.from(utf);
  for (let i = 1; i < bytes.length; i++) assert.deepEqual(await all(sseEvents((async function* () { yield bytes.subarray(0, i); yield bytes.subarray(i); })())), [{ event: 'message', data: 'é' }]);
});

test('SSE reader: data left without its blank line at the end still counts; an event name alone does not', async () => {
  assert.deepEqual(await all(sseData(chunks('data: a\n\ndata: [DONE]'))), ['a', '[DONE]']);
  assert.deepEqual(await all(sseData(chunks('data: a\r\n'))), ['a']);
  assert.deepEqual(await all(sseEvents(chunks('event: lonely\n\n'))), []);
});

test("readSse: ebb's JSON event streams, non-JSON data skipped", async () => {
  const got = await all(readSse(chunks('event: snapshot\ndata: {"workers":[]}\n\nevent: bad\ndata: {nope\n\n: hb\n\nevent: status\ndata: 3\n\n')));
  assert.deepEqual(got, [
    { event: 'snapshot', data: { workers: [] } },
    { event: 'status', data: 3 },
  ]);
});
