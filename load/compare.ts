/**
 * `waybill load compare A.json B.json`: two JSON reports of `waybill load --json` side by side, A before and B after
 * a change, with the figures that matter and the changes beyond a threshold marked. `compareReports` is pure (two
 * reports in, rows out); reading files, flags and printing are the shell around it (`runCompare`).
 *
 * Reports are read leniently: one written before reports had a header, or before p95 was measured, still
 * compares, its missing figures shown as "—" and its header as unknown. Anything that is not a load report at all
 * (no `summary.requests`) is refused, rather than compared as a run of nothing.
 */
import { readFile } from 'node:fs/promises';
import { parseArgs } from 'node:util';

export const COMPARE_USAGE = `usage: waybill load compare A.json B.json [--threshold PCT] [--points PP] [--json]

Compares two JSON reports written by \`waybill load --json\`: A (before) and B (after). For each figure that
matters — requests, throughput, goodput, the delivered ratio, errors (failed, timeout, stream_error, incomplete)
and each outcome, client-side anomalies, reconciliation mismatches, TTFT, ITL, TPOT and end-to-end p50/p95/p99 —
it prints both runs and the change, and marks a change for the worse beyond the threshold with "!" and "worse"
(one for the better: "better").

options
  --threshold PCT   relative change of a latency or a rate that counts (default 10: 10% slower, or 10% less
                    throughput)
  --points PP       change that counts of a ratio or share of requests (delivered, HTTP 2xx, SLO attainment,
                    errors, each outcome), in percentage points (default 1)
  --json            print the comparison as JSON (runs, warnings, rows) instead of a table
  -h, --help        this help
Any rise in client-side anomalies or reconciliation mismatches counts as worse. Requests, duration, delivered and
client_cancelled counts are shown without a verdict (the workload decides them). Warns on stderr when the runs'
headers differ in target, model, load, length, seed, workload or SLO thresholds, or when a report has no header
(written by an older version: "unknown"). Exit 0 once compared; 2 for bad flags, a file that cannot be read, or
one that is not a load report.
examples
  waybill load compare before.json after.json
  waybill load compare before.json after.json --threshold 5 --json
`;

type Json = Record<string, unknown>;

const isObject = (value: unknown): value is Json => value !== null && typeof value === 'object' && !Array.isArray(value);

function at(value: unknown, ...path: string[]): unknown {
  let current = value;
  for (const key of path) current = isObject(current) ? current[key] : undefined;
  return current;
}

const numberAt = (value: unknown, ...path: string[]): number | undefined => {
  const found = at(value, ...path);
  return typeof found === 'number' && Number.isFinite(found) ? found : undefined;
};

/** A JSON report as compare reads it: only `summary` is required. */
export interface LoadReport {
  /** Undefined for a report written before reports had a header. */
  readonly header: Json | undefined;
  readonly summary: Json;
  readonly slo: Json | undefined;
  readonly reconciliation: Json | undefined;
}

/** Parses a JSON report, or says (for a one-line error) why the text is not one. */
export function parseReport(text: string): LoadReport | { problem: string } {
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch (err) {
    return { problem: `not JSON (${(err as Error).message.split('\n')[0] ?? ''})` };
  }
  const summary = at(parsed, 'summary');
  if (!isObject(summary) || numberAt(summary, 'requests') === undefined || !isObject(summary['byOutcome'])) {
    return { problem: 'not a waybill load report (it has no summary.requests and summary.byOutcome)' };
  }
  const part = (key: string) => {
    const value = at(parsed, key);
    return isObject(value) ? value : undefined;
  };
  return { header: part('header'), summary, slo: part('slo'), reconciliation: part('reconciliation') };
}

export interface Thresholds {
  /** A latency or rate changed by more than this many percent (relative). */
  readonly relativePct: number;
  /** A ratio or share of requests changed by more than this many percentage points. */
  readonly points: number;
}

export const DEFAULT_THRESHOLDS: Thresholds = { relativePct: 10, points: 1 };

