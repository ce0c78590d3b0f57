/**
 * The kv router's decision cost at fleet size, in process: 1,000 workers and a million indexed
 * blocks (each worker holding one of 4 shared system prompts and 16 conversation documents, 1,000
 * blocks each), requests of a system prompt + a document + a new question (about 1,600 tokens).
 * Timed apart: tokenizing and hashing the prompt (the mocker's tokenizer), and scoring every
 * eligible worker (index walk + cost, with seven other frontends' load on every worker, as their load
 * events say, and what each would evict: every worker names its capacity and stored lately), plus least-loaded's pick for comparison. Times are CPU time
 * of this process (process.cpuUsage), so a machine shared with other work does not inflate them.
 *
 *   node dist/bench/kv-routing-decision.js [--workers 1000] [--blocks-per-worker 1000] [--decisions 2000]
 */
import { pathToFileURL } from 'node:url';
import pino from 'pino';
import { blockHashes } from '../src/protocol/block-hash.js';
import { mockerTokenIds } from '../src/protocol/mocker-tokenizer.js';
import { KvFeed } from '../src/frontend/routing/kv-feed.js';
import { Router, type RouteHint } from '../src/frontend/routing/router.js';
import { WorkerPool } from '../src/frontend/routing/worker-pool.js';
import type { WorkerRecord } from '../src/discovery/discovery.js';

/** CPU microseconds (user + system) since `from`. */
const cpu = (from: NodeJS.CpuUsage) => {
  const d = process.cpuUsage(from);
  return d.user + d.system;
};

function flag(name: string, dflt: number): number {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 && process.argv[i + 1] !== undefined ? Number(process.argv[i + 1]) : dflt;
}

const BS = 16;
const SYSTEM_BLOCKS = 20;
const DOC_BLOCKS = 60;
const DOCS_PER_WORKER = 16;

/** Random words, and the mocker's token ids of them (what a worker's events would hash). */
const randomWords = (n: number) => Array.from({ length: n }, () => `w${Math.floor(Math.random() * (1 << 30)).toString(36)}`);

export async function kvDecisionCost(workers: number, blocksPerWorker: number, decisions: number) {
  const pool = new WorkerPool();
  const records: WorkerRecord[] = Array.from({ length: workers }, (_, i) => ({
    worker_id: `w-${i}`,
    model: 'm',
    mode: 'aggregated',
    request_url: `http://10.0.${i >> 8}.${i & 255}:9000`,
    system_url: `http://10.0.${i >> 8}.${i & 255}:9001`,
    // Declared without events so the feed starts no subscription (these addresses answer nothing);
    // the index is filled directly below, as snapshots would fill it.
    kv_cache: { block_size: BS, tokenizer: 'mocker-words', events: 'none' },
  }));
  pool.apply({ type: 'reset', records });
  const feed = new KvFeed(pino({ level: 'silent' }));
  feed.apply({ type: 'reset', records });
  const systemWords = [0, 1, 2, 3].map(() => randomWords(SYSTEM_BLOCKS * BS));
  const systems = systemWords.map((w) => mockerTokenIds(w.join(' ')));
  const docsPerWorker = Math.max(1, Math.floor((blocksPerWorker - SYSTEM_BLOCKS) / DOC_BLOCKS));
  const convs: string[] = [];
  let entries = 0;
  for (let i = 0; i < workers; i++) {
    const h = feed.index.replace(`w-${i}`, 'm', 'exact', 'inc');
    const system = systems[i % 4]!;
    for (const hash of blockHashes(system, BS)) feed.index.add(h, hash);
    for (let d = 0; d < docsPerWorker; d++) {
      const doc = randomWords(DOC_BLOCKS * BS);
      const conv = [...system, ...mockerTokenIds(doc.join(' '))];
      if (convs.length < 200 && d === 0) convs.push(`${systemWords[i % 4]!.join(' ')} ${doc.join(' ')}`);
      for (const hash of blockHashes(conv, BS).slice(SYSTEM_BLOCKS)) feed.index.add(h, hash);
    }
    entries += h.blocks.size;
    // Its snapshot named its capacity and it stored lately: the decision weighs what a prompt would evict there.
    h.capacityBlocks = blocksPerWorker;
    feed.index.stored(h, h.blocks.size, performance.now());
    // Seven other frontends route here too: each worker's load event lists their requests (the decision adds them in).
    feed.load.apply(`w-${i}`, { worker_id: `w-${i}`, frontends: Object.fromEntries(Array.from({ length: 7 }, (_, f) => [`frontend-${f}`, [2, [300]]])) });
  }
  const kv = new Router(pool, { kind: 'kv', feed });
  const ll = new Router(pool, { kind: 'least-loaded' });
  const none = new Set<string>();
  const prompts = convs.map((c) => `${c} ${randomWords(40).join(' ')}`);

  // Tokenizing + hashing the prompt (prepare).
  const hints: RouteHint[] = [];
  let t0 = process.cpuUsage();
  for (let i = 0; i < decisions; i++) {
    const hint = await kv.prepare({ model: 'm', prompt: prompts[i % prompts.length]! }, 'aggregated', none, []);
    if (i < prompts.length) hints.push(hint!);
  }
  const prepareUs = cpu(t0) / decisions;

  // Scoring every eligible worker (pick), hints precomputed.
  let hits = 0;
  for (let i = 0; i < 200; i++) kv.pick('m', 'aggregated', none, [], hints[i % hints.length]); // warm-up
  t0 = process.cpuUsage();
  for (let i = 0; i < decisions; i++) {
    const hint = hints[i % hints.length]!;
    kv.pick('m', 'aggregated', none, [], hint);
    if ((hint.chosen?.cachedTokens ?? 0) > SYSTEM_BLOCKS * BS) hits++;
  }
  const scoreUs = cpu(t0) / decisions;

  t0 = process.cpuUsage();
  for (let i = 0; i < decisions * 10; i++) ll.pick('m', 'aggregated', none, []);
  const leastLoadedUs = cpu(t0) / (decisions * 10);
  return {
    workers,
    indexed_entries: entries,
    distinct_blocks: feed.index.blocksOf('m'),
    prompt_tokens: hints[0]!.tokens,
    prepare_us: Math.round(prepareUs * 10) / 10,
    score_us: Math.round(scoreUs * 10) / 10,
    decision_us: Math.round((prepareUs + scoreUs) * 10) / 10,
    least_loaded_us: Math.round(leastLoadedUs * 100) / 100,
    found_document_share: hits / decisions,
  };
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const r = await kvDecisionCost(flag('workers', 1000), flag('blocks-per-worker', 1000), flag('decisions', 2000));
  console.log(
    `${r.workers} workers, ${r.indexed_entries} indexed (block, worker) entries (${r.distinct_blocks} distinct blocks), ${r.prompt_tokens}-token prompts:\n` +
      `  tokenize + hash: ${r.prepare_us} µs, score ${r.workers} workers: ${r.score_us} µs, decision: ${r.decision_us} µs (least-loaded pick: ${r.least_loaded_us} µs)\n` +
      `  the worker holding the prompt's document was chosen in ${(r.found_document_share * 100).toFixed(1)} % of decisions`,
  );
  console.log(JSON.stringify({ bench: 'kv-routing-decision', ...r }));
}
