import { EbbError } from '../protocol/errors.js';
import { EventEmitter } from 'node:events';
import type { Logger } from 'pino';
import { Agent, request } from 'undici';
import type { WorkerMode } from '../discovery/discovery.js';
import type { Continuation, EmbedInput, EmbedOptions, EmbedResult, Engine, EngineCapabilities, EngineStats, FinishReason, GeneratedPiece, GenerateRequest, GenerateResult, Quiescence, SchedulerGauges } from './engine.js';
import { waitUntilHealthy } from './engine-health.js';
import { describeError, getBounded } from './engine-http.js';
import { describeExit, EngineProcess, freePort } from './engine-process.js';
import { createIdlenessProbe, readSchedulerGauges, type EngineIdlenessProbe, type EngineKind, type QuiescenceMode } from './engine-quiescence.js';
import { ReprobeBackoff } from './reprobe-backoff.js';
import { sseData } from '../common/sse-events.js';
import { readBounded } from '../common/bounded-read.js';
import { DEFAULT_BLOCK_SIZE } from '../protocol/block-hash.js';
import type { KvCacheDeclaration } from '../protocol/kv-events.js';
import { KvEventLog } from './kv-event-log.js';
import { KvEventSubscriber } from './openai-engine-kv-events.js';
import { canTokenize, tokenizeOnEngine } from './openai-engine-tokenize.js';
import type { TokenizeRequest } from './engine.js';
import { discardBody } from '../common/discard-body.js';
import type { ToolCallSyntax } from '../protocol/tools.js';
import { CallWriter, engineToolFields } from './openai-engine-tools.js';
import type { TokenLogprob } from '../protocol/request-plane.js';
import { chunkLogprobs, logprobsFields } from './openai-engine-logprobs.js';
import { engineSamplingFields } from './openai-engine-sampling.js';
import { OpenAIEngineAdapters } from './openai-engine-adapters.js';
import type { AdapterSource } from './engine-adapters.js';

/** A streamed completion's request headers (the same object for every request). */
const STREAM_HEADERS: Record<string, string> = { 'content-type': 'application/json', accept: 'text/event-stream' };

export interface OpenAIEngineOptions {
  /** Where the engine server listens; with `command`, defaults to http://127.0.0.1:{port}. */
  url?: string | undefined;
  kind: EngineKind;
  /** Started as the worker's child, `{port}` replaced by a free port (--engine-cmd). */
  command?: string | undefined;
  quiescence: QuiescenceMode;
  /** After SIGTERM, how long the engine child may take before SIGKILL. */
  stopTimeoutMs: number;
  /** How long the engine may take to become healthy at start-up (0: no bound). */
  loadTimeoutMs: number;
  /** The model name the engine serves; default: the first one its /v1/models lists. */
  engineModel?: string | undefined;
  /** The engine's KV event publisher (vLLM's --kv-events-config endpoint, SGLang's), e.g. tcp://host:5557. */
  kvEvents?: string | undefined;
  /** The ZMQ topic its batches are published on ('' : every topic). */
  kvEventsTopic?: string | undefined;
  /** The publisher's replay socket (vLLM's replay_endpoint), asked for batches lost in a gap. */
  kvEventsReplay?: string | undefined;
  /** Tokens per KV block: must be the engine's (vLLM's --block-size); 16 by default, vLLM's default. */
  kvBlockSize?: number | undefined;
  /** How the served model writes a tool call (--engine-tool-syntax); unset: the worker does not offer tools. */
  toolSyntax?: ToolCallSyntax | undefined;
  /** The engine serves /v1/embeddings for its model (--engine-embeddings): the worker declares `embeddings`. */
  embeddings?: boolean | undefined;
  /** LoRA adapters it can load (--lora NAME=PATH); none: the worker serves the base model only. */
  loras?: AdapterSource[] | undefined;
  /** Adapters the engine holds at once (vLLM --max-loras, SGLang --max-loras-per-batch). */
  maxLoras?: number | undefined;
}

