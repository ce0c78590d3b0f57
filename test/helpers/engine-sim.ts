/**
 * Engine simulators: small OpenAI-compatible servers standing in for vLLM, SGLang, llama-server or
 * a generic engine. Each serves /health, /v1/models, streaming /v1/completions and
 * /v1/chat/completions (one word per inter-token interval), /v1/embeddings (vLLM's shape), and its kind's /metrics page, whose
 * running/waiting gauges reflect the requests it really has open. Knobs make it misbehave the way
 * real engines can: busy after ebb's requests ended, metrics slow, garbled or missing, or dead.
 */
import { EventEmitter, once } from 'node:events';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';

export type SimKind = 'vllm' | 'sglang' | 'llamacpp' | 'generic';
export type MetricsMode = 'ok' | 'slow' | 'garbage' | 'missing';

export interface EngineSimOptions {
  kind: SimKind;
  /** Inter-token latency (ms). */
  itlMs?: number;
  model?: string;
  /** Reported in /v1/models as max_model_len (vLLM's field); null leaves it out. */
  maxModelLen?: number | null;
  port?: number;
  /** /health answers 503 for this long after start: a model loading. */
  loadMs?: number;
  /** Send the usage chunk when asked (stream_options.include_usage). */
  usage?: boolean;
  /** Report this many prompt tokens as found in the prefix cache (usage.prompt_tokens_details, as vLLM with --enable-prompt-tokens-details). */
  cachedTokens?: number;
  /** llamacpp: a llama-server started without --metrics (/metrics 501); /slots says which slots process. */
  slotsOnly?: boolean;
  /** Raw calls carry their arguments as a JSON string (`"arguments": "{\"city\": ...}"`), as some fine-tunes write them. */
  stringArguments?: boolean;
}

export interface SeenEngineRequest {
  path: string;
  body: Record<string, any>;
  /** The request's headers (a generation's: its traceparent among them, with tracing on). */
  headers?: Record<string, string | string[] | undefined>;
}

/** The simulators' chat template: one "role: content" line per message, then the answer's opening. */
export function simTemplate(messages: Array<{ role: string; content: string }>): string {
  return messages.map((m) => `<${m.role}> ${m.content}\n`).join('') + '<assistant>';
}

/** The simulators' tokenizer: one id per whitespace-separated word, from its characters. */
export function simTokenIds(text: string): number[] {
  return text.split(/\s+/).filter(Boolean).map((w) => [...w].reduce((h, c) => (h * 31 + c.charCodeAt(0)) % 50_000, 7));
}

/** The simulators' embedding of a text or of token ids: 8 components from its ids, unit length (as vLLM normalizes). */
export function simEmbedding(input: string | number[]): number[] {
  const ids = typeof input === 'string' ? simTokenIds(input) : input;
  const v = Array.from({ length: 8 }, (_, i) => ids.reduce((h, id) => (h * 31 + id * (i + 1)) % 10_007, 1) / 10_007 - 0.5);
  const norm = Math.hypot(...v);
  return v.map((x) => x / norm);
}

const WORDS = 'tide river shore harbor light quiet steady flow ebb drift wave sand gull salt moon'.split(' ');

