import { EbbError } from '../protocol/errors.js';
import { EventEmitter } from 'node:events';
import { setTimeout as sleep, setImmediate as yieldTurn } from 'node:timers/promises';
import { promptParam, type EmbedInput, type EmbedOptions, type EmbedResult, type Engine, type EngineCapabilities, type EngineStats, type GeneratedPiece, type GenerateRequest, type GenerateResult, type KvCacheStats, type Quiescence, type TokenizeRequest } from './engine.js';
import { mockerTokenIds } from '../protocol/mocker-tokenizer.js';
import { truncateNormalized } from '../protocol/embedding-vector.js';
import { slotQuiescence, Slots } from './slots.js';
import { KvTransferStore, type KvTransfer } from './kv-transfers.js';
import { KvEventLog } from './kv-event-log.js';
import { DEFAULT_BLOCK_SIZE } from '../protocol/block-hash.js';
import { PrefixCache, type CachedSequence } from './prefix-cache.js';
import { PrefillCompute } from './prefill-compute.js';
import { mockerToolScript } from './mocker-tools.js';
import { mockerJsonAnswer } from './mocker-json.js';
import { MockerSampler } from './mocker-sampling.js';
import { HERMES_SYNTAX } from '../protocol/tools.js';
import { mockerLogprob, scriptedLogprob } from './mocker-logprobs.js';
import { MOCKER_LORA_DEFAULTS, MockerAdapters, type MockerLoraOptions } from './mocker-adapters.js';
import { adapterRoot } from '../protocol/block-hash.js';

export interface MockerOptions {
  /** Base time to first token; with the KV cache off it grows with prompt length (see ttftFor), on: prefill adds the uncached tokens' time. 0 disables the delay. */
  ttftMs: number;
  /** Inter-token latency. 0 yields to the event loop between tokens, for benchmarks. */
  itlMs: number;
  /** Concurrent sequences (batch slots); the rest queue FIFO. */
  batchSlots: number;
  /** Queued sequences beyond which the engine reports overload (admission answers worker_overloaded). */
  maxQueue: number;
  /** `exact` reports idleness from its own counters; `unknown` simulates an engine that cannot tell. */
  idleness: 'exact' | 'unknown';
  /** Simulated model loading before the engine can serve (a real model takes seconds to minutes). */
  loadMs: number;
  /**
   * Simulates an engine that dies under the worker: a request whose prompt contains this text makes
   * the engine fail (every sequence aborts, onFailure fires). Empty: never.
   */
  failOnPrompt: string;
  /** The simulated model's context length (prompt + completion): what a request without max_tokens may fill. */
  maxContext: number;
  /** Serving role; prefill engines hold KV transfers for decode peers. */
  mode: 'aggregated' | 'prefill' | 'decode';
  /** `unsupported` simulates an adapter that cannot report pending KV transfers (a prefill worker then never drains). */
  kvReporting: 'exact' | 'unsupported';
  /** How long a computed KV waits for its decode peer before it is released (and counted as expired). */
  kvTransferTtlMs: number;
  /**
   * The prefix KV cache: `on`, time to first token is ttftMs plus the uncached prompt tokens at
   * prefillTokensPerS (shared by concurrent prefills), and the engine publishes KV events; `off`,
   * ttftFor's plain model.
   */
  kvCache: 'on' | 'off';
  /** Cache capacity in blocks (running sequences' blocks included). */
  kvBlocks: number;
  /** Tokens per block. */
  kvBlockSize: number;
  /** Uncached prompt tokens a worker prefills per second, all its prefills together. */
  prefillTokensPerS: number;
  /** The simulated model's embedding size: what /embed answers without `dimensions`, and the most it may ask. */
  embeddingDim: number;
  /** LoRA adapters it can load (none: it serves its base model only). */
  lora: MockerLoraOptions;
}

