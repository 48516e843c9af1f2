/**
 * The most streams one core sustains: over the run's streamed scenarios at one token pace (20 ms: c256s, c384s,
 * c512s, c768s), the largest concurrency at which a row kept ITL p99 within 2× the pace and the direct run's
 * throughput (≥ 0.99×). A coarse sweep: the answer lies between that concurrency and the next one run.
 */
import type { ScenarioResult } from './run.js';

export interface Sustained {
  target: string;
  /** The pace of the scenarios read, ms between tokens. */
  paceMs: number;
  /** The largest concurrency that held, or 0 when none of those run did. */
  streams: number;
  /** The smallest concurrency run above it that did not hold (undefined: none ran above it). */
  failedAt: number | undefined;
  /** Concurrencies read, ascending. */
  read: number[];
}

export const SUSTAINED_PACE_MS = 20;

export function sustainedStreams(results: readonly ScenarioResult[], paceMs = SUSTAINED_PACE_MS): Sustained[] {
  const paced = results.filter((r) => r.scenario.stream && r.scenario.itlMs === paceMs).sort((a, b) => a.scenario.concurrency - b.scenario.concurrency);
  if (paced.length === 0) return [];
  const names = [...new Set(paced.flatMap((r) => r.targets.map((t) => t.target)))];
  const out: Sustained[] = [];
  for (const target of names) {
    let streams = 0;
    let failedAt: number | undefined;
    const read: number[] = [];
    for (const result of paced) {
      const row = result.targets.find((t) => t.target === target);
      const direct = result.targets.find((t) => t.target === 'direct');
      if (row === undefined || direct === undefined) continue;
      read.push(result.scenario.concurrency);
      // The first miss bounds the answer: a larger concurrency that held again does not count.
      if (failedAt !== undefined) continue;
      if (row.itlP99 <= 2 * paceMs && row.eventsPerS >= 0.99 * direct.eventsPerS) streams = result.scenario.concurrency;
      else failedAt = result.scenario.concurrency;
    }
    out.push({ target, paceMs, streams, failedAt, read });
  }
  return out;
}

export function formatSustained(rows: readonly Sustained[]): string {
  if (rows.length === 0) return '';
  const lines = [`Most streams one core sustains at a ${rows[0]?.paceMs} ms pace (ITL p99 <= 2x the pace, throughput >= 0.99x direct), over concurrencies ${rows[0]?.read.join(', ')}:`];
  for (const r of rows) {
    const above = r.failedAt === undefined ? 'no larger one run' : `not at ${r.failedAt}`;
    lines.push(`  ${r.target.padEnd(18)} ${r.streams === 0 ? `none of those run (${above})` : `${r.streams} (${above})`}`);
  }
  return lines.join('\n');
}
