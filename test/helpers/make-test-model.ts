/**
 * `npm run make-test-model -- PATH`: writes the tests' tiny llama model (random weights, a
 * byte-fallback vocabulary, a ChatML template; about 0.6 MB) to PATH, so `--engine llama-cpp` can be
 * tried without downloading a model. Its text is gibberish; everything around it is real.
 */
import { writeFileSync } from 'node:fs';
import { tinyLlamaGguf } from './gguf.js';

const path = process.argv[2];
if (path === undefined || path.startsWith('-')) {
  process.stderr.write('usage: npm run make-test-model -- PATH.gguf\n');
  process.exit(2);
}
const model = tinyLlamaGguf();
writeFileSync(path, model.bytes);
process.stdout.write(`wrote ${path} (${model.bytes.length} bytes, ${model.vocabSize} tokens, context ${model.contextLength}): ebb up --engine llama-cpp --model-path ${path}\n`);
