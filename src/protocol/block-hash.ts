/**
 * The prefix-cache block hashes every part of ebb agrees on (worker caches, KV events, the
 * frontend's index). As in vLLM's prefix caching, a prompt's tokens are cut into full blocks of
 * `blockSize` and each block's hash covers its parent's hash and its own token ids, so equal hashes
 * mean equal prefixes. A hash is a non-negative safe integer (53 bits): a Map key without strings,
 * and exact in JSON. Engines with hashes of their own (vLLM) are translated into these from the
 * token ids their events carry.
 */
export type BlockHash = number;

/** The parent of a prompt's first block. */
export const ROOT_BLOCK_HASH: BlockHash = 0;

/** The default block size (tokens per block), vLLM's. */
export const DEFAULT_BLOCK_SIZE = 16;

const LOW = 0x100000000;
const HIGH_MASK = 0x1fffff; // 21 bits above the low 32: 53 in all

/** The hash of one block given its parent's: two 32-bit FNV-1a-style lanes mixed, folded to 53 bits. */
export function chainHash(parent: BlockHash, tokens: ArrayLike<number>, start = 0, end = tokens.length): BlockHash {
  let a = (parent % LOW) >>> 0 ^ 0x811c9dc5;
  let b = Math.floor(parent / LOW) ^ 0x9e3779b9;
  for (let i = start; i < end; i++) {
    const t = tokens[i] as number;
    a = Math.imul(a ^ t, 0x01000193);
    b = Math.imul(b ^ (t >>> 16) ^ (t << 3), 0x5bd1e995);
    b ^= b >>> 15;
  }
  a ^= a >>> 13;
  a = Math.imul(a, 0xc2b2ae35);
  a ^= a >>> 16;
  b = Math.imul(b ^ a, 0x27d4eb2f);
  b ^= b >>> 15;
  return (b & HIGH_MASK) * LOW + (a >>> 0);
}

/**
 * The parent of a prompt's first block under a LoRA adapter: the adapter's name hashed, so two
 * adapters (and the base model) never share a cached block. No adapter: ROOT_BLOCK_HASH, the base
 * model's hashes unchanged.
 */
export function adapterRoot(adapter: string | undefined): BlockHash {
  if (adapter === undefined) return ROOT_BLOCK_HASH;
  const codes = new Array<number>(adapter.length);
  for (let i = 0; i < adapter.length; i++) codes[i] = adapter.charCodeAt(i);
  return chainHash(ROOT_BLOCK_HASH, codes);
}

/** The hashes of every full block of `tokens`, in order (a partial last block has none); `root`: adapterRoot's. */
export function blockHashes(tokens: ArrayLike<number>, blockSize: number = DEFAULT_BLOCK_SIZE, root: BlockHash = ROOT_BLOCK_HASH): BlockHash[] {
  const out: BlockHash[] = [];
  let parent = root;
  for (let start = 0; start + blockSize <= tokens.length; start += blockSize) {
    parent = chainHash(parent, tokens, start, start + blockSize);
    out.push(parent);
  }
  return out;
}
