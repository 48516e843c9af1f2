/**
 * The live status page in a real browser (headless Chromium, driven by playwright-core): faults injected through
 * the gateway show up on the page as they settle (the funnel, failed-request rows with their outcome), with no
 * console or page error; the page fits a 375 px phone without horizontal scrolling, works from the keyboard, and
 * says "disconnected — retrying" when its event stream drops. Screenshots go to test-artifacts/.
 *
 * Needs Chromium (Debian: apt-get install chromium); skipped without it unless WAYBILL_REQUIRE_TOOLS=1.
 */
import { randomUUID } from 'node:crypto';
import { mkdirSync } from 'node:fs';
import { delimiter, join } from 'node:path';
import { chromium, type Browser, type ConsoleMessage, type Page } from 'playwright-core';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { startTracing, type Tracing } from '../src/telemetry/tracing.js';
import { describeWithTool, hasTool } from './helpers/system-tool.js';
import { CHAT, post, startStack, type Stack } from './helpers/stack.js';

const CHROMIUM = process.env['WAYBILL_CHROMIUM'] ?? 'chromium';
const ARTIFACTS = new URL('../test-artifacts/', import.meta.url).pathname;
const STREAM = { ...CHAT, stream: true };
const BROWSER_TIMEOUT = 60_000;

/** The little of the DOM the checks below use: this file compiles without the DOM library. */
interface BrowserElement {
  readonly id: string;
  readonly tagName: string;
  readonly textContent: string | null;
  readonly scrollWidth: number;
  readonly clientWidth: number;
  getAttribute(name: string): string | null;
}
interface BrowserWindow {
  readonly document: {
    readonly activeElement: BrowserElement | null;
    readonly body: BrowserElement;
    readonly documentElement: { readonly scrollWidth: number; readonly clientWidth: number };
    querySelector(selector: string): BrowserElement | null;
    querySelectorAll(selector: string): ArrayLike<BrowserElement>;
  };
  getComputedStyle(element: BrowserElement): { readonly outlineStyle: string; readonly outlineWidth: string };
}

// Inside a function playwright runs in the page, `globalThis as unknown as BrowserWindow` is the page's window: the
// function is sent as source text, so it may use nothing of this module but types. (Functions, not strings: a string
// predicate is run with eval, which the page's Content-Security-Policy forbids.)

/** The browser's executable: a path as given, or the command found on PATH. */
function executable(command: string): string {
  if (command.includes('/')) return command;
  for (const dir of (process.env['PATH'] ?? '').split(delimiter)) {
    if (dir !== '' && hasTool(join(dir, command))) return join(dir, command);
  }
  return command;
}

