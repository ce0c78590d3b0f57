/**
 * A tiny GGUF v3 writer that makes a llama-architecture model for tests: no model can be downloaded
 * here and no package ships one. Weights are random (fixed seed), so the text is gibberish, but
 * llama.cpp loads it like any other model: real tokenizer, KV cache, batching and sampling.
 */
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

/** GGUF metadata value types (gguf.md). */
const enum ValueType {
  UINT32 = 4,
  INT32 = 5,
  FLOAT32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
}

const GGML_TYPE_F32 = 0;
const ALIGNMENT = 32;

/** SentencePiece token types, as llama.cpp reads tokenizer.ggml.token_type. */
const enum TokenType {
  NORMAL = 1,
  UNKNOWN = 2,
  CONTROL = 3,
  BYTE = 6,
}

type Value =
  | { type: ValueType.UINT32 | ValueType.INT32 | ValueType.FLOAT32; value: number }
  | { type: ValueType.BOOL; value: boolean }
  | { type: ValueType.STRING; value: string }
  | { type: ValueType.ARRAY; items: ValueType.STRING; value: string[] }
  | { type: ValueType.ARRAY; items: ValueType.FLOAT32 | ValueType.INT32; value: number[] };

interface Tensor {
  name: string;
  /** ggml order: ne[0] (the contiguous dimension) first. */
  dims: number[];
  data: Float32Array;
}

/** Grows a byte buffer; GGUF is little-endian throughout. */
class Writer {
  private buf = Buffer.alloc(1 << 16);
  length = 0;

  private reserve(n: number): void {
    if (this.length + n <= this.buf.length) return;
    const next = Buffer.alloc(Math.max(this.buf.length * 2, this.length + n));
    this.buf.copy(next, 0, 0, this.length);
    this.buf = next;
  }
  u32(v: number): void {
    this.reserve(4);
    this.length = this.buf.writeUInt32LE(v, this.length);
  }
  i32(v: number): void {
    this.reserve(4);
    this.length = this.buf.writeInt32LE(v, this.length);
  }
  u64(v: number): void {
    this.reserve(8);
    this.length = this.buf.writeBigUInt64LE(BigInt(v), this.length);
  }
  f32(v: number): void {
    this.reserve(4);
    this.length = this.buf.writeFloatLE(v, this.length);
  }
  string(s: string): void {
    const bytes = Buffer.from(s, 'utf8');
    this.u64(bytes.length);
    this.bytes(bytes);
  }
  bytes(b: Uint8Array): void {
    this.reserve(b.length);
    this.buf.set(b, this.length);
    this.length += b.length;
  }
  padTo(alignment: number): void {
    const pad = (alignment - (this.length % alignment)) % alignment;
    this.reserve(pad);
    this.buf.fill(0, this.length, this.length + pad);
    this.length += pad;
  }
  done(): Buffer {
    return this.buf.subarray(0, this.length);
  }
}

function writeValue(w: Writer, v: Value): void {
  w.u32(v.type);
  switch (v.type) {
    case ValueType.UINT32:
      return w.u32(v.value);
    case ValueType.INT32:
      return w.i32(v.value);
    case ValueType.FLOAT32:
      return w.f32(v.value);
    case ValueType.BOOL:
      return w.bytes(Uint8Array.of(v.value ? 1 : 0));
    case ValueType.STRING:
      return w.string(v.value);
    case ValueType.ARRAY:
      w.u32(v.items);
      w.u64(v.value.length);
      if (v.items === ValueType.STRING) for (const s of v.value) w.string(s);
      else if (v.items === ValueType.INT32) for (const n of v.value) w.i32(n);
      else for (const n of v.value) w.f32(n);
  }
}

/** Serialises a GGUF v3 file: header, metadata, tensor infos, then aligned tensor data. */
export function encodeGguf(metadata: Array<[string, Value]>, tensors: Tensor[]): Buffer {
  const w = new Writer();
  w.bytes(Buffer.from('GGUF', 'ascii'));
  w.u32(3);
  w.u64(tensors.length);
  w.u64(metadata.length);
  for (const [key, value] of metadata) {
    w.string(key);
    writeValue(w, value);
  }
  let offset = 0;
  for (const t of tensors) {
    const elements = t.dims.reduce((a, b) => a * b, 1);
    if (elements !== t.data.length) throw new Error(`tensor ${t.name}: ${t.data.length} values for dims ${t.dims.join('x')}`);
    w.string(t.name);
    w.u32(t.dims.length);
    for (const d of t.dims) w.u64(d);
    w.u32(GGML_TYPE_F32);
    w.u64(offset);
    offset += Math.ceil((elements * 4) / ALIGNMENT) * ALIGNMENT;
  }
  w.padTo(ALIGNMENT);
  for (const t of tensors) {
    w.bytes(new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength));
    w.padTo(ALIGNMENT);
  }
  return w.done();
}