export const MOCKER_DEFAULTS: MockerOptions = {
  ttftMs: 20,
  itlMs: 10,
  batchSlots: 32,
  maxQueue: 512,
  idleness: 'exact',
  mode: 'aggregated',
  kvReporting: 'exact',
  kvTransferTtlMs: 30_000,
  loadMs: 0,
  failOnPrompt: '',
  maxContext: 1024,
  kvCache: 'on',
  kvBlocks: 8192,
  kvBlockSize: DEFAULT_BLOCK_SIZE,
  // A 1,200-token uncached prompt: about 100 ms of prefill on an idle worker.
  prefillTokensPerS: 12_000,
  embeddingDim: 64,
  lora: MOCKER_LORA_DEFAULTS,
};

const VOCABULARY = (
  'the of and to in is that it for on with as was at by an be this from or are which not have has one all ' +
  'model token stream worker drain engine serve request cache batch prefill decode state idle ready route ' +
  'signal graceful fleet admit release watch lease ebb flow tide shore quiet steady river harbor light'
).split(' ');

/** Words stand in for tokens: tokenizer-free and deterministic. */
export function countTokens(text: string): number {
  const n = text.split(/\s+/).filter(Boolean).length;
  return Math.max(1, n);
}

/** Time to first token: the base, plus one base per 256 prompt tokens (prefill cost grows with length). */
export function ttftFor(baseMs: number, promptTokens: number): number {
  return baseMs * (1 + promptTokens / 256);
}

function hashString(s: string, seed: number): number {
  let h = (seed ^ 0x9e3779b9) >>> 0;
  for (let i = 0; i < s.length; i++) h = Math.imul(h ^ s.charCodeAt(i), 0x01000193) >>> 0;
  return h;
}

/** mulberry32: small, fast, good enough to pick words reproducibly. */
export function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/**
 * The mocker's embedding of a text: `native` components seeded by the text alone (identical text,
 * identical vector, on every worker), then shortened to `dimensions` and scaled to unit length.
 */
export function mockerEmbedding(text: string, native: number, dimensions: number): Float32Array {
  const random = prng(hashString(text, 0));
  return truncateNormalized(Array.from({ length: native }, () => random() * 2 - 1), dimensions);
}

/** The next word of a generation, as its index in VOCABULARY; `random` must be at its position. */
function pickWord(random: () => number): number {
  return Math.floor(random() * VOCABULARY.length);
}

/** Shortest and longest answer the mocker ends on its own (words), when no max_tokens is given. */
export const NATURAL_LENGTH = { min: 16, max: 96 } as const;

/** Where an answer without max_tokens ends: fixed by the prompt and seed (its generation), as the words are. */
export function naturalLength(generation: number): number {
  return NATURAL_LENGTH.min + ((Math.imul(generation ^ 0x5bd1e995, 0x9e3779b1) >>> 0) % (NATURAL_LENGTH.max - NATURAL_LENGTH.min + 1));
}

/** How the i-th word of a generation is written: words after the first follow a space. */
const leadAt = (i: number) => (i === 0 ? '' : ' ');

/** The stream of the logprobs at position i: fixed by the prompt, the seed and i alone, as the words are by the first two. */
const logprobStream = (generation: number, i: number) => prng((generation ^ Math.imul(i + 1, 0x9e3779b1)) >>> 0);

/** A chat prompt ends where the answer starts: the engine's sequence carries the answer's role, as a chat template's generation prompt does. */
const ASSISTANT_TURN = mockerTokenIds('assistant:');

function pause(ms: number, signal: AbortSignal): Promise<unknown> {
  return ms > 0 ? sleep(ms, undefined, { signal }) : yieldTurn(undefined, { signal });
}

/** The embedded simulated engine: deterministic text for a seed, a timing model, batch slots with a queue. */
export class MockerEngine implements Engine {
  readonly kind = 'mocker';
  readonly capabilities: EngineCapabilities;
  private readonly slots: Slots;
  private readonly events = new EventEmitter();
  private generated = 0;
  /** Aborted when the simulated engine dies: every sequence ends with it. */
  private readonly dead = new AbortController();
  readonly kvTransfers: KvTransferStore | undefined;
  readonly kvEvents: KvEventLog | undefined;
  /** The prefix cache and the prefill compute it saves, with --mocker-kv-cache on. */
  private readonly cache: PrefixCache | undefined;
  private readonly compute: PrefillCompute | undefined;
  readonly kvCacheStats: (() => KvCacheStats) | undefined;
  readonly adapters: MockerAdapters | undefined;

