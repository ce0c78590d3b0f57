/**
 * What the llama-cpp priority tests share: a tiny llama.cpp worker whose sequences all serve flex
 * streams at temperature 0 (--batch-invariant: one answer's arithmetic does not depend on what
 * shares its decodes), the flex streams, the priority request, and the moment every flex stream runs.
 */
import { writeTinyLlamaGguf } from './gguf.js';
import { bounded } from './processes.js';
import { streamCompletion, type StreamOutcome } from './sse.js';

export const MODEL = 'tiny';
/** Long enough that every flex stream still runs when the priority request is answered (a few tokens). */
export const FLEX_TOKENS = 600;

/** `parallel` sequences, none kept back for priority. One thread, CPU only: the machine is shared. */
export const llamaCppFlexWorker = (parallel: number) => ['--engine', 'llama-cpp', '--model-path', writeTinyLlamaGguf(), '--model', MODEL, '--threads', '1', '--gpu', 'off', '--context-size', '2048', '--parallel', String(parallel), '--batch-invariant', '--priority-reserve-slots', '0'];

const question = (i: number) => `question ${i}: tell me about the tides and the moon, number ${i * 7}`;

/** Flex stream `i` (its question is its own) through `frontendUrl`, FLEX_TOKENS long. */
export const flexStream = (frontendUrl: string, i: number, onToken?: (n: number, seen: StreamOutcome) => void) =>
  streamCompletion(frontendUrl, { model: MODEL, messages: [{ role: 'user', content: question(i) }], max_tokens: FLEX_TOKENS, temperature: 0, service_tier: 'flex', stream_options: { include_usage: true } }, undefined, onToken);

/** A priority request of 4 tokens. */
export const priorityRequest = (frontendUrl: string) =>
  streamCompletion(frontendUrl, { model: MODEL, messages: [{ role: 'user', content: 'a priority question' }], max_tokens: 4, temperature: 0, service_tier: 'priority', stream_options: { include_usage: true } });

/** Starts `count` streams (`start(i, onToken)`), and resolves with them once each has streamed 3 pieces: they all run. */
export async function allStreaming<T>(count: number, start: (i: number, onToken: (n: number) => void) => Promise<T>): Promise<Array<Promise<T>>> {
  let running = 0;
  let allRunning!: () => void;
  const filled = new Promise<void>((resolve) => (allRunning = resolve));
  const streams = Array.from({ length: count }, (_, i) =>
    start(i, (n) => {
      if (n === 3 && ++running === count) allRunning();
    }),
  );
  await bounded(filled, `all ${count} flex streams to stream 3 pieces`);
  return streams;
}
