import type { Capability } from '../protocol/capabilities.js';
import { EbbError } from '../protocol/errors.js';
import type { WorkerPool } from './worker-pool.js';

/**
 * What the frontend does with each OpenAI request field. A field that would change the answer is
 * never dropped silently: it is carried to the engine, carried only to engines that declare the
 * capability it needs, or refused with 400 `unsupported_parameter` naming it.
 *
 * - `carried`: translated into the request plane (the schema bounds its values);
 * - `capability`: carried to workers whose engine declares what the value needs; 400 when no
 *   worker of the model does;
 * - `ignored`: no effect on the generated text (bookkeeping fields);
 * - `refused`: ebb cannot honour it yet; 400 unless the value is the default, which changes nothing.
 * Fields not in the table are ignored, as OpenAI adds fields faster than servers follow.
 */
type Policy =
  | { kind: 'carried' }
  | { kind: 'capability'; needs: (value: unknown) => Capability | undefined }
  | { kind: 'ignored' }
  | { kind: 'refused'; isDefault: (value: unknown) => boolean; why: string };

const carried: Policy = { kind: 'carried' };
const ignored: Policy = { kind: 'ignored' };
const unset = (v: unknown) => v === null || v === undefined;
const refused = (isDefault: (v: unknown) => boolean, why: string): Policy => ({ kind: 'refused', isDefault: (v) => unset(v) || isDefault(v), why });
const NOT_CARRIED = 'ebb does not carry it to engines yet';

export const FIELD_POLICY: Readonly<Record<string, Policy>> = {
  model: carried,
  messages: carried,
  prompt: carried,
  max_tokens: carried,
  max_completion_tokens: carried,
  temperature: carried,
  top_p: carried,
  seed: carried,
  stop: carried,
  stream: carried,
  stream_options: carried,
  n: carried, // the schema allows 1 only
  response_format: {
    kind: 'capability',
    needs: (v) => {
      const type = (v as { type?: unknown } | null)?.type;
      return type === 'json_object' || type === 'json_schema' ? type : undefined;
    },
  },
  user: ignored,
  metadata: ignored,
  store: ignored,
  service_tier: ignored,
  parallel_tool_calls: ignored, // meaningless without tools, which are refused
  logprobs: refused((v) => v === false || v === 0, NOT_CARRIED),
  top_logprobs: refused((v) => v === 0, NOT_CARRIED),
  tools: refused((v) => Array.isArray(v) && v.length === 0, NOT_CARRIED),
  tool_choice: refused((v) => v === 'none' || v === 'auto', NOT_CARRIED), // either is a no-op without tools
  functions: refused((v) => Array.isArray(v) && v.length === 0, NOT_CARRIED),
  function_call: refused((v) => v === 'none', NOT_CARRIED),
  presence_penalty: refused((v) => v === 0, NOT_CARRIED),
  frequency_penalty: refused((v) => v === 0, NOT_CARRIED),
  logit_bias: refused((v) => typeof v === 'object' && Object.keys(v as object).length === 0, NOT_CARRIED),
  best_of: refused((v) => v === 1, 'ebb generates one sequence per request'),
  echo: refused((v) => v === false, NOT_CARRIED),
  suffix: refused(() => false, NOT_CARRIED),
};

/**
 * Checks a request's fields against the table and the fleet: resolves when every field can be
 * honoured by some worker of the model, throws 400 `unsupported_parameter` naming the first that
 * cannot. Routing then sends the request only to workers that declare what it needs.
 */
export function checkFields(body: Record<string, unknown>, pool: WorkerPool): void {
  for (const field in body) {
    const policy = FIELD_POLICY[field];
    if (policy === undefined || policy.kind === 'carried' || policy.kind === 'ignored') continue;
    const value = body[field];
    if (policy.kind === 'refused') {
      if (!policy.isDefault(value)) throw new EbbError('unsupported_parameter', `${field} is not supported: ${policy.why}`, { param: field });
      continue;
    }
    const need = policy.needs(value);
    if (need === undefined) continue;
    const model = body.model as string;
    if (!pool.declares(model, need)) {
      const engines = pool.engineKinds(model).join(', ') || 'unknown';
      throw new EbbError('unsupported_parameter', `${field} ${need} is not supported by any worker of model "${model}" (engines: ${engines})`, { param: field });
    }
  }
}
