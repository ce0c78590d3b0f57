import { CALL_SEPARATOR, forcedFunction, HERMES_SYNTAX, renderCall, toolsActive, type ToolSpec } from '../protocol/tools.js';
import type { GenerateRequest } from './engine.js';
import { mockerJson, pieces } from './mocker-json.js';

/**
 * The mocker's tool calls for a request, as the pieces of its raw answer (Hermes syntax), or
 * undefined when it answers in text. Deterministic: a named choice calls that function; `required`
 * calls one (two different ones when parallel calls are allowed and there are two or more tools);
 * `auto` calls one (which, by the prompt) when the user has the last turn, as a model asked
 * something its tools answer does, and answers a tool's result in text: an agent's loop (call,
 * result, answer) runs to its end, the same every time.
 */
export function mockerToolScript(req: GenerateRequest, random: () => number): string[] | undefined {
  const tools = req.tools;
  if (tools === undefined || !toolsActive(tools, req.tool_choice)) return undefined;
  const forced = forcedFunction(req.tool_choice);
  let chosen: ToolSpec[];
  if (forced === 'required') {
    const first = Math.floor(random() * tools.length);
    chosen = req.parallel_tool_calls !== false && tools.length > 1 ? [tools[first]!, tools[(first + 1) % tools.length]!] : [tools[first]!];
  } else if (forced !== undefined) {
    chosen = tools.filter((t) => t.function.name === forced).slice(0, 1);
  } else {
    const last = req.messages?.[req.messages.length - 1];
    if (last === undefined || last.role === 'tool' || last.role === 'assistant') return undefined;
    chosen = [tools[Math.floor(random() * tools.length)]!];
  }
  const text = chosen.map((t) => renderCall(HERMES_SYNTAX, t.function.name, JSON.stringify(mockerJson(t.function.parameters ?? { type: 'object' }, random)))).join(CALL_SEPARATOR);
  return pieces(text);
}