function metricsPage(kind: Exclude<SimKind, 'generic'>, model: string, running: number, waiting: number, held: { running: number; waiting: number }): string {
  const f = (n: number) => n.toFixed(1); // Python's prometheus_client prints floats
  switch (kind) {
    case 'vllm':
      // Two engines (data parallel): what ebb holds runs on engine 0, the held work on engine 1, so
      // a probe that read only the first sample would miss it.
      return [
        '# HELP vllm:num_requests_running Number of requests in model execution batches.',
        '# TYPE vllm:num_requests_running gauge',
        `vllm:num_requests_running{engine="0",model_name="${model}"} ${f(running)}`,
        `vllm:num_requests_running{engine="1",model_name="${model}"} ${f(held.running)}`,
        '# HELP vllm:num_requests_waiting Number of requests waiting to be processed.',
        '# TYPE vllm:num_requests_waiting gauge',
        `vllm:num_requests_waiting{engine="0",model_name="${model}"} ${f(waiting)}`,
        `vllm:num_requests_waiting{engine="1",model_name="${model}"} ${f(held.waiting)}`,
        // Each engine its own KV cache: the second one fuller.
        '# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.',
        '# TYPE vllm:kv_cache_usage_perc gauge',
        `vllm:kv_cache_usage_perc{engine="0",model_name="${model}"} 0.25`,
        `vllm:kv_cache_usage_perc{engine="1",model_name="${model}"} 0.5`,
        '# HELP vllm:num_requests_running_total_fake A longer name sharing the prefix, to be ignored.',
        `vllm:num_requests_running_total_fake{model_name="${model}"} 7.0`,
        '# TYPE vllm:e2e_request_latency_seconds histogram',
        `vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="${model}"} 3.0`,
        '',
      ].join('\n');
    case 'sglang':
      return [
        '# HELP sglang:num_running_reqs The number of running requests.',
        '# TYPE sglang:num_running_reqs gauge',
        `sglang:num_running_reqs{model_name="${model}",tp_rank="0"} ${f(running + held.running)}`,
        '# HELP sglang:num_queue_reqs The number of requests in the waiting queue.',
        '# TYPE sglang:num_queue_reqs gauge',
        `sglang:num_queue_reqs{model_name="${model}",tp_rank="0"} ${f(waiting + held.waiting)}`,
        `sglang:token_usage{model_name="${model}"} 0.28`,
        '',
      ].join('\n');
    case 'llamacpp':
      return [
        '# HELP llamacpp:requests_processing Number of requests processing.',
        '# TYPE llamacpp:requests_processing gauge',
        `llamacpp:requests_processing ${running + held.running}`,
        '# HELP llamacpp:requests_deferred Number of requests deferred.',
        '# TYPE llamacpp:requests_deferred gauge',
        `llamacpp:requests_deferred ${waiting + held.waiting}`,
        '',
      ].join('\n');
  }
}

/**
 * A token's logprobs as vLLM streams them (its OpenAI-compatible server): chat's
 * `logprobs.content[]` ({token, logprob, bytes, top_logprobs}), completions' parallel arrays with
 * `top_logprobs` as token → logprob maps holding the sampled token too. The simulated model is sure
 * of its word; the alternatives are the words after it in WORDS, each less likely.
 */
function simLogprobs(contentShape: boolean, text: string, word: number, top: number, textOffset: number): unknown {
  const lead = text.startsWith(' ') ? ' ' : '';
  const chosen = -0.25 - (word % 4) / 8;
  const ranked = Array.from({ length: Math.max(top, 1) }, (_, r) => ({ token: lead + WORDS[(word + r) % WORDS.length], logprob: chosen - r * 1.5 }));
  const bytes = (t: string) => [...Buffer.from(t, 'utf8')];
  if (contentShape) return { content: [{ token: text, logprob: chosen, bytes: bytes(text), top_logprobs: ranked.slice(0, top).map((c) => ({ ...c, bytes: bytes(c.token) })) }] };
  return { text_offset: [textOffset], tokens: [text], token_logprobs: [chosen], top_logprobs: [Object.fromEntries(ranked.map((c) => [c.token, c.logprob]))] };
}

export class EngineSim extends EventEmitter {
  readonly kind: SimKind;
  readonly model: string;
  url = '';
  port = 0;
  /** Streams open right now. */
  running = 0;
  /** Work the engine holds beyond ebb's requests (holdBusy). */
  held = { running: 0, waiting: 0 };
  metricsMode: MetricsMode = 'ok';
  readonly seen: SeenEngineRequest[] = [];
  /** /metrics reads so far. */
  scrapes = 0;
  /** Streams the client closed before they finished. */
  closedEarly = 0;
  /** LoRA adapters loaded through the runtime endpoints (vLLM's /v1/load_lora_adapter, SGLang's /load_lora_adapter): name -> path. */
  readonly loras = new Map<string, string>();
  /** Adapters whose unload the server refuses (a 500), as an engine that cannot free a slot. */
  readonly failUnloads = new Set<string>();
  private readonly server: Server;
  private readonly startedAt = Date.now();
  private readonly pendingMetrics = new Set<ServerResponse>();

  constructor(private readonly opts: EngineSimOptions) {
    super();
    this.kind = opts.kind;
    this.model = opts.model ?? 'sim-model';
    this.server = createServer((req, res) => this.handle(req, res));
  }

