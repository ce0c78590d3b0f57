import { checkGgufHeader } from './gguf-header.js';
import { EbbError } from '../protocol/errors.js';
import type { Logger } from 'pino';
import {
  getLlama,
  getLlamaGpuTypes,
  LlamaLogLevel,
  type CustomBatchingPrioritizationStrategy,
  type Llama,
  type LlamaContext,
  type LlamaContextSequence,
  type LlamaEmbeddingContext,
  type LlamaGrammar,
  type LlamaGrammarEvaluationState,
  type LlamaModel,
  type Token,
} from 'node-llama-cpp';
import { PausedForContinuation, promptParam, type EmbedInput, type EmbedOptions, type EmbedResult, type Engine, type EngineCapabilities, type EngineStats, type GeneratedPiece, type GenerateRequest, type GenerateResult, type KvCacheStats, type KvPayload, type KvStateHandle, type Quiescence, type TokenizeRequest } from './engine.js';
import { KV_STATE_DEFAULTS, KvStateFiles, sha256File } from './llama-cpp-kv-state.js';
import type { KvTransfer, KvTransferStore } from './kv-transfers.js';
import { GrammarCache, grammarState, oneLine, type ResponseFormatLike } from './llama-cpp-grammar.js';
import { PromptRenderer, type RenderedPrompt } from './llama-cpp-prompt.js';
import { PieceAssembler, type AssembledPiece } from './llama-cpp-text.js';
import { ForcedCall, type Written } from './llama-cpp-tools.js';
import { forcedFunction, toolsActive } from '../protocol/tools.js';
import { LlamaLogprobs, samplingMetadata, type SampledToken } from './llama-cpp-logprobs.js';
import { llamaSampling, type LlamaSamplingOptions } from './llama-cpp-sampling.js';
import { ggmlTokenizer, tokenBytesOf, type TokenBytes } from './llama-cpp-token-bytes.js';
import { PrefixSequences, type SequenceLease } from './llama-cpp-prefix-reuse.js';
import { DEFAULT_BLOCK_SIZE } from '../protocol/block-hash.js';
import { KvEventLog } from './kv-event-log.js';
import { slotQuiescence, Slots } from './slots.js';
import { PriorityGate } from './priority-gate.js';
import { SpareSequence } from './spare-sequence.js';
import { LLAMA_CPP_DEFAULTS, type LlamaCppOptions } from './llama-cpp-options.js';
import { LlamaCppAdapters } from './llama-cpp-adapters.js';
import { checkLoraGguf } from './lora-gguf.js';

export { LLAMA_CPP_DEFAULTS, type LlamaCppOptions, type LlamaGpu } from './llama-cpp-options.js';

/** Fields the worker passes when the request carries them (top_p, response_format). */
type LlamaRequest = GenerateRequest & { top_p?: number | undefined; response_format?: ResponseFormatLike | undefined };

/** A function declared without parameters takes none: its arguments are `{}`. */
const NO_PARAMETERS = { type: 'object', properties: {} };

/**
 * Loads the model and its context; resolves once the engine can serve. Never downloads or builds
 * llama.cpp: the prebuilt binaries come with node-llama-cpp's optional packages, and a machine
 * without one for its platform fails here with one clear line.
 */