/**
 * How a figure's change is measured: relative to A (latencies and rates), in percentage points (ratios: a relative
 * change of 99% delivered is meaningless — 99% → 89% would be "10%"), or as a count where any rise counts (anomalies
 * and mismatches are bugs, not noise).
 */
type Scale = 'relative' | 'points' | 'count';

interface Figure {
  readonly label: string;
  readonly scale: Scale;
  /** Which way is better; undefined: shown without a verdict (the workload decides it). */
  readonly better: 'lower' | 'higher' | undefined;
  readonly value: (report: LoadReport) => number | undefined;
  readonly show: (value: number, report: LoadReport) => string;
}

export interface CompareRow {
  readonly label: string;
  readonly a: number | null;
  readonly b: number | null;
  readonly aText: string;
  readonly bText: string;
  /** B − A: percent of A (relative), percentage points, or a count; null when either is missing (or A is 0, relative). */
  readonly change: number | null;
  readonly changeText: string;
  readonly verdict: 'worse' | 'better' | null;
}

const fixed = (digits: number) => (value: number) => value.toFixed(digits);
const msText = (value: number) => (value < 10 ? value.toFixed(2) : value.toFixed(1));
const pctText = (value: number) => `${(value * 100).toFixed(2)}%`;
const countText = (value: number) => String(Math.round(value));

/** Outcomes that are the system under test failing (load/runner.ts counts the same as errors). */
const ERROR_OUTCOMES = ['failed', 'timeout', 'stream_error', 'incomplete'];
/** Outcomes the workload decides (delivered has its ratio row; cancellations are planned): no verdict. */
const NEUTRAL_OUTCOMES = new Set(['delivered', 'client_cancelled']);

const requestsOf = (r: LoadReport) => numberAt(r.summary, 'requests') ?? 0;
const outcomeCount = (r: LoadReport, outcome: string) => numberAt(r.summary, 'byOutcome', outcome) ?? 0;
const shareOf = (count: (r: LoadReport) => number) => (r: LoadReport) => (requestsOf(r) > 0 ? count(r) / requestsOf(r) : undefined);
const shareShow = (count: (r: LoadReport) => number) => (_: number, r: LoadReport) => `${count(r)} (${pctText(count(r) / Math.max(1, requestsOf(r)))})`;
const sumOf = (value: unknown) => (isObject(value) ? Object.values(value).reduce<number>((sum, v) => sum + (typeof v === 'number' ? v : 0), 0) : 0);

function latencyFigures(label: string, key: string): Figure[] {
  return (['p50', 'p95', 'p99'] as const).map((p) => ({
    label: `${label} ${p} (ms)`,
    scale: 'relative',
    better: 'lower',
    value: (r) => numberAt(r.summary, key, p),
    show: msText,
  }));
}

const MISMATCHES: Figure = {
  label: 'reconciliation mismatches',
  scale: 'count',
  better: 'lower',
  value: (r) => {
    const mismatches = at(r.reconciliation, 'mismatches');
    return Array.isArray(mismatches) ? mismatches.length : undefined;
  },
  show: countText,
};

