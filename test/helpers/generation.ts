import type { GeneratedPiece, GenerateResult } from '../../src/engine/engine.js';

/** Runs an engine's generation to its end: the whole text, its pieces and its result. */
export async function drainGeneration(g: AsyncGenerator<GeneratedPiece, GenerateResult, void>): Promise<{ text: string; pieces: GeneratedPiece[]; result: GenerateResult }> {
  let text = '';
  const pieces: GeneratedPiece[] = [];
  for (;;) {
    const step = await g.next();
    if (step.done) return { text, pieces, result: step.value };
    text += step.value.text;
    pieces.push(step.value);
  }
}