/** mulberry32, then Box-Muller: reproducible normal samples for the weights. */
function normals(seed: number): () => number {
  let a = seed >>> 0;
  const uniform = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return (((t ^ (t >>> 14)) >>> 0) + 1) / 4294967297;
  };
  return () => Math.sqrt(-2 * Math.log(uniform())) * Math.cos(2 * Math.PI * uniform());
}

const SPACE = '\u2581'; // SentencePiece's word-boundary marker
const WORDS = (
  'the of and to in is it for on with as at by an be this from or are not has one all model token stream ' +
  'worker drain engine serve request cache batch state idle ready route signal fleet watch ebb flow tide ' +
  'tides shore quiet steady river harbor light hello world tell me about'
).split(' ');
/** Printable ASCII as single-character pieces, so most output reads as text rather than raw bytes. */
const CHARS = Array.from({ length: 95 }, (_, i) => String.fromCharCode(32 + i)).filter((c) => c !== ' ');

/** ChatML: node-llama-cpp recognises it and stops on <|im_end|>. */
export const TINY_CHAT_TEMPLATE =
  "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}" +
  "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

interface Vocab {
  tokens: string[];
  scores: number[];
  types: number[];
}

/** <unk>, <s>, </s>, the ChatML markers, 256 byte-fallback tokens, then characters and word pieces. */
function vocabulary(): Vocab {
  const v: Vocab = { tokens: [], scores: [], types: [] };
  const seen = new Set<string>();
  const add = (token: string, type: TokenType, score = 0) => {
    if (seen.has(token)) return;
    seen.add(token);
    v.tokens.push(token);
    v.scores.push(score);
    v.types.push(type);
  };
  add('<unk>', TokenType.UNKNOWN);
  add('<s>', TokenType.CONTROL);
  add('</s>', TokenType.CONTROL);
  add('<|im_start|>', TokenType.CONTROL);
  add('<|im_end|>', TokenType.CONTROL);
  for (let b = 0; b < 256; b++) add(`<0x${b.toString(16).toUpperCase().padStart(2, '0')}>`, TokenType.BYTE);
  add(SPACE, TokenType.NORMAL, -1);
  for (const c of CHARS) add(c, TokenType.NORMAL, -2);
  // Every prefix of a word piece is a piece too: SentencePiece merges pairs, so "▁the" is reached
  // through "▁t" and "▁th"; a longer piece scores higher, so merges prefer it.
  for (const word of WORDS) {
    const piece = SPACE + word;
    for (let n = 2; n <= piece.length; n++) add(piece.slice(0, n), TokenType.NORMAL, n - 10);
  }
  return v;
}

/** The constant residual dimension, and roughly its value after RMS norm (the other dimensions are ~N(0,1)). */
const RESIDUAL0 = 4;
const RESIDUAL0_NORMED = 3.5;
/** Logit biases by token text (random logits have a spread of about 1). */
const LOGIT_BIAS: Record<string, number> = {
  '}': 2,
  '<0x7D>': 2,
  '"': -3,
  '<0x22>': -3,
  [SPACE]: -10,
  '<0x20>': -10,
  '<0x0A>': -10,
  '<0x09>': -10,
  '<0x0D>': -10,
  '</s>': -6,
};

export interface TinyModelOptions {
  /** Overrides of the built-in logit biases, by token text (for tuning). */
  logitBias?: Record<string, number>;
  seed?: number;
  embedding?: number;
  layers?: number;
  heads?: number;
  kvHeads?: number;
  feedForward?: number;
  contextLength?: number;
  chatTemplate?: string | null;
}

export interface TinyModel {
  bytes: Buffer;
  vocabSize: number;
  contextLength: number;
}

/** The tiny model's dimensions: the model and the LoRA adapters made for it read them from one place. */
function shapeOf(opts: TinyModelOptions) {
  const nEmbd = opts.embedding ?? 64;
  const nHead = opts.heads ?? 4;
  const headDim = nEmbd / nHead;
  const nHeadKv = opts.kvHeads ?? 2;
  return { nEmbd, nLayer: opts.layers ?? 2, nHead, nHeadKv, nFf: opts.feedForward ?? 128, headDim, nEmbdKv: headDim * nHeadKv };
}

/** A tensor of normal samples times `scale`. */
function randomTensorOf(random: () => number) {
  return (name: string, dims: number[], scale: number): Tensor => {
    const data = new Float32Array(dims.reduce((a, b) => a * b, 1));
    for (let i = 0; i < data.length; i++) data[i] = random() * scale;
    return { name, dims, data };
  };
}

