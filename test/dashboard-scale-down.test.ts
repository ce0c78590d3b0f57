import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import type { Browser, Page } from 'puppeteer-core';
import { browserSkipReason, launchBrowser } from './helpers/browser.js';
import { openLineStream, type OpenStream } from './helpers/http.js';
import { spawnEbb, type EbbProcess, type LogLine } from './helpers/processes.js';

const WORKERS = 3;

describe('fleet dashboard: the scale-down control, in headless chromium against ebb up', { skip: browserSkipReason() }, () => {
  let up: EbbProcess;
  let browser: Browser;
  let page: Page;
  let adminUrl: string;
  const workerIds: string[] = [];
  const requestUrls = new Map<string, string>();
  const streams: OpenStream[] = [];

  before(async () => {
    up = spawnEbb(['up', '--port', '0', '--workers', String(WORKERS), '--model', 'm1', '--mocker-itl-ms', '20'], 'ebb up', { EBB_ADMIN_TOKEN: undefined });
    adminUrl = (await up.waitForEvent('frontend_ready')).admin_url as string;
    for (let i = 0; workerIds.length < WORKERS; i++) {
      const w: LogLine = await up.waitForLog((l) => l.event === 'worker_ready' && !workerIds.includes(l.worker_id as string), `worker_ready #${i + 1}`);
      workerIds.push(w.worker_id as string);
      requestUrls.set(w.worker_id as string, w.request_url as string);
    }
    ({ browser } = await launchBrowser());
    page = await browser.newPage();
    page.setDefaultTimeout(20_000);
  });

  after(async () => {
    for (const st of streams) st.abort();
    await browser?.close().catch(() => undefined);
    await up?.terminate(15_000);
  });

  it('shows the victims and why before it drains, then drains exactly those, even once the fleet ranks otherwise', async () => {
    const dialogs: string[] = [];
    page.on('dialog', (d) => {
      dialogs.push(d.message());
      // While the operator reads: one of the victims shown takes a stream, so a fresh ranking would
      // put it last and take the third worker instead. The confirm drains the ones shown.
      const shown = workerIds.find((id) => d.message().includes(`${id}: idle`)) as string;
      void (async () => {
        const st = await openLineStream(`${requestUrls.get(shown)}/generate`, { model: 'm1', prompt: 'p', max_tokens: 40, stream: true });
        streams.push(st);
        await st.first;
        await d.accept();
      })();
    });
    await page.goto(`${adminUrl}/`);
    await page.waitForFunction((n: number) => document.querySelectorAll('tr[data-worker-id][data-state="serving"]').length === n, {}, WORKERS);
    const section = 'section[data-model="m1"]';
    await page.click(`${section} input[data-input=scale-count]`, { count: 3 });
    await page.type(`${section} input[data-input=scale-count]`, '2');
    await page.click(`${section} button[data-action=scale-down]`);
    await page.waitForFunction(() => document.querySelectorAll('tr[data-worker-id][data-state="drained"]').length === 2, { polling: 'mutation' });
    assert.equal(dialogs.length, 1, 'one confirmation');
    const victims = workerIds.filter((id) => (dialogs[0] as string).includes(`${id}: idle: nothing to wait for`));
    assert.equal(victims.length, 2, `the confirmation names two idle victims: ${dialogs[0]}`);
    const drained = await page.$$eval('tr[data-worker-id][data-state="drained"]', (rows) => rows.map((r) => (r as HTMLElement).dataset.workerId));
    assert.deepEqual([...drained].sort(), victims.sort(), 'the workers drained are the ones shown');
    // The status line follows the victims to their end, as the events move them (it used to stay at "draining").
    const line = `^scale-down of m1 by 2: (${victims.join('|')}) drained since \\d\\d:\\d\\d:\\d\\d; (${victims.join('|')}) drained since \\d\\d:\\d\\d:\\d\\d$`;
    await page.waitForFunction((re: string) => new RegExp(re).test(document.querySelector('#message')?.textContent ?? ''), { polling: 'mutation' }, line).catch(async (err: Error) => {
      assert.fail(`waited for the status line to match ${line}; it says "${await page.$eval('#message', (e) => e.textContent ?? '')}" (${err.message})`);
    });
    // One worker is left serving: the control is off (a scale-down never takes the last one).
    assert.equal(await page.$eval(`${section} button[data-action=scale-down]`, (b) => (b as HTMLButtonElement).disabled), true);
  });
});
