/**
 * The dashboard's tenants (issue 48 item 4): each tenant's use against its limits, what remains and
 * the limit hits this frontend refused, from the same report as GET /tenants, in the page as served
 * and kept current by the fleet's event stream.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Browser, Page } from 'puppeteer-core';
import { browserSkipReason, launchBrowser, withScreenshot } from './helpers/browser.js';
import { frontendSeesWorkers, startFrontend, startWorker, tempDiscoveryUrl, type FrontendHandle, type WorkerHandle } from './helpers/processes.js';

/** Bound on one wait for the page; a broken page fails with a screenshot instead of hanging. */
const PAGE_WAIT_MS = 20_000;
const BUDGET = 1000;
/** A prompt the mocker counts as `words` tokens and the limits estimate at as many. */
const prompt = (words: number) => Array.from({ length: words }, () => 'ebb').join(' ');

interface TenantRow {
  tenant: string;
  usage: { requests_last_minute: number; tokens_today: number };
  remaining: Record<string, number>;
  hits: Record<string, number>;
}

describe('fleet dashboard: tenants\' limits, use and refusals, in headless chromium', { skip: browserSkipReason() }, () => {
  let w: WorkerHandle;
  let f: FrontendHandle;
  let adminUrl: string;
  let browser: Browser;
  let dir: string;
  let page: Page;

  before(async () => {
    const discovery = tempDiscoveryUrl();
    w = await startWorker(['--discovery', discovery, '--model', 'm1', '--mocker-itl-ms', '1', '--mocker-ttft-ms', '0']);
    const limits = join(mkdtempSync(join(tmpdir(), 'ebb-test-limits-')), 'limits.json');
    writeFileSync(limits, JSON.stringify({ acme: { requests_per_minute: 50, tokens_per_day: BUDGET }, beta: { concurrent_streams: 2 } }));
    f = await startFrontend(discovery, ['--limits-file', limits]);
    adminUrl = (await f.waitForEvent('admin_ready')).url as string;
    await frontendSeesWorkers(f, 1);
    ({ browser, dir } = await launchBrowser());
    page = await browser.newPage();
    page.setDefaultTimeout(PAGE_WAIT_MS);
  });

  after(async () => {
    await browser?.close().catch(() => undefined);
    await Promise.all([f?.stop(), w?.stop()]);
  });

  const shot = <T>(name: string, step: () => Promise<T>) => withScreenshot(page, dir, name, '#tenants', step);

  const complete = async (tenant: string, maxTokens: number) => {
    const res = await fetch(`${f.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-ebb-tenant': tenant }, body: JSON.stringify({ model: 'm1', prompt: prompt(20), max_tokens: maxTokens }) });
    return { status: res.status, body: (await res.json()) as { usage?: { total_tokens: number } } };
  };
  const report = async () => ((await (await fetch(`${adminUrl}/tenants`)).json()) as { tenants: TenantRow[] }).tenants;
  /** What the page shows for a tenant's limit: "used / limit" and "N left". */
  const cell = (tenant: string, field: string) =>
    page.$eval(`#tenants tr[data-tenant="${tenant}"] td[data-field="${field}"]`, (td) => ({ text: td.firstChild?.textContent ?? '', left: td.querySelector('.left')?.textContent ?? '', exhausted: td.getAttribute('data-exhausted') }));

  it('shows each tenant\'s use, what remains and the refusals as GET /tenants reports them, and follows them live', async () => {
    // Two answers (their unused reservations refunded) and one request larger than the whole budget, refused before it runs.
    const used: number[] = [];
    for (let i = 0; i < 2; i++) {
      const r = await complete('acme', 100);
      assert.equal(r.status, 200);
      used.push(r.body.usage!.total_tokens);
    }
    assert.equal((await complete('acme', BUDGET)).status, 429, 'a request that would cross the budget is refused');
    const spent = used[0]! + used[1]!;
    const acme = (await report()).find((t) => t.tenant === 'acme')!;
    assert.deepEqual([acme.usage.tokens_today, acme.remaining.tokens_per_day, acme.hits], [spent, BUDGET - spent, { tokens_per_day: 1 }], 'the report counts what the answers used');

    await shot('dashboard-tenants', async () => {
      await page.goto(`${adminUrl}/`);
      // The page as served (its embedded snapshot), before its stream has said anything.
      await page.waitForSelector('#tenants:not([hidden]) tr[data-tenant="acme"]');
      assert.deepEqual(await cell('acme', 'tokens_per_day'), { text: `${spent} / ${BUDGET}`, left: `${BUDGET - spent} left`, exhausted: 'false' });
      assert.deepEqual(await cell('acme', 'requests_per_minute'), { text: `${acme.usage.requests_last_minute} / 50`, left: `${50 - acme.usage.requests_last_minute} left`, exhausted: 'false' });
      assert.equal(await page.$eval('#tenants tr[data-tenant="acme"] td[data-field="hits"]', (td) => td.textContent), 'tokens_per_day 1');
      assert.equal(await page.$eval('#tenants tr[data-tenant="beta"] td[data-field="hits"]', (td) => td.textContent), 'none');
      assert.deepEqual(await cell('beta', 'concurrent_streams'), { text: '0 / 2', left: '2 left', exhausted: 'false' });
      assert.equal(await page.$eval('#tenants .store', (s) => s.textContent), 'counted in this frontend');

      // More use while the page is open: the stream's next tenants event shows it, with the new refusal.
      const third = await complete('acme', 100);
      assert.equal(third.status, 200);
      assert.equal((await complete('acme', BUDGET)).status, 429);
      const now = spent + third.body.usage!.total_tokens;
      await page.waitForFunction(
        (tokens, hits) => {
          const row = document.querySelector('#tenants tr[data-tenant="acme"]');
          return row?.querySelector('td[data-field="tokens_per_day"]')?.firstChild?.textContent === tokens && row.querySelector('td[data-field="hits"]')?.textContent === hits;
        },
        {},
        `${now} / ${BUDGET}`,
        'tokens_per_day 2',
      );
      const latest = (await report()).find((t) => t.tenant === 'acme')!;
      assert.deepEqual(await cell('acme', 'tokens_per_day'), { text: `${latest.usage.tokens_today} / ${BUDGET}`, left: `${latest.remaining.tokens_per_day} left`, exhausted: 'false' }, 'the page and GET /tenants agree');
    });
  });
});