/** The figures compared, in the order printed; outcomes are those either run saw. */
function figuresFor(a: LoadReport, b: LoadReport): Figure[] {
  const outcomes = [...new Set([...Object.keys(at(a.summary, 'byOutcome') as Json), ...Object.keys(at(b.summary, 'byOutcome') as Json)])].sort();
  const errors = (r: LoadReport) => ERROR_OUTCOMES.reduce((sum, o) => sum + outcomeCount(r, o), 0);
  const reconciled = a.reconciliation !== undefined || b.reconciliation !== undefined;
  const fleet = isObject(a.summary['fleet']) || isObject(b.summary['fleet']);
  return [
    { label: 'requests', scale: 'relative', better: undefined, value: (r) => numberAt(r.summary, 'requests'), show: countText },
    { label: 'duration taken (s)', scale: 'relative', better: undefined, value: (r) => numberAt(r.summary, 'durationS'), show: fixed(1) },
    { label: 'throughput (req/s)', scale: 'relative', better: 'higher', value: (r) => numberAt(r.summary, 'requestsPerS'), show: fixed(1) },
    { label: 'output events/s', scale: 'relative', better: 'higher', value: (r) => numberAt(r.summary, 'outputEventsPerS'), show: fixed(0) },
    { label: 'goodput (req/s)', scale: 'relative', better: 'higher', value: (r) => numberAt(r.summary, 'goodputPerS'), show: fixed(2) },
    { label: 'delivered', scale: 'points', better: 'higher', value: (r) => numberAt(r.summary, 'deliveredRatio'), show: pctText },
    { label: 'HTTP 2xx', scale: 'points', better: 'higher', value: (r) => numberAt(r.summary, 'http2xxRatio'), show: pctText },
    { label: 'SLO attainment', scale: 'points', better: 'higher', value: (r) => numberAt(r.summary, 'sloAttainment'), show: pctText },
    { label: 'errors', scale: 'points', better: 'lower', value: shareOf(errors), show: shareShow(errors) },
    ...outcomes.map((outcome): Figure => {
      const count = (r: LoadReport) => outcomeCount(r, outcome);
      return { label: `  ${outcome}`, scale: 'points', better: NEUTRAL_OUTCOMES.has(outcome) ? undefined : 'lower', value: shareOf(count), show: shareShow(count) };
    }),
    { label: 'client-side anomalies', scale: 'count', better: 'lower', value: (r) => sumOf(at(r.summary, 'clientAnomalies')), show: countText },
    ...(reconciled ? [MISMATCHES] : []),
    ...latencyFigures('TTFT', 'ttftMs'),
    ...latencyFigures('ITL', 'itlMs'),
    ...latencyFigures('TPOT', 'tpotMs'),
    ...latencyFigures('end-to-end', 'e2eMs'),
    ...(fleet ? FLEET_FIGURES : []),
  ];
}

/**
 * A fleet run's own figures (load/fleet-stats.ts). The cached-prompt ratio is judged in points (more cached is
 * better); the idle gaps are the workload's think time, shown without a verdict.
 */
const FLEET_FIGURES: readonly Figure[] = [
  { label: 'cached prompt ratio', scale: 'points', better: 'higher', value: (r) => numberAt(r.summary, 'fleet', 'cachedPrompt', 'ratioAll') ?? numberAt(r.summary, 'fleet', 'cachedPrompt', 'ratio'), show: pctText },
  { label: 'cached reported by', scale: 'relative', better: undefined, value: (r) => numberAt(r.summary, 'fleet', 'cachedPrompt', 'reported'), show: countText },
  { label: 'prompt tokens/s', scale: 'relative', better: 'higher', value: (r) => numberAt(r.summary, 'fleet', 'promptTokensPerS'), show: fixed(0) },
  { label: 'idle gap p50 (ms)', scale: 'relative', better: undefined, value: (r) => numberAt(r.summary, 'fleet', 'idleGapMs', 'p50'), show: msText },
  { label: 'idle gap p90 (ms)', scale: 'relative', better: undefined, value: (r) => numberAt(r.summary, 'fleet', 'idleGapMs', 'p90'), show: msText },
];

function changeOf(scale: Scale, a: number, b: number): number | undefined {
  switch (scale) {
    case 'relative':
      return a === 0 ? (b === 0 ? 0 : undefined) : ((b - a) / Math.abs(a)) * 100;
    case 'points':
      return (b - a) * 100;
    case 'count':
      return b - a;
  }
}

function changeText(scale: Scale, change: number): string {
  const sign = change > 0 ? '+' : change < 0 ? '-' : '';
  const size = Math.abs(change);
  switch (scale) {
    case 'relative':
      return `${sign}${size.toFixed(1)}%`;
    case 'points':
      return `${sign}${size.toFixed(2)} pp`;
    case 'count':
      return `${sign}${size}`;
  }
}

/** Worse or better beyond the threshold of the figure's scale (a count: any change). */
function verdictOf(figure: Figure, change: number, thresholds: Thresholds): 'worse' | 'better' | null {
  if (figure.better === undefined) return null;
  const limit = figure.scale === 'relative' ? thresholds.relativePct : figure.scale === 'points' ? thresholds.points : 0;
  const worseBy = figure.better === 'lower' ? change : -change;
  return worseBy > limit ? 'worse' : worseBy < -limit ? 'better' : null;
}

