/**
 * `npm run make-test-model -- PATH`: writes the tests' tiny llama model (random weights, a
 * byte-fallback vocabulary, a ChatML template; about 0.6 MB) to PATH, and two LoRA adapters for it
 * beside it (PATH's name + .lora-a / .lora-b), so `--engine llama-cpp` (and its --lora) can be tried
 * without downloading a model. Its text is gibberish; everything around it is real.
 */
import { writeFileSync } from 'node:fs';
import { tinyLlamaGguf, tinyLoraGguf } from './gguf.js';

const path = process.argv[2];
if (path === undefined || path.startsWith('-')) {
  process.stderr.write('usage: npm run make-test-model -- PATH.gguf\n');
  process.exit(2);
}
const model = tinyLlamaGguf();
writeFileSync(path, model.bytes);
const loras = ['a', 'b'].map((name, i) => {
  const file = path.replace(/(\.gguf)?$/i, `.lora-${name}.gguf`);
  writeFileSync(file, tinyLoraGguf({ seed: i + 1 }));
  return `--lora ${name}=${file}`;
});
process.stdout.write(
  `wrote ${path} (${model.bytes.length} bytes, ${model.vocabSize} tokens, context ${model.contextLength}) and two LoRA adapters: ebb up --engine llama-cpp --model-path ${path} ${loras.join(' ')}\n`,
);