export { OPENAI_ENGINE_DEFAULTS } from './openai-engine-options.js';

/** Where each kind says it can serve: vLLM, SGLang and llama-server have /health; any OpenAI server has /v1/models. */
function healthPath(kind: EngineKind): string {
  return kind === 'generic' ? '/v1/models' : '/health';
}

interface ModelsList {
  data?: Array<{ id?: unknown; max_model_len?: unknown }>;
}

interface StreamChunk {
  error?: { message?: string } | string;
  choices?: Array<{ text?: string | null; logprobs?: unknown; delta?: { content?: string | null; tool_calls?: Array<{ index?: number; function?: { name?: string | null; arguments?: string | null } | null }> | null }; finish_reason?: string | null }>;
  usage?: { prompt_tokens?: number; completion_tokens?: number; prompt_tokens_details?: { cached_tokens?: number } | null } | null;
}

/**
 * An engine's non-200 answer: a 400/413/422 is about the request (a prompt over the context, a field
 * it rejects) and keeps that meaning, and the field the engine named (its `param`), so the client
 * gets it once instead of every worker retrying it; anything else is the engine's failure.
 */
function engineAnswer(status: number, said: EngineError, what: string): Error {
  const message = `the engine answered ${status} to ${what}: ${said.message}`;
  if (status === 413) return new EbbError('payload_too_large', message);
  if (status !== 400 && status !== 422) return new Error(message);
  const param = said.param === undefined ? {} : { param: said.param };
  return /context (length|size|window)|maximum context|exceeds? .*context/i.test(message) ? new EbbError('context_length_exceeded', message, param) : new EbbError('invalid_request', message, param);
}

/** What an engine's error answer says: its message, and the field at fault where it names one. */
interface EngineError {
  message: string;
  param?: string | undefined;
}

/** A fixed-size read of an error answer: enough for its message, never the whole of a runaway body. */
const ERROR_TEXT_LIMIT = 2000;
/** One event of an engine's token stream is a chunk of a few tokens; one past this is a broken engine. */
const ENGINE_EVENT_LIMIT = 1 << 20;

/** Vectors as JSON numbers: 2048 inputs of 4096 dimensions take about 160 MB. */
const ENGINE_EMBEDDINGS_LIMIT = 256 * 1024 * 1024;

/** An engine's /v1/embeddings answer, checked: one vector of numbers per input, put in input order by index. */
function embeddingsOf(text: string, inputs: number): EmbedResult {
  let answer: { data?: Array<{ index?: unknown; embedding?: unknown }>; usage?: { prompt_tokens?: unknown } };
  try {
    answer = JSON.parse(text) as typeof answer;
  } catch {
    throw new Error('the engine\'s embeddings answer is not JSON');
  }
  const vectors: Float32Array[] = [];
  for (const [i, d] of (answer.data ?? []).entries()) {
    const index = typeof d.index === 'number' ? d.index : i;
    if (!Array.isArray(d.embedding) || !d.embedding.every((x) => typeof x === 'number') || index < 0 || index >= inputs || vectors[index] !== undefined)
      throw new Error(`the engine's embeddings answer has a malformed vector at ${i}`);
    vectors[index] = Float32Array.from(d.embedding as number[]);
  }
  if (vectors.length !== inputs || [...vectors].some((v) => v === undefined)) throw new Error(`the engine answered ${answer.data?.length ?? 0} vectors for ${inputs} inputs`);
  const tokens = answer.usage?.prompt_tokens;
  return { vectors, prompt_tokens: typeof tokens === 'number' ? tokens : 0 };
}

async function errorText(body: AsyncIterable<Buffer> & { destroy(): void }): Promise<EngineError> {
  const text = await readBounded(body, ERROR_TEXT_LIMIT, { cut: true });
  try {
    // OpenAI's shape ({error: {message, param}}), vLLM's older flat one ({message, param}), FastAPI's {detail}.
    const parsed = JSON.parse(text) as { error?: { message?: string; param?: unknown } | string; message?: string; param?: unknown; detail?: unknown };
    const e = parsed.error;
    const message = (typeof e === 'string' ? e : e?.message) ?? parsed.message ?? JSON.stringify(parsed.detail ?? parsed);
    const param = typeof e === 'object' && typeof e.param === 'string' ? e.param : typeof parsed.param === 'string' ? parsed.param : undefined;
    return { message, param };
  } catch {
    return { message: text.trim().slice(0, 300) };
  }
}

