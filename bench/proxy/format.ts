/** How the bench writes its figures: fixed digits, a dash for what could not be measured, aligned tables. */
import type { WindowFigures } from './measure.js';

export const f1 = (x: number) => (Number.isFinite(x) ? x.toFixed(1) : '–');
export const f2 = (x: number) => (Number.isFinite(x) ? x.toFixed(2) : '–');
export const signed = (x: number, digits = 2) => (Number.isFinite(x) ? `${x >= 0 ? '+' : ''}${x.toFixed(digits)}` : '–');
export const pct = (x: number) => (Number.isFinite(x) ? `${Math.round(x * 100)}%` : '–');
export const mib = (kib: number) => (Number.isFinite(kib) ? (kib / 1024).toFixed(0) : '–');

export function brief(w: WindowFigures, stream: boolean): string {
  const traffic = stream
    ? `${Math.round(w.eventsPerS)} ev/s (${f1(w.eventsPerRead)}/chunk), TTFT p50 ${f2(w.ttftMs.p50)} p99 ${f2(w.ttftMs.p99)} ms, ITL p99 ${f2(w.itlMs.p99)} ms`
    : `${Math.round(w.requestsPerS)} req/s, latency p50 ${f2(w.ttftMs.p50)} p99 ${f2(w.ttftMs.p99)} ms`;
  const cpu = stream ? `${f1(w.proxyUsPerEvent)} µs/ev` : `${f1(w.proxyUsPerRequest)} µs/req`;
  return (
    traffic +
    (Number.isFinite(w.proxyCpuUs) ? `, proxy ${cpu} (${pct(w.proxyCpuShare)} of core 0)` : '') +
    `, other load core0 ${pct(w.core0Foreign)} core1 ${pct(w.core1Foreign)}` +
    (w.errors + w.requestsIncomplete > 0 ? `, ${w.errors} errors ${w.requestsIncomplete} incomplete ${w.errorMessages.join('; ')}` : '')
  );
}

export function table(rows: string[][]): string {
  const widths = (rows[0] as string[]).map((_, c) => Math.max(...rows.map((r) => (r[c] ?? '').length)));
  return rows.map((r) => r.map((cell, c) => (c === 0 || c === 1 ? cell.padEnd(widths[c] as number) : cell.padStart(widths[c] as number))).join('  ')).join('\n');
}

