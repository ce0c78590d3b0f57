import { existsSync, mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import puppeteer, { type Browser } from 'puppeteer-core';
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
