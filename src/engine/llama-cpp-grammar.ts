import { LlamaGrammar, LlamaGrammarEvaluationState, type Llama, type LlamaModel } from 'node-llama-cpp';
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
 * node-llama-cpp's JSON grammar, json_schema with a grammar built from the schema; a forced tool
 * call's name and arguments likewise. Grammars are compiled once per distinct schema (a bounded
 * cache: schemas come from callers).
 */
export class GrammarCache {
  private json: Promise<LlamaGrammar> | undefined;
  private readonly compiled = new Map<string, Promise<LlamaGrammar>>();
  private static readonly MAX_GRAMMARS = 64;

  constructor(private readonly llama: Llama) {}

  /** The grammar for a response_format, or undefined for plain text. Throws a 400 naming response_format on a schema it cannot compile. */
  async grammarFor(format: ResponseFormatLike | undefined): Promise<LlamaGrammar | undefined> {
    if (format === undefined || format.type === 'text') return undefined;
    if (format.type === 'json_object' || format.json_schema.schema === undefined) return (this.json ??= this.llama.getGrammarFor('json'));
    try {
      return await this.forSchema(format.json_schema.schema);
    } catch (err) {
      // The schema's fault (llama.cpp refuses a grammar past its own repetition bounds): a 400, never a retry on every worker.
      throw new EbbError('invalid_json_schema', `Invalid schema for response_format '${format.json_schema.name ?? ''}': llama.cpp cannot build its grammar: ${oneLine(err)}`, { param: 'response_format' });
    }
  }

  /** The grammar for values of a JSON Schema (a response format's, a tool's parameters). Rejects when it cannot compile. */
  forSchema(schema: Record<string, unknown>): Promise<LlamaGrammar> {
    return this.cached(JSON.stringify(schema), () => this.llama.createGrammarForJsonSchema(schema as never) as Promise<LlamaGrammar>);
  }

  /** A grammar that allows exactly one of `names` (names are [A-Za-z0-9_.-]+, the tool-name pattern). */
  forNames(names: readonly string[]): Promise<LlamaGrammar> {
    const grammar = `root ::= ${names.map((n) => JSON.stringify(n)).join(' | ')}`;
    return this.cached(grammar, async () => new LlamaGrammar(this.llama, { grammar }));
  }

  private cached(key: string, compile: () => Promise<LlamaGrammar>): Promise<LlamaGrammar> {
    let grammar = this.compiled.get(key);
    if (grammar === undefined) {
      if (this.compiled.size >= GrammarCache.MAX_GRAMMARS) this.compiled.delete(this.compiled.keys().next().value as string);
      grammar = compile();
      grammar.catch(() => this.compiled.delete(key));
      this.compiled.set(key, grammar);
    }
    return grammar;
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
 * A grammar state for one answer (or one call's arguments). A continuation's earlier tokens are fed through it first, so the
 * constraint goes on from where the other worker stopped. node-llama-cpp has no public call for
 * that (its own chat code uses these internal ones): pinned at 3.21.1, and checked, not assumed.
 * Each token is asked of the grammar before it is accepted: llama.cpp aborts the whole process on
 * one the grammar does not allow (an end-of-generation token before the JSON is complete), so a
 * continuation that does not follow the format is refused here as the caller's error.
 */
export function grammarState(llama: Llama, model: LlamaModel, grammar: LlamaGrammar, already: readonly number[], follows: string): LlamaGrammarEvaluationState {
  const state = new LlamaGrammarEvaluationState({ model, grammar });
  if (already.length === 0) return state;
  const sampler = (llama as unknown as LlamaInternals)._bindings?.AddonSampler;
  const accept = sampler?.acceptGrammarEvaluationStateToken;
  const allowed = sampler?.canBeNextTokenForGrammarEvaluationState;
  if (typeof accept !== 'function' || typeof allowed !== 'function') throw new Error('this node-llama-cpp build cannot continue a grammar-constrained answer');
  const internal = (state as unknown as GrammarInternals)._state;
  for (const [i, token] of already.entries()) {
    if (!allowed(internal, token))
      throw new EbbError('invalid_request', `continuation token ${i} (id ${token}) does not follow ${follows}: the answer cannot be continued under it`, { param: 'continuation' });
    accept(internal, token);
  }
  return state;
}

export function oneLine(err: unknown): string {
  const message = err instanceof Error ? err.message : String(err);
  return message.split('\n').map((l) => l.trim()).filter(Boolean).join('; ');
}
