/**
 * The status page's window (src/telemetry/status.ts), by value: plain settlements in, an injected clock, the view
 * out — the funnel, expiry as the clock moves, the bounded failure list, percentiles from known inputs.
 */
import { describe, expect, it } from 'vitest';
import type { AttemptRecord, Settlement } from '../src/accounting/ledger.js';
import { causeOf, createStatusWindow, MAX_ROWS, quantile, STATUS_WINDOW } from '../src/telemetry/status.js';

const T0 = Date.UTC(2026, 0, 1, 12, 0, 0);

function settlement(overrides: Partial<Settlement> = {}): Settlement {
  return {
    model: 'm',
    tenant: 'team-a',
    route: 'chat_completions',
    stream: true,
    code: 200,
    outcome: 'delivered',
    attempts: [attempt()],
    anomalies: [],
    finishReasons: ['stop'],
    cancelPhase: undefined,
    ttftMs: 100,
    tpotMs: 20,
    durationMs: 500,
    usage: { promptTokens: 10, completionTokens: 5, cachedTokens: undefined },
    relayed: { outputEvents: 5, outputChars: 20 },
    estimatedCompletionTokens: undefined,
    promptLen: '0-1k',
    slo: 'met',
    doneAfterErrorDropped: 0,
    responseId: undefined,
    responseModel: undefined,
    checks: [],
    accepted: true,
    verdict: 'accepted',
    evaluator: false,
    failedChecks: [],
    clientRetry: undefined,
    answerText: undefined,
    routing: undefined,
    ...overrides,
  };
}

function attempt(overrides: Partial<AttemptRecord> = {}): AttemptRecord {
  return { upstream: 'u1', startedAt: 0, status: 200, result: 'ok', endedAt: 400, firstOutputAt: 80, failure: undefined, ...overrides };
}

function windowAt(start = T0) {
  const clock = { now: start };
  const window = createStatusWindow({
    now: () => clock.now,
    ttftBuckets: [0.05, 0.1, 0.25, 0.5, 1],
    tpotBuckets: [0.01, 0.02, 0.05],
    firstOutputBuckets: [0.05, 0.1, 0.25, 0.5, 1],
  });
  return { clock, window };
}

const STREAM_ERROR = settlement({
  outcome: 'stream_error',
  accepted: false,
  verdict: undefined,
  slo: 'failed',
  finishReasons: ['none'],
  tpotMs: undefined,
  attempts: [attempt({ result: 'error_payload' })],
  anomalies: [{ upstream: 'u1', kind: 'error_payload' }],
});
const TRUNCATED = settlement({
  accepted: false,
  verdict: 'not_accepted',
  finishReasons: ['length'],
  failedChecks: ['not_truncated'],
  slo: 'met',
});
const LIMITED = settlement({ code: 429, outcome: 'rejected', accepted: false, verdict: undefined, slo: 'failed', attempts: [], ttftMs: undefined, tpotMs: undefined, usage: undefined, promptLen: 'unknown', finishReasons: [] });
const NOT_FOUND = settlement({ model: '_other', route: '_other', stream: false, code: 404, outcome: 'rejected', accepted: false, verdict: undefined, slo: 'excluded', attempts: [], ttftMs: undefined, tpotMs: undefined, usage: undefined, promptLen: 'unknown', finishReasons: [] });

