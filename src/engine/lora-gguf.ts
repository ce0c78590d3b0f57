import { readGgufFileInfo, type GgufFileInfo, type GgufTensorInfo } from 'node-llama-cpp';
import { checkGgufHeader } from './gguf-header.js';

const dims = (t: GgufTensorInfo) => t.dimensions.map(Number);

/**
 * Checks that `path` is a LoRA adapter GGUF made for `base` before llama.cpp loads it, by the rules
 * of llama.cpp's llama-adapter.cpp: general.type "adapter", adapter.type "lora", the model's
 * architecture, and every `<W>.lora_a` (ne [in, rank]) / `<W>.lora_b` (ne [rank, out]) pair on a
 * weight W of the base model with W's [in, out]. llama.cpp checks the same, but its reason only
 * reaches its log (node-llama-cpp says "Failed to initialize LoRA adapter"): here the admin call
 * that loads a wrong file is told why.
 */
export async function checkLoraGguf(path: string, base: GgufFileInfo): Promise<void> {
  try {
    await checkGgufHeader(path);
  } catch (err) {
    throw new Error((err as NodeJS.ErrnoException).code === 'ENOENT' ? 'no such file' : (err as Error).message);
  }
  const info = await readGgufFileInfo(path, { sourceType: 'filesystem', logWarnings: false });
  const meta = info.metadata as unknown as Record<string, Record<string, unknown> | undefined>;
  const type = meta.general?.type;
  if (type !== 'adapter') throw new Error(`not a LoRA adapter (general.type is ${JSON.stringify(type ?? null)}, not "adapter"): a model file?`);
  const kind = meta.adapter?.type;
  if (kind !== 'lora') throw new Error(`adapter.type is ${JSON.stringify(kind ?? null)}, not "lora"`);
  const arch = meta.general?.architecture;
  const baseArch = base.metadata.general.architecture;
  if (arch !== baseArch) throw new Error(`an adapter for architecture ${JSON.stringify(arch ?? null)}; the model is ${baseArch}`);
  const weights = new Map((base.fullTensorInfo ?? base.tensorInfo ?? []).map((t) => [t.name, t]));
  const pairs = new Map<string, { a?: GgufTensorInfo; b?: GgufTensorInfo }>();
  for (const t of info.tensorInfo ?? []) {
    const m = /^(.*)\.lora_([ab])$/.exec(t.name);
    if (m === null) continue; // llama.cpp reads only the pairs (and a few norms some adapters carry)
    const pair = pairs.get(m[1] as string) ?? {};
    pair[m[2] as 'a' | 'b'] = t;
    pairs.set(m[1] as string, pair);
  }
  if (pairs.size === 0) throw new Error('the adapter holds no .lora_a / .lora_b tensor pairs');
  for (const [name, { a, b }] of pairs) {
    if (a === undefined || b === undefined) throw new Error(`tensor ${name} has only one of .lora_a and .lora_b`);
    const w = weights.get(name);
    if (w === undefined) throw new Error(`it adapts ${name}, which the model does not have (an adapter for another model)`);
    const [wIn, wOut] = dims(w);
    const [aIn, rank] = dims(a);
    const [bRank, bOut] = dims(b);
    // token_embd's pair is stored the other way round (llama.cpp applies it as a lookup).
    const fits = name === 'token_embd.weight' ? wIn === bOut && wOut === rank : wIn === aIn && wOut === bOut && rank === bRank;
    if (!fits) throw new Error(`its ${name} pair is [${dims(a).join(', ')}] x [${dims(b).join(', ')}]; the model's ${name} is [${dims(w).join(', ')}] (an adapter for another model)`);
  }
}
