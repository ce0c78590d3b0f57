import {
  isChatModelResponseFunctionCall,
  isLlamaText,
  LlamaText,
  type ChatHistoryItem,
  type ChatModelFunctions,
  type ChatModelResponse,
  type ChatWrapper,
  type GbnfJsonSchema,
  type LlamaGrammar,
  type LlamaGrammarEvaluationState,
  type Token,
} from 'node-llama-cpp';
import { EbbError } from '../protocol/errors.js';
import type { ChatMessage } from '../protocol/request-plane.js';
import type { ToolCallSyntax, ToolSpec } from '../protocol/tools.js';

/**
 * Tool calling on llama-cpp. node-llama-cpp's chat wrapper knows how the model was trained to see
 * tools and calls: it renders the functions and earlier calls with their results into the prompt,
 * and describes a call as prefix + name + paramsPrefix + arguments + suffix
 * (settings.functions.call), which the worker declares as its tool_syntax.
 */

/** The wrapper's call syntax as plain text; none when a part names the function (not expressible as one syntax). */
export function toolSyntaxOf(wrapper: ChatWrapper): ToolCallSyntax | undefined {
  const call = wrapper.settings.functions.call;
  const [prefix, params_prefix, suffix] = [call.prefix, call.paramsPrefix, call.suffix].map((part) => LlamaText(part).toString()) as [string, string, string];
  if (prefix === '' || params_prefix === '' || [prefix, params_prefix, suffix].some((s) => s.includes('{{functionName}}'))) return undefined;
  return { prefix, params_prefix, suffix };
}

/** A request's tools as the wrapper documents them in the prompt. */
export function functionsOf(tools: readonly ToolSpec[]): ChatModelFunctions {
  const functions: Record<string, ChatModelFunctions[string]> = {};
  for (const t of tools) {
    const { name, description, parameters } = t.function;
    functions[name] = { ...(description !== undefined && { description }), params: (parameters ?? null) as GbnfJsonSchema | null };
  }
  return functions;
}

/**
 * OpenAI chat messages as node-llama-cpp's chat history: an assistant turn's tool_calls become
 * function-call items carrying their results (the `tool` messages answering them by
 * tool_call_id), and the assistant's next turn goes on in the same model response, as the wrapper
 * models a response that called functions. A `tool` message answering no call is a user turn.
 */
export function chatHistoryOf(messages: readonly ChatMessage[], wrapper: ChatWrapper): ChatHistoryItem[] {
  const results = new Map<string, unknown>();
  for (const m of messages) if (m.role === 'tool' && m.tool_call_id !== undefined) results.set(m.tool_call_id, jsonOrText(m.content));
  const called = new Set(messages.flatMap((m) => (m.role === 'assistant' ? (m.tool_calls ?? []).map((c) => c.id) : [])));
  const call = wrapper.settings.functions.call;
  const history: ChatHistoryItem[] = [];
  for (const m of messages) {
    if (m.role === 'system' || m.role === 'developer') history.push({ type: 'system', text: m.content });
    else if (m.role === 'assistant') {
      const calls = m.tool_calls ?? [];
      const response: ChatModelResponse['response'] = m.content === '' && calls.length > 0 ? [] : [m.content];
      for (const [i, c] of calls.entries())
        response.push({
          type: 'functionCall',
          name: c.function.name,
          params: jsonOrText(c.function.arguments),
          result: results.get(c.id),
          // The call as the model wrote it: its arguments' own text, not a re-serialisation.
          rawCall: LlamaText([call.prefix, c.function.name, call.paramsPrefix, c.function.arguments, call.suffix]).toJSON(),
          startsNewChunk: i === 0,
        });
      const last = history.at(-1);
      if (last !== undefined && endsInCall(last)) (last as ChatModelResponse).response.push(...response);
      else history.push({ type: 'model', response });
    } else if (m.role === 'tool' && m.tool_call_id !== undefined && called.has(m.tool_call_id)) continue;
    else history.push({ type: 'user', text: m.content });
  }
  return history;
}

/** A model response whose last item is a call: the answer to its results goes on in that response. */
export function endsInCall(item: ChatHistoryItem): boolean {
  return item.type === 'model' && isChatModelResponseFunctionCall(item.response.at(-1));
}

function jsonOrText(text: string): unknown {
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return text;
  }
}

/** Text the engine writes into the answer itself, with its tokens. */
export interface Written {
  text: string;
  tokens: Token[];
}

export interface ForcedCallGrammars {
  /** Each function the call may be to, with its arguments' grammar (from its JSON Schema). */
  args: ReadonlyMap<string, LlamaGrammar>;
  /** With several functions: a grammar allowing exactly their names. */
  names: LlamaGrammar | undefined;
}

