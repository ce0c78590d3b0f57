import type { Static } from 'typebox';
import { Type } from './schema.js';

/**
 * Tool calling on the request plane. The engine generates the model's raw text, tool calls
 * included, written in its template's call syntax; the frontend parses the calls out of that text
 * (frontend/wire/tool-call-parser.ts). The raw text is the one truth: a stream cut in the middle
 * of a call's arguments continues on another worker from the text delivered, like any other
 * stream, and the parsed calls come out the same (docs/tools.md has the argument).
 */

export const ToolSpecSchema = Type.Object(
  {
    type: Type.Literal('function'),
    function: Type.Object(
      {
        name: Type.String({ minLength: 1, maxLength: 64, pattern: '^[A-Za-z0-9_.-]+$' }),
        description: Type.Optional(Type.String({ maxLength: 10_000 })),
        parameters: Type.Optional(Type.Record(Type.String(), Type.Unknown())),
        strict: Type.Optional(Type.Union([Type.Boolean(), Type.Null()])),
      },
      { additionalProperties: false },
    ),
  },
  { additionalProperties: false },
);
export type ToolSpec = Static<typeof ToolSpecSchema>;

/** `none`, `auto`, `required`, or one named function (OpenAI's shapes). */
export const ToolChoiceSchema = Type.Union([
  Type.Literal('none'),
  Type.Literal('auto'),
  Type.Literal('required'),
  Type.Object({ type: Type.Literal('function'), function: Type.Object({ name: Type.String({ minLength: 1 }) }) }),
]);
export type ToolChoice = Static<typeof ToolChoiceSchema>;

/** An assistant message's earlier call, as chat history carries it. */
export const ToolCallSchema = Type.Object({
  id: Type.String({ maxLength: 200 }),
  type: Type.Literal('function'),
  function: Type.Object({ name: Type.String(), arguments: Type.String() }),
});
export type ToolCall = Static<typeof ToolCallSchema>;

/**
 * How a model writes a call in its raw text: `prefix` name `params_prefix` arguments-JSON `suffix`
 * (node-llama-cpp describes its chat wrappers' function calls the same way). Declared by each
 * worker in its discovery record, so the frontend parses what that model writes.
 */
export interface ToolCallSyntax {
  prefix: string;
  params_prefix: string;
  suffix: string;
}

/** Hermes/Qwen's `<tool_call>` JSON: Qwen 2.5 and 3, Hermes 2 and 3, and many fine-tunes. */
export const HERMES_SYNTAX: ToolCallSyntax = { prefix: '<tool_call>\n{"name": "', params_prefix: '", "arguments": ', suffix: '}\n</tool_call>' };

export const TOOL_SYNTAX_PRESETS: Readonly<Record<string, ToolCallSyntax>> = { hermes: HERMES_SYNTAX };

export function isToolCallSyntax(v: unknown): v is ToolCallSyntax {
  if (typeof v !== 'object' || v === null) return false;
  const s = v as Record<string, unknown>;
  return typeof s.prefix === 'string' && s.prefix.length > 0 && typeof s.params_prefix === 'string' && s.params_prefix.length > 0 && typeof s.suffix === 'string';
}

/** Between two calls of one answer (parallel calls). */
export const CALL_SEPARATOR = '\n';

/** One call as the model writes it: what a history's assistant turn renders, and what a forced call starts with. */
export function renderCall(syntax: ToolCallSyntax, name: string, args: string): string {
  return `${syntax.prefix}${name}${syntax.params_prefix}${args}${syntax.suffix}`;
}

/** The function a choice forces, if any: `required` forces one of `tools`, a named choice that one. */
export function forcedFunction(choice: ToolChoice | undefined): string | 'required' | undefined {
  if (choice === undefined || typeof choice === 'string') return choice === 'required' ? 'required' : undefined;
  return choice.function.name;
}

/** Whether a request's tools can be called at all (tools present, choice not `none`). */
export function toolsActive(tools: readonly ToolSpec[] | undefined, choice: ToolChoice | undefined): boolean {
  return tools !== undefined && tools.length > 0 && choice !== 'none';
}
