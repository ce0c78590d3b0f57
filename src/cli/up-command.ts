import { Command, Option } from 'commander';
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { temporaryDiscoveryUrl } from '../discovery/connect.js';
import { intOption } from './options.js';
import { servedModelName } from './llama-cpp-flags.js';

interface UpFlags {
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
  host: string;
  port: number;
  discovery?: string;
  mockerTtftMs?: number;
  mockerItlMs?: number;
}

const CLI = fileURLToPath(new URL('./main.js', import.meta.url));

interface Child {
  name: string;
  proc: ChildProcess;
  ready: Promise<Record<string, unknown>>;
}

/** Starts one ebb component as a child process; resolves `ready` on its ready log line. */
function startChild(name: string, args: string[], readyEvent: string): Child {
  // Own process group: a terminal's Ctrl-C reaches only `ebb up`, which stops children in order.
  // The IPC channel tells a child when `ebb up` died without stopping it (the child then drains).
  const proc = spawn(process.execPath, [CLI, ...args], { stdio: ['ignore', 'pipe', 'inherit', 'ipc'], detached: true });
  const ready = new Promise<Record<string, unknown>>((resolve, reject) => {
    createInterface({ input: proc.stdout! }).on('line', (line) => {
      process.stdout.write(line + '\n');
      try {
        const parsed = JSON.parse(line) as Record<string, unknown>;
        if (parsed.event === readyEvent) resolve(parsed);
      } catch {
        /* not a log line */
      }
    });
    proc.once('exit', (code) => reject(new Error(`${name} exited with code ${code} before it was ready`)));
  });
  return { name, proc, ready };
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
    .option('--host <addr>', 'frontend bind address', '127.0.0.1')
    .option('--port <n>', 'frontend port', intOption(0), 8000)
    .option('--discovery <url>', 'discovery URL (default: a fresh temporary directory)')
    .option('--mocker-ttft-ms <n>', 'mocker base time to first token', intOption(0))
    .option('--mocker-itl-ms <n>', 'mocker inter-token latency', intOption(0))
    .action(async (flags: UpFlags) => {
      const discovery = flags.discovery ?? temporaryDiscoveryUrl();
      const mocker: string[] = [];
      if (flags.mockerTtftMs !== undefined) mocker.push('--mocker-ttft-ms', String(flags.mockerTtftMs));
      if (flags.mockerItlMs !== undefined) mocker.push('--mocker-itl-ms', String(flags.mockerItlMs));
      const model = servedModelName(flags, 'ebb-mock');
      const engine = ['--engine', flags.engine, ...llamaCppArgs(flags)];
      const disaggregated = flags.prefill + flags.decode > 0;
      if (disaggregated && (flags.prefill === 0 || flags.decode === 0)) throw new Error('disaggregated serving needs at least one --prefill and one --decode worker');
      const modes = [
        ...Array<string>(flags.workers ?? (disaggregated ? 0 : 2)).fill('aggregated'),
        ...Array<string>(flags.prefill).fill('prefill'),
        ...Array<string>(flags.decode).fill('decode'),
      ];
      if (modes.length === 0) throw new Error('nothing to run: --workers 0 and no --prefill/--decode');
      const workers = modes.map((mode, i) =>
        startChild(`${mode}-${i}`, ['worker', '--model', model, '--mode', mode, '--discovery', discovery, ...engine, ...mocker], 'worker_ready'),
      );
      const frontend = startChild('frontend', ['frontend', '--host', flags.host, '--port', String(flags.port), '--discovery', discovery], 'frontend_ready');
      const all = [...workers, frontend];

      let stopping: Promise<void> | undefined;
      const stop = async (code: number) => {
        // Workers drain first, while the frontend still relays their last tokens; then the frontend.
        const exits = (children: Child[]) =>
          Promise.all(children.map((c) => (c.proc.exitCode === null && c.proc.signalCode === null ? once(c.proc, 'exit') : Promise.resolve())));
        for (const w of workers) w.proc.kill('SIGTERM');
        await exits(workers);
        frontend.proc.kill('SIGTERM');
        await exits([frontend]);
        process.exit(code);
      };
      let signals = 0;
      const onSignal = () => {
        if (++signals > 1) {
          for (const c of all) c.proc.kill('SIGKILL');
          process.exit(130);
        }
        stopping ??= stop(0);
      };
      process.on('SIGINT', onSignal);
      process.on('SIGTERM', onSignal);

      try {
        const readies = await Promise.all(all.map((c) => c.ready));
        const front = readies.at(-1) as { url: string; admin_url?: string };
        const lines = [
          '',
          `ebb is up (discovery ${discovery})`,
          `  OpenAI API:   ${front.url}/v1   (model "${model}")`,
          `  Fleet admin:  ${front.admin_url ?? '-'}/workers   (ebb workers --frontend ${front.admin_url ?? ''})`,
          ...readies.slice(0, -1).map((w) => `  ${String(w.mode)} worker ${String(w.worker_id)}: admin ${String(w.system_url)}   (curl -X POST ${String(w.system_url)}/engine/drain)`),
          '  Ctrl-C drains the workers and stops everything.',
          '',
        ];
        process.stderr.write(lines.join('\n') + '\n');
      } catch (err) {
        process.stderr.write(`ebb up: ${(err as Error).message}\n`);
        stopping ??= stop(1);
      }
    });
}
