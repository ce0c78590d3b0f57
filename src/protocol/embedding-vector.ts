/**
 * Embedding vectors on the wire: little-endian float32, base64, as OpenAI's `encoding_format:
 * "base64"` (and the openai SDK's decoder) define them. Written byte order explicit, so a
 * big-endian host encodes the same bytes.
 */

export function encodeVector(v: Float32Array): string {
  const bytes = Buffer.allocUnsafe(v.length * 4);
  for (let i = 0; i < v.length; i++) bytes.writeFloatLE(v[i] as number, i * 4);
  return bytes.toString('base64');
}

/** undefined when `text` is not whole float32s. */
export function decodeVector(text: string): Float32Array | undefined {
  const bytes = Buffer.from(text, 'base64');
  if (bytes.length % 4 !== 0) return undefined;
  const v = new Float32Array(bytes.length / 4);
  for (let i = 0; i < v.length; i++) v[i] = bytes.readFloatLE(i * 4);
  return v;
}

/** The first `dimensions` components, scaled back to unit length (as OpenAI's text-embedding-3 shorten theirs). */
export function truncateNormalized(v: ArrayLike<number>, dimensions: number): Float32Array {
  const out = Float32Array.from({ length: Math.min(dimensions, v.length) }, (_, i) => v[i] as number);
  let norm = 0;
  for (const x of out) norm += x * x;
  norm = Math.sqrt(norm);
  if (norm > 0) for (let i = 0; i < out.length; i++) out[i] = (out[i] as number) / norm;
  return out;
}
