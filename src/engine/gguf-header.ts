import { open } from 'node:fs/promises';

/** Bounds no real model comes near; past them the header is garbage, not a model. */
const MAX_TENSORS = 1_000_000;
const MAX_METADATA_KEYS = 1_000_000;
const HEADER_BYTES = 24; // magic, version, tensor count (u64), metadata count (u64)

/**
 * Checks that a file starts like a GGUF v2/v3 model before node-llama-cpp reads it: its metadata
 * reader (3.21.1) does not return on a "GGUF" file whose header is garbage, so a corrupt file would
 * hang the worker in loading instead of failing with a clear line.
 */
export async function checkGgufHeader(path: string): Promise<void> {
  const file = await open(path, 'r');
  try {
    const header = Buffer.alloc(HEADER_BYTES);
    const { bytesRead } = await file.read(header, 0, HEADER_BYTES, 0);
    if (bytesRead < HEADER_BYTES || header.toString('latin1', 0, 4) !== 'GGUF') throw new Error('not a GGUF file');
    const version = header.readUInt32LE(4);
    if (version !== 2 && version !== 3) throw new Error(`unsupported GGUF version ${version} (llama.cpp reads versions 2 and 3)`);
    const tensors = header.readBigUInt64LE(8);
    const keys = header.readBigUInt64LE(16);
    if (tensors > BigInt(MAX_TENSORS) || keys > BigInt(MAX_METADATA_KEYS)) throw new Error(`corrupt GGUF header (${tensors} tensors, ${keys} metadata keys)`);
  } finally {
    await file.close();
  }
}