/** Builds the tiny llama model: about half a megabyte with the defaults. */
export function tinyLlamaGguf(opts: TinyModelOptions = {}): TinyModel {
  const seed = opts.seed ?? 42;
  const { nEmbd, nLayer, nHead, nHeadKv, nFf, headDim, nEmbdKv } = shapeOf(opts);
  const contextLength = opts.contextLength ?? 8192;
  const vocab = vocabulary();
  const nVocab = vocab.tokens.length;
  const randomTensor = randomTensorOf(normals(seed));
  const ones = (name: string, n: number): Tensor => ({ name, dims: [n], data: new Float32Array(n).fill(1) });

  // Dimension 0 of the residual stream is held constant (embeddings set it, no layer writes it), so
  // an output row's weight on it is a fixed logit bias for that token (about RESIDUAL0_NORMED per
  // unit). Control tokens get a large negative one: sampling never picks them, so text runs to
  // max_tokens (a grammar that only allows end-of-generation still selects </s>). A JSON grammar
  // needs to reach its end too: "}" leans up and whitespace down, so a JSON-constrained answer
  // closes within a few tokens instead of looping inside a string (random weights loop).
  const embed = randomTensor('token_embd.weight', [nEmbd, nVocab], 1);
  for (let t = 0; t < nVocab; t++) embed.data[t * nEmbd] = RESIDUAL0;
  const output = randomTensor('output.weight', [nEmbd, nVocab], 1 / Math.sqrt(nEmbd));
  for (let t = 0; t < nVocab; t++) {
    const token = vocab.tokens[t] as string;
    const control = vocab.types[t] === TokenType.CONTROL || vocab.types[t] === TokenType.UNKNOWN;
    if (control) for (let d = 0; d < nEmbd; d++) output.data[t * nEmbd + d] = 0;
    const bias = opts.logitBias?.[token] ?? LOGIT_BIAS[token] ?? (control ? -20 : 0);
    output.data[t * nEmbd] = bias / RESIDUAL0_NORMED;
  }
  const zeroRow0 = (t: Tensor, rowLength: number) => {
    // ggml matrices [ne0 = inputs, ne1 = outputs]: output 0 is the first row of ne0 values.
    for (let i = 0; i < rowLength; i++) t.data[i] = 0;
    return t;
  };

  const tensors: Tensor[] = [embed, ones('output_norm.weight', nEmbd), output];
  const scale = 1 / Math.sqrt(nEmbd);
  for (let l = 0; l < nLayer; l++) {
    const p = `blk.${l}`;
    tensors.push(
      ones(`${p}.attn_norm.weight`, nEmbd),
      randomTensor(`${p}.attn_q.weight`, [nEmbd, nEmbd], scale),
      randomTensor(`${p}.attn_k.weight`, [nEmbd, nEmbdKv], scale),
      randomTensor(`${p}.attn_v.weight`, [nEmbd, nEmbdKv], scale),
      zeroRow0(randomTensor(`${p}.attn_output.weight`, [nEmbd, nEmbd], scale), nEmbd),
      ones(`${p}.ffn_norm.weight`, nEmbd),
      randomTensor(`${p}.ffn_gate.weight`, [nEmbd, nFf], scale),
      randomTensor(`${p}.ffn_up.weight`, [nEmbd, nFf], scale),
      zeroRow0(randomTensor(`${p}.ffn_down.weight`, [nFf, nEmbd], 1 / Math.sqrt(nFf)), nFf),
    );
  }

  const u32 = (value: number): Value => ({ type: ValueType.UINT32, value });
  const metadata: Array<[string, Value]> = [
    ['general.architecture', { type: ValueType.STRING, value: 'llama' }],
    ['general.name', { type: ValueType.STRING, value: 'ebb-tiny-llama' }],
    ['general.alignment', u32(ALIGNMENT)],
    ['llama.context_length', u32(contextLength)],
    ['llama.embedding_length', u32(nEmbd)],
    ['llama.block_count', u32(nLayer)],
    ['llama.feed_forward_length', u32(nFf)],
    ['llama.attention.head_count', u32(nHead)],
    ['llama.attention.head_count_kv', u32(nHeadKv)],
    ['llama.attention.layer_norm_rms_epsilon', { type: ValueType.FLOAT32, value: 1e-5 }],
    ['llama.rope.dimension_count', u32(headDim)],
    ['llama.vocab_size', u32(nVocab)],
    ['tokenizer.ggml.model', { type: ValueType.STRING, value: 'llama' }],
    ['tokenizer.ggml.tokens', { type: ValueType.ARRAY, items: ValueType.STRING, value: vocab.tokens }],
    ['tokenizer.ggml.scores', { type: ValueType.ARRAY, items: ValueType.FLOAT32, value: vocab.scores }],
    ['tokenizer.ggml.token_type', { type: ValueType.ARRAY, items: ValueType.INT32, value: vocab.types }],
    ['tokenizer.ggml.unknown_token_id', u32(0)],
    ['tokenizer.ggml.bos_token_id', u32(1)],
    ['tokenizer.ggml.eos_token_id', u32(2)],
    ['tokenizer.ggml.add_bos_token', { type: ValueType.BOOL, value: true }],
    ['tokenizer.ggml.add_eos_token', { type: ValueType.BOOL, value: false }],
  ];
  const template = opts.chatTemplate === undefined ? TINY_CHAT_TEMPLATE : opts.chatTemplate;
  if (template !== null) metadata.push(['tokenizer.chat_template', { type: ValueType.STRING, value: template }]);
  return { bytes: encodeGguf(metadata, tensors), vocabSize: nVocab, contextLength };
}

