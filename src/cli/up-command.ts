import { printable } from '../common/terminal-text.js';
import { Command, Option } from 'commander';
import { renameSync, rmSync, writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { loadPretty, logFormat, prettyOptions } from '../common/logger.js';
import { temporaryDiscoveryUrl } from '../discovery/connect.js';
import { discoveryOption, fleetNameOption, intOption, msOption, portOption, weightOption } from './options.js';
import { OVERLAP_WEIGHT_HELP, ROUTER_HELP } from './router-flags.js';
import { ROUTER_KINDS } from '../frontend/routing/router-kinds.js';
import { DEFAULT_QUEUE_DEPTH, DEFAULT_QUEUE_TIMEOUT_MS } from '../frontend/admission/admission-queue.js';
import { LLAMA_CPP_DEFAULTS } from '../engine/llama-cpp-options.js';
import { servedModelName } from './llama-cpp-flags.js';
import { collectAdapterName, collectLoraFlag } from './lora-flag.js';
import type { AdapterSource } from '../engine/engine-adapters.js';
import { Supervised, type ReadyLine } from './supervisor.js';
import { processesOption } from './frontend-command.js';
import { removeUpState, runningUps, writeUpState } from './up-state.js';
import { assertAdminBindAllowed, loadAdminTokens } from '../common/admin-auth.js';

interface UpFlags {
  queueTimeout?: number;
  queueDepth?: number;
  workers?: number;
  prefill: number;
  decode: number;
  model?: string;
  engine: string;
  modelPath?: string;
  parallel?: number;
  contextSize?: number;
  threads?: number;
  gpu?: string;
  lora?: AdapterSource[];
  loraSlots?: number;
  host: string;
  adminHost: string;
  port: number;
  adminPort?: number;
  adminTokenFile?: string;
  discovery?: string;
  mockerTtftMs?: number;
  mockerItlMs?: number;
  mockerMaxContext?: number;
  router: string;
  kvOverlapWeight?: number;
  mockerKvCache?: 'on' | 'off';
  mockerKvBlocks?: number;
  mockerPrefillTokensPerS?: number;
  mockerLora: string[];
  mockerLoraSlots?: number;
  mockerLoraLoadMs?: number;
  corsOrigin: string[];
  processes: number;
  restart: boolean;
  metricsSdFile?: string;
  name?: string;
}

/** One line on stderr; it may quote what a worker reports, so it is shown escaped. */
/** How long a second Ctrl-C waits for the frontend to end its streams with an error event before killing it. */
const FORCED_STOP_BOUND_MS = 3000;

const say = (line: string) => process.stderr.write(`${printable(line)}\n`);

/** A Prometheus file-SD target list of every component, rewritten (atomically) whenever one (re)starts or exits. */
function writeTargets(file: string, targets: Map<string, { url: string; labels: Record<string, string> }>): void {
  const groups = [...targets.values()].map((t) => ({ targets: [new URL(t.url).host], labels: t.labels }));
  writeFileSync(`${file}.tmp`, JSON.stringify(groups, null, 2) + '\n');
  renameSync(`${file}.tmp`, file);
}

/** The llama-cpp flags `ebb up` passes on to every worker it starts. */
function llamaCppArgs(flags: UpFlags): string[] {
  if (flags.engine !== 'llama-cpp') return [];
  if (flags.modelPath === undefined) throw new Error('--engine llama-cpp needs --model-path FILE.gguf');
  const args = ['--model-path', flags.modelPath];
  if (flags.parallel !== undefined) args.push('--parallel', String(flags.parallel));
  if (flags.contextSize !== undefined) args.push('--context-size', String(flags.contextSize));
  if (flags.threads !== undefined) args.push('--threads', String(flags.threads));
  if (flags.gpu !== undefined) args.push('--gpu', flags.gpu);
  for (const { name, path } of flags.lora ?? []) args.push('--lora', `${name}=${path}`);
  if (flags.loraSlots !== undefined) args.push('--lora-slots', String(flags.loraSlots));
  return args;
}

export function upCommand(): Command {
  return new Command('up')
    .description('run a frontend and N workers (mocker, or llama-cpp on a GGUF model) on this machine with embedded (file) discovery')
    .option('--workers <n>', 'aggregated mocker workers (default 2, or 0 with --prefill/--decode)', intOption(0))
    .option('--prefill <n>', 'prefill workers (disaggregated serving)', intOption(0), 0)
    .option('--decode <n>', 'decode workers (disaggregated serving)', intOption(0), 0)
    .option('--model <name>', 'model name served (default: ebb-mock; with llama-cpp the GGUF file name)')
    .addOption(new Option('--engine <name>', "the workers' engine: mocker, or llama-cpp with --model-path").choices(['mocker', 'llama-cpp']).default('mocker'))
    .option('--model-path <file>', 'llama-cpp: the GGUF model file every worker loads')
    .option('--parallel <n>', 'llama-cpp: sequences per worker evaluated together', intOption(1))
    .option('--context-size <n>', 'llama-cpp: tokens per sequence', intOption(16))
    .option('--threads <n>', 'llama-cpp: CPU threads per worker (default 1)', intOption(1))
    .addOption(new Option('--gpu <kind>', 'llama-cpp: GPU backend, or off').choices(['auto', 'cuda', 'vulkan', 'off']))
    .option('--lora <name=path>', 'llama-cpp: a LoRA adapter GGUF every worker can load, served as model NAME (repeatable)', collectLoraFlag)
    .option('--lora-slots <n>', `llama-cpp: LoRA adapters resident at once per worker (default ${LLAMA_CPP_DEFAULTS.loraSlots})`, intOption(1))
    .option('--host <addr>', 'frontend bind address', '127.0.0.1')
    .option('--port <n>', 'frontend port', portOption, 8000)
    .addOption(new Option('--processes <n>', 'frontend relaying processes on the one port (`auto` = one per core)').argParser(processesOption).default(1))
    .option('--admin-host <addr>', "frontend admin listener (dashboard, fleet admin) bind address; off loopback (a container's published port) it needs --admin-token-file", '127.0.0.1')
    .option('--admin-port <n>', "frontend admin listener port (default: --port + 1; any free port when --port is 0)", portOption)
    .option('--admin-token-file <path>', 'admin bearer token for the frontend and every worker (env EBB_ADMIN_TOKEN); the operator commands then need it too')
    .option('--discovery <url>', 'discovery URL (default: a fresh temporary directory)', discoveryOption)
    .option('--mocker-ttft-ms <n>', 'mocker base time to first token', msOption(0))
    .option('--mocker-itl-ms <n>', 'mocker inter-token latency', msOption(0))
    .option('--mocker-max-context <n>', 'mocker model length: what a request without max_tokens may fill', intOption(1))
    .addOption(new Option('--router <kind>', ROUTER_HELP).choices(ROUTER_KINDS).default('kv'))
    .option('--kv-overlap-weight <w>', OVERLAP_WEIGHT_HELP, weightOption)
    .option('--queue-timeout <ms>', `the frontend: how long a request no worker can take now waits for one (default ${DEFAULT_QUEUE_TIMEOUT_MS}; 0 = no queue, 503 at once)`, msOption(0))
    .option('--queue-depth <n>', `the frontend: requests waiting per model at most (default ${DEFAULT_QUEUE_DEPTH}); past it 429 rate_limit_exceeded`, intOption(1))
    .addOption(new Option('--mocker-kv-cache <mode>', 'mocker prefix KV cache (default on)').choices(['on', 'off']))
    .option('--mocker-kv-blocks <n>', 'mocker prefix cache capacity in blocks, per worker', intOption(1))
    .option('--mocker-prefill-tokens-per-s <n>', 'mocker prefill compute: uncached prompt tokens per second, per worker', intOption(1))
    .addOption(new Option('--mocker-lora <name>', 'mocker LoRA adapter every worker can load, named by clients as their `model` (repeatable)').argParser(collectAdapterName).default([] as string[], 'none'))
    .option('--mocker-lora-slots <n>', 'mocker LoRA adapters resident at once, per worker', intOption(1))
    .option('--mocker-lora-load-ms <n>', 'mocker time to load a LoRA adapter', msOption(0))
    .addOption(new Option('--cors-origin <origin>', 'let browsers on this origin call the API (repeatable)').argParser((v: string, all: string[]) => [...all, v]).default([] as string[], 'none'))
    .option('--no-restart', 'do not restart a component that exits on its own (default: restart with back-off)')
    .option('--name <name>', 'name of this fleet, for the operator commands\' --fleet when several `ebb up` run (default: its pid)', fleetNameOption)
    .option('--metrics-sd-file <file>', 'write a Prometheus file-SD target list of the frontend and every worker here, kept current')
    .action(async (flags: UpFlags) => {
      const name = flags.name ?? String(process.pid);
      const taken = runningUps().find((u) => u.name === name);
      if (taken !== undefined) throw new Error(`a fleet named "${name}" is already running (ebb up pid ${taken.pid}, ${taken.frontend_url}); choose another --name`);
      const mocker: string[] = [];
      if (flags.mockerTtftMs !== undefined) mocker.push('--mocker-ttft-ms', String(flags.mockerTtftMs));
      if (flags.mockerItlMs !== undefined) mocker.push('--mocker-itl-ms', String(flags.mockerItlMs));
      if (flags.mockerMaxContext !== undefined) mocker.push('--mocker-max-context', String(flags.mockerMaxContext));
      if (flags.mockerKvCache !== undefined) mocker.push('--mocker-kv-cache', flags.mockerKvCache);
      if (flags.mockerKvBlocks !== undefined) mocker.push('--mocker-kv-blocks', String(flags.mockerKvBlocks));
      if (flags.mockerPrefillTokensPerS !== undefined) mocker.push('--mocker-prefill-tokens-per-s', String(flags.mockerPrefillTokensPerS));
      for (const name of flags.mockerLora) mocker.push('--mocker-lora', name);
      if (flags.mockerLoraSlots !== undefined) mocker.push('--mocker-lora-slots', String(flags.mockerLoraSlots));
      if (flags.mockerLoraLoadMs !== undefined) mocker.push('--mocker-lora-load-ms', String(flags.mockerLoraLoadMs));
      const model = servedModelName(flags, 'ebb-mock');
      const engine = ['--engine', flags.engine, ...llamaCppArgs(flags)];
      const adminToken = flags.adminTokenFile === undefined ? [] : ['--admin-token-file', flags.adminTokenFile];
      const adminPort = flags.adminPort === undefined ? [] : ['--admin-port', String(flags.adminPort)];
      // Refused here, before anything starts, rather than by the frontend it would start.
      assertAdminBindAllowed(flags.adminHost, await loadAdminTokens(flags.adminTokenFile), '--admin-host');
      const disaggregated = flags.prefill + flags.decode > 0;
      if (disaggregated && (flags.prefill === 0 || flags.decode === 0)) throw new Error('disaggregated serving needs at least one --prefill and one --decode worker');
      const modes = [
        ...Array<string>(flags.workers ?? (disaggregated ? 0 : 2)).fill('aggregated'),
        ...Array<string>(flags.prefill).fill('prefill'),
        ...Array<string>(flags.decode).fill('decode'),
      ];
      if (modes.length === 0) throw new Error('nothing to run: --workers 0 and no --prefill/--decode');
      // Only once the flags are known good: a refused command line leaves no directory behind.
      const ownDiscovery = flags.discovery === undefined;
      const discovery = flags.discovery ?? temporaryDiscoveryUrl();

      const show = logFormat() === 'pretty' ? loadPretty().prettyFactory(prettyOptions()) : (line: string) => `${line}\n`;
      const targets = new Map<string, { url: string; labels: Record<string, string> }>();
      /** `early`: a line of the first start to wait for before it is ready (firstEvent). */
      const supervise = (name: string, args: string[], readyEvent: string, metricsUrl: (ready: ReadyLine) => string, job: string, early?: string) => {
        const child = new Supervised(name, args, readyEvent, flags.restart);
        if (early !== undefined) void child.firstEvent(early);
        child.on('line', (line: string) => process.stdout.write(show(line)));
        child.on('ready', (ready: ReadyLine) => {
          if (flags.metricsSdFile === undefined) return;
          targets.set(name, { url: metricsUrl(ready), labels: { job, component: name, ...(typeof ready.worker_id === 'string' ? { worker_id: ready.worker_id } : {}) } });
          writeTargets(flags.metricsSdFile, targets);
        });
        child.on('exit', (code: number | null, signal: NodeJS.Signals | null, restartInMs: number | undefined) => {
          if (flags.metricsSdFile !== undefined && targets.delete(name)) writeTargets(flags.metricsSdFile, targets);
          if (restartInMs !== undefined) say(`ebb up: ${name} exited unexpectedly (${signal ?? `code ${code}`}); restarting it in ${restartInMs / 1000}s`);
          else if (stopping === undefined) say(`ebb up: ${name} exited (${signal ?? `code ${code}`})${flags.restart ? '' : ' and is not restarted (--no-restart)'}`);
        });
        child.start();
        return child;
      };
      const workers = modes.map((mode, i) =>
        supervise(`${mode}-${i}`, ['worker', '--model', model, '--mode', mode, '--discovery', discovery, ...engine, ...mocker, ...adminToken], 'worker_ready', (r) => String(r.system_url), 'ebb-worker', 'loading_announced'),
      );
      const overlapWeight = flags.kvOverlapWeight === undefined ? [] : ['--kv-overlap-weight', String(flags.kvOverlapWeight)];
      const cors = flags.corsOrigin.flatMap((o) => ['--cors-origin', o]);
      const queue = [...(flags.queueTimeout === undefined ? [] : ['--queue-timeout', String(flags.queueTimeout)]), ...(flags.queueDepth === undefined ? [] : ['--queue-depth', String(flags.queueDepth)])];
      // Nothing balances load onto `ebb up`'s frontend: no shutdown grace to wait out.
      const frontendArgs = ['frontend', '--host', flags.host, '--port', String(flags.port), '--admin-host', flags.adminHost, ...adminPort, '--discovery', discovery, '--shutdown-grace-ms', '0', '--processes', String(flags.processes), '--router', flags.router, ...overlapWeight, ...queue, ...cors, ...adminToken];
      /** Started once every worker is registered as loading (or said why not): see below. */
      let frontend: Supervised | undefined;
      const all = () => (frontend === undefined ? workers : [...workers, frontend]);

      let stopping: Promise<void> | undefined;
      const stop = async (code: number, why: string) => {
        // Workers drain first, while the frontend still relays their last tokens; then the frontend.
        await Promise.all(workers.map((w) => w.stop()));
        await frontend?.stop();
        if (ownDiscovery) rmSync(fileURLToPath(discovery), { recursive: true, force: true });
        if (flags.metricsSdFile !== undefined) rmSync(flags.metricsSdFile, { force: true });
        // A second signal took over: it says how this ended, and exits 130.
        if (signals > 1) return;
        removeUpState(name, process.pid);
        say(`ebb up: stopped (${why})`);
        process.exit(code);
      };
      let signals = 0;
      const killAll = (why: string) => {
        for (const c of all()) c.kill();
        removeUpState(name, process.pid);
        say(`ebb up: ${why}`);
        process.exit(130);
      };
      const onSignal = (signal: NodeJS.Signals) => {
        if (++signals > 2) killAll('third signal, killed everything');
        if (signals > 1) {
          // Forced, yet no stream is cut silently: the frontend ends each with an error event first.
          say('ebb up: second signal: stopping now; open streams end with an error event (a third signal kills everything at once)');
          void (frontend?.interrupt(FORCED_STOP_BOUND_MS) ?? Promise.resolve()).then(() => killAll('second signal, stopped everything'));
          return;
        }
        say(`ebb up: ${signal}: draining the workers, then stopping the frontend`);
        stopping ??= stop(0, 'workers drained, frontend closed');
      };
      process.on('SIGINT', onSignal);
      process.on('SIGTERM', onSignal);
      // Started over IPC (a test, a supervisor) that went away without a word: stop as on SIGTERM,
      // as the components do when `ebb up` goes; nobody reads its output any more.
      const parentGone = () => {
        for (const out of [process.stdout, process.stderr]) out.on('error', () => undefined);
        onSignal('SIGTERM');
      };
      process.once('disconnect', parentGone);
      if (process.send !== undefined && !process.connected) parentGone();

      try {
        // The frontend starts once every worker registered as loading (or said why it did not, or
        // exited): a request it takes from its first moment finds its model coming, and waits in the
        // queue for it, instead of finding no such model while the engines load.
        await Promise.all(workers.map((w) => w.firstEvent('loading_announced').catch(() => undefined)));
        if (stopping !== undefined) return;
        frontend = supervise('frontend', frontendArgs, 'frontend_ready', (r) => String(r.url), 'ebb-frontend');
        const readies = await Promise.all(all().map((c) => c.firstReady));
        const front = readies.at(-1) as { url: string; admin_url?: string };
        const lines = [
          '',
          `ebb is up (discovery ${discovery})`,
          `  Fleet name:   ${name}   (the operator commands' --fleet ${name} when several \`ebb up\` run)`,
          `  OpenAI API:   ${front.url}/v1   (model "${model}")`,
          `  Dashboard:    ${front.admin_url ?? '-'}/   (live fleet view: drain and resume from the browser)`,
          `  Fleet admin:  ${front.admin_url ?? '-'}/workers   (ebb workers, ebb drain ID --wait: they find this fleet)`,
          ...readies.slice(0, -1).map((w) => `  ${String(w.mode)} worker ${String(w.worker_id)}: admin ${String(w.system_url)}   (curl -X POST ${String(w.system_url)}/engine/drain)`),
          ...(flags.metricsSdFile !== undefined ? [`  Prometheus targets: ${flags.metricsSdFile} (file_sd_configs)`] : []),
          `  Ctrl-C drains the workers and stops everything.${flags.restart ? ' A component that exits on its own is restarted.' : ''}`,
          '',
        ];
        // The operator commands without --frontend/--discovery find this fleet through it (before the banner says so).
        writeUpState({ name, pid: process.pid, discovery, frontend_url: front.url, admin_url: front.admin_url });
        for (const line of lines) say(line);
      } catch (err) {
        say(`ebb up: ${(err as Error).message}`);
        stopping ??= stop(1, 'a component could not start');
      }
    });
}