export async function loadLlamaCppEngine(opts: LlamaCppOptions, log: Logger, signal: AbortSignal): Promise<LlamaCppEngine> {
  // node-llama-cpp's own error is often just "Failed to load model"; llama.cpp logs the reason.
  let llamaError: string | undefined;
  const fail = (cause: unknown): Error =>
    new Error(`cannot load model ${opts.modelPath}: ${oneLine(cause)}${llamaError !== undefined ? ` (llama.cpp: ${llamaError})` : ''}`);
  try {
    await checkGgufHeader(opts.modelPath);
  } catch (err) {
    throw fail((err as NodeJS.ErrnoException).code === 'ENOENT' ? 'no such file' : err);
  }
  signal.throwIfAborted();
  let llama: Llama | undefined;
  let model: LlamaModel | undefined;
  try {
    llama = await getLlama({
      gpu: opts.gpu === 'off' ? false : opts.gpu,
      build: 'never',
      skipDownload: true,
      usePrebuiltBinaries: true,
      progressLogs: false,
      maxThreads: opts.threads,
      logLevel: LlamaLogLevel.warn,
      logger: (level, message) => {
        const text = message.trim();
        if (text === '') return;
        // The "error loading model" line names the cause; later lines only repeat that it failed.
        const cause = /error loading model: (?:llama_model_loader: )?(.*)$/.exec(text)?.[1];
        if (cause !== undefined) llamaError = cause;
        else if ((level === LlamaLogLevel.error || level === LlamaLogLevel.fatal) && llamaError === undefined) llamaError = text;
        log.debug({ event: 'llama_cpp_log', level }, text);
      },
    }).catch((err: unknown) => {
      // node-llama-cpp only says "NoBinaryFoundError": name the backend asked for.
      throw (err as Error).name === 'NoBinaryFoundError' || /NoBinaryFound/.test(String(err))
        ? new Error(`no llama.cpp binary for --gpu ${opts.gpu} loads on this machine (none is built or downloaded at run time); --gpu auto falls back to the CPU`)
        : err;
    });
    signal.throwIfAborted();
    await logBackend(llama, opts.gpu, log);
    model = await llama.loadModel({ modelPath: opts.modelPath, loadSignal: signal, ...(opts.gpu === 'off' ? { gpuLayers: 0 } : {}) });
    // Adapters named at start load later, when the worker asks: a wrong file is found now, not then.
    for (const { name, path } of opts.loras ?? []) await checkLoraGguf(path ?? '', model.fileInfo).catch((err: unknown) => Promise.reject(new Error(`--lora ${name}=${path}: ${oneLine(err)}`)));
    const context = await model.createContext({
      ...contextShape(opts, SpareSequence.sequencesFor(opts.preemptionSpareSequence === true)),
      createSignal: signal,
      // A fixed size when asked; otherwise as much of the training context as memory allows.
      contextSize: opts.contextSize ?? { max: model.trainContextSize },
    });
    const contextSize = context.contextSize;
    const kv = await KvStateFiles.open(
      { maxBytes: opts.kvStateMaxBytes ?? KV_STATE_DEFAULTS.maxBytes, ttlMs: opts.kvTransferTtlMs ?? KV_STATE_DEFAULTS.ttlMs },
      sha256File(opts.modelPath).then((model_sha256) => ({ model_sha256, context_size: contextSize })),
      log,
    );
    const engine = new LlamaCppEngine(llama, model, context, opts);
    engine.attachKvState(kv);
    log.info({ event: 'engine_loaded', engine: engine.kind, ...engine.describe() }, `model ${opts.modelPath} loaded`);
    return engine;
  } catch (err) {
    await model?.dispose().catch(() => undefined);
    await llama?.dispose().catch(() => undefined);
    if (signal.aborted) throw signal.reason instanceof Error ? signal.reason : new Error(`loading ${opts.modelPath} was aborted`);
    throw fail(err);
  }
}

/**
 * Says which backend llama.cpp runs on and why: `--gpu auto` on a machine where no GPU backend loads
 * runs on the CPU, and an operator who expected a GPU must learn it at start, not from the speed.
 */
async function logBackend(llama: Llama, requested: LlamaCppOptions['gpu'], log: Logger): Promise<void> {
  const chosen = llama.gpu === false ? 'cpu' : llama.gpu;
  if (requested !== 'auto') {
    log.info({ event: 'llama_backend', requested, backend: chosen }, `llama.cpp runs on ${chosen === 'cpu' ? 'the CPU' : chosen} (--gpu ${requested})`);
    return;
  }
  if (chosen !== 'cpu') {
    log.info({ event: 'llama_backend', requested, backend: chosen }, `llama.cpp runs on ${chosen}: --gpu auto found its libraries and a binary that loads`);
    return;
  }
  // Those with their libraries and drivers here (each has a prebuilt binary for this platform).
  const usable = (await getLlamaGpuTypes('supported').catch(() => [])).filter((t) => t !== false);
  const possible = (await getLlamaGpuTypes('allValid').catch(() => [])).filter((t) => t !== false);
  const why =
    usable.length > 0
      ? `the ${usable.join(', ')} binary did not load (--gpu ${usable[0]} says why)`
      : `no GPU backend has its libraries and drivers on this machine (looked for ${possible.join(', ') || 'none on this platform'})`;
  log.warn({ event: 'llama_backend', requested, backend: 'cpu', why }, `llama.cpp runs on the CPU: --gpu auto fell back, ${why}`);
}

/**
 * Batch invariance. llama.cpp's arithmetic for one sequence depends on what shares its decode: with
 * other sequences' tokens in the same batch the kernels sum in another order, and at a near-tie a
 * temperature-0 answer takes another token from there on. Measured here (CPU, 12 answers of 400
 * tokens in --parallel 12): reruns alone 12/12 identical, reruns arriving at other moments up to
 * 5/12 different; one sequence per decode, 108/108 identical. So a migrated answer can only equal the
 * undisturbed one when neither shared its decodes: node-llama-cpp then dispatches the queued
 * sequences one per decode, in the order they queued.
 */
const oneSequencePerDecode: CustomBatchingPrioritizationStrategy = ({ items }) => items.slice(0, 1).map((item) => ({ item, processAmount: item.tokens.length }));

/**
 * What every context of the engine shares: the base model's and each resident LoRA adapter's. Only
 * the base context has a spare sequence (`spare`): only its paused streams write a state file.
 */
function contextShape(opts: LlamaCppOptions, spare = 0) {
  return {
    sequences: opts.parallel + spare,
    threads: opts.threads,
    ...(opts.batchInvariant ? { batching: { itemPrioritizationStrategy: oneSequencePerDecode } } : {}),
  };
}