/**
 * A worker in front of an OpenAI-compatible engine server (vLLM, SGLang, llama-server, or any
 * other): each generate is one streaming /v1/completions (or /v1/chat/completions) request; the
 * worker keeps its own admission, drain and shutdown. Idleness comes from the engine's own
 * pending-work gauges (engine-quiescence.ts); the engine child, when ebb started it, is stopped
 * only after the worker drained (close()).
 */
export class OpenAIEngine implements Engine {
  readonly kind = 'openai';
  readonly capabilities: EngineCapabilities;
  private readonly events = new EventEmitter();
  private readonly idleness: EngineIdlenessProbe;
  private readonly reprobe: ReprobeBackoff;
  private inflight = 0;
  private generated = 0;
  private usageMissingLogged = false;
  private failure: Error | undefined;
  private lastProbe: Quiescence | null = null;
  /** With --engine-kv-events: the engine's blocks, translated into ebb's hashes (GET /kv/events). */
  readonly kvEvents: KvEventLog | undefined;
  readonly kvCache: KvCacheDeclaration | undefined;
  private readonly kvSubscriber: KvEventSubscriber | undefined;
  readonly adapters: OpenAIEngineAdapters | undefined;

  constructor(
    private readonly opts: OpenAIEngineOptions,
    private readonly baseUrl: string,
    private readonly model: string,
    maxContext: number | null,
    private readonly dispatcher: Agent,
    private readonly proc: EngineProcess | undefined,
    private readonly log: Logger,
  ) {
    const known = opts.kind !== 'generic';
    this.capabilities = {
      // The three named servers honour response_format json_object; a generic one may not.
      json_object: known,
      json_schema: false,
      // vLLM, SGLang and llama-server report logprobs when asked (logprobs / top_logprobs); a generic server may not.
      logprobs: known,
      // Offered only where the operator says how the model writes a call: ebb parses it from the raw text.
      tools: opts.toolSyntax !== undefined,
      ...(opts.toolSyntax !== undefined && { tool_syntax: opts.toolSyntax }),
      max_context: maxContext,
      // A continuation is re-sent as text: the engine re-tokenizes it, so the tokens may differ
      // from the original ones at the seam. Chat continues an assistant-prefix message, which a
      // generic server may not support.
      continuation: known,
      // vLLM, SGLang and llama-server take /v1/completions prompts as token-id arrays.
      prompt_token_ids: known,
      // Only the operator knows whether the engine's model embeds (vLLM: a pooling model): asking
      // a generative one would cost a request and prove little.
      embeddings: opts.embeddings === true,
      // Passed through (openai-engine-sampling.ts): vLLM, SGLang and llama-server honour them all; a
      // generic server answers for what it does not know (its 400 reaches the client, naming it where it does).
      sampling: true,
    };
    const blockSize = opts.kvBlockSize ?? DEFAULT_BLOCK_SIZE;
    if (opts.kvEvents !== undefined) {
      this.kvEvents = new KvEventLog(blockSize, 'worker');
      this.kvSubscriber = new KvEventSubscriber({ endpoint: opts.kvEvents, topic: opts.kvEventsTopic ?? '', replay: opts.kvEventsReplay, log: this.kvEvents, logger: log });
    } else if (canTokenize(opts.kind)) {
      // No events: the frontend approximates from what it sent, hashing the tokens this worker gives it.
      this.kvCache = { block_size: blockSize, tokenizer: 'worker', events: 'none' };
    }
    if (opts.loras !== undefined && opts.loras.length > 0) this.adapters = new OpenAIEngineAdapters(opts.kind, baseUrl, dispatcher, opts.loras, opts.maxLoras ?? 1);
    this.idleness = createIdlenessProbe(opts.kind, opts.quiescence, baseUrl, dispatcher);
    this.reprobe = new ReprobeBackoff(() => this.events.emit('change'));
    proc?.onFailure((err) => {
      this.failure = err;
      this.events.emit('failure', err);
    });
  }

