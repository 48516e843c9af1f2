/**
 * What a run measured, from the client's side: percentiles, rates, the delivered ratio, and joint TTFT+TPOT SLO
 * attainment and goodput judged by the same rules as Waybill's `waybill_slo_requests_total`.
 */
import type { SloResult } from '../src/accounting/outcomes.js';
import { classifyPromptLen, promptLenClasses } from '../src/accounting/prompt-len.js';
import type { RequestResult } from './client.js';

export interface SloThresholds {
  readonly ttftMs: number;
  readonly tpotMs: number;
  readonly e2eMs: number;
}

export interface Percentiles {
  readonly count: number;
  readonly p50: number | undefined;
  readonly p90: number | undefined;
  readonly p99: number | undefined;
  readonly max: number | undefined;
}

export interface RunSummary {
  readonly requests: number;
  readonly durationS: number;
  readonly requestsPerS: number;
  readonly outputEventsPerS: number;
  readonly byOutcome: Record<string, number>;
  readonly byCode: Record<string, number>;
  readonly delivered: number;
  readonly deliveredRatio: number | undefined;
  readonly http2xxRatio: number | undefined;
  readonly slo: Record<string, number>;
  readonly sloAttainment: number | undefined;
  readonly goodputPerS: number;
  readonly ttftMs: Percentiles;
  readonly itlMs: Percentiles;
  readonly tpotMs: Percentiles;
  readonly e2eMs: Percentiles;
  readonly clientAnomalies: Record<string, number>;
}

const BOUNDARIES = [1024, 4096, 16384, 65536];
const CLASSES = promptLenClasses(BOUNDARIES);

export function promptLenOf(result: RequestResult): string {
  return classifyPromptLen(BOUNDARIES, CLASSES, result.usage?.promptTokens);
}

/** The SLO result Waybill records for this request, computed from what the client saw. */
export function sloOf(result: RequestResult, slo: SloThresholds): SloResult {
  switch (result.outcome) {
    case 'delivered': {
      if (!result.plan.stream) return result.e2eMs > slo.e2eMs ? 'missed_e2e' : 'met';
      const ttft = result.ttftMs ?? result.e2eMs;
      const missedTtft = ttft > slo.ttftMs;
      const missedTpot = result.tpotMs !== undefined && result.tpotMs > slo.tpotMs;
      if (missedTtft && missedTpot) return 'missed_ttft_tpot';
      if (missedTtft) return 'missed_ttft';
      return missedTpot ? 'missed_tpot' : 'met';
    }
    case 'rejected':
      return result.code === 429 || result.code === 503 ? 'failed' : 'excluded';
    case 'client_cancelled': {
      if (!result.plan.stream) return result.e2eMs > slo.e2eMs ? 'missed_e2e' : 'excluded';
      return (result.ttftMs ?? result.e2eMs) > slo.ttftMs ? 'missed_ttft' : 'excluded';
    }
    case 'failed':
    case 'timeout':
    case 'stream_error':
    case 'incomplete':
      return 'failed';
  }
}

export function percentiles(values: readonly number[]): Percentiles {
  if (values.length === 0) return { count: 0, p50: undefined, p90: undefined, p99: undefined, max: undefined };
  const sorted = Float64Array.from(values).sort();
  const at = (q: number) => sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))];
  return { count: sorted.length, p50: at(0.5), p90: at(0.9), p99: at(0.99), max: sorted[sorted.length - 1] };
}

function increment(map: Record<string, number>, key: string, by = 1): void {
  map[key] = (map[key] ?? 0) + by;
}

export function summarize(results: readonly RequestResult[], durationS: number, slo: SloThresholds): RunSummary {
  const byOutcome: Record<string, number> = {};
  const byCode: Record<string, number> = {};
  const sloCounts: Record<string, number> = {};
  const clientAnomalies: Record<string, number> = {};
  const ttft: number[] = [];
  const itl: number[] = [];
  const tpot: number[] = [];
  const e2e: number[] = [];
  let events = 0;
  for (const r of results) {
    increment(byOutcome, r.outcome);
    increment(byCode, String(r.code));
    increment(sloCounts, sloOf(r, slo));
    if (r.anomaly !== undefined) increment(clientAnomalies, r.anomaly);
    if (r.ttftMs !== undefined) ttft.push(r.ttftMs);
    for (const gap of r.itlMs) itl.push(gap);
    if (r.tpotMs !== undefined) tpot.push(r.tpotMs);
    e2e.push(r.e2eMs);
    events += r.outputEvents;
  }
  const n = results.length;
  const delivered = byOutcome['delivered'] ?? 0;
  const ok2xx = Object.entries(byCode).reduce((sum, [code, count]) => (code.startsWith('2') ? sum + count : sum), 0);
  const met = sloCounts['met'] ?? 0;
  const judged = n - (sloCounts['excluded'] ?? 0);
  return {
    requests: n,
    durationS,
    requestsPerS: n / durationS,
    outputEventsPerS: events / durationS,
    byOutcome,
    byCode,
    delivered,
    // Undefined, not 0, without traffic: no requests is not a failed SLO.
    deliveredRatio: n > 0 ? delivered / n : undefined,
    http2xxRatio: n > 0 ? ok2xx / n : undefined,
    slo: sloCounts,
    sloAttainment: judged > 0 ? met / judged : undefined,
    goodputPerS: met / durationS,
    ttftMs: percentiles(ttft),
    itlMs: percentiles(itl),
    tpotMs: percentiles(tpot),
    e2eMs: percentiles(e2e),
    clientAnomalies,
  };
}