describeWithTool({ command: CHROMIUM, install: 'Debian: apt-get install chromium' }, 'the status page in a browser', () => {
  let browser: Browser;
  let tracing: Tracing;
  let s: Stack;
  let admin: string;
  let stackClosed: Promise<void> | undefined;
  const closeStack = () => (stackClosed ??= s.close());
  /** Console errors and uncaught page errors, by page. */
  const problems: string[] = [];

  const watch = (page: Page, name: string) => {
    page.on('console', (message: ConsoleMessage) => {
      if (message.type() === 'error') problems.push(`${name} console: ${message.text()}`);
    });
    page.on('pageerror', (error) => problems.push(`${name} page error: ${error.message}`));
  };

  const text = (page: Page, selector: string) => page.locator(selector).first().textContent();
  /** Waits until the element's text is `expected` (the page updates once a second). */
  const waitForText = (page: Page, selector: string, expected: string) =>
    page.waitForFunction(([sel, want]) => (globalThis as unknown as BrowserWindow).document.querySelector(sel)?.textContent === want, [selector, expected] as const, { timeout: 10_000 });
  /** Waits for `count` failed-request rows. */
  const waitForFailures = (page: Page, count: number) =>
    page.waitForFunction((n) => (globalThis as unknown as BrowserWindow).document.querySelectorAll('#failures-body tr[data-outcome]').length === n, count, { timeout: 10_000 });

  beforeAll(async () => {
    mkdirSync(ARTIFACTS, { recursive: true });
    // Real trace ids in the table: spans are made (and dropped: port 9 refuses), so each failure has its 32-hex id.
    tracing = startTracing({ endpoint: 'http://127.0.0.1:9/v1/traces', captureContent: false }, {});
    // A tiny answer cap: a request asking for JSON is delivered and accepted, but its format check unevaluated.
    s = await startStack({ tracing, config: { server: { host: '127.0.0.1', port: 0, admin_port: 0 }, retries: { max_attempts: 1 }, output_checks: { max_output_chars: 1 } } });
    admin = s.gateway.adminUrl ?? '';
    browser = await chromium.launch({ executablePath: executable(CHROMIUM), args: ['--no-sandbox'] });
  }, BROWSER_TIMEOUT);

  afterAll(async () => {
    await browser?.close();
    if (s !== undefined) await closeStack();
    await tracing?.shutdown();
  });

  it(
    'shows injected faults as they settle, from the keyboard, without errors, and on a phone',
    async () => {
      const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
      await context.grantPermissions(['clipboard-read', 'clipboard-write'], { origin: admin });
      const page = await context.newPage();
      watch(page, 'desktop');
      await page.goto(`${admin}/status`);
      await waitForText(page, '#connection', 'live');
      expect(await text(page, '#window')).toMatch(/^Last 5 minutes in 10 s buckets/);

      // A clean stream, one cut by an error event, one truncated at max tokens (delivered, not accepted), an upstream 429;
      // with real ids (UUIDs, as clients send them), which are longer than the table has room for.
      const ids = { ok: randomUUID(), errorEvent: randomUUID(), length: randomUUID(), tooMany: randomUUID(), overCap: randomUUID() };
      const sent = [
        await post(s.base, '/v1/chat/completions', STREAM, { 'x-request-id': ids.ok }),
        await post(s.base, '/v1/chat/completions', STREAM, { 'x-request-id': ids.errorEvent, 'x-sim-fault': 'error_after=2' }),
        await post(s.base, '/v1/chat/completions', STREAM, { 'x-request-id': ids.length, 'x-sim-fault': 'finish_reason=length' }),
        await post(s.base, '/v1/chat/completions', STREAM, { 'x-request-id': ids.tooMany, 'x-sim-fault': 'status=429' }),
        await post(s.base, '/v1/chat/completions', { ...STREAM, response_format: { type: 'json_object' } }, { 'x-request-id': ids.overCap }),
      ];
      expect(sent.map((r) => r.status)).toEqual([200, 200, 200, 429, 200]);

      await waitForText(page, '#f-requests', '5');
      expect(await text(page, '#f-2xx')).toBe('4');
      expect(await text(page, '#f-delivered')).toBe('3');
      expect(await text(page, '#f-accepted')).toBe('2');
      expect(await text(page, '#delivered-ratio')).toBe('60.0%');
      expect(await text(page, '#accepted-ratio')).toBe('40.0%');
      // Beside it: of the 3 checked, 2 evaluated (the over-cap answer is accepted but not evaluated), 1 of them accepted.
      expect(await text(page, '#coverage-ratio')).toBe('66.7%');
      expect(await text(page, '#coverage-counts')).toBe('2 of 3 checked evaluated');
      expect(await text(page, '#accepted-evaluated-ratio')).toBe('50.0%');
      expect(await text(page, '#accepted-evaluated-counts')).toBe('1 of 2 evaluated');

      await waitForFailures(page, 3);
      const failures = await Promise.all((await page.locator('#failures-body tr').all()).map((row) => row.locator('th, td').allTextContents()));
      expect(failures.map((cells) => [cells[1], cells[6], cells[5], cells[7]])).toEqual([
        [ids.tooMany, 'rejected', '429', 'upstream_4xx'],
        [ids.length, 'delivered', '200', 'check_failed:not_truncated'],
        [ids.errorEvent, 'stream_error', '200', 'error_payload'],
      ]);
      for (const cells of failures) expect(cells[9]).toMatch(/^[0-9a-f]{32}$/);

      // At 1280 px nothing overflows: not the page, not the failed-requests table (ids are cut with an ellipsis)…
      const fit = await page.evaluate(() => {
        const { document } = globalThis as unknown as BrowserWindow;
        const region = document.querySelector('#failures .scroll');
        const id = document.querySelector('#failures-body button.id');
        return {
          page: [document.documentElement.scrollWidth, document.documentElement.clientWidth],
          table: [region?.scrollWidth ?? -1, region?.clientWidth ?? -1],
          id: [id?.scrollWidth ?? -1, id?.clientWidth ?? -1],
        };
      });
      expect(fit.page[0]).toBeLessThanOrEqual(fit.page[1] ?? 0);
      expect(fit.table[0], `failed-requests table ${fit.table.join(' > ')} px`).toBeLessThanOrEqual(fit.table[1] ?? 0);
      expect(fit.id[0], 'the id is cut').toBeGreaterThan(fit.id[1] ?? 0);
      expect(await page.locator('#models-body tr th').first().textContent()).toBe('sim-model');
      expect(await page.locator('#upstreams-body tr td').nth(1).textContent()).toBe('up');

      // Keyboard: the skip link comes first and takes focus to the content.
      await page.keyboard.press('Tab');
      expect(await page.evaluate(() => (globalThis as unknown as BrowserWindow).document.activeElement?.textContent)).toBe('Skip to content');
      // Hidden until focused, then on screen.
      expect((await page.locator('a.skip').boundingBox())?.y).toBeGreaterThanOrEqual(0);
      await page.keyboard.press('Enter');
      expect(await page.evaluate(() => (globalThis as unknown as BrowserWindow).document.activeElement?.id)).toBe('main');

      // Every control and scrolling table is reached with Tab, each with a visible focus ring.
      await page.focus('a.skip');
      const reached: string[] = [];
      for (let i = 0; i < 40; i++) {
        if (i > 0) await page.keyboard.press('Tab');
        const focused = await page.evaluate(() => {
          const win = globalThis as unknown as BrowserWindow;
          const el = win.document.activeElement;
          if (el === null || el === win.document.body) return null;
          const style = win.getComputedStyle(el);
          const name = el.getAttribute('aria-labelledby') || el.id || (el.textContent ?? '').trim().slice(0, 30);
          return { tag: el.tagName.toLowerCase(), name, ring: style.outlineStyle !== 'none' && style.outlineWidth !== '0px' };
        });
        if (focused === null) break;
        const label = `${focused.tag}:${focused.name}`;
        if (reached.includes(label)) break;
        reached.push(label);
        expect(focused.ring, `focus ring on ${label}`).toBe(true);
      }
      expect(reached).toEqual(
        expect.arrayContaining([
          'a:Skip to content',
          'button:pause',
          'a:Failed requests',
          'div:funnel-caption',
          'summary:Every bucket, as a table',
          'div:latency-caption',
          'div:failures-caption',
          'a:status.json',
        ]),
      );
      // The pause button works from the keyboard.
      await page.focus('#pause');
      await page.keyboard.press('Space');
      expect(await page.getAttribute('#pause', 'aria-pressed')).toBe('true');
      await page.keyboard.press('Enter');
      expect(await page.getAttribute('#pause', 'aria-pressed')).toBe('false');

      // The picture in README.md and docs/status-page.md (copy test-artifacts/status-page.png to docs/).
      await page.locator('#pause').blur();
      await page.screenshot({ path: join(ARTIFACTS, 'status-page.png'), fullPage: true });
      // …and each id is whole on hover (its title) and when copied, from the keyboard.
      const first = page.locator('#failures-body button.id').first();
      expect(await first.getAttribute('title')).toBe(`${ids.tooMany} — press to copy`);
      await first.focus();
      await page.keyboard.press('Enter');
      await waitForText(page, '#copy-status', `Copied ${ids.tooMany}`);
      expect(await page.evaluate(() => (globalThis as unknown as { navigator: { clipboard: { readText(): Promise<string> } } }).navigator.clipboard.readText())).toBe(ids.tooMany);
      // The page's next update (once a second) keeps the focus on it.
      const generated = await text(page, '#generated');
      await page.waitForFunction((before) => (globalThis as unknown as BrowserWindow).document.querySelector('#generated')?.textContent !== before, generated, { timeout: 10_000 });
      expect(await page.evaluate(() => (globalThis as unknown as BrowserWindow).document.activeElement?.getAttribute('data-id'))).toBe(ids.tooMany);

      await page.screenshot({ path: join(ARTIFACTS, 'status-desktop.png'), fullPage: true });

      // A phone: 375 px wide, nothing wider than the screen (tables scroll inside their own region).
      const phone = await browser.newPage({ viewport: { width: 375, height: 812 }, isMobile: true, hasTouch: true, deviceScaleFactor: 2 });
      watch(phone, 'phone');
      await phone.goto(`${admin}/status`);
      await waitForText(phone, '#f-requests', '5');
      await waitForFailures(phone, 3);
      const widths = await phone.evaluate(() => {
        const { documentElement } = (globalThis as unknown as BrowserWindow).document;
        return { scroll: documentElement.scrollWidth, client: documentElement.clientWidth };
      });
      expect(widths.client).toBe(375);
      expect(widths.scroll).toBeLessThanOrEqual(375);
      await phone.screenshot({ path: join(ARTIFACTS, 'status-phone.png'), fullPage: true });

      expect(problems).toEqual([]);

      // The event stream drops (the gateway stops): the page says so, and EventSource keeps retrying.
      await closeStack();
      await waitForText(page, '#connection', 'disconnected — retrying');
      await waitForText(phone, '#connection', 'disconnected — retrying');
      expect(await page.getAttribute('#connection', 'data-state')).toBe('down');
      await page.screenshot({ path: join(ARTIFACTS, 'status-disconnected.png') });
    },
    BROWSER_TIMEOUT,
  );
});