/** The vocabulary size the GGUF declares: its token list, else `<arch>.vocab_size`. */
function vocabularySizeOf(model: LlamaModel): number | undefined {
  const meta = model.fileInfo.metadata as unknown as Record<string, Record<string, unknown> | undefined>;
  const tokens = ggmlTokenizer(model)?.tokens;
  if (tokens !== undefined) return tokens.length;
  const arch = meta.general?.architecture;
  const size = typeof arch === 'string' ? meta[arch]?.vocab_size : undefined;
  return typeof size === 'number' ? size : undefined;
}

/** A request made ready to run: its tokens, the room its answer has, its grammar state. */
interface Prepared {
  prompt: RenderedPrompt;
  /** A continuation's tokens, then what the engine writes before it samples (a forced call's opening): evaluated after the prompt. */
  already: Token[];
  input: Token[];
  room: number;
  grammarEvaluationState: LlamaGrammarEvaluationState | undefined;
  /** tool_choice forces a call: the engine writes it (llama-cpp-tools.ts). */
  forced: ForcedCall | undefined;
  /** The answer's tokens so far (a continuation's, what the engine wrote, what it sampled): what the penalties count. */
  answer: Token[];
  sampling: LlamaSamplingOptions;
}

/** Rejects with the abort reason once `signal` aborts; never settles otherwise. */
function aborted(signal: AbortSignal): { promise: Promise<never>; dispose: () => void } {
  let onAbort = () => {};
  const promise = new Promise<never>((_, reject) => {
    onAbort = () => reject(signal.reason);
    if (signal.aborted) onAbort();
    else signal.addEventListener('abort', onAbort, { once: true });
  });
  promise.catch(() => undefined);
  return { promise, dispose: () => signal.removeEventListener('abort', onAbort) };
}

/**
 * A GGUF model in this process through node-llama-cpp: one context of `parallel` sequences,
 * each running request holding one sequence (llama.cpp batches their tokens together), the rest
 * queued FIFO. Idleness is exact: the engine itself counts its sequences.
 */
export class LlamaCppEngine implements Engine {
  readonly kind = 'llama-cpp';
  readonly capabilities: EngineCapabilities;
  private readonly slots: Slots;
  /** Flex decodes held back while a priority request gets its first token (priority-gate.ts). */
  private readonly gate = new PriorityGate();
  /** Whether a paused stream's slot may go back before its sequence (--preemption-spare-sequence). */
  private readonly spare: SpareSequence;
  private readonly prompts: PromptRenderer;
  private readonly grammars: GrammarCache;
  /** The context's sequences, kept with their tokens: prompt prefixes are reused (llama-cpp-prefix-reuse.ts). */
  private readonly sequences: PrefixSequences;
  /**
   * The blocks the sequences hold, for the frontend's router (GET /kv/events), hashed over this
   * model's tokens. None with --batch-invariant: that mode never reuses a prefix, so it has none to offer.
   */
  readonly kvEvents: KvEventLog | undefined;
  private generated = 0;
  /** Prompt tokens seen, and those found in a sequence's cache (not evaluated again). */
  private promptTokensSeen = 0;
  private cachedPromptTokens = 0;
  private closed = false;
  /** KV state files: prefill transfers and hand-offs out, pulled states in (see llama-cpp-kv-state). */
  private kv!: KvStateFiles;
  /** From the GGUF's vocabulary; undefined when the file does not say (continuations then use text). */
  private readonly vocabularySize: number | undefined;
  /** Logprobs' `bytes` of the tokens whose text cannot say them (part of a character). */
  private readonly tokenBytes: TokenBytes;
  readonly adapters: LlamaCppAdapters;

  constructor(
    private readonly llama: Llama,
    private readonly model: LlamaModel,
    private readonly context: LlamaContext,
    private readonly opts: LlamaCppOptions,
  ) {
    this.slots = new Slots(opts.parallel);
    this.spare = new SpareSequence(opts.preemptionSpareSequence === true);
    this.prompts = new PromptRenderer(model);
    this.grammars = new GrammarCache(llama);
    this.vocabularySize = vocabularySizeOf(model);
    this.tokenBytes = tokenBytesOf(model);
    this.kvEvents = opts.batchInvariant === true ? undefined : new KvEventLog(DEFAULT_BLOCK_SIZE, 'worker');
    this.sequences = new PrefixSequences(context, context.totalSequences, DEFAULT_BLOCK_SIZE, this.kvEvents);
    this.adapters = new LlamaCppAdapters(model, (path, signal) => this.adapterContext(path, signal), opts.loras ?? [], opts.loraSlots ?? LLAMA_CPP_DEFAULTS.loraSlots);
    const toolSyntax = this.prompts.toolSyntax;
    this.capabilities = {
      json_object: true,
      json_schema: true,
      logprobs: true,
      tools: toolSyntax !== undefined,
      ...(toolSyntax !== undefined && { tool_syntax: toolSyntax }),
      max_context: context.contextSize,
      continuation: true,
      prompt_token_ids: this.vocabularySize !== undefined, // ids are checked against it (see render)
      // node-llama-cpp computes no embeddings with encoder-decoder models.
      embeddings: !(model.fileInsights.hasEncoder && model.fileInsights.hasDecoder),
      // Penalties and logit_bias through llama.cpp's own samplers (llama-cpp-sampling.ts).
      sampling: true,
      preemption: true,
    };
  }

