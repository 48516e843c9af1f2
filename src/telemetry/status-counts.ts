/**
 * The arithmetic of the status window (status.ts): a settlement folded into a row's counts, counts added up,
 * latency counted per histogram bucket and read back as percentiles the way PromQL's `histogram_quantile` reads
 * them, and a failed request's cause from a closed set. Pure.
 */
import type { AttemptRecord, Settlement } from '../accounting/ledger.js';
import type { Cohort, Funnel, Percentiles, TokenCounts } from './status.js';

export interface Counts extends Funnel, Cohort, TokenCounts {}

export const zeroCounts = (): Counts => ({
  requests: 0,
  http_2xx: 0,
  delivered: 0,
  accepted: 0,
  slo_eligible: 0,
  slo_met: 0,
  checked: 0,
  evaluated: 0,
  evaluated_accepted: 0,
  evaluator: 0,
  prompt_tokens: 0,
  cached_prompt_tokens: 0,
  completion_tokens: 0,
});

export function addCounts(into: Counts, from: Counts): void {
  into.requests += from.requests;
  into.http_2xx += from.http_2xx;
  into.delivered += from.delivered;
  into.accepted += from.accepted;
  into.slo_eligible += from.slo_eligible;
  into.slo_met += from.slo_met;
  into.checked += from.checked;
  into.evaluated += from.evaluated;
  into.evaluated_accepted += from.evaluated_accepted;
  into.evaluator += from.evaluator;
  into.prompt_tokens += from.prompt_tokens;
  into.cached_prompt_tokens += from.cached_prompt_tokens;
  into.completion_tokens += from.completion_tokens;
}

export function addSettlement(into: Counts, s: Settlement): void {
  into.requests++;
  if (s.code >= 200 && s.code < 300) into.http_2xx++;
  if (s.outcome === 'delivered') into.delivered++;
  // As the metrics count them: evaluator traffic is in the requests, never in the acceptance counts.
  if (s.evaluator) into.evaluator++;
  else {
    if (s.accepted) into.accepted++;
    if (s.verdict !== undefined) {
      into.checked++;
      if (s.verdict !== 'unevaluated') into.evaluated++;
      if (s.verdict === 'accepted') into.evaluated_accepted++;
    }
  }
  if (s.slo !== 'excluded') into.slo_eligible++;
  if (s.slo === 'met') into.slo_met++;
  into.prompt_tokens += s.usage?.promptTokens ?? 0;
  into.cached_prompt_tokens += s.usage?.cachedTokens ?? 0;
  into.completion_tokens += s.usage?.completionTokens ?? 0;
}

/** Counts `value` in its histogram slot (bounds ascending, the last slot +Inf; `le` semantics, as Prometheus). */
export function observe(counts: Float64Array, bounds: Float64Array, value: number): void {
  let i = 0;
  while (i < bounds.length && value > (bounds[i] as number)) i++;
  counts[i] = (counts[i] as number) + 1;
}

/**
 * The q-quantile of a histogram, as PromQL's `histogram_quantile` estimates it: linear within the bucket holding
 * the rank, from 0 for the first bucket; a rank in the +Inf bucket answers the highest finite bound. Same units as
 * `bounds`; null without observations.
 */
export function quantile(q: number, bounds: ArrayLike<number>, counts: ArrayLike<number>): number | null {
  let total = 0;
  for (let i = 0; i < counts.length; i++) total += counts[i] as number;
  if (total === 0 || bounds.length === 0) return null;
  const rank = q * total;
  let below = 0;
  for (let i = 0; i < bounds.length; i++) {
    const count = counts[i] as number;
    if (below + count >= rank && count > 0) {
      const lower = i === 0 ? 0 : (bounds[i - 1] as number);
      const upper = bounds[i] as number;
      return lower + (upper - lower) * ((rank - below) / count);
    }
    below += count;
  }
  return bounds[bounds.length - 1] as number;
}

export function percentiles(boundsMs: Float64Array, counts: Float64Array): Percentiles {
  let count = 0;
  for (const c of counts) count += c;
  const round = (v: number | null) => (v === null ? null : Math.round(v * 1000) / 1000);
  return { count, p50: round(quantile(0.5, boundsMs, counts)), p95: round(quantile(0.95, boundsMs, counts)), p99: round(quantile(0.99, boundsMs, counts)) };
}

export function addInto(into: Float64Array, from: Float64Array): void {
  for (let i = 0; i < into.length; i++) into[i] = (into[i] as number) + (from[i] as number);
}

/**
 * Why a request failed, from a closed set (never a message): for a delivered one that was not accepted,
 * `check_failed:` and the failed checks; for a cancellation, `client_cancelled:` and its phase; for a request the
 * gateway answered without an attempt (a limit, an unknown model or route, a bad body, a missing key), `gateway`;
 * otherwise the last attempt's failure cause (`upstream_5xx`, `connect_error`, `timeout`, …) or, after commit, its
 * result (`error_payload` for an error event, `incomplete`, `timeout`, `reset`).
 */
export function causeOf(s: Settlement): string {
  if (s.outcome === 'client_cancelled') return `client_cancelled:${s.cancelPhase ?? 'before_first_token'}`;
  if (s.outcome === 'delivered') return s.failedChecks.length > 0 ? `check_failed:${s.failedChecks.join(',')}` : 'none';
  const last: AttemptRecord | undefined = s.attempts.at(-1);
  if (last === undefined) return 'gateway';
  if (last.failure !== undefined) return last.failure.cause;
  if (last.result !== undefined && last.result !== 'ok') return last.result;
  // The attempt itself ended well, yet the request did not: what the stream lacked.
  const anomaly = s.anomalies.find((a) => a.kind === 'missing_finish_reason' || a.kind === 'missing_done' || a.kind === 'error_payload');
  return anomaly?.kind ?? s.outcome;
}