  get url(): string {
    return this.baseUrl;
  }

  get enginePid(): number | undefined {
    return this.proc?.pid;
  }

  async *generate(req: GenerateRequest, signal: AbortSignal): AsyncGenerator<GeneratedPiece, GenerateResult, void> {
    this.inflight++;
    this.reprobe.reset();
    try {
      // Engines refuse max_tokens 0; a continuation whose budget is spent has nothing left to generate.
      const maxTokens: number | undefined = req.max_tokens;
      if (maxTokens !== undefined && maxTokens <= 0) return { finish_reason: 'length', prompt_tokens: 0, completion_tokens: 0 };
      const chat = req.messages !== undefined;
      const path = chat ? '/v1/chat/completions' : '/v1/completions';
      const res = await request(`${this.baseUrl}${path}`, {
        method: 'POST',
        dispatcher: this.dispatcher,
        signal,
        // The worker's span of the request is the engine's parent (vLLM continues the trace with --otlp-traces-endpoint).
        headers: req.traceparent === undefined ? STREAM_HEADERS : { ...STREAM_HEADERS, traceparent: req.traceparent },
        body: JSON.stringify(this.bodyFor(req)),
      });
      if (res.statusCode !== 200) throw engineAnswer(res.statusCode, await errorText(res.body), `POST ${path}`);
      let finish: FinishReason = 'stop';
      let usage: StreamChunk['usage'];
      let pieces = 0;
      // A forced call comes back structured: written as the model's raw call text.
      const calls = req.tools !== undefined && this.opts.toolSyntax !== undefined ? new CallWriter(this.opts.toolSyntax) : undefined;
      /** Logprobs of tokens that came without text of their own (part of a character): they go with the next text. */
      let carried: TokenLogprob[] | undefined;
      try {
        for await (const data of sseData(res.body as AsyncIterable<Buffer>, ENGINE_EVENT_LIMIT)) {
          if (data === '[DONE]') break;
          let chunk: StreamChunk;
          try {
            chunk = JSON.parse(data) as StreamChunk;
          } catch {
            throw new Error(`the engine sent an event that is not JSON on ${path}: ${data.slice(0, 100)}`);
          }
          if (chunk.error !== undefined) throw new Error(`the engine failed mid-stream: ${typeof chunk.error === 'string' ? chunk.error : (chunk.error.message ?? 'unknown error')}`);
          const choice = chunk.choices?.[0];
          let text = chat ? choice?.delta?.content : choice?.text;
          if (calls !== undefined && choice?.delta?.tool_calls) text = (text ?? '') + calls.text(choice.delta.tool_calls);
          if (calls !== undefined && choice?.finish_reason) text = (text ?? '') + calls.close();
          const logprobs = req.logprobs === undefined ? undefined : chunkLogprobs(choice?.logprobs, req.logprobs);
          if (logprobs !== undefined) carried = carried === undefined ? logprobs : [...carried, ...logprobs];
          if (typeof text === 'string' && text !== '') {
            pieces++;
            this.generated++;
            if (carried === undefined) yield { text };
            else {
              yield { text, logprobs: carried };
              carried = undefined;
            }
          }
          if (choice?.finish_reason) finish = choice.finish_reason === 'length' ? 'length' : 'stop'; // tool_calls: a stop
          if (chunk.usage) usage = chunk.usage;
        }
      } finally {
        // The client left, the stream was cut, or the engine's answer is done with: close it now.
        discardBody(res.body);
      }
      if (typeof usage?.completion_tokens !== 'number' && !this.usageMissingLogged) {
        this.usageMissingLogged = true;
        this.log.warn({ event: 'engine_usage_missing' }, 'the engine does not report usage (stream_options.include_usage): completion tokens are counted as stream pieces, prompt tokens as 0');
      }
      const promptTokens = typeof usage?.prompt_tokens === 'number' ? promptTokensOf(usage.prompt_tokens, req.continuation) : 0;
      // vLLM (--enable-prompt-tokens-details), SGLang and llama-server say what their prefix cache held.
      const cached = usage?.prompt_tokens_details?.cached_tokens;
      return {
        finish_reason: finish,
        prompt_tokens: promptTokens,
        completion_tokens: typeof usage?.completion_tokens === 'number' ? usage.completion_tokens : pieces,
        ...(typeof cached === 'number' ? { cached_tokens: Math.min(cached, promptTokens) } : {}),
      };
    } finally {
      this.inflight--;
      // No event comes from the engine itself: ebb's own last call ending is when the lifecycle probes.
      if (this.inflight === 0) this.events.emit('change');
    }
  }

