import { EbbError } from '../../protocol/errors.js';
import type { ChatMessage } from '../../protocol/request-plane.js';
import { sseEvents } from '../../common/sse-events.js';
import type { KeptStream } from '../streams/kept-stream.js';
import type { StreamStore } from '../streams/stream-store.js';
import type { StreamFormat } from '../wire/stream-format.js';
import { inputItems, type InputItem, type ResponseProgress, type ResponseStatus } from './responses-format.js';
import type { StreamPlan } from './stream-plan.js';

/** The Responses API's state for one response: what `GET /v1/responses/{id}`, `cancel` and `previous_response_id` read. */
export interface ResponseRecord {
  readonly id: string;
  /** Who made it (its API key's name): nobody else reads, cancels or continues it. */
  readonly tenant: string;
  readonly background: boolean;
  readonly store: boolean;
  /** The conversation through this response's input (its instructions aside: they do not carry over, as OpenAI's). */
  readonly history: ChatMessage[];
  /** Its input, as GET /v1/responses/{id}/input_items lists it (responses-format.ts inputItems). */
  readonly input: InputItem[];
  status: ResponseStatus;
  /** A streamed (or background) response's format: the object as it stands. */
  progress?: ResponseProgress | undefined;
  /** The final object, once the response is over. */
  final?: Record<string, unknown> | undefined;
  kept?: KeptStream | undefined;
  endedAt: number;
  /** What it holds (its conversation and final object, serialised): the store's byte bound counts it. */
  bytes: number;
}

/** Why a background response's generation stopped: its cancel was asked for. */
export class ResponseCancelled extends Error {
  constructor(id: string) {
    super(`response ${id} was cancelled`);
  }
}

/** What a fleet's store keeps of a finished response. */
interface StoredResponse {
  tenant: string;
  object: Record<string, unknown>;
  history: ChatMessage[];
  input?: InputItem[];
}

export interface ResponseStoreOptions {
  /** How long a stored response stays retrievable after it ended. */
  ttlMs: number;
  maxRecords: number;
  /** All records' conversations and objects at most this many bytes (the oldest ended forgotten first). */
  maxBytes: number;
}

/**
 * The Responses API's responses: this frontend's records (live ones, and stored ones for `ttlMs`
 * after they end, bounded in count and bytes, the oldest ended forgotten first), and in a fleet the
 * shared store's (stored objects, and the copies of streams other frontends run). Every record is
 * its tenant's: another tenant's id is one it has never heard of (404).
 */
export class ResponseStore {
  private readonly records = new Map<string, ResponseRecord>();
  private readonly expired = new Set<string>();
  private bytes = 0;

  constructor(
    private readonly opts: ResponseStoreOptions,
    private readonly streams: StreamStore,
  ) {}

  get size(): number {
    return this.records.size;
  }

  get keptBytes(): number {
    return this.bytes;
  }

  add(record: ResponseRecord): void {
    record.bytes = JSON.stringify(record.history).length + JSON.stringify(record.input).length;
    this.bytes += record.bytes;
    this.records.set(record.id, record);
    this.bound();
  }

  /** This frontend's record `id` of `tenant`, or the 404 saying why there is none. */
  local(id: string, tenant: string): ResponseRecord {
    const r = this.records.get(id);
    if (r !== undefined && r.tenant === tenant && !(r.final !== undefined && Date.now() - r.endedAt > this.opts.ttlMs)) return r;
    if (r !== undefined && r.tenant === tenant) this.forget(r);
    if (r === undefined && this.expired.has(id)) throw new EbbError('response_expired', `response ${id} is no longer kept (older than --response-ttl-ms, or over the store's bounds)`);
    throw new EbbError('response_not_found', `no response ${id} is kept here (not stored: store false, or another frontend's without a shared store)`);
  }

  /** The response object now: this frontend's, else (a fleet) the shared store's; a background response whose frontend died is continued here. */
  async object(id: string, tenant: string): Promise<Record<string, unknown>> {
    try {
      return this.objectOf(this.local(id, tenant));
    } catch (err) {
      const shared = this.streams.shared;
      if (shared === undefined || !notHere(err)) throw err;
      const stored = await shared.kept<StoredResponse>(id, tenant);
      if (stored !== undefined) return stored.object;
      const found = await shared.planAndCopy(id, tenant);
      if (found === undefined) throw err;
      const now = await responseFromEvents(found.copy.events);
      if (!now.done && !found.running) await shared.ensureRunning(id);
      return now.object;
    }
  }

