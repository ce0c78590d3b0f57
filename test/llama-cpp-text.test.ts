import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { PieceAssembler, longestStopPrefixSuffix } from '../src/engine/llama-cpp-text.js';

/** A toy vocabulary: ids are indexes; byte tokens are strings of one raw byte (latin1). */
const VOCAB = ['he', 'llo', ' wor', 'ld', '\xe2', '\x82', '\xac', 'END', '!'];
const detokenize = (ids: number[]) => Buffer.from(ids.map((i) => VOCAB[i]).join(''), 'latin1').toString('utf8');

function run(ids: number[], stops: string[] = []) {
  const a = new PieceAssembler(detokenize, stops, []);
  const pieces = [];
  for (const id of ids) {
    const p = a.push(id);
    if (p) pieces.push(p);
    if (a.stopped) break;
  }
  const rest = a.flush();
  if (rest) pieces.push(rest);
  return { pieces, text: pieces.map((p) => p.text).join(''), stopped: a.stopped };
}

describe('llama-cpp pieces: UTF-8 and stop strings', () => {
  it('sends each token as it comes, with its id', () => {
    const { pieces } = run([0, 1, 2, 3]);
    assert.deepEqual(pieces, [
      { text: 'he', token_ids: [0] },
      { text: 'llo', token_ids: [1] },
      { text: ' wor', token_ids: [2] },
      { text: 'ld', token_ids: [3] },
    ]);
  });

  it('holds the bytes of a character split over byte tokens until it is whole', () => {
    const { pieces } = run([0, 4, 5, 6, 8]);
    assert.deepEqual(pieces, [
      { text: 'he', token_ids: [0] },
      { text: '€', token_ids: [4, 5, 6] },
      { text: '!', token_ids: [8] },
    ]);
  });

  it('never sends part of a stop string, and ends before it', () => {
    const { pieces, stopped } = run([0, 1, 2, 3, 8], ['o world']);
    assert.equal(stopped, true);
    assert.equal(pieces.map((p) => p.text).join(''), 'hell');
    // "llo" and " wor" were held ("o wor" could start the stop string); at the stop only the
    // text before it goes out, with the ids of the tokens that text came from.
    assert.deepEqual(pieces, [
      { text: 'he', token_ids: [0] },
      { text: 'll', token_ids: [1] },
    ]);
  });

  it('releases held text whole, with its ids, once it cannot become a stop string', () => {
    const { pieces, stopped } = run([0, 1, 2, 8], ['lo!']);
    assert.equal(stopped, false);
    assert.deepEqual(pieces, [
      { text: 'he', token_ids: [0] },
      { text: 'llo wor', token_ids: [1, 2] },
      { text: '!', token_ids: [8] },
    ]);
  });

  it('a stop string inside one token cuts that token', () => {
    const { text, stopped } = run([0, 7, 8], ['N']);
    assert.equal(stopped, true);
    assert.equal(text, 'heE');
  });

  it('longestStopPrefixSuffix finds the longest proper prefix at the end', () => {
    assert.equal(longestStopPrefixSuffix('abc', ['cd', 'bcx']), 2);
    assert.equal(longestStopPrefixSuffix('abc', ['abc']), 0, 'a whole match is not a prefix to hold');
    assert.equal(longestStopPrefixSuffix('abc', []), 0);
  });
});