/** The rows of a before/after comparison: each figure for A and B, the change, and the verdict. Pure. */
export function compareReports(a: LoadReport, b: LoadReport, thresholds: Thresholds = DEFAULT_THRESHOLDS): CompareRow[] {
  return figuresFor(a, b).map((figure) => {
    const va = figure.value(a);
    const vb = figure.value(b);
    const change = va === undefined || vb === undefined ? undefined : changeOf(figure.scale, va, vb);
    return {
      label: figure.label,
      a: va ?? null,
      b: vb ?? null,
      aText: va === undefined ? '—' : figure.show(va, a),
      bText: vb === undefined ? '—' : figure.show(vb, b),
      change: change ?? null,
      changeText: change === undefined ? '—' : changeText(figure.scale, change),
      verdict: change === undefined ? null : verdictOf(figure, change, thresholds),
    };
  });
}

const shown = (value: unknown) => (value === undefined ? 'unknown' : typeof value === 'string' ? value : JSON.stringify(value));

/**
 * What differs between the two runs' headers and SLO thresholds, one line each: a comparison across different
 * targets or workloads may still be what was meant, but the reader must know. A missing header is said once.
 */
export function headerDifferences(a: LoadReport, b: LoadReport): string[] {
  const lines: string[] = [];
  const differ = (what: string, va: unknown, vb: unknown) => {
    if (JSON.stringify(va) !== JSON.stringify(vb)) lines.push(`the runs differ in ${what}: ${shown(va)} (A) vs ${shown(vb)} (B)`);
  };
  if (a.header === undefined || b.header === undefined) {
    for (const [name, report] of [['A', a], ['B', b]] as const) {
      if (report.header === undefined) lines.push(`${name} has no header (a report from before headers): its target and workload are unknown`);
    }
  } else {
    for (const key of ['target', 'model', 'load', 'asked', 'seed']) differ(key, a.header[key], b.header[key]);
    const wa = isObject(a.header['workload']) ? a.header['workload'] : {};
    const wb = isObject(b.header['workload']) ? b.header['workload'] : {};
    for (const key of [...new Set([...Object.keys(wa), ...Object.keys(wb)])]) if (key !== 'model') differ(`workload ${key}`, wa[key], wb[key]);
  }
  differ('SLO thresholds', a.slo, b.slo);
  return lines;
}

/** One line per run for the table's title: file (padded to `width`), start, target, load, Waybill version (or "unknown"). */
export function runLine(name: string, file: string, report: LoadReport, width = file.length): string {
  const h = report.header;
  if (h === undefined) return `${name}  ${file.padEnd(width)}  (no header: target, start and workload unknown)`;
  const load = at(h, 'load', 'mode') === 'open' ? `rate ${shown(at(h, 'load', 'ratePerS'))} req/s` : `concurrency ${shown(at(h, 'load', 'concurrency'))}`;
  return `${name}  ${file.padEnd(width)}  ${shown(h['startedAt'])}  ${shown(h['target'])}  ${load}  waybill ${shown(at(h, 'waybill', 'version'))}`;
}

/** The rows as an aligned plain-text table; worse rows start with "!". */
export function compareTable(rows: readonly CompareRow[], thresholds: Thresholds): string {
  const head = { label: 'figure', aText: 'A', bText: 'B', changeText: 'change' };
  // A loop, not Math.max(...rows): a hostile report may hold more outcome rows than a call takes arguments.
  const width = (pick: (r: typeof head) => string) => rows.reduce((max, r) => Math.max(max, pick(r).length), pick(head).length);
  const wl = width((r) => r.label);
  const wa = width((r) => r.aText);
  const wb = width((r) => r.bText);
  const wc = width((r) => r.changeText);
  const line = (mark: string, r: typeof head, verdict: string) =>
    `${mark} ${r.label.padEnd(wl)}  ${r.aText.padStart(wa)}  ${r.bText.padStart(wb)}  ${r.changeText.padStart(wc)}${verdict === '' ? '' : `  ${verdict}`}`.trimEnd();
  const worse = rows.filter((r) => r.verdict === 'worse').length;
  const better = rows.filter((r) => r.verdict === 'better').length;
  return [
    line(' ', head, ''),
    ...rows.map((r) => line(r.verdict === 'worse' ? '!' : ' ', r, r.verdict ?? '')),
    '',
    `${worse} worse, ${better} better (beyond ${thresholds.relativePct}% for latencies and rates, ${thresholds.points} pp for ratios and shares, any rise in anomalies and mismatches)`,
  ].join('\n');
}

