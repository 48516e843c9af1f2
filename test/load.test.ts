import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { statusOutcome } from '../load/client.js';
import { parseLoadArgs, runLoadWith } from '../load/main.js';
import { htmlReport } from '../load/report.js';
import { summarize } from '../load/stats.js';
import { planRequest, seededRandom, type Workload } from '../load/workload.js';
import { createSimulator, type Simulator } from '../src/sim/server.js';

const WORKLOAD: Workload = {
  model: undefined,
  promptTokens: { min: 10, max: 100 },
  outputTokens: { min: 8, max: 16 },
  streamShare: 0.5,
  chatShare: 0.5,
  n: { min: 1, max: 2 },
  usageShare: 0.5,
  cancelShare: 0.1,
  cancelAfterFirstTokenShare: 0.5,
  faultShare: 0.2,
  faultKinds: ['status', 'error_after', 'no_done'],
  slowShare: 0.05,
};

describe('load options', () => {
  it('reports every problem at once, naming the flag', async () => {
    const result = await parseLoadArgs(['--concurrency', '0', '--stream-share', '2', '--fault-kinds', 'status,bogus', '--duration', 'soon']);
    expect('problems' in result && [...result.problems].sort()).toEqual([
      '--concurrency: "0" must be a positive number',
      '--duration: "soon" is not a duration (e.g. 250ms, 30s, 2m)',
      '--fault-kinds: unknown kind "bogus" (one of status, error_before_output, error_after, reset_after, reset_before_response, stall_after, end_after, no_done, drop_finish, malformed_after, oversized_after, data_after_done)',
      '--stream-share: "2" is not a share between 0 and 1',
      '--url: required',
    ]);
  });
});

describe('workload', () => {
  it('is the same for the same seed, and never combines a fault, a cancellation and slow timing', () => {
    const plans = (seed: number) => {
      const random = seededRandom(seed);
      return Array.from({ length: 500 }, (_, i) => planRequest(WORKLOAD, random, i, true));
    };
    expect(plans(3)).toEqual(plans(3));
    expect(plans(3)).not.toEqual(plans(4));
    for (const plan of plans(3)) {
      expect([plan.fault, plan.cancel, plan.slow].filter((x) => x !== undefined).length).toBeLessThanOrEqual(1);
      if (plan.cancel !== undefined) expect(plan.stream).toBe(true);
      if (plan.fault !== undefined && !plan.stream) expect(['status', 'reset_after', 'reset_before_response', 'stall_after']).toContain(plan.fault);
      if (plan.cancel?.phase === 'streaming') expect(plan.cancel.afterEvents).toBeLessThanOrEqual(plan.maxTokens / 2);
    }
  });
});

describe('client-side outcomes', () => {
  it('tells Waybill\'s own 504 (a deadline: timeout) from an upstream error event with code 504 (failed)', () => {
    expect(statusOutcome(504, '{"error":{"message":"m","type":"timeout_error","param":null,"code":"upstream_timeout"}}')).toBe('timeout');
    expect(statusOutcome(504, '{"error":{"message":"m","type":"GatewayTimeout","param":null,"code":504}}')).toBe('failed');
    expect(statusOutcome(502, '')).toBe('failed');
    expect(statusOutcome(429, '')).toBe('rejected');
  });
});

describe('the HTML report', () => {
  it('draws a long run (millions of inter-token gaps) without exceeding the call stack', () => {
    const plan = planRequest(WORKLOAD, seededRandom(1), 0, false);
    const gaps = Array.from({ length: 1_000_000 }, (_, i) => 1 + (i % 97));
    const result = {
      plan, startedAt: 0, status: 200, outcome: 'delivered' as const, code: 200, cancelPhase: undefined, ttftMs: 5, tpotMs: 2,
      e2eMs: 2000, itlMs: gaps, outputEvents: gaps.length + 1, usage: undefined, finishReasons: ['stop' as const], anomaly: undefined, error: undefined,
    };
    const slo = { ttftMs: 2000, tpotMs: 100, e2eMs: 60_000 };
    const html = htmlReport(summarize([result], 2, slo), slo, [result], undefined);
    expect(html).toContain('Inter-token latency (per event) (1000000 values');
  });
});

describe('a run against the simulator', () => {
  let sim: Simulator;
  let url: string;
  beforeAll(async () => {
    sim = createSimulator({ ttftMs: 2, itlMs: 1, jitter: 0 });
    url = (await sim.listen(0, '127.0.0.1')).url;
  });
  afterAll(async () => {
    await sim.close();
  });

  it('measures every request and writes the JSON and self-contained HTML reports', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'waybill-load-'));
    const config = await parseLoadArgs([
      '--url', url, '--concurrency', '8', '--requests', '60', '--output-tokens', '10',
      '--usage-share', '1', '--json', join(dir, 'r.json'), '--html', join(dir, 'r.html'), '--quiet',
    ]);
    if ('problems' in config) throw new Error(config.problems.join('\n'));
    const lines: string[] = [];
    expect(await runLoadWith(config, (t) => lines.push(t))).toEqual({ exitCode: 0, mismatches: 0 });
    expect(lines.join('\n')).toMatch(/delivered\s+60 {2}\(100\.00% delivered vs 100\.00% HTTP 2xx\)/);
    const report = JSON.parse(readFileSync(join(dir, 'r.json'), 'utf8')) as {
      summary: { requests: number; ttftMs: { count: number }; itlMs: { count: number } };
      requests: Array<{ outcome: string; output_events: number; usage: { completionTokens: number } }>;
    };
    expect(report.summary.requests).toBe(60);
    expect(report.requests.every((r) => r.outcome === 'delivered' && r.output_events === 10 && r.usage.completionTokens === 10)).toBe(true);
    expect(report.summary.ttftMs.count).toBe(60);
    expect(report.summary.itlMs.count).toBe(60 * 9);
    const html = readFileSync(join(dir, 'r.html'), 'utf8');
    expect(html).toContain('<svg');
    expect(html).not.toMatch(/<(script|link|img)[^>]+(src|href)=/);
    expect(sim.stats().byRoute.chat_completions).toBe(60);
  });
});
