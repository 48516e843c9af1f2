/**
 * The load reports people read: chart axes with nice ticks and units, gaps where nothing was measured, and the
 * header that says what was run and why the run took as long as it did — unit by unit, then on real runs against
 * the simulator.
 */
import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { lineChartSvg, logTicks, niceTicks, pathOf, segmentsOf, tickLabel } from '../load/chart.js';
import type { RequestResult } from '../load/client.js';
import { explainTaken, formatDuration, measureTaken, redactArgs, workloadKeys, type RunHeader } from '../load/header.js';
import { parseLoadArgs, runLoadWith } from '../load/main.js';
import { htmlReport } from '../load/report.js';
import { summarize } from '../load/stats.js';
import { chatShareMix, planRequest, seededRandom, type Workload } from '../load/workload.js';
import { createSimulator, type Simulator } from '../src/sim/server.js';

describe('nice ticks', () => {
  it('step by 1, 2 or 5 × 10^k and enclose the data', () => {
    expect(niceTicks(0, 37)).toEqual({ values: [0, 10, 20, 30, 40], step: 10, decimals: 0 });
    expect(niceTicks(0, 0.83)).toEqual({ values: [0, 0.2, 0.4, 0.6, 0.8, 1], step: 0.2, decimals: 1 });
    expect(niceTicks(0, 1234)).toEqual({ values: [0, 500, 1000, 1500], step: 500, decimals: 0 });
    expect(niceTicks(12.5, 13.7)).toEqual({ values: [12.5, 13, 13.5, 14], step: 0.5, decimals: 1 });
    // A flat series (every second 0 req/s) still gets an axis.
    expect(niceTicks(0, 0).values).toEqual([0, 0.2, 0.4, 0.6, 0.8, 1]);
  });

  it('hold for any range: a 1-2-5 step, exact decimals, a handful of ticks, the data inside', () => {
    fc.assert(
      fc.property(fc.double({ min: 0, max: 1e6, noNaN: true }), fc.double({ min: 1e-3, max: 1e6, noNaN: true }), (min, span) => {
        const { values, step, decimals } = niceTicks(min, min + span);
        const mantissa = step / 10 ** Math.floor(Math.log10(step) + 1e-9);
        expect([1, 2, 5, 10].some((m) => Math.abs(mantissa - m) < 1e-6)).toBe(true);
        // Within a hair (1e-9 of a step): 0.30000000000000004 is on the tick 0.3, not past it.
        expect(values[0]).toBeLessThanOrEqual(min + 1e-9 * step);
        expect(values[values.length - 1]).toBeGreaterThanOrEqual(min + span - 1e-9 * step);
        expect(values.length).toBeGreaterThanOrEqual(2);
        expect(values.length).toBeLessThanOrEqual(12);
        for (const v of values) expect(Number(v.toFixed(decimals))).toBe(v);
      }),
    );
  });

  it('on a log axis are the powers of ten inside, with 2 and 5 × 10^k when fewer than three fall inside', () => {
    expect(logTicks(1, 1000)).toEqual([1, 10, 100, 1000]);
    expect(logTicks(3, 400)).toEqual([5, 10, 20, 50, 100, 200]);
    expect([tickLabel(0.2, 1), tickLabel(0.05), tickLabel(1000), tickLabel(20, 0)]).toEqual(['0.2', '0.05', '1000', '20']);
  });
});

/** The `d` of the data line (not the grid) of the first chart in `svg`. */
const dataPath = (svg: string) => /<path d="([^"]*)" fill="none" stroke="#c05030"/.exec(svg)?.[1];

