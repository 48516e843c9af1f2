import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { statusOutcome, type RequestResult } from '../load/client.js';
import { parseLoadArgs, runLoadWith } from '../load/main.js';
import { parseMetrics, reconcile } from '../load/reconcile.js';
import { htmlReport } from '../load/report.js';
import { createEventReader, readEvent } from '../load/sse.js';
import { sloCandidates, summarize } from '../load/stats.js';
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

describe('the client reads responses on its own', () => {
  it('cuts events however the bytes are chunked (inside a UTF-8 character, between CR and LF)', () => {
    const text = [
      ': keep-alive',
      'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}',
      '',
      'data: {"choices":[{"index":0,"delta":{"content":"héllo"},"finish_reason":null}]}',
      '',
      'data: {"choices":[{"index":0,"text":"","finish_reason":"length"}]}',
      '',
      'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":2}}}',
      '',
      'data: [DONE]',
      '',
      '',
    ].join('\r\n');
    const bytes = Buffer.from(text);
    const expected = [
      { kind: 'chunk', output: [], finishes: [], usage: undefined },
      { kind: 'chunk', output: [0], finishes: [], usage: undefined },
      { kind: 'chunk', output: [], finishes: [[0, 'length']], usage: undefined },
      { kind: 'chunk', output: [], finishes: [], usage: { promptTokens: 7, completionTokens: 3, cachedTokens: 2 } },
      { kind: 'done' },
    ];
    for (let cut = 1; cut < bytes.length; cut++) {
      const events: unknown[] = [];
      const reader = createEventReader((data) => events.push(readEvent(data)), () => events.push('oversized'));
      reader.feed(bytes.subarray(0, cut));
      reader.feed(bytes.subarray(cut));
      reader.end();
      expect(events, `cut at ${cut}`).toEqual(expected);
    }
  });

  it('tells Waybill\'s own error events by their string code, and counts only countable usage', () => {
    expect(readEvent('{"error":{"message":"m","type":"timeout_error","param":null,"code":"stream_timeout"}}')).toEqual({ kind: 'error', code: 'stream_timeout' });
    expect(readEvent('{"error":{"message":"m","type":"BadRequestError","param":null,"code":400}}')).toEqual({ kind: 'error', code: undefined });
    expect(readEvent('{"id":"broken')).toEqual({ kind: 'malformed' });
    expect(readEvent('[1]')).toEqual({ kind: 'malformed' });
    const usage = (u: string) => (readEvent(`{"choices":[],"usage":${u}}`) as { usage: unknown }).usage;
    expect(usage('{"prompt_tokens":1e308,"completion_tokens":1}')).toBeUndefined();
    expect(usage('{"prompt_tokens":2,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":3}}')).toBeUndefined();
    expect(usage('{"prompt_tokens":2,"completion_tokens":null}')).toEqual({ promptTokens: 2, completionTokens: undefined, cachedTokens: undefined });
    const output = (choice: string) => (readEvent(`{"choices":[${choice}]}`) as { output: readonly number[] }).output;
    expect(output('{"index":1,"delta":{"tool_calls":[{"index":0}]}}')).toEqual([1]);
    expect(output('{"index":0,"delta":{"reasoning_content":"x"}}')).toEqual([0]);
    expect(output('{"index":0,"delta":{"content":null}}')).toEqual([]);
  });
});