  /** POST /v1/embeddings on the engine (vLLM, SGLang and llama-server serve OpenAI's shape); counted as in flight like a generation. */
  async embed(inputs: EmbedInput[], opts: EmbedOptions, signal: AbortSignal): Promise<EmbedResult> {
    this.inflight++;
    this.reprobe.reset();
    try {
      const res = await request(`${this.baseUrl}/v1/embeddings`, {
        method: 'POST',
        dispatcher: this.dispatcher,
        signal,
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: this.model, input: inputs, encoding_format: 'float', ...(opts.dimensions !== undefined && { dimensions: opts.dimensions }) }),
      });
      if (res.statusCode !== 200) throw engineAnswer(res.statusCode, await errorText(res.body), 'POST /v1/embeddings');
      return embeddingsOf(await readBounded(res.body, ENGINE_EMBEDDINGS_LIMIT, { what: 'the engine\'s embeddings answer' }), inputs.length);
    } finally {
      this.inflight--;
      if (this.inflight === 0) this.events.emit('change');
    }
  }

  /** The token ids the engine server evaluates for the request (openai-engine-tokenize.ts). */
  tokenize(req: TokenizeRequest, signal: AbortSignal): Promise<number[]> {
    return tokenizeOnEngine(this.opts.kind, this.baseUrl, this.model, req, this.dispatcher, signal);
  }

  private bodyFor(req: GenerateRequest): Record<string, unknown> {
    const body: Record<string, unknown> = {
      // vLLM names an adapter as the model; SGLang takes it as lora_path (below).
      model: req.adapter !== undefined && this.opts.kind === 'vllm' ? req.adapter : this.model,
      stream: true,
      stream_options: { include_usage: true },
      temperature: req.temperature,
    };
    const maxTokens: number | undefined = req.max_tokens;
    // No budget: until the model stops or its context is full. vLLM reads an explicit null that way;
    // the others get their own default (llama-server: unbounded; SGLang's /v1/completions: 16, as OpenAI's).
    if (maxTokens !== undefined) body.max_tokens = maxTokens;
    else if (this.opts.kind === 'vllm') body.max_tokens = null;
    // Read structurally: fields the request plane carries (top_p, response_format), passed through as they are.
    const extra = req as GenerateRequest & { top_p?: number; response_format?: unknown };
    if (extra.top_p !== undefined) body.top_p = extra.top_p;
    if (req.seed !== undefined) body.seed = req.seed;
    Object.assign(body, engineSamplingFields(this.opts.kind, req.sampling));
    if (req.adapter !== undefined && this.opts.kind === 'sglang') body.lora_path = req.adapter;
    if (req.stop !== undefined && req.stop.length > 0) body.stop = req.stop;
    // Only requested of engines that declare json_object (the request plane checks it).
    if (extra.response_format !== undefined) body.response_format = extra.response_format;
    Object.assign(body, engineToolFields(req));
    Object.assign(body, logprobsFields(this.opts.kind, req.messages !== undefined, req.logprobs));
    const cont = req.continuation;
    if (req.messages !== undefined) {
      body.messages = cont ? [...req.messages, { role: 'assistant', content: cont.text }] : req.messages;
      // vLLM and SGLang continue a final assistant message only when told; llama-server does it by itself.
      if (cont && (this.opts.kind === 'vllm' || this.opts.kind === 'sglang')) {
        body.continue_final_message = true;
        body.add_generation_prompt = false;
      }
    } else if (req.prompt_token_ids !== undefined) {
      // Ids continue with ids: a text continuation cannot be appended to a token prompt.
      if (cont && cont.token_ids === undefined) throw new Error('a token-id prompt can only be continued from token ids');
      body.prompt = cont ? [...req.prompt_token_ids, ...(cont.token_ids ?? [])] : req.prompt_token_ids;
    } else body.prompt = cont ? req.prompt + cont.text : req.prompt;
    return body;
  }

  async probeQuiescence(): Promise<Quiescence> {
    // A generate still unwinding (its engine request closing) emits a change when it is done.
    if (this.inflight > 0) return { state: 'busy', waiting_for: [`${this.inflight} engine request${this.inflight === 1 ? '' : 's'} still closing`] };
    if (this.failure) return (this.lastProbe = { state: 'unknown', reason: this.failure.message });
    const q = await this.idleness.probe();
    this.lastProbe = q;
    if (q.state === 'idle' || !this.idleness.canChange || this.inflight > 0) this.reprobe.reset();
    else this.reprobe.schedule();
    return q;
  }

  onQuiescenceChange(listener: () => void): () => void {
    this.events.on('change', listener);
    return () => this.events.off('change', listener);
  }

  /** The engine server queues what it cannot run yet; its own limits answer for overload. */
  isOverloaded(): boolean {
    return false;
  }

  onFailure(listener: (err: Error) => void): () => void {
    this.events.on('failure', listener);
    // A failure before anyone listened (between start-up and the worker wiring this) is not lost.
    if (this.failure) queueMicrotask(() => listener(this.failure as Error));
    return () => this.events.off('failure', listener);
  }

  /** vLLM, SGLang and llama-server say what they run, queue and hold: the picker metrics pass that on. */
  get schedulerGauges(): (() => Promise<SchedulerGauges | undefined>) | undefined {
    if (this.opts.kind === 'generic') return undefined;
    return () => readSchedulerGauges(this.opts.kind, this.baseUrl, this.dispatcher);
  }

  stats(): EngineStats {
    return {
      kind: this.kind,
      engine_kind: this.opts.kind,
      engine_url: this.baseUrl,
      engine_model: this.model,
      quiescence: this.opts.quiescence,
      ...(this.proc ? { engine_pid: this.proc.pid ?? null } : {}),
      running_sequences: this.inflight,
      queued_sequences: 0,
      batch_slots: 0,
      generated_tokens: this.generated,
      last_probe: this.lastProbe,
      ...(this.kvSubscriber ? { kv_events: this.kvSubscriber.stats() } : {}),
    };
  }

  async close(): Promise<void> {
    this.reprobe.reset();
    await this.kvSubscriber?.close();
    await this.proc?.stop(this.opts.stopTimeoutMs);
    await this.dispatcher.destroy();
  }
}