describe('the funnel', () => {
  it('counts 2xx ⊇ delivered ⊇ accepted over one denominator, and the SLO apart from exclusions', () => {
    const { window } = windowAt();
    window.record(settlement(), 'r1', 'trace-1');
    window.record(settlement(), 'r2', undefined);
    window.record(STREAM_ERROR, 'r3', 'trace-3');
    window.record(TRUNCATED, 'r4', undefined);
    window.record(LIMITED, 'r5', undefined);
    window.record(NOT_FOUND, 'r6', undefined);
    const { funnel } = window.view();
    expect(funnel).toMatchObject({ requests: 6, http_2xx: 4, delivered: 3, accepted: 2, slo_eligible: 5, slo_met: 3, slo_attainment: 0.6 });
    expect(funnel.outcomes).toEqual({ delivered: 3, rejected: 2, failed: 0, timeout: 0, stream_error: 1, incomplete: 0, client_cancelled: 0 });
  });

  it('shows the evaluation cohort beside the accepted ratio: coverage and accepted among evaluated over their own denominators', () => {
    const { window } = windowAt();
    window.record(settlement(), 'r1', undefined);
    window.record(TRUNCATED, 'r2', undefined);
    // Over the cap: accepted (nothing failed), but outside the evaluated cohort.
    window.record(settlement({ verdict: 'unevaluated' }), 'r3', undefined);
    window.record(settlement({ verdict: 'unevaluated' }), 'r4', undefined);
    // Evaluator traffic: a request, never accepted nor checked.
    window.record(settlement({ evaluator: true, slo: 'excluded' }), 'r5', undefined);
    window.record(STREAM_ERROR, 'r6', undefined);
    const { funnel } = window.view();
    expect(funnel).toMatchObject({ requests: 6, delivered: 5, accepted: 3, checked: 4, evaluated: 2, evaluated_accepted: 1, evaluator: 1 });
    expect(funnel.evaluation_coverage).toBe(0.5);
    expect(funnel.accepted_among_evaluated).toBe(0.5);
    const empty = windowAt().window.view().funnel;
    expect([empty.evaluation_coverage, empty.accepted_among_evaluated]).toEqual([null, null]);
  });

  it('splits rows by model and tenant, with the configured names present at zero', () => {
    const { window } = windowAt();
    window.record(settlement(), 'r1', undefined);
    window.record(settlement({ tenant: 'team-b', usage: { promptTokens: 7, completionTokens: 3, cachedTokens: 2 } }), 'r2', undefined);
    window.record(NOT_FOUND, 'r3', undefined);
    const view = window.view({ models: ['m', 'idle-model'], tenants: ['team-a', 'team-b', 'team-c'] });
    expect(view.models.map((r) => [r.name, r.requests, r.delivered, r.accepted])).toEqual([
      ['m', 2, 2, 2],
      ['idle-model', 0, 0, 0],
      ['_other', 1, 0, 0],
    ]);
    const b = view.tenants.find((r) => r.name === 'team-b');
    expect(b).toMatchObject({ requests: 1, prompt_tokens: 7, cached_prompt_tokens: 2, completion_tokens: 3, slo_attainment: 1 });
    expect(view.tenants.find((r) => r.name === 'team-c')).toMatchObject({ requests: 0, slo_attainment: null, goodput_per_second: 0 });
  });

  it('computes goodput over the time the window covers', () => {
    const { clock, window } = windowAt(T0 - (T0 % 10_000));
    for (let i = 0; i < 20; i++) window.record(settlement(), `r${i}`, undefined);
    clock.now += 10_000;
    const view = window.view();
    expect(view.window).toEqual({ seconds: 300, bucket_seconds: 10, covered_seconds: 10 });
    expect(view.funnel.goodput_per_second).toBe(2);
    expect(view.models[0]?.goodput_per_second).toBe(2);
  });
});

describe('the sliding window', () => {
  it('has 30 buckets of 10 s, newest last, and forgets a bucket once it leaves the window', () => {
    const start = T0 - (T0 % STATUS_WINDOW.bucketMs);
    const { clock, window } = windowAt(start);
    window.record(settlement(), 'old', undefined);
    clock.now = start + 100_000;
    window.record(STREAM_ERROR, 'newer', undefined);
    let view = window.view();
    expect(view.series).toHaveLength(30);
    expect(view.series.at(-1)?.start).toBe(new Date(start + 100_000).toISOString());
    expect(view.funnel.requests).toBe(2);
    expect(view.series.filter((p) => p.requests > 0).map((p) => p.requests)).toEqual([1, 1]);

    // 5 minutes after the first bucket began, it has left the window; the second is still in it.
    clock.now = start + 300_000;
    view = window.view();
    expect(view.funnel).toMatchObject({ requests: 1, delivered: 0 });
    expect(view.series[0]?.start).toBe(new Date(start + 10_000).toISOString());
    // Its slot is reused by a new bucket without the old counts.
    window.record(settlement(), 'new', undefined);
    expect(window.view().funnel).toMatchObject({ requests: 2, delivered: 1 });

    clock.now = start + 100_000 + 300_000;
    expect(window.view().funnel.requests).toBe(1);
    clock.now += 3_600_000;
    expect(window.view().funnel.requests).toBe(0);
    expect(window.view().models).toEqual([]);
  });

  it('folds rows past the cap into _other, so no input grows a bucket without bound', () => {
    const { window } = windowAt();
    for (let i = 0; i < MAX_ROWS + 50; i++) window.record(settlement({ model: `model-${i}` }), `r${i}`, undefined);
    const { models } = window.view();
    expect(models).toHaveLength(MAX_ROWS + 1);
    expect(models.find((r) => r.name === '_other')?.requests).toBe(50);
  });
});

