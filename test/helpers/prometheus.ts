/**
 * A real, throwaway Prometheus for tests (Debian's `prometheus`, which .ci/run installs with
 * promtool): loopback only, a fresh TSDB in a temporary directory, scraping the targets a test
 * names every second. Ready once its own /-/ready says so.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { freePort } from '../../src/engine/engine-process.js';
import { bounded } from './processes.js';
import { skipWithout } from './required-tool.js';

export function prometheusSkipReason(): string | undefined {
  return skipWithout(spawnSync('prometheus', ['--version']).status === 0, 'prometheus not installed: the dashboard-against-Prometheus test SKIPPED; apt-get install prometheus');
}

export interface PromSeries {
  metric: Record<string, string>;
  values: Array<[number, string]>;
}

export class Prometheus {
  private constructor(
    readonly url: string,
    private readonly proc: ChildProcess,
    private readonly dir: string,
    private readonly output: string[],
  ) {}

  /** Starts Prometheus scraping `jobs` (job name -> host:port targets serving /metrics) every second. */
  static async start(jobs: Record<string, string[]>): Promise<Prometheus> {
    const dir = mkdtempSync(join(tmpdir(), 'ebb-test-prometheus-'));
    const config = [
      'global:',
      '  scrape_interval: 1s',
      '  scrape_timeout: 900ms',
      '  evaluation_interval: 1s',
      'scrape_configs:',
      ...Object.entries(jobs).flatMap(([job, targets]) => [`  - job_name: ${job}`, '    static_configs:', `      - targets: [${targets.map((t) => JSON.stringify(t)).join(', ')}]`]),
      '',
    ].join('\n');
    writeFileSync(join(dir, 'prometheus.yml'), config);
    const port = await freePort();
    const proc = spawn('prometheus', [`--config.file=${join(dir, 'prometheus.yml')}`, `--storage.tsdb.path=${join(dir, 'data')}`, `--web.listen-address=127.0.0.1:${port}`], { stdio: ['ignore', 'pipe', 'pipe'] });
    const output: string[] = [];
    // Its own word that it serves queries.
    const ready = new Promise<void>((resolve) => {
      const seen = (d: string) => {
        output.push(d);
        if (output.join('').includes('Server is ready to receive web requests')) resolve();
      };
      proc.stdout!.setEncoding('utf8').on('data', seen);
      proc.stderr!.setEncoding('utf8').on('data', seen);
    });
    const p = new Prometheus(`http://127.0.0.1:${port}`, proc, dir, output);
    const exited = once(proc, 'exit').then(([code]) => {
      throw new Error(`prometheus exited (${code}) before it was ready: ${output.join('')}`);
    });
    exited.catch(() => undefined);
    await bounded(Promise.race([ready, exited]), `prometheus on ${p.url} to be ready: ${output.join('').slice(-2000)}`);
    return p;
  }

  /** An instant query's result (a vector). */
  async query(expr: string): Promise<Array<{ metric: Record<string, string>; value: [number, string] }>> {
    const res = await fetch(`${this.url}/api/v1/query?query=${encodeURIComponent(expr)}`);
    const body = (await res.json()) as { status: string; error?: string; data?: { result: Array<{ metric: Record<string, string>; value: [number, string] }> } };
    if (body.status !== 'success') throw new Error(`query ${expr}: ${body.error}`);
    return body.data!.result;
  }

  /** A range query's result (a matrix), as Grafana's time-series panels ask for it. */
  async queryRange(expr: string, startS: number, endS: number, stepS: number): Promise<PromSeries[]> {
    const res = await fetch(`${this.url}/api/v1/query_range?query=${encodeURIComponent(expr)}&start=${startS}&end=${endS}&step=${stepS}`);
    const body = (await res.json()) as { status: string; error?: string; data?: { result: PromSeries[] } };
    if (body.status !== 'success') throw new Error(`query_range ${expr}: ${body.error}`);
    return body.data!.result;
  }

  async stop(): Promise<void> {
    if (this.proc.exitCode === null && this.proc.signalCode === null) {
      this.proc.kill('SIGKILL');
      await once(this.proc, 'exit');
    }
    rmSync(this.dir, { recursive: true, force: true });
  }
}
