import { existsSync, mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import assert from 'node:assert/strict';
import puppeteer, { type Browser, type Page } from 'puppeteer-core';
import { skipWithout } from './required-tool.js';

/** Debian's chromium (`apt-get install chromium`); CHROMIUM_BIN overrides. */
export const CHROMIUM = process.env.CHROMIUM_BIN ?? '/usr/bin/chromium';


/**
 * For `describe('…', { skip: browserSkipReason() }, …)`: undefined when chromium is installed.
 * Missing, it prints a banner and skips, except under CI=true, where it throws (as etcd does).
 */
export function browserSkipReason(): string | undefined {
  return skipWithout(existsSync(CHROMIUM), `chromium not found at ${CHROMIUM}: browser tests SKIPPED; apt-get install chromium (or set CHROMIUM_BIN)`);
}

/** Headless chromium with a fresh profile, nothing reaching out to the network on its own. */
export async function launchBrowser(): Promise<{ browser: Browser; dir: string }> {
  const dir = mkdtempSync(join(tmpdir(), 'ebb-test-browser-'));
  const browser = await puppeteer.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: [
      '--headless',
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
      `--user-data-dir=${join(dir, 'profile')}`,
    ],
  });
  return { browser, dir };
}

/**
 * Runs `step`; on failure saves a screenshot of `page` into `dir` and names it in the assertion
 * message, with the text of `selector` (what the page showed where the test looked).
 */
export async function withScreenshot<T>(page: Page, dir: string, name: string, selector: string, step: () => Promise<T>): Promise<T> {
  try {
    return await step();
  } catch (err) {
    const path = join(dir, `${name}.png`);
    const saved = await page.screenshot({ path, fullPage: true }).then(
      () => true,
      () => false,
    );
    const text = await page.evaluate((sel) => document.querySelector(sel)?.textContent ?? '', selector).catch(() => '');
    throw new assert.AssertionError({ message: `${name}: ${(err as Error).message}\nscreenshot: ${saved ? path : '(could not be taken)'}\n${selector}: ${text.slice(0, 2000)}` });
  }
}