export interface ForcedCallModel {
  /** The tokens of text the engine writes (a wrapper's special tokens as such). */
  tokenize(text: string): Token[];
  /** A grammar state with `text` (already delivered) fed through it; refuses text the grammar does not allow. */
  state(grammar: LlamaGrammar, text: string, follows: string): LlamaGrammarEvaluationState;
}

/**
 * One call forced by tool_choice (`required`, or a named function), written by the engine: the
 * opening (prefix, name, params prefix) as text it evaluates itself; with several functions the
 * name is sampled under a grammar of their names first; the arguments are sampled under the
 * function's JSON Schema grammar; then the suffix, and the answer stops. A continuation goes on
 * from the text delivered: the part of the call it holds is fed through the same grammars, so a
 * stream moved in the middle of the name or the arguments ends in the same valid call.
 */
export class ForcedCall {
  private phase: 'name' | 'args' | 'done' = 'done';
  private name = '';
  private grammar: LlamaGrammar | undefined;
  private evaluation: LlamaGrammarEvaluationState | undefined;
  /** Written before anything is sampled: the call's opening (none when a continuation holds it). */
  readonly opening: Written | undefined;

  constructor(
    private readonly syntax: ToolCallSyntax,
    private readonly grammars: ForcedCallGrammars,
    private readonly model: ForcedCallModel,
    delivered: string,
  ) {
    const names = [...grammars.args.keys()];
    const only = names.length === 1 ? names[0] : undefined;
    if (delivered === '') {
      this.opening = this.write(only === undefined ? syntax.prefix : syntax.prefix + only + syntax.params_prefix);
      if (only === undefined) this.toName('');
      else this.toArgs(only, '');
      return;
    }
    if (!delivered.startsWith(syntax.prefix)) throw refused('does not start with the forced call');
    const rest = delivered.slice(syntax.prefix.length);
    const at = rest.indexOf(syntax.params_prefix);
    if (at < 0) {
      if (only !== undefined) throw refused('ends inside the forced call\'s opening');
      this.toName(rest);
      return;
    }
    const name = rest.slice(0, at);
    const args = rest.slice(at + syntax.params_prefix.length);
    if (!grammars.args.has(name)) throw refused(`calls "${name}", which tool_choice does not allow`);
    this.name = name;
    // Delivered whole (the stream moved after the suffix): nothing is left to write.
    if (syntax.suffix !== '' && args.endsWith(syntax.suffix) && isJson(args.slice(0, -syntax.suffix.length))) return;
    this.toArgs(name, args);
  }

  /** The whole call was delivered already. */
  get done(): boolean {
    return this.phase === 'done';
  }

  /** The grammar state the next token is sampled under. */
  get state(): LlamaGrammarEvaluationState | undefined {
    return this.evaluation;
  }

  /** Text that ends the sampled part besides the grammar's own end (node-llama-cpp's JSON grammars end in "\n\n\n\n"). */
  get stops(): string[] {
    if (this.phase !== 'args') return [];
    return (this.grammar?.stopGenerationTriggers ?? []).flatMap((t) => (typeof t === 'string' ? [t] : isLlamaText(t) ? [t.toString()] : []));
  }

  /** A sampled piece of the answer, as delivered (while the name is chosen, a piece of it). */
  took(text: string): void {
    if (this.phase === 'name') this.name += text;
  }

  /** The sampled part ended: what the engine writes now, and whether sampling goes on after it. */
  ended(): { write: Written; sample: boolean } {
    if (this.phase === 'name') {
      if (!this.grammars.args.has(this.name)) throw new Error(`the name grammar let the model write "${this.name}", which is no tool's name`);
      this.toArgs(this.name, '');
      return { write: this.write(this.syntax.params_prefix), sample: true };
    }
    this.phase = 'done';
    this.evaluation = undefined;
    return { write: this.write(this.syntax.suffix), sample: false };
  }

  private toName(delivered: string): void {
    this.phase = 'name';
    this.name = delivered;
    this.grammar = this.grammars.names!;
    this.evaluation = this.model.state(this.grammar, delivered, 'the names of the tools tool_choice allows');
  }

  private toArgs(name: string, delivered: string): void {
    this.phase = 'args';
    this.grammar = this.grammars.args.get(name)!;
    this.evaluation = this.model.state(this.grammar, delivered, `the parameters of tool "${name}"`);
  }

  private write(text: string): Written {
    return { text, tokens: text === '' ? [] : this.model.tokenize(text) };
  }
}

function refused(what: string): EbbError {
  return new EbbError('invalid_request', `the continuation ${what}: it cannot be continued under tool_choice`, { param: 'continuation' });
}

function isJson(text: string): boolean {
  try {
    JSON.parse(text);
    return true;
  } catch {
    return false;
  }
}
