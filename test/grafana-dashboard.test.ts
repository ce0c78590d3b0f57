/**
 * The Grafana dashboard (deploy/grafana/ebb-fleet.json, issue 46 item 3) against a real
 * Prometheus that scraped a loaded fleet: every panel's every query, run as Grafana runs it (a
 * range query, its variables filled in), returns series with values. The Kubernetes monitoring
 * manifest provisions the same JSON.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { loadAll } from 'js-yaml';
import { bounded, frontendSeesWorkers, startFrontend, startWorker, tempDiscoveryUrl, type EbbProcess, type FrontendHandle, type WorkerHandle } from './helpers/processes.js';
import { call } from './helpers/http.js';
import { Prometheus, prometheusSkipReason } from './helpers/prometheus.js';
import { streamCompletion, type StreamOutcome } from './helpers/sse.js';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const DASHBOARD = join(ROOT, 'deploy', 'grafana', 'ebb-fleet.json');

interface Panel {
  type: string;
  title: string;
  id: number;
  datasource?: { uid: string };
  targets?: Array<{ expr: string; refId: string }>;
}
const dashboard = JSON.parse(readFileSync(DASHBOARD, 'utf8')) as { uid: string; panels: Panel[]; templating: { list: Array<{ name: string }> } };
const panels = dashboard.panels.filter((p) => p.type !== 'row');

/** A panel's query as Grafana sends it: every model, a rate window of five scrapes. */
const filled = (expr: string) => expr.replaceAll('$__rate_interval', '5s').replaceAll('$model', '.*');