  async listen(): Promise<this> {
    this.server.listen(this.opts.port ?? 0, '127.0.0.1');
    await once(this.server, 'listening');
    this.port = (this.server.address() as { port: number }).port;
    this.url = `http://127.0.0.1:${this.port}`;
    return this;
  }

  /** The engine stays busy after ebb's requests end (a request of another client, a KV transfer...). */
  holdBusy(running = 1, waiting = 0): void {
    this.held = { running, waiting };
  }

  /** Ends held work, and answers metrics reads left hanging by the `slow` mode. */
  release(): void {
    this.held = { running: 0, waiting: 0 };
    this.metricsMode = 'ok';
    for (const res of this.pendingMetrics) this.answerMetrics(res);
    this.pendingMetrics.clear();
  }

  /** Resolves on the next /metrics read (after it was answered, or left hanging). */
  nextScrape(): Promise<void> {
    return once(this, 'scrape').then(() => undefined);
  }

  /** Resolves when a stream the client closed early has been torn down. */
  nextClosedEarly(): Promise<void> {
    return once(this, 'closed-early').then(() => undefined);
  }

  /** Crash: the listener and every connection go away at once. */
  die(): void {
    this.server.close();
    this.server.closeAllConnections();
  }

  async close(): Promise<void> {
    for (const res of this.pendingMetrics) res.destroy();
    this.pendingMetrics.clear();
    this.server.closeAllConnections();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  private json(res: ServerResponse, status: number, body: unknown): void {
    res.writeHead(status, { 'content-type': 'application/json' });
    res.end(JSON.stringify(body));
  }

  private handle(req: IncomingMessage, res: ServerResponse): void {
    const path = (req.url ?? '/').split('?')[0];
    if (req.method === 'GET' && path === '/health') {
      const loading = Date.now() - this.startedAt < (this.opts.loadMs ?? 0);
      if (this.kind === 'generic') return this.json(res, 404, { error: 'not found' });
      return loading ? this.json(res, 503, { error: 'loading model' }) : this.json(res, 200, {});
    }
    if (req.method === 'GET' && path === '/v1/models') {
      if (Date.now() - this.startedAt < (this.opts.loadMs ?? 0)) return this.json(res, 503, { error: 'loading model' });
      const len = this.opts.maxModelLen === undefined ? 4096 : this.opts.maxModelLen;
      // Adapters as vLLM lists them: after the base model, each with its `parent`.
      const loras = [...this.loras].map(([id, path]) => ({ id, object: 'model', owned_by: 'sim', root: path, parent: this.model }));
      return this.json(res, 200, { object: 'list', data: [{ id: this.model, object: 'model', owned_by: 'sim', ...(len === null ? {} : { max_model_len: len }) }, ...loras] });
    }
    if (req.method === 'GET' && path === '/metrics') {
      this.scrapes++;
      if (this.kind === 'generic') this.json(res, 404, { error: 'not found' });
      else if (this.opts.slotsOnly) this.json(res, 501, { error: { code: 501, message: 'This server does not support metrics endpoint.', type: 'not_supported_error' } });
      else if (this.metricsMode === 'slow') this.pendingMetrics.add(res);
      else this.answerMetrics(res);
      this.emit('scrape');
      return;
    }
    if (req.method === 'GET' && path === '/slots' && this.opts.slotsOnly) {
      const busy = this.running + this.held.running;
      return this.json(res, 200, [0, 1].map((id) => ({ id, n_ctx: 4096, is_processing: id < busy })));
    }
    if (req.method === 'POST' && (path === '/v1/completions' || path === '/v1/chat/completions'))
      return this.readJson(req, res, (body) => {
        this.seen.push({ path, body, headers: req.headers });
        this.emit('request', { path, body });
        this.stream(path === '/v1/chat/completions', body, res);
      });
    if (req.method === 'POST' && (path === '/tokenize' || path === '/apply-template') && this.kind !== 'generic') {
      let raw = '';
      req.setEncoding('utf8');
      req.on('data', (c: string) => (raw += c));
      req.on('end', () => {
        const body = JSON.parse(raw) as Record<string, any>;
        this.seen.push({ path, body });
        if (path === '/apply-template') return this.kind === 'llamacpp' ? this.json(res, 200, { prompt: simTemplate(body.messages) }) : this.json(res, 404, {});
        // vLLM's shape ({prompt} or {messages}) and llama-server's ({content}).
        const text = this.kind === 'llamacpp' ? String(body.content) : body.messages ? simTemplate(body.messages) : String(body.prompt);
        const tokens = simTokenIds(text);
        return this.json(res, 200, this.kind === 'llamacpp' ? { tokens } : { count: tokens.length, max_model_len: 4096, tokens });
      });
      return;
    }
    const lora = this.kind === 'vllm' ? '/v1/' : this.kind === 'sglang' ? '/' : undefined;
    if (req.method === 'POST' && lora !== undefined && (path === `${lora}load_lora_adapter` || path === `${lora}unload_lora_adapter`))
      return this.readJson(req, res, (body) => {
        this.seen.push({ path, body });
        const name = String(body.lora_name);
        if (path.endsWith('unload_lora_adapter')) {
          if (this.failUnloads.has(name)) return this.json(res, 500, { error: { message: `cannot free the slot of '${name}'` } });
          if (!this.loras.delete(name)) return this.json(res, 404, { error: { message: `The lora adapter '${name}' cannot be found.` } });
        } else {
          if (this.loras.has(name)) return this.json(res, 400, { error: { message: `The lora adapter '${name}' has already been loaded.` } });
          this.loras.set(name, String(body.lora_path));
        }
        this.emit('lora', { path, body });
        return void res.writeHead(200, { 'content-type': 'text/plain' }).end('Success');
      });
    if (req.method === 'POST' && path === '/v1/embeddings') return void this.readJson(req, res, (body) => this.embeddings(body, res));
    this.json(res, 404, { error: { message: `no route ${req.method} ${path}` } });
  }

  /**
   * A tool call, vLLM's way: a forced one (`required`, a named function) as structured
   * delta.tool_calls (guided decoding needs no parser), anything else raw in the content. A final
   * assistant message to continue (continue_final_message) that begins the raw call is continued
   * from where it stops, as a model continues its own text.
   */
  private streamCall(body: Record<string, any>, call: { name: string; args: string }, res: ServerResponse): void {
    const id = `chatcmpl-${Math.random().toString(36).slice(2, 10)}`;
    const forced = body.tool_choice === 'required' || (typeof body.tool_choice === 'object' && body.tool_choice !== null);
    const messages = body.messages as Array<{ role: string; content: string }>;
    const prefix = body.continue_final_message === true ? (messages[messages.length - 1]?.content ?? '') : '';
    const deltas: Array<Record<string, unknown>> = [];
    if (forced) {
      deltas.push({ tool_calls: [{ index: 0, id: `chatcmpl-tool-${id}`, type: 'function', function: { name: call.name, arguments: '' } }] });
      for (const piece of argPieces(call.args)) deltas.push({ tool_calls: [{ index: 0, function: { arguments: piece } }] });
    } else {
      const raw = rawPieces(this.opts.stringArguments === true ? { name: call.name, args: JSON.stringify(call.args) } : call);
      if (!raw.join('').startsWith(prefix)) return this.json(res, 400, { error: { message: 'the simulator continues only its own call' } });
      let skip = prefix.length;
      for (const piece of raw) {
        if (skip >= piece.length) skip -= piece.length;
        else {
          deltas.push({ content: piece.slice(skip) });
          skip = 0;
        }
      }
    }
    this.running++;
    let finished = false;
    res.on('close', () => {
      if (!finished) this.running--;
      finished = true;
    });
    res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
    const send = (obj: unknown) => res.write(`data: ${JSON.stringify(obj)}\n\n`);
    const chunk = (delta: Record<string, unknown>, finish: string | null) => ({ id, object: 'chat.completion.chunk', model: this.model, choices: [{ index: 0, delta, finish_reason: finish }] });
    let n = 0;
    const step = () => {
      if (finished || res.destroyed) return;
      if (n < deltas.length) {
        send(chunk(deltas[n++]!, null));
        return void setTimeout(step, this.opts.itlMs ?? 20);
      }
      send(chunk({}, forced ? 'tool_calls' : 'stop'));
      if (body.stream_options?.include_usage === true) send({ id, object: 'chat.completion.chunk', model: this.model, choices: [], usage: { prompt_tokens: 10, completion_tokens: n, total_tokens: 10 + n } });
      res.write('data: [DONE]\n\n');
      finished = true;
      this.running--;
      res.end();
    };
    setTimeout(step, this.opts.itlMs ?? 20);
  }

  private readJson(req: IncomingMessage, res: ServerResponse, then: (body: Record<string, any>) => void): void {
    let raw = '';
    req.setEncoding('utf8');
    req.on('data', (c: string) => (raw += c));
    req.on('end', () => {
      let body: Record<string, any>;
      try {
        body = JSON.parse(raw) as Record<string, any>;
      } catch {
        return this.json(res, 400, { error: { message: 'body is not JSON' } });
      }
      then(body);
    });
  }

  /** vLLM's /v1/embeddings (a pooling model without Matryoshka support): its answer's shape, its refusal of `dimensions`. */
  private embeddings(body: Record<string, any>, res: ServerResponse): void {
    this.seen.push({ path: '/v1/embeddings', body });
    const input = body.input as string | string[] | number[] | number[][];
    const inputs: Array<string | number[]> = typeof input === 'string' || typeof input[0] === 'number' ? [input as string | number[]] : (input as Array<string | number[]>);
    if (body.dimensions != null)
      return this.json(res, 400, {
        object: 'error',
        message: `Model "${this.model}" does not support matryoshka representation, changing output dimensions will lead to poor results.`,
        type: 'BadRequestError',
        param: null,
        code: 400,
      });
    const tokens = inputs.reduce((n, x) => n + (typeof x === 'string' ? simTokenIds(x).length : x.length), 0);
    this.json(res, 200, {
      id: `embd-${Math.random().toString(36).slice(2, 10)}`,
      object: 'list',
      created: Math.floor(Date.now() / 1000),
      model: this.model,
      data: inputs.map((x, index) => ({ index, object: 'embedding', embedding: simEmbedding(x) })),
      usage: { prompt_tokens: tokens, total_tokens: tokens, completion_tokens: 0, prompt_tokens_details: null },
    });
  }

  private answerMetrics(res: ServerResponse): void {
    if (this.kind === 'generic') return;
    const ok = metricsPage(this.kind, this.model, this.running, 0, this.held);
    const text =
      this.metricsMode === 'garbage'
        ? `<html><body>502 Bad Gateway</body></html>\n${ok.replace(/ (\d+(\.\d+)?)$/gm, ' lots')}`
        : this.metricsMode === 'missing'
          ? '# HELP process_cpu_seconds_total CPU time\nprocess_cpu_seconds_total 1.5\n'
          : ok;
    res.writeHead(200, { 'content-type': 'text/plain; version=0.0.4' });
    res.end(text);
  }

  private stream(chat: boolean, body: Record<string, any>, res: ServerResponse): void {
    if (chat && Array.isArray(body.tools) && body.tools.length > 0) {
      const call = simToolCall(body);
      if (call !== undefined) return this.streamCall(body, call, res);
    }
    if (typeof body.max_tokens !== 'number' || body.max_tokens < 1) return this.json(res, 400, { error: { message: 'max_tokens must be at least 1' } });
    const maxTokens = body.max_tokens as number;
    const stops: string[] = Array.isArray(body.stop) ? body.stop : typeof body.stop === 'string' ? [body.stop] : [];
    const prompt = chat ? (body.messages as Array<{ content: string }>).map((m) => m.content).join('\n') : String(body.prompt ?? '');
    // A word is a token; a prompt of token ids counts its ids.
    const promptTokens = Array.isArray(body.prompt) ? body.prompt.length : Math.max(1, prompt.split(/\s+/).filter(Boolean).length);
    // vLLM's refusal of a request that does not fit the model (its 400 and wording); only with an explicit maxModelLen.
    const maxLen = this.opts.maxModelLen;
    if (typeof maxLen === 'number' && promptTokens + maxTokens > maxLen)
      return this.json(res, 400, {
        object: 'error',
        message: `This model's maximum context length is ${maxLen} tokens. However, you requested ${promptTokens + maxTokens} tokens (${promptTokens} in the messages, ${maxTokens} in the completion). Please reduce the length of the messages or completion.`,
        type: 'BadRequestError',
        param: null,
        code: 400,
      });
    const withUsage = this.opts.usage !== false && body.stream_options?.include_usage === true;
    const id = `cmpl-${Math.random().toString(36).slice(2, 10)}`;
    let seed = (Number(body.seed ?? 0) >>> 0) + 1;
    this.running++;
    let finished = false;
    const end = () => {
      if (finished) return;
      finished = true;
      this.running--;
    };
    res.on('close', () => {
      if (finished) return;
      end();
      this.closedEarly++;
      this.emit('closed-early');
    });
    res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
    const send = (obj: unknown) => res.write(`data: ${JSON.stringify(obj)}\n\n`);
    // Chat asks with logprobs true and top_logprobs N, completions with logprobs N; llama-server reports none for N = 0 (its n_probs).
    const asked: number | undefined = chat ? (body.logprobs === true ? (body.top_logprobs ?? 0) : undefined) : typeof body.logprobs === 'number' ? body.logprobs : undefined;
    const top = this.kind === 'llamacpp' && asked === 0 ? undefined : asked;
    const chunk = (text: string | null, finish: string | null, word?: number) => {
      // llama-server answers completions in chat's shape too.
      const logprobs = top === undefined || word === undefined || text === null ? null : simLogprobs(chat || this.kind === 'llamacpp', text, word, top, textOffset);
      return chat
        ? { id, object: 'chat.completion.chunk', model: this.model, choices: [{ index: 0, delta: text === null ? {} : { content: text }, logprobs, finish_reason: finish }] }
        : { id, object: 'text_completion', model: this.model, choices: [{ index: 0, text: text ?? '', logprobs, finish_reason: finish }] };
    };
    let textOffset = 0;
    let n = 0;
    let text = '';
    const step = () => {
      if (finished || res.destroyed) return;
      seed = (Math.imul(seed, 1103515245) + 12345) >>> 0;
      const word = `${n === 0 ? '' : ' '}${WORDS[seed % WORDS.length]}`;
      text += word;
      n++;
      const stopped = stops.some((s) => s !== '' && text.includes(s));
      const last = stopped || n >= maxTokens;
      if (!stopped) send(chunk(word, null, seed % WORDS.length));
      textOffset += word.length;
      if (!last) return void setTimeout(step, this.opts.itlMs ?? 20);
      send(chunk(null, stopped ? 'stop' : 'length'));
      const completion = stopped ? n - 1 : n;
      const details = this.opts.cachedTokens === undefined ? {} : { prompt_tokens_details: { cached_tokens: Math.min(this.opts.cachedTokens, promptTokens) } };
      if (withUsage) send({ id, object: 'text_completion', model: this.model, choices: [], usage: { prompt_tokens: promptTokens, completion_tokens: completion, total_tokens: promptTokens + completion, ...details } });
      res.write('data: [DONE]\n\n');
      end();
      res.end();
    };
    setTimeout(step, this.opts.itlMs ?? 20);
  }
}

/**
 * The simulated model's tool call for a chat request with tools, or undefined when it answers in
 * text (after a tool's result). It calls the named function, else the first; its arguments follow
 * the parameters' properties. A Hermes model: with `tool_choice: "none"` it still writes the call,
 * raw, in its content (the template listed the tools), as vLLM returns it unparsed.
 */
export function simToolCall(body: Record<string, any>): { name: string; args: string } | undefined {
  const messages = body.messages as Array<{ role: string }>;
  const last = messages[messages.length - 1];
  if (last?.role === 'tool') return undefined;
  const choice = body.tool_choice;
  const tool = (body.tools as Array<{ function: { name: string; parameters?: { properties?: Record<string, { type?: string; enum?: unknown[] }> } } }>).find(
    (t) => typeof choice !== 'object' || choice === null || t.function.name === choice.function?.name,
  )!;
  const args: Record<string, unknown> = {};
  for (const [key, prop] of Object.entries(tool.function.parameters?.properties ?? {}))
    args[key] = prop.enum?.[0] ?? (prop.type === 'integer' || prop.type === 'number' ? 3 : prop.type === 'boolean' ? true : 'harbor town');
  return { name: tool.function.name, args: JSON.stringify(args) };
}

const HERMES_OPEN = '<tool_call>\n{"name": "';
/** A call's raw text in the Hermes syntax, in the pieces a model emits it. */
const rawPieces = (call: { name: string; args: string }) => [HERMES_OPEN, call.name, '", "arguments": ', ...argPieces(call.args), '}\n</tool_call>'];
const argPieces = (args: string) => args.match(/.{1,4}/gs) ?? [];

export async function startEngineSim(opts: EngineSimOptions): Promise<EngineSim> {
  return new EngineSim(opts).listen();
}
