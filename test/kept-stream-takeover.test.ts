import { describe, it, after } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { KeptStream } from '../src/frontend/streams/kept-stream.js';
import { bounded } from './helpers/processes.js';

const event = (id: number) => Buffer.from(`id: ${id}\ndata: {"n":${id}}\n\n`);
const ERROR = Buffer.from('data: {"error":{"code":"stream_lost"}}\n\n');

/**
 * A stream continued from a copy after its writer went away (issue 42 item 4, issue 43 item 5): a
 * client whose resume point the copy lacks got events from that writer the continuation cannot
 * match, so it ends with an error; a client the copy covers is served the continuation. Real HTTP
 * responses on a port-0 server.
 */
describe('kept stream continued from a copy', () => {
  const stream = new KeptStream('chatcmpl-taken', { maxBytes: 1 << 20, graceMs: 60_000, writeTimeoutMs: 5_000, onBytes: () => undefined, onOver: () => undefined, onAbandoned: () => undefined }, '');
  stream.detach();
  // What the dead writer's copy held: events 0 to 2 (its client had more: up to 4).
  stream.seed(Buffer.concat([event(0), event(1), event(2)]));
  const server = createServer((req, res) => {
    const from = Number(new URL(req.url!, 'http://x').searchParams.get('after'));
    stream.follow(res as ServerResponse, from, { 'content-type': 'text/event-stream' });
  });
  after(() => server.close());
  const listening = new Promise<string>((resolve) => server.listen(0, '127.0.0.1', () => resolve(`http://127.0.0.1:${(server.address() as AddressInfo).port}`)));
  const resume = async (after: number) => (await fetch(`${await listening}/?after=${after}`)).text();

  it('ends a follower ahead of the copy with an error, and serves one the copy covers its continuation', async () => {
    // Both ask before the continuation is made: one waits for event 4, one resumes after 1.
    const ahead = resume(4);
    const covered = resume(1);
    await new Promise<void>((resolve) => {
      const check = () => (stream.followerCount === 2 ? resolve() : setImmediate(check));
      check();
    });
    stream.regenerates(Buffer.concat([event(0), event(1), event(2)]), ERROR);
    assert.equal(await bounded(ahead, 'the follower ahead of the copy to be ended'), ERROR.toString(), 'the follower waiting for event 4 ends with the error, given no continuation');
    // A later resume past the copy is refused the same way, before the continuation reaches it.
    assert.equal(await bounded(resume(4), 'a resume past the copy to be answered'), ERROR.toString());
    // The continuation: its events reach the covered follower, then the end.
    stream.append(event(3));
    stream.append(event(4));
    stream.end(Buffer.from('data: [DONE]\n\n'));
    assert.equal(await covered, Buffer.concat([event(2), event(3), event(4), Buffer.from('data: [DONE]\n\n')]).toString());
  });
});