  constructor(private readonly opts: MockerOptions = MOCKER_DEFAULTS) {
    if (opts.lora.names.length > 0) this.adapters = new MockerAdapters(opts.lora);
    if (opts.kvCache === 'on') {
      this.kvEvents = new KvEventLog(opts.kvBlockSize, 'mocker-words');
      this.cache = new PrefixCache(opts.kvBlocks, opts.kvBlockSize, this.kvEvents);
      this.compute = new PrefillCompute(opts.prefillTokensPerS);
      const cache = this.cache;
      this.kvCacheStats = () => cache.stats();
    }
    this.capabilities = { json_object: true, json_schema: true, logprobs: true, tools: true, tool_syntax: HERMES_SYNTAX, max_context: opts.maxContext, continuation: true, prompt_token_ids: true, embeddings: true, sampling: true, preemption: true };
    this.slots = new Slots(opts.batchSlots);
    if (opts.mode === 'prefill') {
      this.kvTransfers = new KvTransferStore(opts.kvTransferTtlMs);
      // Every transfer ending changes what a drain waits for, not only the last one.
      this.kvTransfers.on('completed', () => this.slots.changed());
      this.kvTransfers.on('expired', () => this.slots.changed());
    }
  }

  /** The simulated load: resolves after `loadMs`, rejects when `signal` aborts first. */
  async load(signal: AbortSignal): Promise<void> {
    if (this.opts.loadMs > 0) await sleep(this.opts.loadMs, undefined, { signal });
  }

  /** What generate would refuse about the request itself, found before the worker answers (a logit_bias id past the tokenizer). */
  async check(req: GenerateRequest): Promise<void> {
    if (req.sampling !== undefined) new MockerSampler(VOCABULARY, req.sampling, '');
  }

  /** Prefill costs its time to first token, then the KV is held until a decode peer takes it. */
  async prefill(req: GenerateRequest, signal: AbortSignal): Promise<KvTransfer> {
    if (!this.kvTransfers) throw new Error(`a ${this.opts.mode} engine does not prefill for decode peers`);
    const promptTokens = countTokens(req.prompt);
    await this.slots.acquire(signal);
    const seq = this.cache?.begin(this.sequenceTokens(req), adapterRoot(req.adapter));
    try {
      await this.prefillTime(promptTokens, seq, signal);
      const transfer = this.kvTransfers.create(promptTokens);
      return seq === undefined ? transfer : { ...transfer, cached_tokens: Math.min(seq.cachedTokens, promptTokens) };
    } finally {
      seq?.end();
      this.slots.release();
    }
  }

  /** The tokens the engine's sequence starts with: the prompt, the answer's turn for a chat, and a continuation's words. */
  private sequenceTokens(req: GenerateRequest): number[] {
    const tokens = mockerTokenIds(req.prompt);
    if (req.messages !== undefined) tokens.push(...ASSISTANT_TURN);
    if (req.continuation !== undefined) tokens.push(...mockerTokenIds(req.continuation.text));
    return tokens;
  }

  /**
   * Time to first token. With the cache: the base, then the tokens not found cached computed on
   * the worker's shared prefill budget, after which the prompt's blocks are cached. Without: ttftFor.
   */
  private async prefillTime(promptTokens: number, seq: CachedSequence | undefined, signal: AbortSignal): Promise<void> {
    if (seq === undefined || this.compute === undefined) return void (await pause(ttftFor(this.opts.ttftMs, promptTokens), signal));
    await pause(this.opts.ttftMs, signal);
    await this.compute.run(seq.tokens - seq.cachedTokens, signal);
    seq.prefilled();
  }


