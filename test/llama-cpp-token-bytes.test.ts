import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { byteLevelBytes } from '../src/engine/llama-cpp-token-bytes.js';

describe('llama-cpp logprobs: the bytes of a byte-level BPE token (GPT-2, Llama 3, Qwen vocabularies)', () => {
  it('reads a token\'s spelling back as its bytes, a character split over tokens included', () => {
    assert.deepEqual(byteLevelBytes('Ġhello'), [...Buffer.from(' hello')], 'Ġ is the space');
    assert.deepEqual(byteLevelBytes('Ċ'), [0x0a], 'Ċ is the newline');
    // ’ (U+2019) is E2 80 99: a token may hold any part of it.
    assert.deepEqual(byteLevelBytes('âĢĻ'), [0xe2, 0x80, 0x99]);
    assert.deepEqual(byteLevelBytes('âĢ'), [0xe2, 0x80], 'the first two bytes of a character');
    assert.equal(Buffer.from(byteLevelBytes('ĠcafÃ©')!).toString('utf8'), ' café');
  });

  it('says nothing of a spelling outside the byte alphabet', () => {
    assert.equal(byteLevelBytes('日本'), undefined);
  });
});
