import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Browser, Page } from 'puppeteer-core';
import { browserSkipReason, launchBrowser, withScreenshot } from './helpers/browser.js';
import { call } from './helpers/http.js';
import { spawnEbb, START_BOUND_MS, startFrontend, startWorker, tempDiscoveryUrl, type EbbProcess, type LogLine } from './helpers/processes.js';
import { streamCompletion, type StreamOutcome } from './helpers/sse.js';

const WORKERS = 3;
const MAX_TOKENS = 40;
/** Bound on one wait for the page; a broken page fails with a screenshot instead of hanging. */
const PAGE_WAIT_MS = 20_000;
/** The width at which a drain's longer row clipped the resume button. */
const VIEWPORT = { width: 1400, height: 900 };
/** Long and without a break opportunity, as a rollout may name its drains (it widens its column), then words. */
const LONG_REASON = 'browser_test_rollout_2026_12_03_canary_batch_7_of_12_node_pool_gpu_a100 then the canary batch';
/** HH:MM:SS, the page's one format for a point in time. */
const CLOCK = /^\d\d:\d\d:\d\d\b/;

describe('fleet dashboard in headless chromium, against ebb up', { skip: browserSkipReason() }, () => {
  let up: EbbProcess;
  let browser: Browser;
  let dir: string;
  let page: Page;
  let adminUrl: string;
  let apiUrl: string;
  const workerIds: string[] = [];

  before(async () => {
    // 20 ms per token, 40 tokens: a request runs about 0.8 s, so a drain under load is seen draining.
    up = spawnEbb(['up', '--port', '0', '--workers', String(WORKERS), '--model', 'm1', '--mocker-itl-ms', '20'], 'ebb up', { EBB_ADMIN_TOKEN: undefined });
    const ready = await up.waitForEvent('frontend_ready', undefined, { boundMs: START_BOUND_MS });
    adminUrl = ready.admin_url as string;
    apiUrl = ready.url as string;
    for (let i = 0; workerIds.length < WORKERS; i++) {
      const w: LogLine = await up.waitForLog((l) => l.event === 'worker_ready' && !workerIds.includes(l.worker_id as string), `worker_ready #${i + 1}`, { boundMs: START_BOUND_MS });
      workerIds.push(w.worker_id as string);
    }
    // A drain and a resume before any page is open: the page must still show them (history).
    const early = workerIds[WORKERS - 1] as string;
    assert.equal((await call('POST', `${adminUrl}/workers/${early}/drain`, { reason: 'before the page' })).status, 200);
    assert.equal((await call('POST', `${adminUrl}/workers/${early}/resume`, {})).status, 200);
    ({ browser, dir } = await launchBrowser());
    page = await browser.newPage();
    page.setDefaultTimeout(PAGE_WAIT_MS);
    await page.setViewport(VIEWPORT);
  });

  after(async () => {
    await browser?.close().catch(() => undefined);
    await up?.terminate(15_000);
  });

  const shot = <T>(name: string, step: () => Promise<T>) => withScreenshot(page, dir, name, '#models', step);

  it('paints the fleet without its event stream (a plain screenshot), then shows the minute before it opened; favicon', async () => {
    const favicon = await fetch(`${adminUrl}/favicon.ico`);
    assert.equal(favicon.status, 200, 'a favicon, not a 404');
    assert.match(favicon.headers.get('content-type') ?? '', /^image\/svg\+xml/);
    await favicon.arrayBuffer();

    // Nothing but the page itself: the stream and /dashboard/info never answer, as for a screenshot taken at load.
    await page.setRequestInterception(true);
    const held = (req: { url(): string; abort(): Promise<void>; continue(): Promise<void> }) => void (/workers\/events|dashboard\/info/.test(req.url()) ? req.abort() : req.continue());
    page.on('request', held);
    try {
      await shot('dashboard-first-paint', async () => {
        await page.goto(`${adminUrl}/`, { waitUntil: 'load' });
        const rows = await page.$$eval('tr[data-worker-id]', (r) => r.map((e) => (e as HTMLElement).dataset.state));
        assert.deepEqual(rows, Array(WORKERS).fill('serving'), 'the first paint shows every worker');
        await page.screenshot({ path: join(dir, 'first-paint.png') });
      });
    } finally {
      page.off('request', held);
      await page.setRequestInterception(false);
    }

    await shot('dashboard-history', async () => {
      await page.goto(`${adminUrl}/`);
      await page.waitForFunction(() => document.querySelector('#conn')?.textContent === 'live');
      // The drain before the page opened is in the audit trail, in the page's one time format.
      await page.waitForFunction(() => /drain by .*\(before the page\)/.test(document.querySelector('#audit-list')?.textContent ?? ''), { polling: 'mutation' });
      const lines = await page.$$eval('#audit-list li', (li) => li.map((e) => e.textContent ?? ''));
      for (const line of lines) assert.match(line, CLOCK, `audit line in HH:MM:SS: ${line}`);
      // Each chart reaches back before the page opened (the workers' own in-flight history).
      await page.waitForFunction(
        () => [...document.querySelectorAll('canvas')].every((c) => Number((c as HTMLCanvasElement).dataset.oldestMs) > performance.now()),
        { polling: 200 },
      );
    });
  });

  it('shows every worker, drains one under traffic (draining -> drained), resumes it to serving', async () => {
    const outcomes: StreamOutcome[] = [];
    let stop = false;
    const loops = Array.from({ length: 6 }, async (_, i) => {
      while (!stop) outcomes.push(await streamCompletion(apiUrl, { model: 'm1', max_tokens: MAX_TOKENS, seed: i }));
    });
    try {
      await shot('dashboard-workers', async () => {
        await page.goto(`${adminUrl}/`);
        await page.waitForFunction((n: number) => document.querySelectorAll('tr[data-worker-id][data-state="serving"]').length === n, {}, WORKERS);
        const shown = await page.$$eval('tr[data-worker-id]', (rows) => rows.map((r) => (r as HTMLElement).dataset.workerId));
        assert.deepEqual([...shown].sort(), [...workerIds].sort(), 'the page lists every worker of ebb up');
        await page.waitForFunction(() => document.querySelector('#conn')?.textContent === 'live');
      });

      const target = workerIds[0] as string;
      const row = `tr[data-worker-id="${target}"]`;
      // Wait for traffic on the target, so its drain has requests to finish.
      await shot('dashboard-traffic', () =>
        page.waitForFunction((sel: string) => Number(document.querySelector(`${sel} [data-field=inflight]`)?.textContent) > 0, { polling: 'mutation' }, row),
      );

      // Every state the row shows, in order: a quick drain must not slip between two looks. While it
      // drains (the row at its widest), its resume button must be inside what the section shows, the
      // SINCE column not under the actions, the reason column wider than a word, and the hand-off
      // time (still to come) said as such.
      await page.evaluate((sel: string) => {
        const r = document.querySelector(sel) as HTMLElement;
        const seen: string[] = [r.dataset.state ?? ''];
        const w = window as unknown as { seenStates: string[]; resumeClipped: string[]; waitingTexts: string[] };
        w.seenStates = seen;
        w.resumeClipped = [];
        w.waitingTexts = [];
        const box = (field: string) => (r.querySelector(`[data-field=${field}]`) as HTMLElement).getBoundingClientRect();
        new MutationObserver(() => {
          if (seen.at(-1) !== r.dataset.state) seen.push(r.dataset.state ?? '');
          if (r.dataset.state !== 'draining') return;
          const b = (r.querySelector('button[data-action=resume]') as HTMLElement).getBoundingClientRect();
          const section = (r.closest('section') as HTMLElement).getBoundingClientRect();
          if (b.right > Math.min(section.right, window.innerWidth) || b.left < section.left) w.resumeClipped.push(`button ${b.left}-${b.right}, section ${section.left}-${section.right}`);
          if (box('since').right > box('actions').left + 0.5) w.resumeClipped.push(`SINCE ends at ${box('since').right}, under the actions from ${box('actions').left}`);
          if (box('reason').width < 100) w.resumeClipped.push(`the drain reason squeezed to ${box('reason').width} px`);
          const waiting = r.querySelector('[data-field=waiting]')?.textContent ?? '';
          if (waiting !== '' && w.waitingTexts.at(-1) !== waiting) w.waitingTexts.push(waiting);
        }).observe(r, { attributes: true, subtree: true, characterData: true, childList: true });
      }, row);

      await shot('dashboard-drain', async () => {
        await page.type(`${row} input[data-input=reason]`, LONG_REASON);
        await page.type(`${row} input[data-input=deadline]`, '10m');
        await page.click(`${row} button[data-action=drain]`);
        await page.waitForFunction((sel: string) => (document.querySelector(sel) as HTMLElement | null)?.dataset.state === 'drained', { polling: 'mutation' }, row);
        const seen = await page.evaluate(() => (window as unknown as { seenStates: string[] }).seenStates);
        assert.deepEqual(seen, ['serving', 'draining', 'drained'], 'the row went serving -> draining -> drained');
        assert.deepEqual(await page.evaluate(() => (window as unknown as { resumeClipped: string[] }).resumeClipped), [], `the draining row fits at ${VIEWPORT.width} px`);
        const waiting = (await page.evaluate(() => (window as unknown as { waitingTexts: string[] }).waitingTexts)).filter((t) => /in-flight/.test(t));
        assert.ok(waiting.length > 0, 'the row showed what the drain waited for');
        for (const t of waiting) assert.match(t, /\(hands off to other workers at \d\d:\d\d:\d\d, in \d+m\d\ds\)/, 'a hand-off still to come, and how far off');
        // Drained, its cached blocks are shown but not as routable capacity.
        assert.equal(await page.$eval(`${row} [data-field=kv]`, (e) => `${(e as HTMLElement).dataset.routable} ${getComputedStyle(e).textDecorationLine}`), 'false line-through');
        assert.equal(await page.$eval(`tr[data-worker-id="${workerIds[1]}"] [data-field=kv]`, (e) => (e as HTMLElement).dataset.routable), 'true', 'a serving worker\'s are');
        assert.equal(await page.$eval(`${row} [data-field=reason]`, (e) => e.textContent), LONG_REASON, 'the drain reason is shown');
        // The audit trail arrived through the stream: the drain, by the caller's address on this open loopback fleet.
        await page.waitForFunction((r: string) => (document.querySelector('#audit-list')?.textContent ?? '').includes(`: drained (${r})`), { polling: 'mutation' }, LONG_REASON);
        // The status line follows the worker the action was on, to its end.
        await page.waitForFunction((id: string) => new RegExp(`^drain of ${id}: drained since \\d\\d:\\d\\d:\\d\\d$`).test(document.querySelector('#message')?.textContent ?? ''), { polling: 'mutation' }, target);
      });

      await shot('dashboard-resume', async () => {
        await page.click(`${row} button[data-action=resume]`);
        await page.waitForFunction((sel: string) => (document.querySelector(sel) as HTMLElement | null)?.dataset.state === 'serving', { polling: 'mutation' }, row);
        const seen = await page.evaluate(() => (window as unknown as { seenStates: string[] }).seenStates);
        assert.deepEqual(seen, ['serving', 'draining', 'drained', 'serving']);
        await page.waitForFunction((id: string) => new RegExp(`^resume of ${id}: serving since `).test(document.querySelector('#message')?.textContent ?? ''), { polling: 'mutation' }, target);
        // Per model: the frontend's own minute of requests, errors and time to first token.
        await page.waitForFunction(() => /req\/s · 0 errors of [1-9]\d* \(60 s\) · TTFT p50 \d/.test(document.querySelector('section[data-model="m1"] [data-field=model-stats]')?.textContent ?? ''), { polling: 200 });
      });
    } finally {
      stop = true;
      await Promise.all(loops);
    }
    const failures = outcomes.filter((o) => o.status !== 200 || !o.done || o.tokens !== MAX_TOKENS || o.error);
    assert.deepEqual(failures, [], 'traffic through the drain and resume: every request completed with all its tokens');
    assert.ok(outcomes.length > 0);
  });

  it('"drain all of model" drains every serving worker of the model, after a confirmation', async () => {
    const dialogs: string[] = [];
    page.on('dialog', (d) => {
      dialogs.push(d.type());
      void (d.type() === 'prompt' ? d.accept('retire m1') : d.accept());
    });
    await shot('dashboard-drain-model', async () => {
      await page.waitForFunction((n: number) => document.querySelectorAll('tr[data-worker-id][data-state="serving"]').length === n, {}, WORKERS);
      await page.click('section[data-model="m1"] button[data-action=drain-model]');
      await page.waitForFunction((n: number) => document.querySelectorAll('tr[data-worker-id][data-state="drained"]').length === n, { polling: 'mutation' }, WORKERS);
      assert.deepEqual(dialogs, ['confirm', 'prompt']);
      const reasons = await page.$$eval('tr[data-worker-id] [data-field=reason]', (cells) => cells.map((c) => c.textContent));
      assert.deepEqual(reasons, Array(WORKERS).fill('retire m1'));
    });
  });
});