/** Writes the tiny model into a fresh temp dir and returns its path. */
export function writeTinyLlamaGguf(opts: TinyModelOptions = {}): string {
  const dir = mkdtempSync(join(tmpdir(), 'ebb-gguf-'));
  const file = join(dir, 'tiny-llama.gguf');
  writeFileSync(file, tinyLlamaGguf(opts).bytes);
  return file;
}

export interface TinyLoraOptions {
  /** Another seed, another adapter: two adapters answer differently. */
  seed?: number;
  rank?: number;
  /** The model it is made for (its dimensions); a mismatch makes an adapter llama.cpp refuses. */
  base?: TinyModelOptions;
  /** general.architecture; llama.cpp refuses an adapter of another architecture than its model's. */
  architecture?: string;
}

/**
 * A LoRA adapter GGUF for the tiny model, laid out as llama.cpp's llama-adapter.cpp reads one:
 * general.type "adapter", adapter.type "lora", adapter.lora.alpha, and for each adapted weight
 * W (ne [in, out]) a pair `W.lora_a` (ne [in, rank]) and `W.lora_b` (ne [rank, out]). It adapts
 * attn_q, attn_v and ffn_up of every layer, never what writes the residual stream's constant
 * dimension (attn_output, ffn_down), so the control tokens stay suppressed. With alpha = rank
 * the delta B·A has the base weights' own scale: a temperature-0 answer changes from its first tokens.
 */
export function tinyLoraGguf(opts: TinyLoraOptions = {}): Buffer {
  const { nEmbd, nLayer, nFf, nEmbdKv } = shapeOf(opts.base ?? {});
  const rank = opts.rank ?? 4;
  const randomTensor = randomTensorOf(normals(opts.seed ?? 1));
  const tensors: Tensor[] = [];
  for (let l = 0; l < nLayer; l++) {
    for (const [weight, nIn, nOut] of [
      [`blk.${l}.attn_q.weight`, nEmbd, nEmbd],
      [`blk.${l}.attn_v.weight`, nEmbd, nEmbdKv],
      [`blk.${l}.ffn_up.weight`, nEmbd, nFf],
    ] as const) {
      tensors.push(randomTensor(`${weight}.lora_a`, [nIn, rank], 1 / Math.sqrt(nIn)), randomTensor(`${weight}.lora_b`, [rank, nOut], 1 / Math.sqrt(rank)));
    }
  }
  const metadata: Array<[string, Value]> = [
    ['general.architecture', { type: ValueType.STRING, value: opts.architecture ?? 'llama' }],
    ['general.type', { type: ValueType.STRING, value: 'adapter' }],
    ['general.name', { type: ValueType.STRING, value: `ebb-tiny-lora-${opts.seed ?? 1}` }],
    ['general.alignment', { type: ValueType.UINT32, value: ALIGNMENT }],
    ['adapter.type', { type: ValueType.STRING, value: 'lora' }],
    ['adapter.lora.alpha', { type: ValueType.FLOAT32, value: rank }],
  ];
  return encodeGguf(metadata, tensors);
}

/** Writes a tiny LoRA adapter into a fresh temp dir and returns its path. */
export function writeTinyLoraGguf(opts: TinyLoraOptions = {}): string {
  const dir = mkdtempSync(join(tmpdir(), 'ebb-lora-'));
  const file = join(dir, `tiny-lora-${opts.seed ?? 1}.gguf`);
  writeFileSync(file, tinyLoraGguf(opts));
  return file;
}