  /**
   * A resident adapter's context: the base context's size and shape, the adapter applied to all of
   * it. Its sequences publish no KV events: the router's block hashes are the base model's, and an
   * adapter's KV answers none of them.
   */
  private async adapterContext(path: string, signal: AbortSignal) {
    const context = await this.model.createContext({ ...contextShape(this.opts), contextSize: this.context.contextSize, createSignal: signal, lora: { adapters: [{ filePath: path }] } });
    return { context, sequences: new PrefixSequences(context, context.totalSequences, DEFAULT_BLOCK_SIZE, undefined) };
  }

  /** The sequences a request runs on: its adapter's context, or the base model's. */
  private sequencesFor(req: GenerateRequest): PrefixSequences {
    return req.adapter === undefined ? this.sequences : this.adapters.contextOf(req.adapter).sequences;
  }

  attachKvState(kv: KvStateFiles): void {
    this.kv = kv;
    // Every transfer ending changes what a drain waits for.
    kv.transfers.on('completed', () => this.slots.changed());
    kv.transfers.on('expired', () => this.slots.changed());
  }

  get kvTransfers(): KvTransferStore {
    return this.kv.transfers;
  }

  kvPayload(transferId: string): KvPayload | undefined {
    return this.kv.payload(transferId);
  }

  importKv(header: string, bytes: number, body: AsyncIterable<Uint8Array>, signal: AbortSignal): Promise<KvStateHandle> {
    return this.kv.import(header, bytes, body, signal);
  }

  /**
   * Prefill side of disaggregated serving: evaluates the prompt but its last token (the decode
   * worker evaluates that one, for the first token's logits) and holds the state for the peer.
   */
  async prefill(request: GenerateRequest, signal: AbortSignal): Promise<KvTransfer> {
    if (this.closed) throw new Error('the engine is closed');
    // A state holds no trace of the adapter that computed it: states of adapters do not move.
    if (request.adapter !== undefined)
      throw new EbbError('unsupported_parameter', `LoRA adapter "${request.adapter}": llama-cpp does not move an adapter's KV between workers; serve it aggregated`, { param: 'model' });
    const { prompt } = await this.prepare(request as LlamaRequest);
    await this.slots.acquire(signal);
    const abort = aborted(signal);
    let lease: SequenceLease | undefined;
    let evaluating: Promise<void> | undefined;
    let failed = false;
    try {
      // A prefix this worker already holds (a shared system prompt) is not evaluated again.
      lease = await this.sequences.take(prompt.tokens, this.opts.batchInvariant !== true);
      this.countPrompt(prompt.tokens.length, lease.cached);
      // One batch of the context's size at a time (where llama.cpp splits one long evaluation too, so
      // the state is the same), the caller asked between them: a prefill whose caller left stops
      // within a batch instead of evaluating the rest of a long prompt for nobody.
      const rest = prompt.tokens.slice(lease.cached, -1);
      const step = this.context.batchSize;
      for (let at = 0; at < rest.length; at += step) {
        signal.throwIfAborted();
        evaluating = lease.sequence.evaluateWithoutGeneratingNewTokens(rest.slice(at, at + step));
        evaluating.catch(() => undefined);
        await Promise.race([evaluating, abort.promise]);
      }
      const transfer = await this.kv.export(lease.sequence, prompt.tokens.length);
      this.sequences.publish(lease);
      return { ...transfer, cached_tokens: Math.min(lease.cached, prompt.tokens.length) };
    } catch (err) {
      failed = !signal.aborted;
      throw err;
    } finally {
      abort.dispose();
      // The sequence is kept: it goes back only once llama.cpp is done writing to it.
      await evaluating?.catch(() => undefined);
      if (lease) await this.sequences.give(lease, failed);
      this.slots.release();
    }
  }

  /** What the worker's start-up line shows about the model. */
  describe(): Record<string, unknown> {
    return {
      model_path: this.opts.modelPath,
      context_size: this.context.contextSize,
      parallel: this.opts.parallel,
      threads: this.opts.threads,
      batch_invariant: this.opts.batchInvariant === true,
      preemption_spare_sequence: this.spare.sequences > 0,
      gpu: this.llama.gpu === false ? 'off' : this.llama.gpu,
      gpu_layers: this.model.gpuLayers,
      chat_template: this.prompts.templateName,
      lora: this.adapters.available().map((a) => a.name),
      lora_slots: this.adapters.maxResident,
    };
  }