/**
 * The engine counts a continuation's delivered tokens as prompt (they are re-sent with it); the
 * client's usage counts them once, as completion. Exact when they went as ids; re-sent as text,
 * the engine re-tokenizes them, so the seam may count a token more or less than the original.
 */
function promptTokensOf(engineCount: number, cont: Continuation | undefined): number {
  if (cont === undefined) return engineCount;
  return Math.max(0, engineCount - (cont.token_ids?.length ?? cont.completion_tokens));
}

function trimSlash(url: string): string {
  return url.replace(/\/+$/, '');
}

/**
 * Starts the engine child (with --engine-cmd), waits until the engine serves and learns its model;
 * resolves only then. Aborting `signal` (SIGTERM while loading) stops the child and rejects. Every
 * failure is one line naming the URL or command and the cause.
 */
export async function createOpenAIEngine(opts: OpenAIEngineOptions, mode: WorkerMode, log: Logger, signal: AbortSignal): Promise<OpenAIEngine> {
  if (mode !== 'aggregated') throw new Error(`--engine openai serves aggregated workers only (got --mode ${mode}): the engine server does its own prefill and decode`);
  let url = opts.url;
  let command = opts.command;
  if (command !== undefined) {
    if (command.includes('{port}')) {
      const port = await freePort();
      command = command.replaceAll('{port}', String(port));
      url ??= `http://127.0.0.1:${port}`;
    } else if (url === undefined) throw new Error('--engine-cmd has no {port} and no --engine-url is given: ebb cannot know where the engine listens');
  }
  if (url === undefined) throw new Error('--engine openai needs --engine-url (or --engine-cmd with {port})');
  for (const [flag, endpoint] of [['--engine-kv-events', opts.kvEvents], ['--engine-kv-events-replay', opts.kvEventsReplay]] as const)
    if (endpoint !== undefined && !/^(tcp|ipc):\/\/./.test(endpoint)) throw new Error(`${flag} is not a ZMQ endpoint (tcp://host:port or ipc://path): ${endpoint}`);
  const base = trimSlash(url);
  try {
    new URL(base);
  } catch {
    throw new Error(`--engine-url is not a URL: ${url}`);
  }
  const dispatcher = new Agent({ keepAliveTimeout: 10_000 });
  const proc = command === undefined ? undefined : new EngineProcess(command, log);
  try {
    await waitUntilHealthy({ url: `${base}${healthPath(opts.kind)}`, dispatcher, log, signal, timeoutMs: opts.loadTimeoutMs, exited: proc?.exited });
    const { model, maxContext } = await readModels(base, dispatcher, opts.engineModel);
    if (proc?.exitStatus) throw new Error(`the engine exited (${describeExit(proc.exitStatus)}) right after it became healthy`);
    log.info({ event: 'engine_connected', url: base, engine_kind: opts.kind, engine_model: model, max_context: maxContext, quiescence: opts.quiescence }, `engine ${opts.kind} at ${base} serves ${model}`);
    return new OpenAIEngine(opts, base, model, maxContext, dispatcher, proc, log);
  } catch (err) {
    await proc?.stop(opts.stopTimeoutMs);
    await dispatcher.destroy();
    const msg = describeError(err);
    throw new Error(command !== undefined ? `engine command "${command}": ${msg}` : msg.includes(base) ? msg : `engine at ${base}: ${msg}`);
  }
}