describe('fleet dashboard with an admin token', { skip: browserSkipReason() }, () => {
  const procs: EbbProcess[] = [];
  let browser: Browser;
  let dir: string;
  let page: Page;

  after(async () => {
    await browser?.close().catch(() => undefined);
    await Promise.all(procs.map((p) => p.stop()));
  });

  it('loads without the token but shows nothing until it has it (a wrong one refused), then drains with it as a bearer token (the audit names its owner)', async () => {
    const tokens = join(mkdtempSync(join(tmpdir(), 'ebb-test-token-')), 'admin-tokens');
    writeFileSync(tokens, 'dana:tok-dana\nops:tok-ops\n', { mode: 0o600 });
    const discovery = tempDiscoveryUrl();
    const w = await startWorker(['--discovery', discovery, '--admin-token-file', tokens], { EBB_ADMIN_TOKEN: undefined });
    procs.push(w);
    const fe = await startFrontend(discovery, ['--admin-port', '0', '--admin-token-file', tokens], { EBB_ADMIN_TOKEN: undefined });
    procs.push(fe);
    const adminUrl = (await fe.waitForEvent('frontend_ready')).admin_url as string;
    ({ browser, dir } = await launchBrowser());
    page = await browser.newPage();
    page.setDefaultTimeout(PAGE_WAIT_MS);
    const row = `tr[data-worker-id="${w.workerId}"]`;
    const shoot = async (name: string, err: unknown) => {
      const path = join(dir, `${name}.png`);
      const saved = await page.screenshot({ path, fullPage: true }).then(() => true, () => false);
      return new assert.AssertionError({ message: `${name}: ${(err as Error).message}\nscreenshot: ${saved ? path : '(could not be taken)'}` });
    };
    try {
      await page.goto(`${adminUrl}/`);
      // The page loads; the fleet is the token holders' to read (issue 49).
      await page.waitForFunction(() => document.querySelector('#conn')?.textContent === 'admin token needed');
      assert.equal(await page.$eval('#auth', (e) => (e as HTMLElement).hidden), false, 'the page asks for the token');
      assert.equal(await page.$$eval('tr[data-worker-id]', (rows) => rows.length), 0, 'no worker shown without the token');
      assert.ok(!(await page.content()).includes(w.workerId), 'nor anywhere in the page');
      await page.type('#token', 'tok-wrong');
      await page.click('#token-save');
      await page.waitForFunction(() => document.querySelector('#conn')?.textContent === 'admin token refused');
      assert.equal(await page.$$eval('tr[data-worker-id]', (rows) => rows.length), 0, 'no worker shown with a wrong token');

      await page.$eval('#token', (e) => { (e as HTMLInputElement).value = ''; });
      await page.type('#token', 'tok-dana');
      await page.click('#token-save');
      await page.waitForSelector(`${row}[data-state="serving"]`);
      // The buttons stay where they are whatever the connection status says (a header that wrapped
      // while "connecting…" moved them as the stream opened, and a click landed beside its button).
      const drainTop = (conn: string) =>
        page.evaluate((text, sel) => {
          document.querySelector('#conn')!.textContent = text;
          return document.querySelector(sel)!.getBoundingClientRect().top;
        }, conn, `${row} button[data-action=drain]`);
      assert.equal(await drainTop('as of 23:59:59, connecting…'), await drainTop('live'));
      await page.waitForFunction(() => document.querySelector('#conn')?.className === 'live');
      await page.type(`${row} input[data-input=reason]`, 'with a token');
      await page.click(`${row} button[data-action=drain]`);
      await page.waitForSelector(`${row}[data-state="drained"]`);
      await page.waitForFunction(() => /drain by dana: \w+ \(with a token\)/.test(document.querySelector('#audit-list')?.textContent ?? ''), { polling: 'mutation' });
    } catch (err) {
      throw await shoot('dashboard-token', err);
    }
  });
});