  async *generate(req: GenerateRequest, callerSignal: AbortSignal): AsyncGenerator<GeneratedPiece, GenerateResult, void> {
    if (this.opts.failOnPrompt !== '' && req.prompt.includes(this.opts.failOnPrompt) && !this.dead.signal.aborted) {
      this.dead.abort(new Error('simulated engine failure (--mocker-fail-on-prompt)'));
      this.events.emit('failure', this.dead.signal.reason);
    }
    if (this.dead.signal.aborted) throw this.dead.signal.reason;
    if (req.adapter !== undefined && this.adapters?.isResident(req.adapter) !== true) throw new Error(`adapter ${req.adapter} is not resident (the worker must load it first)`);
    const signal = AbortSignal.any([callerSignal, this.dead.signal]);
    const promptTokens = countTokens(req.prompt);
    // As a real engine does: a prompt that leaves no room in the context is refused, not queued.
    if (promptTokens >= this.opts.maxContext)
      throw new EbbError('context_length_exceeded', `the prompt is ${promptTokens} tokens; this model's context holds ${this.opts.maxContext} (--mocker-max-context)`, { param: promptParam(req) });
    await this.slots.acquire(signal, req.tier);
    // With its KV pulled from a prefill worker, decode starts at the first token, without a prefix lookup here.
    const seq = req.prefilled ? undefined : this.cache?.begin(this.sequenceTokens(req), adapterRoot(req.adapter));
    /** What this call delivered, cached with the prompt when the sequence ends (as vLLM keeps decoded blocks). */
    let delivered = '';
    try {
      // An adapter answers the same prompt with its own words: seeded by its name too.
      const generation = hashString(req.adapter === undefined ? req.prompt : `${req.adapter}\u0000${req.prompt}`, req.seed ?? 0);
      const random = prng(generation);
      // A written answer instead of words (each its own draw, so words stay as they were): tool calls,
      // else, with response_format json, JSON valid against its schema.
      const calls = req.tools === undefined ? undefined : mockerToolScript(req, prng(hashString(JSON.stringify(req.tools), generation)));
      const format = req.response_format;
      const script = calls ?? (format === undefined || format.type === 'text' ? undefined : mockerJsonAnswer(format, prng(hashString(JSON.stringify(format), generation))));
      // Penalties and logit_bias change which word is drawn (none: the plain draw, as before).
      const sampler = req.sampling === undefined ? undefined : new MockerSampler(VOCABULARY, req.sampling, req.prompt);
      // Position i's word (its VOCABULARY index; drawn in order, so `random` must be at i) and its piece.
      const wordAt = () => (script !== undefined ? -1 : sampler !== undefined ? sampler.pick(random) : pickWord(random));
      const pieceOf = (i: number, word: number) => (script === undefined ? leadAt(i) + VOCABULARY[word] : (script[i] ?? ''));
      // A continuation replays the words already delivered (no delay), so a migrated stream goes on
      // exactly as the same request would have on one worker.
      const done = req.continuation?.completion_tokens ?? 0;
      let text = '';
      for (let i = 0; i < done; i++) text += pieceOf(i, wordAt());
      if (req.continuation !== undefined && text !== req.continuation.text)
        throw new Error('continuation text does not match this request\'s generation (different prompt or seed?)');
      if (req.prefilled) await pause(this.opts.itlMs, signal);
      else await this.prefillTime(promptTokens, seq, signal);
      // What the client is told was cached: the prompt's share (a continuation's words are not prompt);
      // with its KV pulled, what the prefill worker found cached.
      const found = req.prefilled ? req.prefill_cached_tokens : seq?.cachedTokens;
      const cached = found === undefined ? {} : { cached_tokens: Math.min(found, promptTokens) };
      // No budget: the context is the limit.
      const budget = req.max_tokens ?? Math.max(0, this.opts.maxContext - promptTokens - done);
      // Calls and JSON end where their text does. Words end at the answer's own length when no
      // max_tokens is given (as a model ends its turn); with one they run to it, the length a
      // benchmark or a test asks for (vLLM's ignore_eos).
      const left = script !== undefined ? Math.max(0, script.length - done) : req.max_tokens === undefined ? Math.max(0, naturalLength(generation) - done) : Infinity;
      const steps = Math.min(budget, left);
      for (let n = 0; n < steps; n++) {
        if (n > 0) await pause(this.opts.itlMs, signal);
        // As real weights would: an adapter unloaded under a running sequence breaks it (the worker must never).
        if (req.adapter !== undefined && !this.adapters!.isResident(req.adapter)) throw new Error(`adapter ${req.adapter} was unloaded under a running sequence`);
        const word = wordAt();
        const piece = pieceOf(done + n, word);
        text += piece;
        const hit = script === undefined ? req.stop?.find((s) => s.length > 0 && text.includes(s)) : undefined;
        if (hit !== undefined) return { finish_reason: 'stop', prompt_tokens: promptTokens, completion_tokens: n, ...cached };
        this.generated++;
        delivered += piece;
        if (req.logprobs === undefined) yield { text: piece };
        else yield { text: piece, logprobs: [script === undefined ? mockerLogprob(VOCABULARY, word, leadAt(done + n), req.logprobs, logprobStream(generation, done + n)) : scriptedLogprob(piece, req.logprobs)] };
      }
      return { finish_reason: left <= budget ? 'stop' : 'length', prompt_tokens: promptTokens, completion_tokens: steps, ...cached };
    } finally {
      seq?.end(mockerTokenIds(delivered));
      this.slots.release();
    }
  }

