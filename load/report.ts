/**
 * Reports of a run: a readable summary table, a JSON report, and a self-contained HTML report (inline SVG, no
 * external assets) with latency histograms and time series of throughput and TTFT. Both files open with the run's
 * header (load/header.ts): what was run, and why it took as long as it did.
 */
import { histogramSvg, lineChartSvg, type Marker } from './chart.js';
import type { RequestResult } from './client.js';
import { fleetText } from './fleet-stats.js';
import { formatDuration, headerRows, type RunHeader } from './header.js';
import type { Reconciliation } from './reconcile.js';
import type { Percentiles, RunSummary, SloThresholds } from './stats.js';

const ms = (value: number | undefined) => (value === undefined ? '—' : value < 10 ? value.toFixed(2) : value.toFixed(1));
const pct = (value: number | undefined) => (value === undefined ? '—' : `${(value * 100).toFixed(2)}%`);

function row(label: string, p: Percentiles): string {
  return `  ${label.padEnd(16)} ${String(p.count).padStart(8)} ${ms(p.p50).padStart(9)} ${ms(p.p90).padStart(9)} ${ms(p.p95).padStart(9)} ${ms(p.p99).padStart(9)} ${ms(p.max).padStart(9)}`;
}

export function summaryTable(summary: RunSummary, slo: SloThresholds): string {
  const lines = [
    `requests        ${summary.requests} in ${summary.durationS.toFixed(1)} s  (${summary.requestsPerS.toFixed(1)} req/s, ${summary.outputEventsPerS.toFixed(0)} output events/s)`,
    `delivered       ${summary.delivered}  (${pct(summary.deliveredRatio)} delivered vs ${pct(summary.http2xxRatio)} HTTP 2xx)`,
    `outcomes        ${Object.entries(summary.byOutcome).map(([k, v]) => `${k}=${v}`).join('  ')}`,
    `routes          ${Object.entries(summary.byRoute).map(([k, v]) => `${k}=${v}`).join('  ')}`,
    `status codes    ${Object.entries(summary.byCode).map(([k, v]) => `${k}=${v}`).join('  ')}`,
    `SLO (TTFT ${slo.ttftMs} ms, TPOT ${slo.tpotMs} ms, e2e ${slo.e2eMs} ms)`,
    `  attainment    ${pct(summary.sloAttainment)}   goodput ${summary.goodputPerS.toFixed(2)} req/s`,
    `  results       ${Object.entries(summary.slo).map(([k, v]) => `${k}=${v}`).join('  ')}`,
    '',
    `  ${'latency (ms)'.padEnd(16)} ${'count'.padStart(8)} ${'p50'.padStart(9)} ${'p90'.padStart(9)} ${'p95'.padStart(9)} ${'p99'.padStart(9)} ${'max'.padStart(9)}`,
    row('TTFT', summary.ttftMs),
    row('ITL (per event)', summary.itlMs),
    row('TPOT', summary.tpotMs),
    row('end-to-end', summary.e2eMs),
  ];
  if (summary.fleet !== undefined) lines.push('', fleetText(summary.fleet));
  const anomalies = Object.entries(summary.clientAnomalies);
  if (anomalies.length > 0) lines.push('', 'client-side anomalies:', ...anomalies.map(([k, v]) => `  ${v} × ${k}`));
  return lines.join('\n');
}

const count = (value: number) => (value === Number.POSITIVE_INFINITY ? 'any' : String(value));

export function reconciliationText(reconciliation: Reconciliation): string {
  const checked = Object.entries(reconciliation.checked).map(([k, v]) => `${k}=${v}`).join('  ');
  const { slo = 0, ...races } = reconciliation.uncertain;
  const raceText = Object.entries(races).map(([k, v]) => `${k}=${v}`).join('  ');
  const lines = [
    reconciliation.mismatches.length === 0
      ? `reconciliation: 0 mismatches (${checked})`
      : `reconciliation: ${reconciliation.mismatches.length} mismatch(es) (${checked})`,
    `  borderline SLO results (margin ${reconciliation.marginMs} ms): ${slo}`,
    `  races compared as bounds: ${raceText === '' ? 'none' : raceText}`,
  ];
  for (const m of reconciliation.bounded) lines.push(`  within bounds: ${m.what} [${m.key || 'total'}]: ${count(m.min)}..${count(m.max)}, Waybill ${m.waybill}`);
  for (const m of reconciliation.mismatches) {
    const expected = m.min === m.max ? count(m.min) : `${count(m.min)}..${count(m.max)}`;
    lines.push(`  ${m.what} [${m.key || 'total'}]: expected ${expected}, Waybill ${m.waybill}`);
  }
  return lines.join('\n');
}

/** Everything a report is written from. */
export interface ReportInput {
  readonly header: RunHeader;
  readonly summary: RunSummary;
  readonly slo: SloThresholds;
  readonly results: readonly RequestResult[];
  readonly reconciliation: Reconciliation | undefined;
}

/**
 * The JSON report. `header` first, so `head` shows what was run; reports written before headers existed have none,
 * and `waybill load compare` reads them as "unknown". In `reconciliation`, a bound with no upper limit is written
 * `null` (JSON has no Infinity).
 */
