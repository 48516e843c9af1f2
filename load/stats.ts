/**
 * What a run measured, from the client's side: percentiles, rates, the delivered ratio, and joint TTFT+TPOT SLO
 * attainment and goodput judged by the rules of Waybill's `waybill_slo_requests_total` (docs/metrics.md). The
 * judgement is the reconciliation's oracle, so it is written here from the documented rules, not taken from the
 * ledger.
 */
import type { Outcome, RequestResult } from './client.js';
import type { FleetSummary } from './fleet-stats.js';
import { inputTexts } from './load-routes.js';

export interface SloThresholds {
  readonly ttftMs: number;
  readonly tpotMs: number;
  readonly e2eMs: number;
}

export type SloResult = 'met' | 'missed_ttft' | 'missed_tpot' | 'missed_ttft_tpot' | 'missed_e2e' | 'failed' | 'excluded';

export interface Percentiles {
  readonly count: number;
  readonly p50: number | undefined;
  readonly p90: number | undefined;
  readonly p95: number | undefined;
  readonly p99: number | undefined;
  readonly max: number | undefined;
}

export interface RunSummary {
  readonly requests: number;
  readonly durationS: number;
  readonly requestsPerS: number;
  readonly outputEventsPerS: number;
  readonly byOutcome: Record<string, number>;
  /** Requests per route, and per route and outcome (`route|outcome`). */
  readonly byRoute: Record<string, number>;
  readonly byRouteOutcome: Record<string, number>;
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
  /** A fleet workload's own figures (load/fleet-stats.ts): cached-prompt ratio, upstream shares, idle gaps. */
  readonly fleet?: FleetSummary;
}

/** docs/metrics.md `prompt_len` with the default boundaries (k = 1024 tokens; a boundary belongs to the class above). */
const PROMPT_LEN_CLASSES: ReadonlyArray<readonly [number, string]> = [
  [1024, '0-1k'],
  [4096, '1k-4k'],
  [16384, '4k-16k'],
  [65536, '16k-64k'],
  [Number.POSITIVE_INFINITY, '64k+'],
];
export const PROMPT_LENS: readonly string[] = [...PROMPT_LEN_CLASSES.map(([, name]) => name), 'unknown'];

/** Waybill's default `metrics.chars_per_token`, for its estimate of a prompt without usage. */
const CHARS_PER_TOKEN = 4;

/**
 * The request's class: from usage `prompt_tokens` when the answer reported it, otherwise from the estimate Waybill
 * makes of the input it was sent (the characters of its texts — a rerank's query and documents — / chars_per_token,
 * rounded up).
 */
export function promptLenOf(result: RequestResult): string {
  const chars = inputTexts(result.plan).reduce((sum, text) => sum + text.length, 0);
  const tokens = result.usage?.promptTokens ?? Math.ceil(chars / CHARS_PER_TOKEN);
  return PROMPT_LEN_CLASSES.find(([upper]) => tokens < upper)?.[1] ?? 'unknown';
}

/** A duration Waybill may have measured: somewhere in [lo, hi]. */
interface Range {
  readonly lo: number;
  readonly hi: number;
}

/** Whether a duration in `range` is over `limit`: known (one answer) or borderline (both). */
function over(range: Range, limit: number): boolean[] {
  if (range.hi <= limit) return [false];
  return range.lo > limit ? [true] : [false, true];
}

interface Timings {
  /** Time to the first output (a delivered stream without output: to its `[DONE]`). */
  readonly ttft: Range | undefined;
  readonly tpot: Range | undefined;
  /** Time to the end: the whole answer, or the client leaving. */
  readonly e2e: Range;
}

/** The SLO results possible for a request with this outcome and these timings (one when none is borderline). */
function judge(outcome: Outcome, result: RequestResult, slo: SloThresholds, t: Timings): SloResult[] {
  const stream = result.plan.stream;
  switch (outcome) {
    case 'delivered': {
      if (!stream) return over(t.e2e, slo.e2eMs).map((missed) => (missed ? 'missed_e2e' : 'met'));
      const results: SloResult[] = [];
      for (const ttft of over(t.ttft ?? t.e2e, slo.ttftMs)) {
        for (const tpot of t.tpot === undefined ? [false] : over(t.tpot, slo.tpotMs)) {
          results.push(ttft && tpot ? 'missed_ttft_tpot' : ttft ? 'missed_ttft' : tpot ? 'missed_tpot' : 'met');
        }
      }
      return results;
    }
    case 'rejected':
      // 429 and 503 are the service failing to serve; other rejections are the client's doing.
      return [result.code === 429 || result.code === 503 ? 'failed' : 'excluded'];
    case 'client_cancelled':
      // A cancellation counts against the SLO only once its threshold had passed.
      if (!stream) return over(t.e2e, slo.e2eMs).map((missed) => (missed ? 'missed_e2e' : 'excluded'));
      return over(t.ttft ?? t.e2e, slo.ttftMs).map((missed) => (missed ? 'missed_ttft' : 'excluded'));
    case 'failed':
    case 'timeout':
    case 'stream_error':
    case 'incomplete':
      return ['failed'];
  }
}

