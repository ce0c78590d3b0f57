import { CALL_SEPARATOR, forcedFunction, isToolCallSyntax, TOOL_SYNTAX_PRESETS, type ToolCallSyntax } from '../protocol/tools.js';
import type { GenerateRequest } from './engine.js';

/**
 * Tools on an OpenAI-compatible engine server. ebb parses calls itself, from the raw text (see
 * docs/tools.md): the engine renders the tools into its chat template, and its answer stays raw.
 * - `auto`: sent as `tool_choice: "none"`, so the engine's own parser (vLLM's
 *   --tool-call-parser, SGLang's) leaves the text as the model wrote it; ebb finds the calls.
 * - a forced call (`required`, a named function): sent as it is; the engine constrains the call
 *   itself (guided decoding) and answers with structured `delta.tool_calls`, which the worker writes
 *   back as raw text in the model's syntax, so the frontend, and a continuation, see one format.
 * - a continuation: `none`, the partial raw text continued as the final assistant message.
 */

/** --engine-tool-syntax: a preset's name (`hermes`) or the syntax as JSON ({prefix, params_prefix, suffix}). */
export function parseToolSyntax(value: string): ToolCallSyntax {
  const preset = TOOL_SYNTAX_PRESETS[value];
  if (preset !== undefined) return preset;
  let parsed: unknown;
  try {
    parsed = JSON.parse(value);
  } catch {
    throw new Error(`--engine-tool-syntax is neither a preset (${Object.keys(TOOL_SYNTAX_PRESETS).join(', ')}) nor JSON: ${value}`);
  }
  if (!isToolCallSyntax(parsed)) throw new Error('--engine-tool-syntax JSON needs non-empty strings prefix and params_prefix, and a string suffix');
  return parsed;
}

/** The tool fields of the engine request. */
export function engineToolFields(req: GenerateRequest): Record<string, unknown> {
  if (req.tools === undefined || req.tools.length === 0) return {};
  const forced = forcedFunction(req.tool_choice) !== undefined && req.continuation === undefined;
  return {
    tools: req.tools,
    tool_choice: forced ? req.tool_choice : 'none',
    ...(req.parallel_tool_calls === false && forced && { parallel_tool_calls: false }),
  };
}

interface ToolCallDelta {
  index?: number;
  function?: { name?: string | null; arguments?: string | null } | null;
}

/** An engine's structured call pieces (a forced call) as the raw text the model's syntax writes. */
export class CallWriter {
  private open: number | undefined;

  constructor(private readonly syntax: ToolCallSyntax) {}

  text(deltas: ToolCallDelta[]): string {
    let out = '';
    for (const d of deltas) {
      const index = d.index ?? this.open ?? 0;
      if (index !== this.open) {
        out += this.close();
        if (index > 0 || out !== '') out += CALL_SEPARATOR;
        out += `${this.syntax.prefix}${d.function?.name ?? ''}${this.syntax.params_prefix}`;
        this.open = index;
      }
      out += d.function?.arguments ?? '';
    }
    return out;
  }

  /** The open call's end (the suffix), once its arguments are complete. */
  close(): string {
    if (this.open === undefined) return '';
    this.open = undefined;
    return this.syntax.suffix;
  }
}
