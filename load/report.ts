/**
 * Reports of a run: a readable summary table, a JSON report, and a self-contained HTML report (inline SVG, no
 * external assets) with latency histograms and time series of throughput and TTFT.
 */
import type { RequestResult } from './client.js';
import type { Reconciliation } from './reconcile.js';
import type { Percentiles, RunSummary, SloThresholds } from './stats.js';

const ms = (value: number | undefined) => (value === undefined ? '—' : value < 10 ? value.toFixed(2) : value.toFixed(1));
const pct = (value: number | undefined) => (value === undefined ? '—' : `${(value * 100).toFixed(2)}%`);

function row(label: string, p: Percentiles): string {
  return `  ${label.padEnd(16)} ${String(p.count).padStart(8)} ${ms(p.p50).padStart(9)} ${ms(p.p90).padStart(9)} ${ms(p.p99).padStart(9)} ${ms(p.max).padStart(9)}`;
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
    `  ${'latency (ms)'.padEnd(16)} ${'count'.padStart(8)} ${'p50'.padStart(9)} ${'p90'.padStart(9)} ${'p99'.padStart(9)} ${'max'.padStart(9)}`,
    row('TTFT', summary.ttftMs),
    row('ITL (per event)', summary.itlMs),
    row('TPOT', summary.tpotMs),
    row('end-to-end', summary.e2eMs),
  ];
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

export interface JsonReport {
  readonly summary: RunSummary;
  readonly slo: SloThresholds;
  readonly reconciliation: Reconciliation | undefined;
  readonly requests: Array<Record<string, unknown>>;
}

export function jsonReport(summary: RunSummary, slo: SloThresholds, results: readonly RequestResult[], reconciliation: Reconciliation | undefined): JsonReport {
  return {
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
    })),
  };
}

const escape = (text: string) => text.replace(/[&<>"]/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;' })[c] ?? c);

/** An SVG histogram of `values` (log-spaced bins when they span decades). */
function histogramSvg(title: string, values: readonly number[], unit: string): string {
  const width = 520;
  const height = 180;
  if (values.length === 0) return `<figure><figcaption>${escape(title)}: no data</figcaption></figure>`;
  // A loop, not Math.min(...values): a long run has millions of inter-token gaps, past the engine's argument limit.
  let lowest = Number.POSITIVE_INFINITY;
  let max = Number.NEGATIVE_INFINITY;
  for (const v of values) {
    if (v < lowest) lowest = v;
    if (v > max) max = v;
  }
  const min = Math.max(1e-3, lowest);
  const bins = 40;
  const log = max / min > 50;
  const edge = (i: number) => (log ? min * (max / min) ** (i / bins) : min + ((max - min) * i) / bins);
  const counts = new Array<number>(bins).fill(0);
  for (const v of values) {
    let i = bins - 1;
    while (i > 0 && v < edge(i)) i--;
    counts[i] = (counts[i] ?? 0) + 1;
  }
  const top = Math.max(...counts);
  const bar = (width - 40) / bins;
  const rects = counts
    .map((c, i) => {
      const h = top === 0 ? 0 : ((height - 40) * c) / top;
      return `<rect x="${(30 + i * bar).toFixed(1)}" y="${(height - 20 - h).toFixed(1)}" width="${(bar - 1).toFixed(1)}" height="${h.toFixed(1)}" fill="#4878a8"><title>${edge(i).toFixed(2)}–${edge(i + 1).toFixed(2)} ${unit}: ${c}</title></rect>`;
    })
    .join('');
  return `<figure><figcaption>${escape(title)} (${values.length} values${log ? ', log scale' : ''})</figcaption><svg width="${width}" height="${height}" viewBox="0 0 ${width} ${height}">${rects}<text x="30" y="${height - 4}" font-size="10">${min.toFixed(2)} ${unit}</text><text x="${width - 10}" y="${height - 4}" font-size="10" text-anchor="end">${max.toFixed(2)} ${unit}</text><text x="4" y="14" font-size="10">${top}</text></svg></figure>`;
}

/** An SVG line chart of per-second series. */
function seriesSvg(title: string, points: ReadonlyArray<[number, number]>, unit: string): string {
  const width = 520;
  const height = 180;
  if (points.length === 0) return `<figure><figcaption>${escape(title)}: no data</figcaption></figure>`;
  const maxX = Math.max(1, ...points.map(([x]) => x));
  const maxY = Math.max(1e-9, ...points.map(([, y]) => y));
  const path = points
    .map(([x, y], i) => `${i === 0 ? 'M' : 'L'}${(30 + ((width - 40) * x) / maxX).toFixed(1)},${(height - 20 - ((height - 40) * y) / maxY).toFixed(1)}`)
    .join(' ');
  return `<figure><figcaption>${escape(title)}</figcaption><svg width="${width}" height="${height}" viewBox="0 0 ${width} ${height}"><path d="${path}" fill="none" stroke="#c05030" stroke-width="1.5"/><text x="30" y="${height - 4}" font-size="10">0 s</text><text x="${width - 10}" y="${height - 4}" font-size="10" text-anchor="end">${maxX} s</text><text x="4" y="14" font-size="10">${maxY.toFixed(1)} ${unit}</text></svg></figure>`;
}

export function htmlReport(summary: RunSummary, slo: SloThresholds, results: readonly RequestResult[], reconciliation: Reconciliation | undefined): string {
  const seconds = Math.max(1, Math.ceil(summary.durationS));
  const done = new Array<number>(seconds).fill(0);
  const events = new Array<number>(seconds).fill(0);
  const ttftBySecond: number[][] = Array.from({ length: seconds }, () => []);
  for (const r of results) {
    const s = Math.min(seconds - 1, Math.floor((r.startedAt + r.e2eMs) / 1000));
    done[s] = (done[s] ?? 0) + 1;
    events[s] = (events[s] ?? 0) + r.outputEvents;
    if (r.ttftMs !== undefined) ttftBySecond[Math.min(seconds - 1, Math.floor(r.startedAt / 1000))]?.push(r.ttftMs);
  }
  const median = (xs: number[]) => (xs.length === 0 ? 0 : ([...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? 0));
  const all = (pick: (r: RequestResult) => number | undefined) => results.map(pick).filter((v): v is number => v !== undefined);
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Waybill load report</title>
<style>body{font:14px system-ui,sans-serif;margin:2em;max-width:1100px}pre{background:#f4f4f4;padding:1em;overflow:auto}figure{display:inline-block;margin:0 1em 1em 0}figcaption{font-weight:600;margin-bottom:.3em}</style>
</head><body>
<h1>Waybill load report</h1>
<h2>Summary</h2>
<pre>${escape(summaryTable(summary, slo))}</pre>
${reconciliation === undefined ? '' : `<h2>Reconciliation</h2><pre>${escape(reconciliationText(reconciliation))}</pre>`}
<h2>Latency</h2>
${histogramSvg('TTFT', all((r) => r.ttftMs), 'ms')}
${histogramSvg('Inter-token latency (per event)', results.flatMap((r) => r.itlMs), 'ms')}
${histogramSvg('TPOT', all((r) => r.tpotMs), 'ms')}
${histogramSvg('End-to-end', all((r) => r.e2eMs), 'ms')}
<h2>Over time</h2>
${seriesSvg('Requests completed per second', done.map((v, i) => [i, v] as [number, number]), 'req/s')}
${seriesSvg('Output events per second', events.map((v, i) => [i, v] as [number, number]), 'ev/s')}
${seriesSvg('TTFT median by second started', ttftBySecond.map((xs, i) => [i, median(xs)] as [number, number]), 'ms')}
</body></html>
`;
}
