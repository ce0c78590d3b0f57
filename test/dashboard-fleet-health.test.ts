/**
 * The fleet dashboard under overload and failure (issue 46 item 4), in headless chromium against
 * real workers and a frontend: queued requests split by tier, the queue's 429 sheds counted as
 * errors, a LoRA adapter's row and its drain control, a worker's crash (SIGKILL) and its restart
 * (the same id, a new process) in the audit trail.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import type { Browser, Page } from 'puppeteer-core';
import { browserSkipReason, launchBrowser, withScreenshot } from './helpers/browser.js';
import { call } from './helpers/http.js';
import { bounded, frontendSeesWorkers, spawnEbb, startFrontend, startWorker, tempDiscoveryUrl, workerReady, type EbbProcess, type FrontendHandle, type WorkerHandle } from './helpers/processes.js';
import { streamCompletion, type StreamOutcome } from './helpers/sse.js';

const PAGE_WAIT_MS = 20_000;

describe('fleet dashboard: tiers, sheds, adapters, crashes', { skip: browserSkipReason() }, () => {
  const started: EbbProcess[] = [];
  let discovery: string;
  let withAdapter: WorkerHandle;
  let crashing: WorkerHandle;
  let frontend: FrontendHandle;
  let adminUrl: string;
  let browser: Browser;
  let page: Page;
  let dir: string;
  const WORKER_ARGS = ['--model', 'm1', '--mocker-batch-slots', '2', '--mocker-itl-ms', '20', '--mocker-ttft-ms', '0'];

  before(async () => {
    discovery = tempDiscoveryUrl();
    withAdapter = await startWorker(['--discovery', discovery, ...WORKER_ARGS, '--mocker-lora', 'tides-lora', '--mocker-lora-load-ms', '50']);
    crashing = await startWorker(['--discovery', discovery, ...WORKER_ARGS, '--worker-id', 'w-crashes']);
    started.push(withAdapter, crashing);
    // Four waiting at most: a fifth (flex) is shed at once (429 queue_full).
    frontend = await startFrontend(discovery, ['--admin-port', '0', '--queue-depth', '4'], { EBB_ADMIN_TOKEN: undefined });
    started.push(frontend);
    await frontendSeesWorkers(frontend, 2);
    adminUrl = (await frontend.waitForEvent('frontend_ready')).admin_url as string;
    ({ browser, dir } = await launchBrowser());
    page = await browser.newPage();
    page.setDefaultTimeout(PAGE_WAIT_MS);
    await page.setViewport({ width: 1400, height: 900 });
    await page.goto(`${adminUrl}/`);
    await page.waitForFunction(() => document.querySelector('#conn')?.textContent === 'live');
  });

  after(async () => {
    await browser?.close().catch(() => undefined);
    await Promise.all(started.map((p) => p.stop()));
  });

  const shot = <T>(name: string, step: () => Promise<T>) => withScreenshot(page, dir, name, 'body', step);

  it('shows the queued requests by tier, and the 429 sheds as errors', async () => {
    // Both workers drained: requests wait for one to resume (a drained worker may), by tier; past four waiting, flex is shed (429).
    for (const w of [withAdapter, crashing]) {
      assert.equal((await call('POST', `${adminUrl}/workers/${w.workerId}/drain`, { reason: 'capacity test' })).status, 200);
      await w.waitForEvent('state_changed', (l) => l.to === 'drained');
    }
    const waiting: Array<Promise<StreamOutcome>> = [];
    for (const tier of ['priority', 'default', 'default', 'flex']) {
      const mark = frontend.mark();
      waiting.push(streamCompletion(frontend.url, { model: 'm1', max_tokens: 3 }, undefined, undefined, { 'x-ebb-service-tier': tier }));
      await frontend.waitForEvent('request_queued', (l) => l.tier === tier, { after: mark });
    }
    const shed = await Promise.all([0, 1].map(() => call('POST', `${frontend.url}/v1/chat/completions`, { model: 'm1', messages: [{ role: 'user', content: 'x' }], max_tokens: 3 }, { 'x-ebb-service-tier': 'flex' })));
    assert.deepEqual(shed.map((r) => r.status), [429, 429], 'the queue is full: shed');
    await shot('dashboard-tiers', async () => {
      const section = 'section[data-model="m1"]';
      await page.waitForFunction((s: string) => /^4 queued · priority 1 · default 2 · flex 1$/.test(document.querySelector(`${s} [data-field=queued]`)?.textContent ?? ''), { polling: 200 }, section);
      assert.equal(await page.$eval(`${section} [data-field=queued]`, (e) => (e as HTMLElement).hidden), false);
      // The sheds are errors (429: the fleet could not serve them), said as sheds, and errors stand out (bold).
      // Read in one step: the section is redrawn each second.
      await page.waitForFunction((s: string) => {
        const e = document.querySelector(`${s} [data-field=errors]`);
        return e !== null && /^2 errors \(2 shed 429\)$/.test(e.textContent ?? '') && getComputedStyle(e).fontWeight === '600';
      }, { polling: 200 }, section);
    });
    for (const w of [withAdapter, crashing]) assert.equal((await call('POST', `${adminUrl}/workers/${w.workerId}/resume`, {})).status, 200);
    for (const r of await Promise.all(waiting)) assert.equal(r.error, undefined, 'every queued request was served once a worker resumed');
    await shot('dashboard-queue-empty', () => page.waitForFunction(() => (document.querySelector('section[data-model="m1"] [data-field=queued]') as HTMLElement).hidden, { polling: 200 }));
  });

  it("shows a worker's LoRA adapter as a row, and drains it from there", async () => {
    const answer = await call('POST', `${frontend.url}/v1/chat/completions`, { model: 'tides-lora', messages: [{ role: 'user', content: 'hi' }], max_tokens: 3 });
    assert.equal(answer.status, 200, JSON.stringify(answer.body));
    const row = `tr[data-adapter-of="${withAdapter.workerId}"][data-adapter="tides-lora"]`;
    await shot('dashboard-adapter', async () => {
      await page.waitForFunction((sel: string) => (document.querySelector(sel) as HTMLElement | null)?.dataset.state === 'serving', { polling: 200 }, row);
      assert.equal(await page.$$eval('tr[data-worker-id]', (r) => r.length), 2, 'adapter rows are not worker rows');
      await page.type(`${row} input[data-input=adapter-reason]`, 'retire the adapter');
      await page.click(`${row} button[data-action=drain-adapter]`);
      await page.waitForFunction((id: string) => new RegExp(`^drain of adapter tides-lora on ${id}: (draining|unloaded)$`).test(document.querySelector('#message')?.textContent ?? ''), { polling: 'mutation' }, withAdapter.workerId);
      // Idle, it unloads: its row goes.
      await page.waitForFunction((sel: string) => document.querySelector(sel) === null, { polling: 200 }, row);
    });
    const status = await call('GET', `${withAdapter.systemUrl}/engine/status`);
    const adapter = (status.body.adapters as Array<{ name: string; state: string }>).find((a) => a.name === 'tides-lora');
    assert.equal(adapter?.state, 'unloaded', 'the worker unloaded it');
    await withAdapter.waitForLog((l) => JSON.stringify(l).includes('retire the adapter'), 'the drain reason reached the worker');
  });

  it("puts a worker's crash (SIGKILL) and its restart (the same id, a new process) in the audit trail", async () => {
    crashing.signal('SIGKILL');
    // A crash stands out (red); read with its text in one step, as the list may be redrawn between two reads.
    await shot('dashboard-crash', () =>
      page.waitForFunction(() => [...document.querySelectorAll('#audit-list li[data-what=crash]')].some((li) => /w-crashes +crash by frontend: unreachable while serving/.test(li.textContent ?? '') && getComputedStyle(li).color === 'rgb(170, 51, 51)'), { polling: 'mutation' }),
    );
    const again = await workerReady(spawnEbb(['worker', '--port', '0', '--system-port', '0', '--discovery', discovery, ...WORKER_ARGS, '--worker-id', 'w-crashes'], 'worker'));
    started.push(again);
    // Its first status is the restart: still loading when the frontend reached it first (a loaded machine), else serving.
    await shot('dashboard-restart', () =>
      page.waitForFunction(() => [...document.querySelectorAll('#audit-list li[data-what=restart]')].some((li) => /w-crashes +restart by frontend: (loading|serving) again \(a new process/.test(li.textContent ?? '')), { polling: 'mutation' }),
    );
  });
});