/** The model the engine serves, and its context length where the engine says (vLLM's max_model_len). */
async function readModels(base: string, dispatcher: Agent, wanted: string | undefined): Promise<{ model: string; maxContext: number | null }> {
  const res = await getBounded(`${base}/v1/models`, dispatcher, 5000, 1 << 20);
  if (res.status !== 200) throw new Error(`GET ${base}/v1/models answered ${res.status}`);
  let list: ModelsList;
  try {
    list = JSON.parse(res.text) as ModelsList;
  } catch {
    throw new Error(`GET ${base}/v1/models is not JSON`);
  }
  const models = (list.data ?? []).filter((m): m is { id: string; max_model_len?: unknown } => typeof m?.id === 'string');
  // Not an adapter (vLLM and SGLang list those with a parent): the base model.
  const chosen = wanted === undefined ? (models.find((m) => typeof (m as { parent?: unknown }).parent !== 'string') ?? models[0]) : models.find((m) => m.id === wanted);
  if (chosen === undefined)
    throw new Error(wanted === undefined ? `GET ${base}/v1/models lists no model` : `the engine serves ${models.map((m) => `"${m.id}"`).join(', ') || 'no model'}, not "${wanted}" (--engine-model)`);
  const len = chosen.max_model_len;
  return { model: chosen.id, maxContext: typeof len === 'number' && Number.isInteger(len) && len > 0 ? len : null };
}
