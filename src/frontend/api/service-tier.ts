/**
 * The body's service_tier as ebb's admission queue reads it (admission/ticket.ts: priority, default,
 * flex). OpenAI's `scale` (its reserved-capacity tier) and the `fast` newer SDKs send both ask to
 * be served ahead of the default tier: ebb's `priority`. `auto` and `default` stay the default.
 */
export function ebbTier(value: unknown): unknown {
  return value === 'scale' || value === 'fast' ? 'priority' : value;
}
