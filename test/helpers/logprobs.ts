import assert from 'node:assert/strict';
import type { TokenLogprob } from '../../src/protocol/request-plane.js';

/** The text lines of a request-plane stream, parsed. */
export function textLines(lines: string[]): Array<{ text: string; token_ids?: number[]; logprobs?: TokenLogprob[] }> {
  return lines.map((l) => JSON.parse(l)).filter((p) => typeof p.text === 'string');
}

/**
 * Checks one token's entry as OpenAI's chat `logprobs.content[]` types it: text, finite logprob
 * <= 0, its bytes the UTF-8 of its text (unless `ownBytes`: a token that is part of a character has bytes its text cannot say), at most
 * `top` alternatives, most likely first, each of the same shape.
 */
export function assertTokenLogprob(e: TokenLogprob, top: number, what: string, opts: { ownBytes?: boolean; exactTop?: boolean } = {}): void {
  const candidate = (c: { token: string; logprob: number; bytes: number[] | null }, whose: string) => {
    assert.equal(typeof c.token, 'string', `${whose}: token`);
    assert.ok(Number.isFinite(c.logprob) && c.logprob <= 0, `${whose}: logprob ${c.logprob} is finite and <= 0`);
    if (!opts.ownBytes) assert.deepEqual(c.bytes, [...Buffer.from(c.token, 'utf8')], `${whose}: bytes are the token's UTF-8`);
    else assert.ok(Array.isArray(c.bytes) && c.bytes.length > 0 && c.bytes.every((b) => Number.isInteger(b) && b >= 0 && b < 256), `${whose}: bytes`);
  };
  candidate(e, what);
  assert.ok(Array.isArray(e.top_logprobs), `${what}: top_logprobs is an array`);
  if (opts.exactTop !== false) assert.equal(e.top_logprobs.length, top, `${what}: ${top} alternatives`);
  else assert.ok(e.top_logprobs.length <= top, `${what}: at most ${top} alternatives`);
  e.top_logprobs.forEach((c, i) => candidate(c, `${what} alternative ${i}`));
  for (let i = 1; i < e.top_logprobs.length; i++) assert.ok(e.top_logprobs[i - 1]!.logprob >= e.top_logprobs[i]!.logprob, `${what}: alternatives sorted, most likely first`);
  const listed = e.top_logprobs.find((c) => c.token === e.token);
  if (listed !== undefined) assert.equal(listed.logprob, e.logprob, `${what}: the chosen token listed with its own logprob`);
}