describe('borderline SLO results', () => {
  const plan = { ...planRequest(WORKLOAD, seededRandom(1), 0, false), stream: true, n: 1, cancel: undefined, fault: undefined, slow: undefined };
  const result = (over: Partial<RequestResult>): RequestResult => ({
    plan, startedAt: 0, sentMs: 5, status: 200, outcome: 'delivered', code: 200, cancelPhase: undefined, ttftMs: 100, tpotMs: 20,
    e2eMs: 1000, itlMs: [], outputEvents: 11, usage: { promptTokens: 100, completionTokens: 11, cachedTokens: undefined },
    finishReasons: ['stop'], cancelRacedEnd: false, anomaly: undefined, error: undefined, ...over,
  });
  const slo = { ttftMs: 2000, tpotMs: 100, e2eMs: 60_000 };

  it('are those whose client timing lies within the margin of a threshold; the others are exact', () => {
    // TTFT runs from the moment the request was written (sentMs 5); Waybill's cannot be longer than the client's.
    expect(sloCandidates(result({ ttftMs: 2005 }), slo, 50)).toEqual(['met']);
    expect(sloCandidates(result({ ttftMs: 2030 }), slo, 50)).toEqual(['met', 'missed_ttft']);
    expect(sloCandidates(result({ ttftMs: 2056 }), slo, 50)).toEqual(['missed_ttft']);
    // TPOT is an interval over 10 gaps (11 tokens): the margin is 5 ms either side.
    expect(sloCandidates(result({ tpotMs: 94 }), slo, 50)).toEqual(['met']);
    expect(sloCandidates(result({ tpotMs: 97 }), slo, 50)).toEqual(['met', 'missed_tpot']);
    expect(sloCandidates(result({ tpotMs: 106 }), slo, 50)).toEqual(['missed_tpot']);
    // A cancellation before the first token: the time the client waited, the margin either side.
    const cancelled = result({ outcome: 'client_cancelled', code: 499, cancelPhase: 'before_first_token', ttftMs: undefined, tpotMs: undefined, usage: undefined });
    expect(sloCandidates({ ...cancelled, e2eMs: 1960 }, slo, 50)).toEqual(['excluded', 'missed_ttft']);
    expect(sloCandidates({ ...cancelled, e2eMs: 1900 }, slo, 50)).toEqual(['excluded']);
  });

  it('let Waybill\'s count of a class lie between the exact count and the exact count plus the borderline ones', () => {
    const results = [result({ ttftMs: 2030 }), result({ ttftMs: 10 })];
    const mismatchesWith = (met: number, missed: number) => {
      const text = [`waybill_slo_requests_total{model="m",prompt_len="0-1k",result="met"} ${met}`, `waybill_slo_requests_total{model="m",prompt_len="0-1k",result="missed_ttft"} ${missed}`].join('\n');
      const after = { metrics: parseMetrics(text), sims: [] };
      return reconcile(results, { metrics: [], sims: [] }, after, slo, 50).mismatches.filter((m) => m.what.startsWith('SLO'));
    };
    expect(mismatchesWith(2, 0)).toEqual([]);
    expect(mismatchesWith(1, 1)).toEqual([]);
    expect(mismatchesWith(0, 2)).toEqual([
      { what: 'SLO results by prompt_len', key: '0-1k|met', min: 1, max: 2, waybill: 0 },
      { what: 'SLO results by prompt_len', key: '0-1k|missed_ttft', min: 0, max: 1, waybill: 2 },
    ]);
    // Each request is counted once: met 2 and missed 1 are each within bounds, but not together.
    expect(mismatchesWith(2, 1)).toEqual([{ what: 'SLO results by prompt_len', key: 'total', min: 2, max: 2, waybill: 3 }]);
  });
});

describe('the HTML report', () => {
  it('draws a long run (millions of inter-token gaps) without exceeding the call stack', () => {
    const plan = planRequest(WORKLOAD, seededRandom(1), 0, false);
    const gaps = Array.from({ length: 1_000_000 }, (_, i) => 1 + (i % 97));
    const result = {
      plan, startedAt: 0, sentMs: 0, status: 200, outcome: 'delivered' as const, code: 200, cancelPhase: undefined, ttftMs: 5, tpotMs: 2,
      e2eMs: 2000, itlMs: gaps, outputEvents: gaps.length + 1, usage: undefined, finishReasons: ['stop' as const], cancelRacedEnd: false, anomaly: undefined, error: undefined,
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