export interface CompareIo {
  readonly out: (text: string) => void;
  readonly err: (text: string) => void;
  readonly readFile: (path: string) => Promise<string>;
}

/** A report is a file anyone may hand over: its strings reach the terminal without control characters (escapes). */
// eslint-disable-next-line no-control-regex
const printable = (text: string) => text.replace(/[\u0000-\u0008\u000b-\u001f\u007f-\u009f]/g, '?');

const DEFAULT_IO: CompareIo = {
  out: (text) => process.stdout.write(`${printable(text)}\n`),
  err: (text) => process.stderr.write(`${printable(text)}\n`),
  readFile: (path) => readFile(path, 'utf8'),
};

/** The exit code a usage or input problem gets, as for every other `waybill` command. */
const USAGE_ERROR = 2;

/** `waybill load compare …`: returns the exit code (0 once compared, 2 for a usage or input problem). */
export async function runCompare(argv: readonly string[], io: CompareIo = DEFAULT_IO): Promise<number> {
  if (argv.includes('--help') || argv.includes('-h')) {
    io.out(COMPARE_USAGE);
    return 0;
  }
  const fail = (message: string) => {
    io.err(`waybill load compare: ${message}`);
    return USAGE_ERROR;
  };
  let parsed;
  try {
    parsed = parseArgs({ args: [...argv], allowPositionals: true, strict: true, options: { threshold: { type: 'string' }, points: { type: 'string' }, json: { type: 'boolean' } } });
  } catch (err) {
    return fail(`${(err as Error).message.split('\n')[0] ?? ''} (waybill load compare --help)`);
  }
  const { values, positionals } = parsed;
  const [fileA, fileB] = positionals;
  if (positionals.length !== 2 || fileA === undefined || fileB === undefined) return fail(`give two JSON reports, A (before) and B (after); got ${positionals.length} (waybill load compare --help)`);
  const limit = (text: string | undefined, fallback: number) => (text === undefined ? fallback : text.trim() === '' ? Number.NaN : Number(text));
  const thresholds = { relativePct: limit(values.threshold, DEFAULT_THRESHOLDS.relativePct), points: limit(values.points, DEFAULT_THRESHOLDS.points) };
  if (!(thresholds.relativePct >= 0)) return fail(`--threshold: "${values.threshold ?? ''}" is not a percentage ≥ 0`);
  if (!(thresholds.points >= 0)) return fail(`--points: "${values.points ?? ''}" is not a number of percentage points ≥ 0`);
  const reports: LoadReport[] = [];
  for (const file of [fileA, fileB]) {
    let text;
    try {
      text = await io.readFile(file);
    } catch (err) {
      return fail(`cannot read ${file} (${(err as Error).message.split(',')[0] ?? ''})`);
    }
    const report = parseReport(text);
    if ('problem' in report) return fail(`${file} is ${report.problem}`);
    reports.push(report);
  }
  const [a, b] = reports as [LoadReport, LoadReport];
  const warnings = headerDifferences(a, b);
  for (const warning of warnings) io.err(`warning: ${warning}`);
  const rows = compareReports(a, b, thresholds);
  if (values.json === true) {
    io.out(JSON.stringify({ a: { file: fileA, header: a.header ?? null }, b: { file: fileB, header: b.header ?? null }, thresholds, warnings, rows }, null, 2));
  } else {
    const width = Math.max(fileA.length, fileB.length);
    io.out([runLine('A', fileA, a, width), runLine('B', fileB, b, width), '', compareTable(rows, thresholds)].join('\n'));
  }
  return 0;
}