  /** Tokens of a prompt as this engine would evaluate it (for tests and benchmarks). */
  render(req: Pick<GenerateRequest, 'prompt' | 'messages' | 'stop' | 'prompt_token_ids' | 'tools' | 'tool_choice'>): RenderedPrompt {
    const stops = (req.stop ?? []).filter((s) => s.length > 0);
    if (req.prompt_token_ids !== undefined) {
      return { tokens: this.vocabularyIds(req.prompt_token_ids, 'prompt'), stopTokens: new Set(), stopTexts: [...stops] };
    }
    if (req.messages === undefined || req.messages.length === 0) return this.prompts.plain(req.prompt, stops);
    return this.prompts.chat(req.messages, stops, toolsActive(req.tools, req.tool_choice) ? req.tools : undefined);
  }

  /** Ids outside the vocabulary crash llama.cpp (the whole process): refused here, naming the field that sent them. */
  private vocabularyIds(ids: number[], param: 'prompt' | 'input'): Token[] {
    const size = this.vocabularySize;
    if (size === undefined) throw new Error('this model does not say its vocabulary size: token-id prompts cannot be checked');
    const bad = ids.find((id) => id >= size);
    if (bad !== undefined) throw new EbbError('invalid_request', `${param} token id ${bad} is outside this model's vocabulary (${size} tokens)`, { param });
    return ids as Token[];
  }

  /**
   * Embeddings through node-llama-cpp's embedding context: made on the first embedding (a worker
   * that never embeds never holds its memory), one input at a time in one batch slot, so the load
   * and idleness the worker sees include it. Its vectors are the model's own size: `dimensions`
   * other than that is refused (a causal model's vectors are not trained to be shortened).
   */
  async embed(inputs: EmbedInput[], opts: EmbedOptions, signal: AbortSignal): Promise<EmbedResult> {
    if (this.closed) throw new Error('the engine is closed');
    const native = this.model.embeddingVectorSize;
    if (opts.dimensions !== undefined && opts.dimensions !== native)
      throw new EbbError('invalid_request', `dimensions ${opts.dimensions} is not supported: this model's embeddings have ${native} dimensions`, { param: 'dimensions' });
    const resolved = inputs.map((input) => (typeof input === 'string' ? input : this.vocabularyIds(input, 'input')));
    await this.slots.acquire(signal);
    try {
      const context = await this.embeddingContext();
      const vectors: Float32Array[] = [];
      let promptTokens = 0;
      for (const input of resolved) {
        signal.throwIfAborted();
        const tokens = context.calculateInputLength(input);
        if (tokens >= this.context.contextSize) throw new EbbError('context_length_exceeded', `an input is ${tokens} tokens; this engine's context holds ${this.context.contextSize}`, { param: 'input' });
        promptTokens += tokens;
        vectors.push(Float32Array.from((await context.getEmbeddingFor(input)).vector));
      }
      return { vectors, prompt_tokens: promptTokens };
    } finally {
      this.slots.release();
    }
  }

  private embeddings: Promise<LlamaEmbeddingContext> | undefined;

  private embeddingContext(): Promise<LlamaEmbeddingContext> {
    this.embeddings ??= this.model
      .createEmbeddingContext({
        contextSize: this.context.contextSize,
        // One batch holds a whole input: a non-causal (BERT-style) model pools over all of it at once.
        batchSize: this.context.contextSize,
        threads: this.opts.threads,
      })
      .catch((err: unknown) => {
        this.embeddings = undefined; // the next embedding tries again (memory may have been freed)
        throw err;
      });
    return this.embeddings;
  }

  /**
   * Everything a request needs before it takes a sequence, checked: the caller's errors
   * (invalid_request) are found here, and the worker asks for them (check) before it answers.
   */
  private async prepare(req: LlamaRequest): Promise<Prepared> {
    const prompt = this.render(req);
    const forced = await this.forcedCall(req);
    const already = [...this.continuationTokens(req), ...(forced?.opening?.tokens ?? [])];
    const input = [...prompt.tokens, ...already];
    const room = this.context.contextSize - input.length;
    if (room <= 0) throw new EbbError('context_length_exceeded', `the prompt is ${input.length} tokens; this engine's context holds ${this.context.contextSize}`, { param: promptParam(req) });
    // A forced call is the whole answer: its own grammars constrain it, not response_format's.
    const grammar = forced === undefined ? await this.grammars.grammarFor(req.response_format) : undefined;
    const grammarEvaluationState = grammar ? grammarState(this.llama, this.model, grammar, already, `response_format ${req.response_format?.type ?? ''}`) : undefined;
    const answer = [...already];
    const sampling = llamaSampling(this.model, this.vocabularySize, req.sampling, answer, this.context.contextSize);
    return { prompt, already, input, room, grammarEvaluationState, forced, answer, sampling };
  }