describe('a series with seconds that have no value', () => {
  it('breaks into runs: a missing second starts a new segment, never a point at 0', () => {
    const values = [5, 7, undefined, 4, undefined, undefined, 9];
    expect(segmentsOf(values)).toEqual([[[0, 5], [1, 7]], [[3, 4]], [[6, 9]]]);
    expect(pathOf(segmentsOf(values), (bin) => bin * 10, (v) => v)).toBe('M0.0,5.0 L10.0,7.0 M30.0,4.0 M60.0,9.0');
  });

  it('is drawn with a move across the gap, a dot for a lone value, axes titled with their units', () => {
    const svg = lineChartSvg({ title: 'TTFT median by second started', yTitle: 'TTFT (ms)', values: [5, 7, undefined, 4, 6, undefined, undefined, 3] });
    const d = dataPath(svg) ?? '';
    expect(d.match(/[ML]/g)).toEqual(['M', 'L', 'M', 'L', 'M']);
    expect(svg.match(/<circle /g)?.length).toBe(1);
    expect(svg).toContain('(gaps: seconds without a value)');
    expect(svg).toContain('>time since start (s)</text>');
    expect(svg).toContain('>TTFT (ms)</text>');
    // x: 8 seconds → ticks 0, 2, 4, 6, 8; y: up to 7 ms → 0, 2, 4, 6, 8.
    const labels = [...svg.matchAll(/text-anchor="middle">([\d.]+)<\/text>/g)].map((m) => m[1]);
    expect(labels).toEqual(['0', '2', '4', '6', '8']);
    const yLabels = [...svg.matchAll(/text-anchor="end">([\d.]+)<\/text>/g)].map((m) => m[1]);
    expect(yLabels).toEqual(['0', '2', '4', '6', '8']);
  });

  it('in the HTML report: a second in which no request started breaks the TTFT line; counts stay true zeros', () => {
    const WORKLOAD: Workload = {
      model: undefined, promptTokens: { min: 10, max: 10 }, outputTokens: { min: 4, max: 4 }, streamShare: 1, routeShares: chatShareMix(1),
      n: { min: 1, max: 1 }, usageShare: 0, cancelShare: 0, cancelAfterFirstTokenShare: 0.5, faultShare: 0, faultKinds: [], slowShare: 0,
    };
    const plan = planRequest(WORKLOAD, seededRandom(1), 0, false);
    const at = (startedAt: number, ttftMs: number): RequestResult => ({
      plan, startedAt, sentMs: 0, status: 200, outcome: 'delivered', code: 200, cancelPhase: undefined, ttftMs, tpotMs: 1, e2eMs: 100,
      itlMs: [1, 1, 1], outputEvents: 4, usage: undefined, finishReasons: ['stop'], cancelRacedEnd: false, anomaly: undefined, error: undefined,
    });
    // Seconds 0 and 2 have requests; second 1 has none.
    const results = [at(100, 40), at(2200, 60)];
    const slo = { ttftMs: 2000, tpotMs: 100, e2eMs: 60_000 };
    const asked = { requests: null, durationS: 3, warmup: 0 };
    const header: RunHeader = {
      target: 'http://127.0.0.1:1', model: 'm', startedAt: '2026-12-01T00:00:00.000Z', load: { mode: 'closed', concurrency: 1 }, asked,
      taken: measureTaken(results, asked, 3000), workload: workloadKeys(WORKLOAD, 'm'), seed: 1, simulator: false, reconcile: false,
      timeoutS: 300, waybill: { version: '0.0.0', revision: 'unknown' }, argv: [],
    };
    const html = htmlReport({ header, summary: summarize(results, 3, slo), slo, results, reconciliation: undefined });
    const chart = (title: string) => html.slice(html.indexOf(`<figcaption>${title}`)).split('</figure>')[0] ?? '';
    // Two lone seconds: two moves, no line between them, a dot each.
    expect(dataPath(chart('TTFT median by second started'))?.match(/[ML]/g)).toEqual(['M', 'M']);
    expect(chart('TTFT median by second started').match(/<circle /g)?.length).toBe(2);
    // Completions per second: 1, 0, 1 — a zero is a measurement, drawn as one.
    expect(dataPath(chart('Requests completed per second'))?.match(/[ML]/g)).toEqual(['M', 'L', 'L']);
    expect(chart('Requests completed per second')).toContain('3 s window ends');
  });
});

