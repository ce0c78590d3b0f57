import { LlamaGrammarEvaluationState, type Llama, type LlamaGrammar, type LlamaModel } from 'node-llama-cpp';
import { EbbError } from '../protocol/errors.js';

/**
 * OpenAI's response_format, as the request plane carries it. Structural on purpose: the engine
 * needs only `type` and the schema, whatever else the protocol's type holds.
 */
export type ResponseFormatLike =
  | { type: 'text' }
  | { type: 'json_object' }
  | { type: 'json_schema'; json_schema: { name?: string; schema?: Record<string, unknown> | undefined } };

/**
 * Structured output through llama.cpp's grammar-constrained sampling: json_object with
 * node-llama-cpp's JSON grammar, json_schema with a grammar built from the schema. Grammars are
 * compiled once per distinct schema (a bounded cache: schemas come from callers).
 */
export class GrammarCache {
  private json: Promise<LlamaGrammar> | undefined;
  private readonly schemas = new Map<string, Promise<LlamaGrammar>>();
  private static readonly MAX_SCHEMAS = 64;

  constructor(private readonly llama: Llama) {}

  /** The grammar for a response_format, or undefined for plain text. Throws on a schema it cannot compile. */
  async grammarFor(format: ResponseFormatLike | undefined): Promise<LlamaGrammar | undefined> {
    if (format === undefined || format.type === 'text') return undefined;
    if (format.type === 'json_object' || format.json_schema.schema === undefined) return (this.json ??= this.llama.getGrammarFor('json'));
    const schema = format.json_schema.schema;
    const key = JSON.stringify(schema);
    let grammar = this.schemas.get(key);
    if (grammar === undefined) {
      if (this.schemas.size >= GrammarCache.MAX_SCHEMAS) this.schemas.delete(this.schemas.keys().next().value as string);
      grammar = this.llama.createGrammarForJsonSchema(schema as never) as Promise<LlamaGrammar>;
      grammar.catch(() => this.schemas.delete(key));
      this.schemas.set(key, grammar);
    }
    try {
      return await grammar;
    } catch (err) {
      throw new Error(`response_format json_schema "${format.json_schema.name ?? ''}" cannot be honoured: ${oneLine(err)}`);
    }
  }
}

interface GrammarInternals {
  _state: unknown;
}
interface LlamaInternals {
  _bindings?: {
    AddonSampler?: {
      acceptGrammarEvaluationStateToken?: (state: unknown, token: number) => void;
      canBeNextTokenForGrammarEvaluationState?: (state: unknown, token: number) => boolean;
    };
  };
}

/**
 * A grammar state for one answer. A continuation's earlier tokens are fed through it first, so the
 * constraint goes on from where the other worker stopped. node-llama-cpp has no public call for
 * that (its own chat code uses these internal ones): pinned at 3.21.1, and checked, not assumed.
 * Each token is asked of the grammar before it is accepted: llama.cpp aborts the whole process on
 * one the grammar does not allow (an end-of-generation token before the JSON is complete), so a
 * continuation that does not follow the format is refused here as the caller's error.
 */
export function grammarState(llama: Llama, model: LlamaModel, grammar: LlamaGrammar, already: readonly number[], format: string): LlamaGrammarEvaluationState {
  const state = new LlamaGrammarEvaluationState({ model, grammar });
  if (already.length === 0) return state;
  const sampler = (llama as unknown as LlamaInternals)._bindings?.AddonSampler;
  const accept = sampler?.acceptGrammarEvaluationStateToken;
  const allowed = sampler?.canBeNextTokenForGrammarEvaluationState;
  if (typeof accept !== 'function' || typeof allowed !== 'function') throw new Error('this node-llama-cpp build cannot continue a grammar-constrained answer');
  const internal = (state as unknown as GrammarInternals)._state;
  for (const [i, token] of already.entries()) {
    if (!allowed(internal, token))
      throw new EbbError('invalid_request', `continuation token ${i} (id ${token}) does not follow response_format ${format}: the answer cannot be continued under it`, { param: 'continuation' });
    accept(internal, token);
  }
  return state;
}

export function oneLine(err: unknown): string {
  const message = err instanceof Error ? err.message : String(err);
  return message.split('\n').map((l) => l.trim()).filter(Boolean).join('; ');
}
