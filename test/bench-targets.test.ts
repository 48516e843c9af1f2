/**
 * bench/proxy/targets.ts and compare.ts: issue 27's verdicts against the bare Node relay's row of the same run, and
 * the bench's `--variant NAME=JSON` flag (bench/proxy/options.ts).
 */
import { describe, expect, it } from 'vitest';
import { compare } from '../bench/proxy/compare.js';
import { parseConfigKeys, parseOptions, parseVariant, tokensOf, UsageError } from '../bench/proxy/options.js';
import type { ScenarioResult } from '../bench/proxy/run.js';
import { checkTargets, ISSUE_27 } from '../bench/proxy/targets.js';
import { formatSustained, sustainedStreams } from '../bench/proxy/sustained.js';
import { scenarioNamed } from '../bench/proxy/options.js';
import { splitCosts, splitProblem } from '../bench/proxy/split.js';

/** A scenario's result with the figures compare() reads, per target. */
function result(name: string, rows: Record<string, { usPerEvent?: number; usPerRequest?: number; ttftP50?: number; ttftP99?: number; itlP99?: number; rss?: number; events?: number }>): ScenarioResult {
  const targets = Object.entries(rows).map(([target, f]) => ({
    target,
    ttftP50: f.ttftP50 ?? 20,
    ttftP99: f.ttftP99 ?? 30,
    itlP99: f.itlP99 ?? 10,
    eventsPerS: f.events ?? 1000,
    requestsPerS: 100,
    proxyUsPerEvent: f.usPerEvent ?? Number.NaN,
    proxyUsPerRequest: f.usPerRequest ?? Number.NaN,
    rssPerStreamKiB: f.rss ?? Number.NaN,
    rssWindowPerStreamKiB: Number.NaN,
    peakRssKiB: 0,
  }));
  return { scenario: scenarioNamed(name), targets, windows: [] } as unknown as ScenarioResult;
}

const reference = { label: 'peer-figures.md', usPerEvent: {} } as never;

describe("issue 27's targets", () => {
  it('reads each figure against the relay of the same scenario, by value', () => {
    const comparisons = compare(
      [
        result('c64s', { direct: {}, waybill: { usPerEvent: 36, ttftP99: 31.5 }, 'node-floor': { usPerEvent: 30 } }),
        result('c256s', { direct: {}, waybill: { usPerEvent: 40, ttftP99: 36, rss: 18 }, 'node-floor': { usPerEvent: 30 } }),
        result('max', { direct: {}, waybill: { itlP99: 14, ttftP50: 29 }, 'node-floor': { itlP99: 10 } }),
        result('req', { direct: {}, waybill: { usPerRequest: 250 }, 'node-floor': { usPerRequest: 132 } }),
      ],
      reference,
    );
    const checks = checkTargets(ISSUE_27, comparisons);
    const verdict = (start: string) => checks.find((c) => c.target.startsWith(start));
    expect(verdict('CPU/event at c64s')).toMatchObject({ met: true, measured: '36.0 vs relay 30.0 µs/ev = 1.20x' });
    expect(verdict('CPU/event at c256s')).toMatchObject({ met: false, measured: '40.0 vs relay 30.0 µs/ev = 1.33x' });
    expect(verdict('added TTFT p99 at c64s')?.met).toBe(true);
    expect(verdict('added TTFT p99 at c256s')?.met).toBe(false);
    expect(verdict('ITL p99 at saturation')).toMatchObject({ met: false });
    expect(verdict('new streams at saturation')).toMatchObject({ met: true });
    expect(verdict('CPU per request')).toMatchObject({ met: true, measured: "1.89x the relay's µs/req" });
    expect(verdict('RSS')).toMatchObject({ met: true });
  });

  it('says n/a where the relay row or the scenario did not run', () => {
    const comparisons = compare([result('c64s', { direct: {}, waybill: { usPerEvent: 36 } })], reference);
    const checks = checkTargets(ISSUE_27, comparisons);
    expect(checks).toHaveLength(ISSUE_27.targets.length);
    expect(checks.find((c) => c.target.startsWith('CPU/event at c64s'))).toMatchObject({ met: undefined, measured: 'no node-floor row (--no-floor)' });
    expect(checks.find((c) => c.target.startsWith('CPU/event at c256s'))).toMatchObject({ met: undefined, measured: 'c256s not run' });
  });
});

describe('--variant NAME=JSON', () => {
  it('adds a row with configuration keys, repeatable', () => {
    const options = parseOptions(['--variant', 'a={"engine_signals":{"enabled":false}}', '--variant', 'b-2={}', '--nginx', 'off']);
    expect(options.variants).toEqual([
      { name: 'a', config: { engine_signals: { enabled: false } } },
      { name: 'b-2', config: {} },
    ]);
  });

  it("takes server keys other than the bench's own", () => {
    expect(parseVariant('helpers-share={"server":{"helper_threads":"share"}}')).toEqual({ name: 'helpers-share', config: { server: { helper_threads: 'share' } } });
  });

  it('refuses a bad name, bad JSON or a non-object', () => {
    for (const raw of [undefined, '=x', 'A={}', 'a b={}', 'a={', 'a=[]', 'a=1', 'a=null']) expect(() => parseVariant(raw)).toThrow(UsageError);
  });

  it("refuses the bench's own keys and a built-in row's name", () => {
    for (const raw of ['a={"server":{"port":1}}', 'a={"server":{"host":"0.0.0.0","helper_threads":"share"}}', 'a={"server":{"workers":2}}', 'a={"server":1}', 'a={"pools":[]}', 'a={"shutdown":{}}', 'lean={}', '2w={}', 'turns-off={}', 'otel={}', 'contract={}']) {
      expect(() => parseVariant(raw)).toThrow(UsageError);
    }
  });
});