  /** The call tool_choice forces (`required`, a named function), with its grammars compiled; none under `auto`. */
  private async forcedCall(req: GenerateRequest): Promise<ForcedCall | undefined> {
    const choice = forcedFunction(req.tool_choice);
    const syntax = this.prompts.toolSyntax;
    if (choice === undefined || syntax === undefined || req.tools === undefined || !toolsActive(req.tools, req.tool_choice)) return undefined;
    const tools = choice === 'required' ? req.tools : req.tools.filter((t) => t.function.name === choice);
    if (tools.length === 0) throw new EbbError('invalid_request', `tool_choice names function "${choice}", which is not in tools`, { param: 'tool_choice' });
    const args = new Map<string, LlamaGrammar>();
    for (const t of tools) {
      const grammar = await this.grammars.forSchema(t.function.parameters ?? NO_PARAMETERS).catch((err: unknown) => {
        const index = req.tools!.indexOf(t);
        throw new EbbError('invalid_function_parameters', `Invalid schema for function '${t.function.name}': llama.cpp cannot build its grammar: ${oneLine(err)}`, { param: `tools[${index}].function.parameters` });
      });
      args.set(t.function.name, grammar);
    }
    const names = args.size > 1 ? await this.grammars.forNames([...args.keys()]) : undefined;
    const model = {
      tokenize: (text: string) => this.prompts.written(text),
      state: (grammar: LlamaGrammar, text: string, follows: string) => grammarState(this.llama, this.model, grammar, this.model.tokenize(text, false, 'trimLeadingSpace'), follows),
    };
    return new ForcedCall(syntax, { args, names }, model, req.continuation?.text ?? '');
  }

  /** The tokens generate evaluates for this request: the rendered prompt, then a continuation's tokens. */
  async tokenize(req: TokenizeRequest): Promise<number[]> {
    if (this.closed) throw new Error('the engine is closed');
    return [...this.render(req).tokens, ...this.continuationTokens(req as GenerateRequest)];
  }

  async check(request: GenerateRequest): Promise<void> {
    if (this.closed) throw new Error('the engine is closed');
    await this.prepare(request as LlamaRequest);
  }

