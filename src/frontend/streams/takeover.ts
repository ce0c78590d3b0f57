import type { GenerateBody } from '../../protocol/request-plane.js';
import type { ResponsesRequest } from '../api/responses-format.js';
import type { Resumed } from '../relay/lane.js';
import { sseEvents } from '../../common/sse-events.js';

/**
 * What a frontend writes to the shared store when it starts a stream that another frontend could
 * continue if it went away: the requests its worker got, and what its events' format needs to go
 * on byte for byte (ids, the creation time, a response's own ids). Only single-sequence streams
 * without tool parsing or logprobs are continued this way; the others end with an error event.
 */
export interface TakeoverPlan {
  endpoint: 'chat' | 'completion' | 'responses';
  gens: GenerateBody[];
  model: string;
  includeUsage: boolean;
  created: number;
  /** The tier the answer says (its chunks' and object's service_tier), kept so the continuation says it too. */
  serviceTier?: string | undefined;
  responses?: { uuid: string; request: ResponsesRequest; messageId: string; createdAt: number } | undefined;
}

/** Where a stream stood when its frontend went away: each sequence's text and tokens, and its last event's id. */
export interface TakeoverPoint {
  resumed: Resumed[];
  lastId: number;
}

/**
 * Reads the events a frontend sent (as the store kept them) for where its one sequence stood; undefined
 * when it cannot be continued: it finished (its end or finish event went out), or ended in an error.
 */
export async function takeoverPoint(plan: TakeoverPlan, events: Buffer): Promise<TakeoverPoint | undefined> {
  let text = '';
  let tokens = 0;
  let lastId = -1;
  for await (const { id, event: type, data } of sseEvents([events])) {
    if (id !== undefined) lastId = Number(id);
    if (data === '[DONE]') return undefined;
    const parsed = JSON.parse(data) as { error?: unknown; delta?: string; choices?: Array<{ finish_reason?: string | null; text?: string; delta?: { content?: string } }> };
    if (plan.endpoint === 'responses') {
      if (type === 'error' || type === 'response.output_text.done' || type === 'response.completed' || type === 'response.incomplete' || type === 'response.failed') return undefined;
      if (type === 'response.output_text.delta' && typeof parsed.delta === 'string') {
        text += parsed.delta;
        tokens++;
      }
      continue;
    }
    if (parsed.error !== undefined) return undefined;
    const choice = parsed.choices?.[0];
    if (choice?.finish_reason) return undefined;
    const piece = plan.endpoint === 'chat' ? choice?.delta?.content : choice?.text;
    if (typeof piece === 'string' && piece !== '') {
      text += piece;
      tokens++;
    }
  }
  return { resumed: [{ text, tokens }], lastId };
}
