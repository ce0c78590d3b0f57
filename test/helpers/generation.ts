import type { GeneratedPiece, GenerateResult } from '../../src/engine/engine.js';

/** Runs an engine's generation to its end: the whole text and its result. */
export async function drainGeneration(g: AsyncGenerator<GeneratedPiece, GenerateResult, void>): Promise<{ text: string; result: GenerateResult }> {
  let text = '';
  for (;;) {
    const step = await g.next();
    if (step.done) return { text, result: step.value };
    text += step.value.text;
  }
}