  /**
   * Deterministic vectors (mocker-embedding.ts), costing a prefill of the inputs' tokens in a batch
   * slot: drains and load see an embedding as they see a generation.
   */
  async embed(inputs: EmbedInput[], opts: EmbedOptions, callerSignal: AbortSignal): Promise<EmbedResult> {
    const native = this.opts.embeddingDim;
    const dimensions = opts.dimensions ?? native;
    if (dimensions > native)
      throw new EbbError('invalid_request', `dimensions ${dimensions} is more than this model's ${native} (--mocker-embedding-dim)`, { param: 'dimensions' });
    const texts = inputs.map((input) => (typeof input === 'string' ? input : input.join(' ')));
    const counts = inputs.map((input) => (typeof input === 'string' ? countTokens(input) : input.length));
    const longest = Math.max(...counts);
    if (longest > this.opts.maxContext)
      throw new EbbError('context_length_exceeded', `an input is ${longest} tokens; this model's context holds ${this.opts.maxContext} (--mocker-max-context)`, { param: 'input' });
    if (this.dead.signal.aborted) throw this.dead.signal.reason;
    const signal = AbortSignal.any([callerSignal, this.dead.signal]);
    const promptTokens = counts.reduce((a, b) => a + b, 0);
    await this.slots.acquire(signal);
    try {
      await pause(ttftFor(this.opts.ttftMs, promptTokens), signal);
      return { vectors: texts.map((text) => mockerEmbedding(text, native, dimensions)), prompt_tokens: promptTokens };
    } finally {
      this.slots.release();
    }
  }

  async probeQuiescence(): Promise<Quiescence> {
    if (this.opts.idleness === 'unknown') return { state: 'unknown', reason: 'engine cannot report idleness (--mocker-idleness unknown)' };
    if (this.kvTransfers && this.opts.kvReporting === 'unsupported') {
      return { state: 'unknown', reason: 'engine cannot report pending KV transfers (--mocker-kv-reporting unsupported)' };
    }
    return slotQuiescence(this.slots, this.kvTransfers?.size ?? 0);
  }

  onFailure(listener: (err: Error) => void): () => void {
    this.events.on('failure', listener);
    return () => this.events.off('failure', listener);
  }

  onQuiescenceChange(listener: () => void): () => void {
    return this.slots.onChange(listener);
  }

  isOverloaded(): boolean {
    return this.slots.queued >= this.opts.maxQueue;
  }

  stats(): EngineStats {
    return {
      kind: this.kind,
      ...this.slots.stats,
      generated_tokens: this.generated,
      ...(this.kvTransfers ? { kv_transfers_pending: this.kvTransfers.size } : {}),
      // Prefill load with the KV cache on: what a router may weigh against a cache hit.
      ...(this.compute ? { prefills_running: this.compute.running, prefill_tokens_left: Math.round(this.compute.tokensLeft) } : {}),
    };
  }

  /** The tokens its prefix cache hashes for the request (one id per word, protocol/mocker-tokenizer.ts). */
  async tokenize(req: TokenizeRequest): Promise<number[]> {
    return this.sequenceTokens(req as GenerateRequest);
  }

  async close(): Promise<void> {
    this.kvTransfers?.close();
  }
}