  async *generate(request: GenerateRequest, signal: AbortSignal): AsyncGenerator<GeneratedPiece, GenerateResult, void> {
    const req = request as LlamaRequest;
    if (this.closed) throw new Error('the engine is closed');
    const { prompt, already, input, room, grammarEvaluationState, forced, answer, sampling } = await this.prepare(req);
    const promptTokens = prompt.tokens.length;
    /** Leading tokens of `input` not evaluated here: found in the sequence's cache, or loaded from a peer's state. */
    let skipped = 0;
    /** Of those, the prompt tokens cached before this request came (what its usage calls cached). */
    let cached = 0;
    // No max_tokens (where the request plane allows that): whatever the context leaves.
    const limit = Math.min((req.max_tokens as number | undefined) ?? room, room);
    const result = (finish_reason: GenerateResult['finish_reason'], completion_tokens: number): GenerateResult => ({
      // max_tokens cut short by the context is still "length", as OpenAI reports it.
      finish_reason,
      prompt_tokens: promptTokens,
      completion_tokens,
      cached_tokens: Math.min(cached, promptTokens),
    });
    if (req.max_tokens === 0 || forced?.done) {
      await req.kv_state?.dispose();
      return result(forced?.done ? 'stop' : 'length', 0);
    }
    const sequences = this.sequencesFor(req);
    // A pulled state was computed on the base model (adapters' states are never exported): under an adapter it is evaluated again here.
    const pulled = req.adapter === undefined ? req.kv_state : undefined;

    await this.slots.acquire(signal, req.tier);
    // From its slot to its first token a priority request's work runs without flex decodes beside it.
    let ungate = req.tier === 'priority' ? this.gate.hold() : undefined;
    let lease: SequenceLease | undefined;
    let failed = false;
    let tokens: AsyncGenerator<SampledToken, void, void | Token | Token[]> | undefined;
    /** A replayed evaluation an abort may have left running: the sequence goes back only after it. */
    let replaying: Promise<void> | undefined;
    const abort = aborted(signal);
    let n = 0;
    try {
      if (pulled !== undefined) {
        // A peer's state replaces whatever the sequence held: an emptied one is taken.
        lease = await sequences.take(input, false);
        const kept = await this.kv.load(lease.sequence, pulled, input);
        // A state that did not load may have left part of itself: start clean (a re-prefill).
        if (kept === undefined) await sequences.clear(lease);
        else {
          skipped = kept;
          // A prefill peer's state: what that peer found cached; a hand-off's was computed for this request.
          cached = req.prefilled ? (req.prefill_cached_tokens ?? 0) : 0;
          sequences.publish(lease);
        }
      } else {
        // Batch invariant: a reused prefix was evaluated in other batches, so that mode never reuses one.
        lease = await sequences.take(input, this.opts.batchInvariant !== true);
        skipped = lease.cached;
        cached = skipped;
        this.countPrompt(promptTokens, skipped);
      }
      const sequence = lease.sequence;
      // Batch invariant: the delivered tokens are evaluated one per decode, as the worker that
      // generated them did (a GPU's kernels differ by how many tokens a decode holds).
      const replay = this.opts.batchInvariant === true && already.length > 0 && skipped < input.length - 1;
      if (replay) {
        const evaluate = (these: Token[]) => {
          const done = sequence.evaluateWithoutGeneratingNewTokens(these);
          done.catch(() => undefined); // an abort wins the race; awaited below before the sequence goes back
          replaying = done;
          return Promise.race([done, abort.promise]);
        };
        if (skipped < prompt.tokens.length) await evaluate(prompt.tokens.slice(skipped));
        for (const token of already.slice(Math.max(0, skipped - prompt.tokens.length), -1)) await evaluate([token]);
      }
      // With logprobs: what llama.cpp measured of each sampled token, kept for the piece that carries it.
      const logprobs = req.logprobs === undefined ? undefined : new LlamaLogprobs(this.model, this.tokenBytes, req.logprobs, input);
      const out = (piece: AssembledPiece): GeneratedPiece => logprobs?.attach(piece) ?? piece;
      const stream = (tokens = sequence.evaluateWithMetadata(replay ? already.slice(-1) : input.slice(skipped), samplingMetadata(req.logprobs), {
        temperature: req.temperature,
        topP: req.top_p ?? 1,
        ...sampling,
        // Seeds are unsigned in llama.cpp; none given: a fresh one per request.
        ...(req.seed !== undefined ? { seed: req.seed >>> 0 } : {}),
        // A forced call's grammar changes as the call goes on (name, then arguments).
        ...(forced !== undefined ? { grammarEvaluationState: () => forced.state } : grammarEvaluationState ? { grammarEvaluationState } : {}),
        yieldEogToken: true,
      }) as AsyncGenerator<SampledToken, void, void | Token | Token[]>);
      // A flex sequence asks for its next token (which queues its decode) only through the open gate.
      const flex = req.tier === 'flex';
      const ask = (replacement?: Token[]) => (flex ? this.gate.passed(signal).then(() => stream.next(replacement)) : stream.next(replacement));
      // With tools a call may be written in special tokens (<tool_call>): they are the answer's text.
      const special = toolsActive(req.tools, req.tool_choice);
      const detokenize = (ids: number[], before: number[]) => this.model.detokenize(ids as Token[], special, before as Token[]);
      let text = new PieceAssembler(detokenize, forced?.stops ?? prompt.stopTexts, input);
      /** Text the engine writes itself, counted as answer tokens (certain ones), cut at max_tokens like any. */
      const write = (w: Written): { piece: GeneratedPiece | undefined; whole: boolean } => {
        const ids = w.tokens.slice(0, Math.max(0, limit - n));
        const whole = ids.length === w.tokens.length;
        n += ids.length;
        this.generated += ids.length;
        logprobs?.written(ids);
        const piece = whole ? w.text : this.model.detokenize(ids, true);
        return { piece: piece === '' && ids.length === 0 ? undefined : out({ text: piece, token_ids: ids }), whole };
      };
      let next = ask();
      let published = false;
      if (forced?.opening !== undefined) {
        const { piece, whole } = write(forced.opening);
        if (piece) yield piece;
        if (!whole || n >= limit) return result('length', n);
      }
      while (true) {
        const step = await Promise.race([next, abort.promise]);
        ungate?.();
        ungate = undefined;
        // The prompt is in the KV now: its blocks are news for the router.
        if (!published) sequences.publish(lease);
        published = true;
        if (step.done) return result('stop', n);
        const token = step.value.token;
        const ended = this.model.isEogToken(token) || prompt.stopTokens.has(token);
        if (!ended) {
          n++;
          this.generated++;
          if (flex) this.gate.flexToken();
          // Counted by the penalties before the next token is sampled (tokens.next() below samples it).
          answer.push(token);
          logprobs?.sampled(step.value);
        }
        const piece = ended ? text.flush() : text.push(token);
        if (piece) forced?.took(piece.text);
        if (!ended && !text.stopped && n < limit) {
          // The next token is decoded while the caller sends this one: llama.cpp works while the
          // worker writes (the sequence is ours until we return, so nothing else is delayed).
          next = ask();
          next.catch(() => undefined);
          if (piece) yield out(piece);
          continue;
        }
        const stopped = ended || text.stopped;
        const rest = stopped ? undefined : text.flush();
        const last = piece && rest ? { text: piece.text + rest.text, token_ids: [...piece.token_ids, ...rest.token_ids] } : (piece ?? rest);
        if (last) yield out(last);
        if (!stopped) return result('length', n);
        if (forced === undefined) return result('stop', n);
        // A forced call's name or arguments are complete: the engine writes what follows them.
        const after = forced.ended();
        const { piece: written, whole } = write(after.write);
        // What the engine wrote is the answer's too, counted by the penalties (the opening already is: it is in `already`).
        answer.push(...after.write.tokens);
        if (written) yield written;
        if (!whole || (after.sample && n >= limit)) return result('length', n);
        if (!after.sample) return result('stop', n);
        text = new PieceAssembler(detokenize, forced.stops, after.write.tokens);
        next = ask(after.write.tokens);
        next.catch(() => undefined);
      }
    } catch (err) {
      failed = !signal.aborted;
      throw err;
    } finally {
      abort.dispose();
      ungate?.();
      // Paused for a priority request, or one waits for this slot: what gives it back (its state file written) runs without flex decodes beside it.
      const preempted = signal.aborted && signal.reason instanceof PausedForContinuation && signal.reason.reason === 'preempted';
      const ungateBack = preempted || this.slots.queuedPriority > 0 ? this.gate.hold() : undefined;
      // With a spare sequence a paused base-model stream's slot goes back now: the priority request
      // takes the free sequence while this one ends its decode and writes its state.
      const spareBack = preempted && lease !== undefined && sequences === this.sequences ? this.spare.lend(req.request_id) : undefined;
      if (spareBack) this.slots.release();
      try {
        // The sequence goes back, with its tokens, before the slot does: the next request gets it.
        await tokens?.return().catch(() => undefined);
        await replaying?.catch(() => undefined);
        await req.kv_state?.dispose();
        // Handed off at a drain deadline: the next worker loads this sequence instead of re-evaluating it.
        if (lease !== undefined && n > 0 && signal.aborted && req.adapter === undefined && req.kv_handoff?.wanted(signal.reason)) await this.exportHandoff(lease.sequence, promptTokens, req.kv_handoff.exported);
        if (lease) await sequences.give(lease, failed);
        // Only once its sequence is free again (a give that threw keeps the spare lent: pauses then wait as without one).
        if (spareBack) {
          spareBack();
          this.slots.changed();
        } else this.slots.release();
      } finally {
        ungateBack?.();
      }
    }
  }