describe("bench/ab.js --a-config / --b-config (parseConfigKeys)", () => {
  it('takes configuration keys, and names the flag when it refuses the bench\'s own', () => {
    expect(parseConfigKeys('--b-config', '{"logging":{"requests":false}}')).toEqual({ logging: { requests: false } });
    expect(() => parseConfigKeys('--b-config', '{"pools":[]}')).toThrow('--b-config: pools is the bench\'s own');
    expect(() => parseConfigKeys('--a-config', '{"server":{"admin_port":9}}')).toThrow('--a-config: server.admin_port');
    expect(() => parseConfigKeys('--a-config', 'nope')).toThrow('--a-config: the configuration is not JSON');
  });
});

describe('the reqs scenario', () => {
  it('stays at one streamed token whatever --tokens asks of the streams', () => {
    const options = parseOptions(['--tokens', '64', '--nginx', 'off']);
    expect(tokensOf(scenarioNamed('reqs'), options)).toBe(1);
    expect(scenarioNamed('reqs').stream).toBe(true);
    expect(tokensOf(scenarioNamed('c64s'), options)).toBe(64);
    expect(tokensOf(scenarioNamed('c1'), options)).toBe(64);
  });
});

describe('bench/ab.js --split: a cost per request and one per event from two answer lengths', () => {
  it('recovers a and b from two windows built from them', () => {
    // 300 µs per request and 10 µs per event: 10 + 300/66 and 10 + 300/202 per event.
    const split = splitCosts({ usPerEvent: 10 + 300 / 66, eventsPerRequest: 66 }, { usPerEvent: 10 + 300 / 202, eventsPerRequest: 202 });
    expect(split.usPerRequest).toBeCloseTo(300, 9);
    expect(split.usPerEvent).toBeCloseTo(10, 9);
    // A proxy whose cost per event does not depend on the answer's length has no cost per request.
    expect(splitCosts({ usPerEvent: 20, eventsPerRequest: 66 }, { usPerEvent: 20, eventsPerRequest: 202 })).toEqual({ usPerRequest: 0, usPerEvent: 20 });
  });

  it('says undetermined for one answer length, and refuses scenarios that differ in more than it', () => {
    expect(splitCosts({ usPerEvent: 20, eventsPerRequest: 66 }, { usPerEvent: 30, eventsPerRequest: 66 })).toEqual({ usPerRequest: Number.NaN, usPerEvent: Number.NaN });
    expect(splitProblem(scenarioNamed('c64s'), scenarioNamed('c64'))).toBeUndefined();
    expect(splitProblem(scenarioNamed('c64s'), scenarioNamed('c256s'))).toBe('c256s differs from c64s in more than its answer length');
    expect(splitProblem(scenarioNamed('c64s'), scenarioNamed('c64s'))).toBe("c64s has c64s's answer length: nothing tells a from b");
    expect(splitProblem(scenarioNamed('c64s'), scenarioNamed('reqs'))).toBe('both scenarios must stream answers of more than one token');
    expect(splitProblem(scenarioNamed('c64'), scenarioNamed('max'))).toBe('both scenarios must be paced (a saturated read carries several events)');
  });
});

describe('the most streams one core sustains (bench/proxy/sustained.ts)', () => {
  it('is the largest 20 ms concurrency that held ITL p99 <= 40 ms and the direct throughput, below the first that did not', () => {
    const rows = (waybillItl: number, relayItl: number, relayEvents = 1000) => ({
      direct: { itlP99: 25 },
      waybill: { itlP99: waybillItl },
      'node-floor': { itlP99: relayItl, events: relayEvents },
    });
    const results = [
      result('c512s', rows(95, 39.9)),
      result('c256s', rows(38, 30)),
      result('c384s', rows(41, 35, 980)),
      result('c768s', rows(200, 80)),
      // Another pace is not read.
      result('c64s', rows(1, 1)),
    ];
    const found = sustainedStreams(results);
    expect(found.find((r) => r.target === 'waybill')).toEqual({ target: 'waybill', paceMs: 20, streams: 256, failedAt: 384, read: [256, 384, 512, 768] });
    // 384 missed on throughput (980 < 0.99 × 1000); 512 held again, but the first miss bounds the answer.
    expect(found.find((r) => r.target === 'node-floor')).toMatchObject({ streams: 256, failedAt: 384 });
    expect(found.find((r) => r.target === 'direct')).toMatchObject({ streams: 768, failedAt: undefined });
    expect(formatSustained(found)).toContain('waybill            256 (not at 384)');
  });

  it('reads none when the smallest run already missed, and nothing without a 20 ms scenario', () => {
    expect(sustainedStreams([result('c256s', { direct: {}, waybill: { itlP99: 41 } })]).find((r) => r.target === 'waybill')).toMatchObject({ streams: 0, failedAt: 256 });
    expect(sustainedStreams([result('c64s', { direct: {}, waybill: {} })])).toEqual([]);
  });
});
