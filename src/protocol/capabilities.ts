import { isToolCallSyntax, toolsActive, type ToolCallSyntax } from './tools.js';
import type { EmbedBody, GenerateBody } from './request-plane.js';
import { carriesSampling } from './sampling.js';

/**
 * What an engine can honour beyond plain text generation. Each worker publishes its engine's in its
 * discovery record, so the frontend sends a request that needs one only to workers that declare it,
 * and answers 400 naming the field when no worker of the model does (never a silent ignore).
 */
export interface EngineCapabilities {
  /** response_format {"type":"json_object"} */
  json_object: boolean;
  /** response_format {"type":"json_schema", ...} */
  json_schema: boolean;
  logprobs: boolean;
  tools: boolean;
  /** Context length in tokens (prompt + completion); null when the engine does not say. */
  max_context: number | null;
  /** Can take `continuation` (stream migration): the frontend only migrates to such workers. */
  continuation: boolean;
  /** Takes a prompt as token ids of its own tokenizer (completions with `prompt: [1, 2, 3]`). */
  prompt_token_ids: boolean;
  /** With `tools`: how the model writes a call in its raw text, which the frontend parses (tools.ts). */
  tool_syntax?: ToolCallSyntax | null | undefined;
  /** Serves POST /embed (the frontend's /v1/embeddings): the frontend routes embeddings only to such workers. */
  embeddings: boolean;
  /** Honours frequency_penalty, presence_penalty, repetition_penalty, logit_bias, top_k and min_p (sampling.ts). */
  sampling: boolean;
  /**
   * Counts its own batch slots and can pause a running sequence (in-process engines): its worker
   * preempts a `preemptible` flex stream for a priority request that finds no free slot. Not routed
   * on: the frontend only leaves `preemptible` off what it sends a worker without it.
   */
  preemption?: boolean | undefined;
}

/** The yes/no capabilities, in one list: routing indexes and record checks iterate it. */
export const CAPABILITIES = ['json_object', 'json_schema', 'logprobs', 'tools', 'continuation', 'prompt_token_ids', 'embeddings', 'sampling'] as const;
export type Capability = (typeof CAPABILITIES)[number];

const NONE: readonly Capability[] = [];

/** What a request-plane body needs of the engine that serves it; the same empty array for plain requests (the hot path). */
export function capabilitiesNeeded(body: GenerateBody): readonly Capability[] {
  const format = body.response_format?.type;
  const structured = format === 'json_object' || format === 'json_schema';
  const tools = body.tools !== undefined && toolsActive(body.tools, body.tool_choice);
  const sampling = carriesSampling(body);
  if (!structured && !tools && !sampling && body.continuation === undefined && body.prompt_token_ids === undefined && body.logprobs !== true) return NONE;
  const out: Capability[] = [];
  if (structured) out.push(format);
  if (sampling) out.push('sampling');
  if (tools) out.push('tools');
  if (body.logprobs === true) out.push('logprobs');
  if (body.continuation !== undefined) out.push('continuation');
  if (body.prompt_token_ids !== undefined) out.push('prompt_token_ids');
  return out;
}

const EMBED_TEXT: readonly Capability[] = ['embeddings'];
const EMBED_IDS: readonly Capability[] = ['embeddings', 'prompt_token_ids'];

/** What an embedding request needs: token-id inputs go only to engines that take their own tokenizer's ids. */
export function embeddingNeeds(body: Pick<EmbedBody, 'input'>): readonly Capability[] {
  return typeof body.input[0] === 'string' ? EMBED_TEXT : EMBED_IDS;
}

/** The first of `needs` that `declared` lacks; a record without capabilities (an older worker) declares none. */
export function missingCapability(declared: EngineCapabilities | undefined, needs: readonly Capability[]): Capability | undefined {
  for (const c of needs) if (declared?.[c] !== true) return c;
  return undefined;
}

/** Discovery records come from other processes: check the shape before routing on it. */
export function isCapabilities(v: unknown): v is EngineCapabilities {
  if (typeof v !== 'object' || v === null) return false;
  const c = v as Record<string, unknown>;
  return (
    // A capability added after a worker was built is absent from its record: it declares it false
    // (missingCapability reads absent as no).
    CAPABILITIES.every((k) => c[k] === undefined || typeof c[k] === 'boolean') &&
    (c.tool_syntax === undefined || c.tool_syntax === null || isToolCallSyntax(c.tool_syntax)) &&
    (c.max_context === null || (typeof c.max_context === 'number' && Number.isInteger(c.max_context) && c.max_context > 0))
  );
}