  /** The prefix cache's hit counts (kvCacheStats): tokens pulled from a peer are no cache hit, nor a miss. */
  private countPrompt(promptTokens: number, cached: number): void {
    this.cachedPromptTokens += Math.min(cached, promptTokens);
    this.promptTokensSeen += promptTokens;
  }

  private async exportHandoff(sequence: LlamaContextSequence, promptTokens: number, exported: (t: KvTransfer) => void): Promise<void> {
    try {
      exported(await this.kv.export(sequence, promptTokens));
    } catch {
      /* no state (disk bound, closing): the next worker re-evaluates, as after a crash */
    }
  }

  /**
   * A continuation resumes from the exact tokens where the other worker has them, else from its
   * text. Ids come over the network: one outside the vocabulary would abort the process inside
   * llama.cpp (detokenizing it throws a C++ exception), so they are checked first. An
   * end-of-generation token means that answer had ended: there is nothing to continue.
   */
  private continuationTokens(req: GenerateRequest): Token[] {
    const c = req.continuation;
    if (c === undefined) return [];
    const ids = c.token_ids;
    if (ids === undefined || this.vocabularySize === undefined) return this.model.tokenize(c.text, false);
    const size = this.vocabularySize;
    const bad = ids.find((id) => !Number.isInteger(id) || id < 0 || id >= size);
    if (bad !== undefined)
      throw new EbbError('invalid_request', `continuation token id ${bad} is not in this model's vocabulary (${size} tokens): another model generated it`, { param: 'continuation' });
    const end = ids.findIndex((id) => this.model.isEogToken(id as Token));
    if (end >= 0) throw new EbbError('invalid_request', `continuation token ${end} (id ${ids[end]}) ends the answer (end of generation): there is nothing to continue`, { param: 'continuation' });
    return ids as Token[];
  }

  async probeQuiescence(): Promise<Quiescence> {
    const q = slotQuiescence(this.slots, this.kv.transfers.size);
    // Its slot is back, but a paused stream still ends its decode and writes its state in the spare's time.
    if (!this.spare.lent || q.state === 'unknown') return q;
    const paused = 'a paused stream writing its KV state (its slot already back)';
    return { state: 'busy', waiting_for: [...(q.state === 'busy' ? q.waiting_for : []), paused] };
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
      ...this.gate.stats,
      ...this.spare.stats,
      sequences_taken: this.sequences.taken,
      context_size: this.context.contextSize,
      sequences_free: this.slots.capacity - this.slots.running,
      threads: this.opts.threads,
      kv_transfers_pending: this.kv.transfers.size,
      kv_state_bytes: this.kv.bytes,
      lora_slots: this.adapters.maxResident,
      lora_resident: this.adapters.residentNames,
    };
  }

  /** The sequences' blocks, as GET /engine/status shows them (`kv_cache`). */
  kvCacheStats(): KvCacheStats {
    const seen = this.promptTokensSeen;
    return {
      block_size: this.sequences.blockSize,
      capacity_blocks: this.opts.parallel * Math.floor(this.context.contextSize / this.sequences.blockSize),
      cached_blocks: this.sequences.cachedBlocks,
      prompt_tokens_hit: this.cachedPromptTokens,
      prompt_tokens_missed: seen - this.cachedPromptTokens,
      hit_rate: seen === 0 ? 0 : this.cachedPromptTokens / seen,
    };
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await this.kv.close();
    await this.adapters.close();
    await (await this.embeddings?.catch(() => undefined))?.dispose();
    await this.context.dispose();
    await this.model.dispose();
    await this.llama.dispose();
  }
}