describe('the failed requests', () => {
  it('keeps the requests that were not accepted, newest first, with ids and closed-set values only', () => {
    const { clock, window } = windowAt();
    window.record(settlement(), 'ok', 'trace-ok');
    window.record(STREAM_ERROR, 'broken', 'trace-broken');
    clock.now += 1500;
    window.record(TRUNCATED, 'cut', undefined);
    window.record(LIMITED, 'limited', undefined);
    // The client's own error (SLO `excluded`) is counted, not listed.
    window.record(NOT_FOUND, 'not-found', undefined);
    const { failures, funnel } = window.view();
    expect(funnel.requests).toBe(5);
    expect(failures.map((f) => [f.request_id, f.outcome, f.cause, f.code])).toEqual([
      ['limited', 'rejected', 'gateway', 429],
      ['cut', 'delivered', 'check_failed:not_truncated', 200],
      ['broken', 'stream_error', 'error_payload', 200],
    ]);
    expect(failures[2]).toEqual({
      request_id: 'broken',
      trace_id: 'trace-broken',
      at: new Date(T0).toISOString(),
      model: 'm',
      tenant: 'team-a',
      route: 'chat_completions',
      stream: true,
      code: 200,
      outcome: 'stream_error',
      cause: 'error_payload',
      upstream: 'u1',
      attempts: 1,
    });
    expect(failures[0]).toMatchObject({ upstream: null, attempts: 0, trace_id: null });
  });

  it('keeps only the last 50, and does not forget them with the window', () => {
    const { clock, window } = windowAt();
    for (let i = 0; i < 120; i++) window.record(STREAM_ERROR, `r${i}`, undefined);
    clock.now += 3_600_000;
    const { failures, funnel } = window.view();
    expect(funnel.requests).toBe(0);
    expect(failures).toHaveLength(STATUS_WINDOW.failures);
    expect(failures[0]?.request_id).toBe('r119');
    expect(failures.at(-1)?.request_id).toBe('r70');
  });

  it('names the cause from the settlement, never from a message', () => {
    expect(causeOf(settlement({ outcome: 'client_cancelled', cancelPhase: 'streaming', accepted: false }))).toBe('client_cancelled:streaming');
    expect(
      causeOf(
        settlement({
          outcome: 'failed',
          code: 502,
          accepted: false,
          attempts: [attempt({ result: 'connect_error', failure: { status: 502, outcome: 'failed', cause: 'connect_error', upstreamError: undefined } })],
        }),
      ),
    ).toBe('connect_error');
    expect(causeOf(settlement({ outcome: 'incomplete', accepted: false, anomalies: [{ upstream: 'u1', kind: 'missing_done' }] }))).toBe('missing_done');
    expect(causeOf(settlement({ outcome: 'timeout', accepted: false, attempts: [attempt({ result: 'timeout' })] }))).toBe('timeout');
  });
});

describe('latency', () => {
  it('estimates percentiles as histogram_quantile does', () => {
    // Buckets (le): 1, 2, 4, +Inf with 10, 10, 0, 0 observations.
    expect(quantile(0.5, [1, 2, 4], [10, 10, 0, 0])).toBe(1);
    expect(quantile(0.75, [1, 2, 4], [10, 10, 0, 0])).toBe(1.5);
    expect(quantile(0.25, [1, 2, 4], [10, 10, 0, 0])).toBe(0.5);
    // A rank in the +Inf bucket answers the highest finite bound.
    expect(quantile(0.99, [1, 2, 4], [1, 0, 0, 9])).toBe(4);
    // Empty buckets before the rank are skipped.
    expect(quantile(0.5, [1, 2, 4], [0, 0, 4, 0])).toBe(3);
    expect(quantile(0.5, [1, 2, 4], [0, 0, 0, 0])).toBeNull();
  });

  it('gives TTFT and TPOT percentiles per prompt-length class, from the configured buckets', () => {
    const { window } = windowAt();
    // TTFT 60..150 ms: 4 in the (50, 100] bucket, 4 in (100, 250]; p95 = 100 + 150 × (7.6 − 4) / 4. One long prompt at 800 ms.
    for (const ttft of [60, 70, 80, 90, 110, 120, 130, 150]) window.record(settlement({ ttftMs: ttft, tpotMs: 15 }), 'r', undefined);
    window.record(settlement({ ttftMs: 800, tpotMs: 40, promptLen: '16k-64k' }), 'long', undefined);
    window.record(NOT_FOUND, 'nf', undefined);
    const { latency } = window.view({ promptLenClasses: ['0-1k', '1k-4k', '16k-64k', 'unknown'] });
    expect(latency.map((l) => l.prompt_len)).toEqual(['0-1k', '1k-4k', '16k-64k', 'unknown']);
    const short = latency[0];
    expect(short?.ttft).toEqual({ count: 8, p50: 100, p95: 235, p99: 247 });
    expect(short?.tpot).toEqual({ count: 8, p50: 15, p95: 19.5, p99: 19.9 });
    expect(latency[2]?.ttft).toMatchObject({ count: 1, p50: 750 });
    expect(latency[1]?.ttft).toEqual({ count: 0, p50: null, p95: null, p99: null });
  });

  it('tracks each upstream: attempts, failures as passive health counts them, first output', () => {
    const { window } = windowAt();
    window.record(settlement({ attempts: [attempt({ upstream: 'u2', result: 'http_5xx', firstOutputAt: undefined }), attempt({ firstOutputAt: 70 })] }), 'r1', undefined);
    window.record(settlement({ attempts: [attempt({ result: 'http_4xx', firstOutputAt: undefined })], outcome: 'rejected', code: 400, accepted: false }), 'r2', undefined);
    const { upstreams } = window.view({ upstreams: ['u1', 'u2', 'u3'] });
    expect(upstreams.map((u) => [u.name, u.attempts, u.failed_attempts, u.first_output.count])).toEqual([
      ['u1', 2, 0, 1],
      ['u2', 1, 1, 0],
      ['u3', 0, 0, 0],
    ]);
    expect(upstreams[1]?.last_failure).toEqual({ at: new Date(T0).toISOString(), result: 'http_5xx' });
    expect(upstreams[0]?.last_failure).toBeNull();
  });
});