describe('the duration taken, and why it differs from the one asked', () => {
  const timed = (startedAt: number, e2eMs: number) => ({ startedAt, e2eMs });

  it('a --duration 10s run that waits out a 30 s stall says so', () => {
    const quick = Array.from({ length: 8 }, (_, i) => timed(i * 1000, 500));
    const stalled = Array.from({ length: 12 }, (_, i) => timed(4000 + i * 100, 35_100 - 4000 - i * 100));
    const taken = measureTaken([...quick, ...stalled], { requests: null, durationS: 10, warmup: 0 }, 35_100);
    expect(taken).toEqual({
      durationS: 35.1, requests: 20, stoppedBy: 'duration', windowS: 10, stillRunning: 12,
      explanation: 'took 35.1 s, asked 10 s: waited 25.1 s for 12 in-flight requests after the 10 s window',
    });
  });

  it('says when nothing was in flight, when the count asked was reached first, and when nothing was sent', () => {
    const facts = { asked: { requests: null, durationS: 10, warmup: 0 }, takenMs: 10_020, stoppedBy: 'duration', windowMs: 10_000, stillRunning: 0, sent: 50 } as const;
    expect(explainTaken(facts)).toBe('took 10 s, asked 10 s: no request was in flight when the 10 s window closed');
    expect(explainTaken({ ...facts, stillRunning: 1 })).toBe('took 10 s, asked 10 s: waited 20 ms for 1 in-flight request after the 10 s window');
    expect(explainTaken({ ...facts, sent: 0 })).toBe('took 10 s, asked 10 s: no request was sent');
    const sixty = Array.from({ length: 60 }, (_, i) => timed(i * 1000 / 59, i < 52 ? 10 : 200));
    expect(measureTaken(sixty, { requests: 60, durationS: null, warmup: 0 }, 1200).explanation).toBe(
      'no duration asked; took 1.2 s: the 60 requests asked were sent by 1 s, then waited 200 ms for 8 in-flight requests',
    );
    expect(measureTaken(sixty, { requests: 60, durationS: 10, warmup: 0 }, 1200)).toMatchObject({
      stoppedBy: 'requests', windowS: 1, stillRunning: 8,
      explanation: 'took 1.2 s, asked 10 s: the 60 requests asked were sent by 1 s, before the 10 s window closed, then waited 200 ms for 8 in-flight requests',
    });
  });

  it('keeps no secret in the flags it records', () => {
    expect(redactArgs(['--url', 'http://user:pw@gw:8080', '--api-key', 'sk-1', '--api-key=sk-2', '--seed', '3'])).toEqual([
      '--url', 'http://<redacted>@gw:8080', '--api-key', '<redacted>', '--api-key=<redacted>', '--seed', '3',
    ]);
    // --flag=URL, a password holding '@', a token in the query.
    expect(redactArgs(['--url=http://alice:s3cret@gw', '--sim=http://a:p@ss@sim:8000/', '--url', 'http://gw/v1?token=abc'])).toEqual([
      '--url=http://<redacted>@gw',
      '--sim=http://<redacted>@sim:8000/',
      '--url',
      'http://gw/v1?<redacted>',
    ]);
  });
});

interface HeaderJson {
  header: RunHeader;
  summary: { requests: number; durationS: number; ttftMs: { p95: number } };
}

