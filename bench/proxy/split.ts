/**
 * `bench/ab.js --split LONG`: one proxy's CPU per event at two answer lengths, measured back to back, split into a cost
 * per request (a) and a cost per event (b):
 *
 *   CPU per event = b + a ÷ (events per request)
 *
 * Two windows of one process, minutes apart at most, solve it exactly; the least-squares fit of bench/proxy/fit.ts
 * needs windows of separate processes, whose ±15% spread swamped a (docs/performance.md). This is what told the
 * in-place cost of a streamed request apart from `reqs`'s, where the same code runs hot, request after request.
 */
import type { Scenario } from './scenarios.js';
import { measuresRequests } from './scenarios.js';

/** One measured window: CPU per event, and the events per request the client saw. */
export interface SplitWindow {
  readonly usPerEvent: number;
  readonly eventsPerRequest: number;
}

export interface CostSplit {
  /** µs per request (a) and per event (b); NaN when the two windows have the same events per request. */
  readonly usPerRequest: number;
  readonly usPerEvent: number;
}

/** a and b from two windows of one process at two answer lengths. */
export function splitCosts(short: SplitWindow, long: SplitWindow): CostSplit {
  const spread = 1 / short.eventsPerRequest - 1 / long.eventsPerRequest;
  if (!Number.isFinite(spread) || Math.abs(spread) < 1e-9) return { usPerRequest: Number.NaN, usPerEvent: Number.NaN };
  const usPerRequest = (short.usPerEvent - long.usPerEvent) / spread;
  return { usPerRequest, usPerEvent: long.usPerEvent - usPerRequest / long.eventsPerRequest };
}

/**
 * Why `long` cannot be split against `short`, or undefined when it can: both paced streams at the same pace, first
 * token and concurrency, of different lengths (one simulator serves both: its answers are capped by `max_tokens`).
 */
export function splitProblem(short: Scenario, long: Scenario): string | undefined {
  if (measuresRequests(short) || measuresRequests(long)) return 'both scenarios must stream answers of more than one token';
  if (short.itlMs <= 0 || long.itlMs <= 0) return 'both scenarios must be paced (a saturated read carries several events)';
  if (short.itlMs !== long.itlMs || short.ttftMs !== long.ttftMs || short.concurrency !== long.concurrency) {
    return `${long.name} differs from ${short.name} in more than its answer length`;
  }
  if (short.tokens === long.tokens) return `${long.name} has ${short.name}'s answer length: nothing tells a from b`;
  return undefined;
}