const point = (ms: number): Range => ({ lo: ms, hi: ms });

/** The SLO result of this request as the client saw it (its clocks from the request's start): the summary's. */
export function sloOf(result: RequestResult, slo: SloThresholds): SloResult {
  const timings = {
    ttft: result.ttftMs === undefined ? undefined : point(result.ttftMs),
    tpot: result.tpotMs === undefined ? undefined : point(result.tpotMs),
    e2e: point(result.e2eMs),
  };
  return judge(result.outcome, result, slo, timings)[0] ?? 'failed';
}

/**
 * The SLO results Waybill may have recorded for this request, given that the client's clocks and Waybill's agree
 * within `marginMs` (docs/load.md, "Borderline requests"). Times run from the moment the request was written, the
 * closest a client gets to Waybill's arrival. Waybill's TTFT cannot be longer than the client's (it starts after the
 * request was written and stops before the event reaches the client), so a client TTFT at or under the threshold
 * is exact, and only one within the margin above it is borderline; TPOT, an interval over (tokens per choice - 1),
 * has margin / (tokens per choice - 1) either side; end-to-end time the margin either side. Several results: the
 * request is borderline.
 */
export function sloCandidates(result: RequestResult, slo: SloThresholds, marginMs: number, outcome: Outcome = result.outcome): SloResult[] {
  const sent = result.sentMs ?? 0;
  const ttftClient = result.ttftMs === undefined ? undefined : result.ttftMs - sent;
  const e2eClient = result.e2eMs - sent;
  const perChoice = result.usage?.completionTokens === undefined ? undefined : result.usage.completionTokens / Math.max(1, result.plan.n);
  const tpotMargin = perChoice !== undefined && perChoice > 1 ? marginMs / (perChoice - 1) : 0;
  const delivered = outcome === 'delivered';
  const timings: Timings = {
    ttft: ttftClient === undefined ? undefined : { lo: ttftClient - marginMs, hi: ttftClient },
    tpot:
      result.tpotMs !== undefined
        ? { lo: result.tpotMs - tpotMargin, hi: result.tpotMs + tpotMargin }
        : delivered && result.outcome !== 'delivered'
          ? { lo: 0, hi: Number.POSITIVE_INFINITY } // delivered in Waybill's eyes only: its TPOT is unknown here
          : undefined,
    // A delivered stream's [DONE] is like its first output: Waybill reads it before the client does.
    e2e: delivered && result.plan.stream ? { lo: e2eClient - marginMs, hi: e2eClient } : { lo: e2eClient - marginMs, hi: e2eClient + marginMs },
  };
  return [...new Set(judge(outcome, result, slo, timings))];
}

export function percentiles(values: readonly number[]): Percentiles {
  if (values.length === 0) return { count: 0, p50: undefined, p90: undefined, p95: undefined, p99: undefined, max: undefined };
  const sorted = Float64Array.from(values).sort();
  const at = (q: number) => sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))];
  return { count: sorted.length, p50: at(0.5), p90: at(0.9), p95: at(0.95), p99: at(0.99), max: sorted[sorted.length - 1] };
}

function increment(map: Record<string, number>, key: string, by = 1): void {
  map[key] = (map[key] ?? 0) + by;
}

export function summarize(results: readonly RequestResult[], durationS: number, slo: SloThresholds): RunSummary {
  const byOutcome: Record<string, number> = {};
  const byRoute: Record<string, number> = {};
  const byRouteOutcome: Record<string, number> = {};
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
    increment(byRoute, r.plan.route);
    increment(byRouteOutcome, `${r.plan.route}|${r.outcome}`);
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
    byRoute,
    byRouteOutcome,
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
