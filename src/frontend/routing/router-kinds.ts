/** How the frontend chooses a worker for each attempt (--router); see Router. */
export const ROUTER_KINDS = ['kv', 'least-loaded', 'round-robin'] as const;
export type RouterKind = (typeof ROUTER_KINDS)[number];
