import type { Logger } from 'pino';
import type { Dispatcher } from 'undici';
import { Backoff, pause } from '../common/backoff.js';
import { describeError, getBounded } from './engine-http.js';
import { describeExit, type EngineExit } from './engine-process.js';

export interface HealthWait {
  url: string;
  dispatcher: Dispatcher;
  log: Logger;
  /** SIGTERM during loading: stop waiting at once. */
  signal: AbortSignal;
  /** 0: no bound (an engine loading a large model may take many minutes). */
  timeoutMs: number;
  /** The engine child, when ebb started it: its exit ends the wait with its status. */
  exited?: Promise<EngineExit> | undefined;
}

/** How often a progress line is logged while the engine loads. */
const PROGRESS_EVERY_MS = 10_000;

/**
 * Resolves once the engine's health endpoint answers 200. A poll, and only at start-up: an engine
 * loading its model emits nothing ebb could wait on, it only starts answering. The retry delay is
 * short (the engine is ready sooner) and capped (loading takes minutes, the log shows progress).
 */
export async function waitUntilHealthy(w: HealthWait): Promise<void> {
  const started = performance.now();
  let lastProgress = started;
  let lastAnswer = 'no answer yet';
  let exit: EngineExit | undefined;
  void w.exited?.then((e) => (exit = e));
  const gone = new AbortController();
  void w.exited?.then(() => gone.abort());
  const stop = AbortSignal.any([w.signal, gone.signal]);
  const backoff = new Backoff({ minMs: 100, maxMs: 1000 });
  for (;;) {
    if (w.signal.aborted) throw new Error(`engine start-up cancelled while waiting for ${w.url}`);
    if (exit !== undefined)
      throw new Error(exit.error !== undefined ? `the engine ${exit.error}` : `the engine exited (${describeExit(exit)}) before ${w.url} answered 200 (last: ${lastAnswer})`);
    try {
      const res = await getBounded(w.url, w.dispatcher, 5000, 64 << 10, stop);
      if (res.status === 200) {
        w.log.info({ event: 'engine_ready', url: w.url, seconds: (performance.now() - started) / 1000 }, `engine ready: ${w.url} answered 200`);
        return;
      }
      lastAnswer = `${res.status}`;
    } catch (err) {
      lastAnswer = describeError(err);
    }
    const waited = performance.now() - started;
    if (w.timeoutMs > 0 && waited >= w.timeoutMs)
      throw new Error(`the engine at ${w.url} did not become healthy within ${w.timeoutMs} ms (last: ${lastAnswer})`);
    if (performance.now() - lastProgress >= PROGRESS_EVERY_MS) {
      lastProgress = performance.now();
      w.log.info({ event: 'engine_loading', url: w.url, seconds: Math.round(waited / 1000), last: lastAnswer }, `engine loading: waited ${Math.round(waited / 1000)} s for ${w.url} (last: ${lastAnswer})`);
    }
    await pause(backoff.next(), stop);
  }
}
