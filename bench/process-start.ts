/**
 * Process start cost: the CPU (user + system) an ebb process spends from exec to ready, averaged over
 * `--runs` starts (default 10), for each program given, side by side:
 * - worker: `ebb worker` (mocker) to its `worker_ready` line;
 * - frontend: `ebb frontend` to `frontend_ready`;
 * - cli: `ebb workers --discovery` (an operator command), exec to exit.
 * A worker's start is paid on every scale-up and restart, an operator command's on every call (and
 * the test suite starts about 330 servers and 90 commands). Linux only: reads /proc and bash's `time`.
 *
 *   node dist/bench/process-start.js [--runs 10] [--programs dist/bin/ebb.js,dist/src/cli/main.js]
 */
import { execFileSync, spawn } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { createInterface } from 'node:readline';
import { arg } from './cli-arg.js';
import { procCpuMs } from './proc-cpu.js';

const runs = Number(arg('runs', '10'));
const programs = arg('programs', 'dist/bin/ebb.js,dist/src/cli/main.js').split(',').map((p) => resolve(p));

/** CPU to the ready line, read from /proc at that moment; then SIGTERM and wait for the exit. */
async function toReady(program: string, args: string[], readyEvent: string): Promise<number> {
  const proc = spawn(process.execPath, [program, ...args], { stdio: ['ignore', 'pipe', 'inherit'], env: { ...process.env, EBB_LOG_FORMAT: 'json' } });
  const exited = new Promise((r) => proc.once('exit', r));
  let ms = NaN;
  for await (const line of createInterface({ input: proc.stdout })) {
    if (line.includes(`"event":"${readyEvent}"`)) {
      ms = procCpuMs(proc.pid!) ?? NaN;
      proc.kill('SIGTERM');
    }
  }
  await exited;
  if (Number.isNaN(ms)) throw new Error(`${program} ${args[0]}: no ${readyEvent} line, or no /proc/${proc.pid}/stat to read at it`);
  return ms;
}

/** CPU of a command from exec to exit, as bash's `time` reports it for its child. */
function wholeCommand(program: string, args: string[]): number {
  const out = execFileSync('bash', ['-c', `TIMEFORMAT='%3U %3S'; { time "$@" >/dev/null 2>&1; } 2>&1`, 'bash', process.execPath, program, ...args], { encoding: 'utf8' });
  const [user, sys] = out.trim().split(/\s+/).map(Number) as [number, number];
  return (user + sys) * 1000;
}

const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
const rows: Array<Record<string, string>> = [];
for (const program of programs) {
  const discovery = pathToFileURL(mkdtempSync(join(tmpdir(), 'ebb-start-'))).href;
  const worker: number[] = [];
  const frontend: number[] = [];
  const cli: number[] = [];
  for (let i = 0; i < runs; i++) {
    worker.push(await toReady(program, ['worker', '--port', '0', '--system-port', '0', '--model', 'm', '--discovery', discovery], 'worker_ready'));
    frontend.push(await toReady(program, ['frontend', '--port', '0', '--discovery', discovery], 'frontend_ready'));
    cli.push(wholeCommand(program, ['workers', '--discovery', discovery]));
  }
  rows.push({ program, worker_ms: mean(worker).toFixed(0), frontend_ms: mean(frontend).toFixed(0), cli_ms: mean(cli).toFixed(0) });
}
console.table(rows);
