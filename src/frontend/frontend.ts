import type { Logger } from 'pino';
import { listen } from '../common/http-server.js';
import { connectDiscovery } from '../discovery/connect.js';
import type { Discovery, DiscoveryEvent } from '../discovery/discovery.js';
import { createFrontendMetrics } from './metrics.js';
import { createOpenAIServer } from './openai-server.js';
import { Upstream } from './upstream.js';
import { WorkerPool } from './worker-pool.js';

export interface FrontendOptions {
  host: string;
  port: number;
  discoveryUrl: string;
}

export interface RunningFrontend {
  url: string;
  pool: WorkerPool;
  discovery: Discovery;
  close(): Promise<void>;
}

export async function startFrontend(opts: FrontendOptions, log: Logger): Promise<RunningFrontend> {
  const discovery = await connectDiscovery(opts.discoveryUrl);
  const pool = new WorkerPool();
  const watch = await discovery.watch((event: DiscoveryEvent) => {
    pool.apply(event);
    if (event.type === 'reset') log.info({ event: 'discovery_reset', workers: event.records.map((r) => r.worker_id) }, `routing view: ${event.records.length} worker(s)`);
    else if (event.type === 'put') log.info({ event: 'worker_added', worker_id: event.record.worker_id, model: event.record.model }, `worker ${event.record.worker_id} joined`);
    else log.info({ event: 'worker_removed', worker_id: event.worker_id }, `worker ${event.worker_id} left`);
  });
  const metrics = createFrontendMetrics(pool);
  const upstream = new Upstream(pool, metrics);
  const app = createOpenAIServer({ pool, upstream, metrics, log });
  const url = await listen(app, opts.host, opts.port);
  return {
    url,
    pool,
    discovery,
    async close() {
      await app.close();
      await watch.close();
      await upstream.close();
      await discovery.close();
    },
  };
}