  /** `previous_response_id`: the conversation so far, the previous answer its last turn (a 400 naming the field when there is none). */
  async history(id: string, tenant: string): Promise<ChatMessage[]> {
    const shared = this.streams.shared;
    let r: ResponseRecord | undefined;
    try {
      r = this.local(id, tenant);
    } catch (err) {
      if (shared === undefined || !notHere(err)) throw previous(err);
      const stored = await shared.kept<StoredResponse>(id, tenant);
      if (stored !== undefined) return stored.history;
      // A streamed one whose stored object is still on its way: its plan's input and its events' answer.
      const found = await shared.planAndCopy(id, tenant);
      const plan = found === undefined || found.plan === '' ? undefined : (JSON.parse(found.plan) as StreamPlan);
      const now = found === undefined ? undefined : await responseFromEvents(found.copy.events);
      if (plan?.responses === undefined || now?.done !== true) throw previous(err);
      const messages = plan.gens[0]!.messages ?? [];
      return [...(plan.responses.request.instructions ? messages.slice(1) : messages), assistantTurn(now.object.output as OutputItem[])];
    }
    if (r.final === undefined) throw new EbbError('invalid_request', `previous_response_id: response ${id} is still ${r.status}`, { param: 'previous_response_id' });
    return [...r.history, assistantTurn(r.final.output as OutputItem[])];
  }

  /** Its input items (GET /v1/responses/{id}/input_items), oldest first: this frontend's record, else the fleet's store. */
  async input(id: string, tenant: string): Promise<InputItem[]> {
    try {
      return this.local(id, tenant).input;
    } catch (err) {
      const shared = this.streams.shared;
      if (shared === undefined || !notHere(err)) throw err;
      const stored = await shared.kept<StoredResponse>(id, tenant);
      if (stored?.input !== undefined) return stored.input;
      const found = await shared.planAndCopy(id, tenant);
      const request = found === undefined || found.plan === '' ? undefined : (JSON.parse(found.plan) as StreamPlan).responses?.request;
      if (request === undefined) throw err;
      return inputItems(request, id);
    }
  }

  /**
   * Forgets a response that is over (DELETE /v1/responses/{id}): its record, its object and
   * conversation in the fleet's store, and its kept stream, so nothing of it is served again. One
   * still running is refused: cancel it (background) or let it end first.
   */
  async delete(id: string, tenant: string): Promise<void> {
    const running = (status: string) => new EbbError('invalid_request', `response ${id} is still ${status}: cancel it (a background one) or let it end, then delete it`, { param: 'response_id' });
    let r: ResponseRecord | undefined;
    try {
      r = this.local(id, tenant);
    } catch (err) {
      const shared = this.streams.shared;
      if (shared === undefined || !notHere(err)) throw err;
      if ((await shared.kept<StoredResponse>(id, tenant)) === undefined) {
        const found = await shared.planAndCopy(id, tenant);
        if (found === undefined) throw err;
        if (found.copy.last === undefined) throw running('in_progress');
      }
    }
    if (r !== undefined && r.final === undefined) throw running(r.status);
    if (r !== undefined) this.forget(r, false);
    this.streams.remove(id, tenant);
    await this.streams.shared?.forget(id);
  }

  /** Stops a background response (wherever it runs; here when its frontend is gone); its object, saying cancelled. */
  async cancel(id: string, tenant: string): Promise<Record<string, unknown>> {
    let r: ResponseRecord;
    try {
      r = this.local(id, tenant);
    } catch (err) {
      const shared = this.streams.shared;
      const found = shared === undefined || !notHere(err) ? undefined : await shared.planAndCopy(id, tenant);
      if (found === undefined) throw err;
      const plan = found.plan === '' ? undefined : (JSON.parse(found.plan) as StreamPlan);
      if (plan?.responses?.request.background !== true) throw notBackground(id);
      if (found.copy.last === undefined) await shared!.cancel(id);
      return this.object(id, tenant);
    }
    if (!r.background) throw notBackground(id);
    if (r.final === undefined && r.kept !== undefined) {
      const cancelled = new ResponseCancelled(r.id);
      r.kept.cancel(cancelled);
      await r.kept.over;
      // Its stream's end settles it too, a few ticks on; the answer says cancelled now.
      this.settleStreamed(r, cancelled);
    }
    return this.objectOf(r);
  }

  /** A cancel asked at another frontend, for a response this one runs (its own, or one it took over). */
  cancelHere(id: string): void {
    this.streams.running(id)?.cancel(new ResponseCancelled(id));
  }

  /** The response is over: its final object, kept while stored (resolves once the fleet's store has it too). */
  async settle(r: ResponseRecord, final: Record<string, unknown>, status: ResponseStatus): Promise<void> {
    r.status = status;
    r.final = { ...final, status };
    r.endedAt = Date.now();
    if (!r.store) return this.forget(r, false);
    const size = JSON.stringify(r.final).length;
    r.bytes += size;
    this.bytes += size;
    this.bound();
    const history = [...r.history, assistantTurn(r.final.output as OutputItem[])];
    await this.streams.shared?.keep(r.id, { tenant: r.tenant, object: r.final, history, input: r.input } satisfies StoredResponse, this.opts.ttlMs);
  }

