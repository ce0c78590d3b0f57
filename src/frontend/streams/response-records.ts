import { EbbError } from '../../protocol/errors.js';
import type { ChatMessage } from '../../protocol/request-plane.js';
import type { ResponseProgress, ResponseStatus } from '../api/responses-format.js';
import type { KeptStream } from './kept-stream.js';

/** The Responses API's state for one response: what `GET /v1/responses/{id}`, `cancel` and `previous_response_id` read. */
export interface ResponseRecord {
  readonly id: string;
  readonly background: boolean;
  readonly store: boolean;
  /** The conversation through this response's input (its instructions aside: they do not carry over, as OpenAI's). */
  readonly history: ChatMessage[];
  status: ResponseStatus;
  /** A streamed (or background) response's format: the object as it stands. */
  progress?: ResponseProgress | undefined;
  /** The final object, once the response is over. */
  final?: Record<string, unknown> | undefined;
  kept?: KeptStream | undefined;
  endedAt: number;
}

/** Why a background response's generation stopped: its cancel was asked for. */
export class ResponseCancelled extends Error {
  constructor(id: string) {
    super(`response ${id} was cancelled`);
  }
}

/**
 * The responses this frontend keeps (its memory): live ones, and stored ones (store, OpenAI's
 * default) for `ttlMs` after they end, at most `maxRecords` (the oldest ended forgotten first).
 */
export class ResponseRecords {
  private readonly records = new Map<string, ResponseRecord>();
  private readonly expired = new Set<string>();

  constructor(
    private readonly ttlMs: number,
    private readonly maxRecords: number,
    /** A fleet's shared store: stored responses are kept there too, for the other frontends. */
    private readonly shared?: { keepResponse(id: string, object: Record<string, unknown>, history: ChatMessage[], ttlMs: number): Promise<void> } | undefined,
  ) {}

  add(record: ResponseRecord): void {
    this.records.set(record.id, record);
    this.bound();
  }

  /** The record `id`, or the 404 saying why there is none. */
  get(id: string): ResponseRecord {
    const now = Date.now();
    const r = this.records.get(id);
    if (r !== undefined && !(r.final !== undefined && now - r.endedAt > this.ttlMs)) return r;
    if (r !== undefined) this.forget(r);
    if (this.expired.has(id)) throw new EbbError('response_expired', `response ${id} is no longer kept (older than --response-ttl-ms, or over the store's bounds)`);
    throw new EbbError('response_not_found', `no response ${id} is kept here (not stored: store false, or another frontend's without a shared store)`);
  }

  /** The record `id`, if this frontend keeps it. */
  find(id: string): ResponseRecord | undefined {
    return this.records.get(id);
  }

  /** The response object now: its final one, or its progress with the record's own status. */
  object(r: ResponseRecord): Record<string, unknown> {
    if (r.final !== undefined) return r.final;
    const now = r.progress?.now() as Record<string, unknown> | undefined;
    return { ...(now ?? { id: r.id, object: 'response', output: [] }), status: r.status };
  }

  /** The response is over: its final object, kept while stored (resolves once the fleet's store has it too). */
  async settle(r: ResponseRecord, final: Record<string, unknown>, status: ResponseStatus): Promise<void> {
    r.status = status;
    r.final = { ...final, status };
    r.endedAt = Date.now();
    if (!r.store) this.records.delete(r.id);
    else await this.shared?.keepResponse(r.id, r.final, [...r.history, assistantTurn(r.final.output as OutputItem[])], this.ttlMs);
  }

  /** `previous_response_id`: the conversation so far, the previous answer its last turn. */
  history(id: string): ChatMessage[] {
    let r: ResponseRecord;
    try {
      r = this.get(id);
    } catch (err) {
      throw new EbbError('invalid_request', `previous_response_id: ${(err as Error).message}`, { param: 'previous_response_id' });
    }
    if (r.final === undefined) throw new EbbError('invalid_request', `previous_response_id: response ${id} is still ${r.status}`, { param: 'previous_response_id' });
    return [...r.history, assistantTurn(r.final.output as OutputItem[])];
  }

  private forget(r: ResponseRecord): void {
    this.records.delete(r.id);
    this.expired.add(r.id);
    if (this.expired.size > 50_000) this.expired.delete(this.expired.values().next().value as string);
  }

  /** Past the bound, ended records go first, oldest first (insertion order). */
  private bound(): void {
    if (this.records.size <= this.maxRecords) return;
    for (const r of this.records.values()) {
      if (this.records.size <= this.maxRecords) return;
      if (r.final !== undefined) this.forget(r);
    }
  }
}

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