describe('the header of a real run against the simulator', () => {
  let sim: Simulator;
  let slow: Simulator;
  let url: string;
  let slowUrl: string;
  beforeAll(async () => {
    sim = createSimulator({ ttftMs: 2, itlMs: 1, jitter: 0 });
    url = (await sim.listen(0, '127.0.0.1')).url;
    // Every answer's first token waits 600 ms: a 150 ms window must wait for its in-flight requests.
    slow = createSimulator({ ttftMs: 600, itlMs: 1, jitter: 0, prefillMsPer1kTokens: 0 });
    slowUrl = (await slow.listen(0, '127.0.0.1')).url;
  });
  afterAll(async () => {
    await sim.close();
    await slow.close();
  });

  it('says in the JSON and the HTML what was run: target, start, length, load, workload, seed, version, flags', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'waybill-load-'));
    const args = [
      '--url', url, '--concurrency', '4', '--requests', '20', '--seed', '9', '--output-tokens', '5', '--prompt-tokens', '10-20',
      '--api-key', 'secret-key', '--json', join(dir, 'r.json'), '--html', join(dir, 'r.html'), '--quiet',
    ];
    const config = await parseLoadArgs(args);
    if ('problems' in config) throw new Error(config.problems.join('\n'));
    const before = Date.now();
    const lines: string[] = [];
    expect((await runLoadWith(config, (t) => lines.push(t))).exitCode).toBe(0);
    const after = Date.now();
    const report = JSON.parse(readFileSync(join(dir, 'r.json'), 'utf8')) as HeaderJson;
    const { header } = report;
    const { version } = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as { version: string };
    expect(Object.keys(report)[0]).toBe('header');
    expect(header.target).toBe(url);
    expect(header.model).toBe('sim-model');
    expect(Date.parse(header.startedAt)).toBeGreaterThanOrEqual(before - 5);
    expect(Date.parse(header.startedAt)).toBeLessThanOrEqual(after);
    expect(header.startedAt).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
    expect(header.load).toEqual({ mode: 'closed', concurrency: 4 });
    expect(header.asked).toEqual({ requests: 20, durationS: null, warmup: 0 });
    expect(header.taken).toMatchObject({ requests: 20, stoppedBy: 'requests' });
    expect(header.taken.durationS).toBe(report.summary.durationS);
    const time = String.raw`(\d+ ms|[\d.]+ s)`;
    expect(header.taken.explanation).toMatch(new RegExp(`^no duration asked; took ${time}: the 20 requests asked were sent by ${time}, then waited ${time} for [1-4] in-flight requests?$`));
    expect(header.workload).toMatchObject({ model: 'sim-model', prompt_tokens: '10-20', output_tokens: '5', stream_share: 1, route_shares: { chat_completions: 1 }, n: '1' });
    expect(header.seed).toBe(9);
    expect(header.waybill.version).toBe(version);
    expect(header.argv).toEqual(args.map((a) => (a === 'secret-key' ? '<redacted>' : a)));
    expect(typeof report.summary.ttftMs.p95).toBe('number');
    expect(lines).toContain(`run             ${header.taken.explanation}`);

    const html = readFileSync(join(dir, 'r.html'), 'utf8');
    expect(html).toContain('<h2>What was run</h2>');
    for (const [label, value] of [
      ['target', url], ['started', header.startedAt], ['why', header.taken.explanation], ['seed', '9'], ['load', 'closed loop, concurrency 4'],
      ['workload output_tokens', '5'], ['waybill', version], ['reconciliation', 'not run'],
    ]) {
      expect(html).toContain(`<tr><th>${label}</th><td>${value}</td></tr>`);
    }
    expect(html).toContain(`<tr><th>flags</th><td>${header.argv.join(' ').replace('<redacted>', '&lt;redacted&gt;')}</td></tr>`);
    expect(html).not.toContain('secret-key');
    expect(readFileSync(join(dir, 'r.json'), 'utf8')).not.toContain('secret-key');
    expect(html).not.toMatch(/<(script|link|img)[^>]+(src|href)=/);
  });

  it('a --duration run whose requests outlast its window says how long it waited for them', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'waybill-load-'));
    const config = await parseLoadArgs([
      '--url', slowUrl, '--concurrency', '2', '--duration', '150ms', '--output-tokens', '2', '--json', join(dir, 'r.json'), '--html', join(dir, 'r.html'), '--quiet',
    ]);
    if ('problems' in config) throw new Error(config.problems.join('\n'));
    expect((await runLoadWith(config, () => {})).exitCode).toBe(0);
    const { header } = JSON.parse(readFileSync(join(dir, 'r.json'), 'utf8')) as HeaderJson;
    expect(header.asked).toEqual({ requests: null, durationS: 0.15, warmup: 0 });
    // Both streams started at once and stalled 600 ms for their first token: the run waited for them past 150 ms.
    expect(header.taken).toMatchObject({ requests: 2, stoppedBy: 'duration', windowS: 0.15, stillRunning: 2 });
    expect(header.taken.durationS).toBeGreaterThanOrEqual(0.6);
    const takenMs = header.taken.durationS * 1000;
    expect(header.taken.explanation).toBe(
      `took ${formatDuration(takenMs)}, asked 150 ms: waited ${formatDuration(takenMs - 150)} for 2 in-flight requests after the 150 ms window`,
    );
    const html = readFileSync(join(dir, 'r.html'), 'utf8');
    expect(html).toContain(`<tr><th>why</th><td>${header.taken.explanation}</td></tr>`);
    expect(html).toContain('150 ms window ends');
  });
});