describe('the Grafana dashboard', () => {
  it('is provisioned by the monitoring manifest as it is in deploy/grafana/; every panel queries the data source variable; ids unique', () => {
    const docs = loadAll(readFileSync(join(ROOT, 'deploy', 'kubernetes', 'monitoring.yaml'), 'utf8')) as Array<{ kind: string; metadata: { labels?: Record<string, string> }; data?: Record<string, string> }>;
    const map = docs.find((d) => d.kind === 'ConfigMap' && d.metadata.labels?.grafana_dashboard === '1');
    assert.ok(map, 'a ConfigMap the Grafana sidecar loads (label grafana_dashboard: "1")');
    assert.deepEqual(JSON.parse(map.data!['ebb-fleet.json']!), JSON.parse(readFileSync(DASHBOARD, 'utf8')), 'the manifest carries deploy/grafana/ebb-fleet.json whole');
    assert.ok(panels.length >= 20, `panels: ${panels.length}`);
    assert.equal(new Set(dashboard.panels.map((p) => p.id)).size, dashboard.panels.length, 'panel ids are unique');
    assert.deepEqual(dashboard.templating.list.map((v) => v.name), ['datasource', 'model']);
    for (const p of panels) {
      assert.equal(p.datasource?.uid, '${datasource}', `${p.title}: the data source variable`);
      assert.ok((p.targets ?? []).length > 0, `${p.title}: a query`);
    }
  });

  describe('against a real Prometheus scraping a loaded fleet', { skip: prometheusSkipReason() }, () => {
    const started: EbbProcess[] = [];
    let prometheus: Prometheus;
    let frontend: FrontendHandle;
    let adminUrl: string;
    let workers: WorkerHandle[];
    before(async () => {
      const discovery = tempDiscoveryUrl();
      const common = ['--discovery', discovery, '--model', 'm1', '--mocker-batch-slots', '2', '--mocker-itl-ms', '5', '--mocker-ttft-ms', '0'];
      workers = [await startWorker([...common, '--mocker-lora', 'tides-lora', '--mocker-lora-load-ms', '20']), await startWorker(common)];
      started.push(...workers);
      frontend = await startFrontend(discovery, ['--admin-port', '0', '--queue-depth', '4']);
      started.push(frontend);
      await frontendSeesWorkers(frontend, 2);
      adminUrl = (await frontend.waitForEvent('frontend_ready')).admin_url as string;
      const hostOf = (url: string) => new URL(url).host;
      prometheus = await Prometheus.start({ 'ebb-frontend': [hostOf(frontend.url)], 'ebb-worker': workers.map((w) => hostOf(w.systemUrl)) });
    });
    after(async () => {
      await Promise.all(started.map((p) => p.stop()));
      await prometheus?.stop();
    });

    /** Polls Prometheus (it has no event for a scrape) until `pred` holds of `expr`'s instant value; bounded. */
    async function scraped(expr: string, pred: (v: number) => boolean, what: string): Promise<void> {
      await bounded(
        (async () => {
          for (;;) {
            const [s] = await prometheus.query(expr);
            if (s !== undefined && pred(Number(s.value[1]))) return;
            await new Promise((resolve) => setTimeout(resolve, 250));
          }
        })(),
        `prometheus to scrape ${what} (${expr})`,
      );
    }

    it('every panel\'s queries return series with values', async () => {
      // Its first scrapes come seconds after its start (it batches target updates): the load starts once every target was scraped.
      await scraped('count(up == 1)', (v) => v === 3, 'every target');
      const startS = Date.now() / 1000 - 5;
      // Traffic by tier and tenant, streamed and collected, and an adapter's: four at a time, the fleet's four batch slots.
      const tiers = ['priority', 'default', 'flex'];
      const requests: Array<() => Promise<StreamOutcome | number>> = [
        ...Array.from({ length: 12 }, (_, i) => () => streamCompletion(frontend.url, { model: 'm1', max_tokens: 20, seed: i }, undefined, undefined, { 'x-ebb-service-tier': tiers[i % 3]!, 'x-ebb-tenant': `team-${i % 4}` })),
        ...Array.from({ length: 6 }, (_, i) => () => call('POST', `${frontend.url}/v1/chat/completions`, { model: 'm1', messages: [{ role: 'user', content: `question ${i}` }], max_tokens: 8 }).then((r) => r.status)),
        ...Array.from({ length: 2 }, () => () => streamCompletion(frontend.url, { model: 'tides-lora', max_tokens: 10 })),
      ];
      const outcomes: Array<StreamOutcome | number> = [];
      await Promise.all(Array.from({ length: 4 }, async () => {
        for (let next = requests.shift(); next !== undefined; next = requests.shift()) outcomes.push(await next());
      }));
      for (const o of outcomes) assert.ok(typeof o === 'number' ? o === 200 : o.error === undefined && o.status === 200, JSON.stringify(o));

      // Both workers drained: requests queue by tier, the full queue sheds, and a resume serves them.
      for (const w of workers) {
        assert.equal((await call('POST', `${adminUrl}/workers/${w.workerId}/drain`, { reason: 'dashboard test' })).status, 200);
        await w.waitForEvent('state_changed', (l) => l.to === 'drained');
      }
      const queued: Array<Promise<StreamOutcome>> = [];
      for (const tier of ['priority', 'default', 'flex', 'default']) {
        const mark = frontend.mark();
        queued.push(streamCompletion(frontend.url, { model: 'm1', max_tokens: 5 }, undefined, undefined, { 'x-ebb-service-tier': tier }));
        await frontend.waitForEvent('request_queued', (l) => l.tier === tier, { after: mark });
      }
      await scraped('sum(ebb_frontend_queue_depth)', (v) => v === 4, 'the four queued requests');
      const shed = await Promise.all([0, 1].map(() => call('POST', `${frontend.url}/v1/chat/completions`, { model: 'm1', messages: [{ role: 'user', content: 'x' }], max_tokens: 3 }, { 'x-ebb-service-tier': 'flex' })));
      assert.deepEqual(shed.map((r) => r.status), [429, 429]);
      for (const w of workers) assert.equal((await call('POST', `${adminUrl}/workers/${w.workerId}/resume`, {})).status, 200);
      for (const o of await Promise.all(queued)) assert.equal(o.error, undefined);

      // Everything the fleet counted is in Prometheus: its last scrape came after the last request.
      const own = (await fetch(`${frontend.url}/metrics`).then((r) => r.text())).split('\n').filter((l) => l.startsWith('ebb_frontend_model_requests_total{')).reduce((n, l) => n + Number(l.slice(l.lastIndexOf(' ') + 1)), 0);
      await scraped('sum(ebb_frontend_model_requests_total)', (v) => v === own, `the frontend's ${own} requests`);
      await scraped('sum(ebb_frontend_queue_depth) or vector(0)', (v) => v === 0, 'the empty queue');
      // Two scrapes of every target after the load: a rate() of a series born during it has two samples.
      const doneS = Date.now() / 1000;
      await scraped('min(timestamp(up))', (v) => v > doneS + 1.2, 'two scrapes of every target after the load');

      const endS = Date.now() / 1000;
      const empty: string[] = [];
      for (const p of panels)
        for (const t of p.targets!) {
          const series = await prometheus.queryRange(filled(t.expr), startS, endS, 1);
          const values = series.flatMap((s) => s.values.map(([, v]) => Number(v)).filter((v) => Number.isFinite(v)));
          if (series.length === 0 || values.length === 0) empty.push(`${p.title} [${t.refId}] ${t.expr}: ${series.length} series, ${values.length} values`);
        }
      assert.deepEqual(empty, [], 'every panel query returns series with values');
    });
  });
});