  /** A streamed response's format says how it ended: its record takes the final object (or says it was cancelled, or failed). */
  settleStreamed(r: ResponseRecord, reason: unknown): void {
    if (r.final !== undefined || r.progress === undefined) return;
    const now = r.progress.now() as Record<string, unknown>;
    const status: ResponseStatus = reason instanceof ResponseCancelled ? 'cancelled' : now.status === 'in_progress' ? 'failed' : (now.status as ResponseStatus);
    void this.settle(r, now, status);
  }

  /** A response this frontend took over: its record here (retrieve, cancel), settled as it ends. */
  adopt(plan: StreamPlan, kept: KeptStream, fmt: StreamFormat & Partial<ResponseProgress>): ((fmt: StreamFormat, reason: unknown) => void) | undefined {
    const request = plan.responses?.request;
    if (request === undefined || fmt.now === undefined) return undefined;
    const messages = plan.gens[0]!.messages ?? [];
    const record: ResponseRecord = {
      id: plan.id,
      tenant: kept.tenant,
      background: request.background === true,
      store: request.store !== false,
      history: request.instructions ? messages.slice(1) : messages,
      input: inputItems(request, plan.id),
      status: 'in_progress',
      progress: fmt as ResponseProgress,
      kept,
      endedAt: 0,
      bytes: 0,
    };
    this.add(record);
    return (_, reason) => this.settleStreamed(record, reason);
  }

  /** The object of a record: its final one, or its progress with the record's own status. */
  objectOf(r: ResponseRecord): Record<string, unknown> {
    if (r.final !== undefined) return r.final;
    const now = r.progress?.now() as Record<string, unknown> | undefined;
    return { ...(now ?? { id: r.id, object: 'response', output: [] }), status: r.status };
  }

  private forget(r: ResponseRecord, remember = true): void {
    if (this.records.get(r.id) !== r) return;
    this.records.delete(r.id);
    this.bytes -= r.bytes;
    if (!remember) return;
    this.expired.add(r.id);
    if (this.expired.size > 50_000) this.expired.delete(this.expired.values().next().value as string);
  }

  /** Past a bound, ended records go first, oldest first (insertion order); a live one is never forgotten. */
  private bound(): void {
    const over = () => this.records.size > this.opts.maxRecords || this.bytes > this.opts.maxBytes;
    if (!over()) return;
    for (const r of this.records.values()) {
      if (!over()) return;
      if (r.final !== undefined) this.forget(r);
    }
  }
}

/** A 404 of this frontend's own records: another frontend of the fleet may hold the response. */
const notHere = (err: unknown) => err instanceof EbbError && err.code === 'response_not_found';

const notBackground = (id: string) => new EbbError('invalid_request', `only background responses can be cancelled; ${id} is not one`, { param: 'response_id' });

const previous = (err: unknown) => new EbbError('invalid_request', `previous_response_id: ${(err as Error).message}`, { param: 'previous_response_id' });

type OutputItem = { type: string; content?: Array<{ text?: string }>; call_id?: string; name?: string; arguments?: string };

/** A response's output items as the assistant turn of a chat history: its text, and its calls. */
export function assistantTurn(output: OutputItem[]): ChatMessage {
  let content = '';
  const calls: NonNullable<ChatMessage['tool_calls']> = [];
  for (const item of output) {
    if (item.type === 'message') content += (item.content ?? []).map((p) => p.text ?? '').join('');
    else if (item.type === 'function_call') calls.push({ id: item.call_id ?? '', type: 'function', function: { name: item.name ?? '', arguments: item.arguments ?? '' } });
  }
  return calls.length > 0 ? { role: 'assistant', content, tool_calls: calls } : { role: 'assistant', content };
}

/** A Responses API stream's events, read back into its object: the last one it carried, its output so far. */
export async function responseFromEvents(events: Buffer): Promise<{ object: Record<string, unknown>; done: boolean }> {
  let object: Record<string, unknown> = {};
  let item: Record<string, unknown> | undefined;
  let text = '';
  for await (const { data } of sseEvents([events])) {
    const parsed = JSON.parse(data) as { type?: string; response?: Record<string, unknown>; item?: Record<string, unknown>; delta?: string; code?: string };
    if (parsed.response !== undefined) object = parsed.response;
    if (parsed.type === 'response.output_item.added' && parsed.item !== undefined) item = parsed.item;
    if (parsed.type === 'response.output_text.delta' && typeof parsed.delta === 'string') text += parsed.delta;
    if (parsed.type === 'response.completed' || parsed.type === 'response.incomplete' || parsed.type === 'response.failed') return { object, done: true };
    if (parsed.type === 'error') return { object: { ...object, status: parsed.code === 'cancelled' ? 'cancelled' : 'failed' }, done: true };
  }
  const output = item === undefined ? [] : [{ ...item, content: text === '' ? [] : [{ type: 'output_text', text, annotations: [], logprobs: [] }] }];
  return { object: { ...object, status: 'in_progress', output }, done: false };
}
