/** --router and --kv-overlap-weight, shared with `ebb up` (which passes them on). */
export const ROUTER_HELP = 'how each request picks its worker: kv (prefix-cache overlap weighed against load), least-loaded (fewest in-flight), round-robin';
export const OVERLAP_WEIGHT_HELP = 'kv router: weight of the prompt tokens a worker would have to prefill (not cached there) against its load (queued prefill tokens + 64 per in-flight request); higher follows the cache harder, 0 routes by load alone';