export interface JsonReport {
  readonly header: RunHeader;
  readonly summary: RunSummary;
  readonly slo: SloThresholds;
  readonly reconciliation: Reconciliation | undefined;
  readonly requests: Array<Record<string, unknown>>;
}

export function jsonReport({ header, summary, slo, results, reconciliation }: ReportInput): JsonReport {
  return {
    header,
    summary,
    slo,
    reconciliation,
    requests: results.map((r) => ({
      index: r.plan.index,
      route: r.plan.route,
      stream: r.plan.stream,
      fault: r.plan.fault,
      cancel: r.plan.cancel?.phase,
      started_ms: Math.round(r.startedAt),
      sent_ms: r.sentMs,
      status: r.status,
      code: r.code,
      outcome: r.outcome,
      ttft_ms: r.ttftMs,
      tpot_ms: r.tpotMs,
      e2e_ms: r.e2eMs,
      output_events: r.outputEvents,
      finish_reasons: r.finishReasons,
      usage: r.usage,
      anomaly: r.anomaly,
      // Fleet requests: the group, or the session and turn (absent otherwise).
      ...(r.plan.fleet === undefined ? {} : { group: r.plan.fleet.group, session: r.plan.fleet.session, turn: r.plan.fleet.turn, prompt_tokens_planned: r.plan.promptTokens }),
    })),
  };
}

const escape = (text: string) => text.replace(/[&<>"]/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;' })[c] ?? c);

/** The median of each second's values; undefined for a second without any, which the chart draws as a gap. */
function medians(bySecond: readonly number[][]): Array<number | undefined> {
  return bySecond.map((xs) => (xs.length === 0 ? undefined : [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]));
}

/** Where the sending stopped: the runner then only waits, so what follows on the time charts is the drain. */
function windowMarker(header: RunHeader): Marker {
  return { atS: header.taken.windowS, label: header.taken.stoppedBy === 'duration' ? `${formatDuration(header.taken.windowS * 1000)} window ends` : 'last request sent' };
}

function headerTable(header: RunHeader, reconciliation: Reconciliation | undefined): string {
  const verdict = reconciliation === undefined ? 'not run' : `${reconciliation.mismatches.length} mismatch(es) (below)`;
  const rows = [...headerRows(header), ['reconciliation', verdict] as const];
  return `<table class="header">${rows.map(([k, v]) => `<tr><th>${escape(k)}</th><td>${escape(v)}</td></tr>`).join('')}</table>`;
}

export function htmlReport({ header, summary, slo, results, reconciliation }: ReportInput): string {
  const seconds = Math.max(1, Math.ceil(summary.durationS));
  // Counts per second are 0 in a second without completions (a true zero); latencies have no value there.
  const done = new Array<number>(seconds).fill(0);
  const events = new Array<number>(seconds).fill(0);
  const ttftBySecond: number[][] = Array.from({ length: seconds }, () => []);
  for (const r of results) {
    const s = Math.min(seconds - 1, Math.floor((r.startedAt + r.e2eMs) / 1000));
    done[s] = (done[s] ?? 0) + 1;
    events[s] = (events[s] ?? 0) + r.outputEvents;
    if (r.ttftMs !== undefined) ttftBySecond[Math.min(seconds - 1, Math.floor(r.startedAt / 1000))]?.push(r.ttftMs);
  }
  const all = (pick: (r: RequestResult) => number | undefined) => results.map(pick).filter((v): v is number => v !== undefined);
  const markers = [windowMarker(header)];
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Waybill load report: ${escape(header.target)} ${escape(header.startedAt)}</title>
<style>body{font:14px system-ui,sans-serif;margin:2em;max-width:1200px}pre{background:#f4f4f4;padding:1em;overflow:auto}figure{display:inline-block;margin:0 1em 1em 0}figcaption{font-weight:600;margin-bottom:.3em}table.header{border-collapse:collapse}table.header th{text-align:left;font-weight:600;padding:.15em 1em .15em 0;vertical-align:top;white-space:nowrap}table.header td{padding:.15em 0;font-family:ui-monospace,monospace;word-break:break-all}</style>
</head><body>
<h1>Waybill load report</h1>
<h2>What was run</h2>
${headerTable(header, reconciliation)}
<h2>Summary</h2>
<pre>${escape(summaryTable(summary, slo))}</pre>
${reconciliation === undefined ? '' : `<h2>Reconciliation</h2><pre>${escape(reconciliationText(reconciliation))}</pre>`}
<h2>Latency</h2>
${histogramSvg('TTFT', all((r) => r.ttftMs), 'ms')}
${histogramSvg('Inter-token latency (per event)', results.flatMap((r) => r.itlMs), 'ms', 'events')}
${histogramSvg('TPOT', all((r) => r.tpotMs), 'ms')}
${histogramSvg('End-to-end', all((r) => r.e2eMs), 'ms')}
<h2>Over time</h2>
${lineChartSvg({ title: 'Requests completed per second', yTitle: 'requests/s', values: done, markers })}
${lineChartSvg({ title: 'Output events per second', yTitle: 'events/s', values: events, markers })}
${lineChartSvg({ title: 'TTFT median by second started', yTitle: 'TTFT (ms)', values: medians(ttftBySecond), markers })}
</body></html>
`;
}
