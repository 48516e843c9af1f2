/**
 * `waybill load compare`: rows and verdicts from hand-built reports, the warnings when runs differ, reports from
 * before headers, and the exit-code contract — through the function and through the built CLI.
 */
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { compareReports, compareTable, headerDifferences, parseReport, runCompare, type CompareRow, type LoadReport } from '../load/compare.js';

const latency = (p50: number, p95: number | undefined, p99: number) => ({ count: 100, p50, p90: p95, ...(p95 === undefined ? {} : { p95 }), p99, max: p99 });

/** A JSON report as `waybill load --json` writes it, with the figures compare reads (no requests list). */
function report(over: { summary?: Record<string, unknown>; header?: Record<string, unknown> | null; workload?: Record<string, unknown>; reconciliation?: unknown } = {}) {
  const header = {
    target: 'http://gw-1:8080', model: 'sim-model', startedAt: '2026-12-01T10:00:00.000Z', load: { mode: 'closed', concurrency: 64 },
    asked: { requests: null, durationS: 10, warmup: 0 }, seed: 1, waybill: { version: '0.1.0', revision: 'unknown' },
    workload: { model: 'sim-model', prompt_tokens: '64-512', output_tokens: '32-128', stream_share: 1, ...over.workload },
  };
  return {
    ...(over.header === null ? {} : { header: { ...header, ...over.header } }),
    summary: {
      requests: 1000, durationS: 10, requestsPerS: 100, outputEventsPerS: 5000, goodputPerS: 95,
      byOutcome: { delivered: 990, failed: 5, client_cancelled: 5 }, deliveredRatio: 0.99, http2xxRatio: 0.995, sloAttainment: 0.96,
      clientAnomalies: {}, ttftMs: latency(100, 200, 300), itlMs: latency(10, 20, 30), tpotMs: latency(12, 24, 36), e2eMs: latency(1000, 2000, 3000),
      ...over.summary,
    },
    slo: { ttftMs: 2000, tpotMs: 100, e2eMs: 60_000 },
    ...(over.reconciliation === undefined ? {} : { reconciliation: over.reconciliation }),
  };
}

const parsed = (value: unknown): LoadReport => {
  const result = parseReport(JSON.stringify(value));
  if ('problem' in result) throw new Error(result.problem);
  return result;
};

const byLabel = (rows: readonly CompareRow[]) => Object.fromEntries(rows.map((r) => [r.label, r]));

describe('compare rows', () => {
  const before = parsed(report());
  const after = parsed(
    report({
      summary: {
        requestsPerS: 85, // −15%: worse
        outputEventsPerS: 4600, // −8%: within 10%
        deliveredRatio: 0.975, // −1.5 pp: worse
        byOutcome: { delivered: 975, failed: 20, client_cancelled: 30, timeout: 0 }, // failed +1.5 pp; cancellations are the workload's
        clientAnomalies: { 'malformed event reached the client': 1 }, // any rise: worse
        ttftMs: latency(80, 215, 400), // p50 −20%: better; p95 +7.5%; p99 +33.3%: worse
      },
    }),
  );
  const rows = compareReports(before, after);

  it('give each figure for A and B, the change in its scale, and a verdict beyond the threshold', () => {
    const rowOf = byLabel(rows);
    expect(rowOf['throughput (req/s)']).toEqual({ label: 'throughput (req/s)', a: 100, b: 85, aText: '100.0', bText: '85.0', change: -15, changeText: '-15.0%', verdict: 'worse' });
    expect(rowOf['delivered']).toMatchObject({ aText: '99.00%', bText: '97.50%', changeText: '-1.50 pp', verdict: 'worse' });
    expect(rowOf['  failed']).toMatchObject({ aText: '5 (0.50%)', bText: '20 (2.00%)', changeText: '+1.50 pp', verdict: 'worse' });
    expect(rowOf['  client_cancelled']).toMatchObject({ aText: '5 (0.50%)', bText: '30 (3.00%)', changeText: '+2.50 pp', verdict: null });
    expect(rowOf['  timeout']).toMatchObject({ aText: '0 (0.00%)', bText: '0 (0.00%)', verdict: null });
    expect(rowOf['errors']).toMatchObject({ a: 0.005, b: 0.02, verdict: 'worse' });
    expect(rowOf['client-side anomalies']).toMatchObject({ a: 0, b: 1, changeText: '+1', verdict: 'worse' });
    expect(rowOf['TTFT p50 (ms)']).toMatchObject({ change: -20, changeText: '-20.0%', verdict: 'better' });
    expect(rowOf['TTFT p95 (ms)']).toMatchObject({ changeText: '+7.5%', verdict: null });
    expect(rowOf['TTFT p99 (ms)']?.verdict).toBe('worse');
    expect(rowOf['requests']).toMatchObject({ changeText: '0.0%', verdict: null });
    // No reconciliation in either: no row for it.
    expect(rowOf['reconciliation mismatches']).toBeUndefined();
  });

  it('mark exactly the changes beyond the thresholds, which the flags move', () => {
    const worse = (r: readonly CompareRow[]) => r.filter((row) => row.verdict === 'worse').map((row) => row.label);
    expect(worse(rows)).toEqual(['throughput (req/s)', 'delivered', 'errors', '  failed', 'client-side anomalies', 'TTFT p99 (ms)']);
    expect(worse(compareReports(before, after, { relativePct: 5, points: 2 }))).toEqual(['throughput (req/s)', 'output events/s', 'client-side anomalies', 'TTFT p95 (ms)', 'TTFT p99 (ms)']);
  });

  it('read a report from before headers and p95: missing figures are "—", without a verdict', () => {
    const old = report({ header: null, summary: { ttftMs: latency(100, undefined, 300) } });
    const rowOf = byLabel(compareReports(parsed(old), after));
    expect(rowOf['TTFT p95 (ms)']).toEqual({ label: 'TTFT p95 (ms)', a: null, b: 215, aText: '—', bText: '215.0', change: null, changeText: '—', verdict: null });
    expect(rowOf['TTFT p99 (ms)']?.verdict).toBe('worse');
  });

  it('count reconciliation mismatches when either run reconciled', () => {
    const reconciled = (n: number) => parsed(report({ reconciliation: { mismatches: Array.from({ length: n }, () => ({})), checked: {}, marginMs: 50, uncertain: {}, bounded: [] } }));
    expect(byLabel(compareReports(reconciled(0), reconciled(2)))['reconciliation mismatches']).toMatchObject({ a: 0, b: 2, changeText: '+2', verdict: 'worse' });
    expect(byLabel(compareReports(before, reconciled(0)))['reconciliation mismatches']).toMatchObject({ a: null, b: 0, verdict: null });
  });

  it('print as an aligned table, worse rows marked "!"', () => {
    const three = rows.filter((r) => ['requests', 'throughput (req/s)', 'TTFT p50 (ms)'].includes(r.label));
    expect(compareTable(three, { relativePct: 10, points: 1 })).toBe(
      [
        '  figure                  A     B  change',
        '  requests             1000  1000    0.0%',
        '! throughput (req/s)  100.0  85.0  -15.0%  worse',
        '  TTFT p50 (ms)       100.0  80.0  -20.0%  better',
        '',
        '1 worse, 1 better (beyond 10% for latencies and rates, 1 pp for ratios and shares, any rise in anomalies and mismatches)',
      ].join('\n'),
    );
  });
});

describe('runs that differ', () => {
  it('are warned about, field by field; a missing header once per run', () => {
    const a = parsed(report());
    const b = parsed(report({ header: { target: 'http://gw-2:8080', load: { mode: 'open', ratePerS: 20 } }, workload: { output_tokens: '8-48' } }));
    expect(headerDifferences(a, b)).toEqual([
      'the runs differ in target: http://gw-1:8080 (A) vs http://gw-2:8080 (B)',
      'the runs differ in load: {"mode":"closed","concurrency":64} (A) vs {"mode":"open","ratePerS":20} (B)',
      'the runs differ in workload output_tokens: 32-128 (A) vs 8-48 (B)',
    ]);
    expect(headerDifferences(a, a)).toEqual([]);
    expect(headerDifferences(parsed(report({ header: null })), a)).toEqual(['A has no header (a report from before headers): its target and workload are unknown']);
  });
});

function io(files: Record<string, string>) {
  const out: string[] = [];
  const err: string[] = [];
  return {
    out,
    err,
    io: {
      out: (t: string) => out.push(t),
      err: (t: string) => err.push(t),
      readFile: (path: string) => (path in files ? Promise.resolve(files[path] ?? '') : Promise.reject(new Error(`ENOENT: no such file or directory, open '${path}'`))),
    },
  };
}

describe('runCompare', () => {
  const files = {
    'a.json': JSON.stringify(report()),
    'b.json': JSON.stringify(report({ summary: { requestsPerS: 50 }, workload: { output_tokens: '8' } })),
    'old.json': JSON.stringify(report({ header: null })),
    'notjson.json': '{"summary":',
    'other.json': '{"name":"waybill","version":"0.1.0"}',
  };

  it('prints both runs and the table, and warns on stderr when the workloads differ; exit 0', async () => {
    const run = io(files);
    expect(await runCompare(['a.json', 'b.json'], run.io)).toBe(0);
    expect(run.err).toEqual(['warning: the runs differ in workload output_tokens: 32-128 (A) vs 8 (B)']);
    const [text = ''] = run.out;
    expect(text.split('\n').slice(0, 2)).toEqual([
      'A  a.json  2026-12-01T10:00:00.000Z  http://gw-1:8080  concurrency 64  waybill 0.1.0',
      'B  b.json  2026-12-01T10:00:00.000Z  http://gw-1:8080  concurrency 64  waybill 0.1.0',
    ]);
    expect(text).toMatch(/^! throughput \(req\/s\) +100\.0 +50\.0 +-50\.0% +worse$/m);
  });

  it('with --json prints the runs, warnings and rows as JSON; an old report\'s header is null ("unknown")', async () => {
    const run = io(files);
    expect(await runCompare(['old.json', 'b.json', '--json', '--threshold', '60'], run.io)).toBe(0);
    const json = JSON.parse(run.out[0] ?? '') as { a: { header: unknown }; thresholds: unknown; warnings: string[]; rows: CompareRow[] };
    expect(json.a.header).toBeNull();
    expect(json.thresholds).toEqual({ relativePct: 60, points: 1 });
    expect(json.warnings).toEqual(['A has no header (a report from before headers): its target and workload are unknown']);
    expect(json.rows.find((r) => r.label === 'throughput (req/s)')).toMatchObject({ change: -50, verdict: null });
  });

  it('refuses, in one line and exit 2, a file it cannot read, text that is not JSON, JSON that is not a load report, and bad usage', async () => {
    const cases: Array<[string[], string]> = [
      [['a.json', 'missing.json'], 'waybill load compare: cannot read missing.json (ENOENT: no such file or directory)'],
      [['notjson.json', 'a.json'], 'waybill load compare: notjson.json is not JSON (Unexpected end of JSON input)'],
      [['a.json', 'other.json'], 'waybill load compare: other.json is not a waybill load report (it has no summary.requests and summary.byOutcome)'],
      [['a.json'], 'waybill load compare: give two JSON reports, A (before) and B (after); got 1 (waybill load compare --help)'],
      [['a.json', 'b.json', '--threshold', 'ten'], 'waybill load compare: --threshold: "ten" is not a percentage ≥ 0'],
      [['a.json', 'b.json', '--points=-1'], 'waybill load compare: --points: "-1" is not a number of percentage points ≥ 0'],
    ];
    for (const [argv, message] of cases) {
      const run = io(files);
      expect(await runCompare(argv, run.io), argv.join(' ')).toBe(2);
      expect(run.err).toEqual([message]);
      expect(run.out).toEqual([]);
    }
    const unknown = io(files);
    expect(await runCompare(['a.json', 'b.json', '--colour'], unknown.io)).toBe(2);
    expect(unknown.err).toHaveLength(1);
    expect(unknown.err[0]).toMatch(/^waybill load compare: Unknown option '--colour'.* \(waybill load compare --help\)$/);
  });
});

const BIN = new URL('../bin/waybill.js', import.meta.url).pathname;

/** The built CLI (npm test builds before vitest), as an operator runs it. */
async function waybill(args: string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const child = spawn(process.execPath, [BIN, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  const [code] = (await once(child, 'exit')) as [number | null];
  // Node's own process warnings are not Waybill's output.
  stderr = stderr.split('\n').filter((l) => l !== '' && !/^\(node:\d+\) /.test(l) && !l.startsWith('(Use `node --trace-warnings')).map((l) => `${l}\n`).join('');
  return { code, stdout, stderr };
}

describe('waybill load compare, the command', () => {
  const dir = mkdtempSync(join(tmpdir(), 'waybill-compare-'));
  const a = join(dir, 'a.json');
  const notReport = join(dir, 'package.json');
  writeFileSync(a, JSON.stringify(report()));
  writeFileSync(notReport, '{"name":"waybill"}');

  it('compares two reports, exit 0', async () => {
    const result = await waybill(['load', 'compare', a, a]);
    expect([result.code, result.stderr]).toEqual([0, '']);
    expect(result.stdout).toMatch(/^ {2}TTFT p95 \(ms\) +200\.0 +200\.0 +0\.0%$/m);
  });

  it('refuses a missing file and JSON that is not a load report: one line on stderr, exit 2', async () => {
    const missing = await waybill(['load', 'compare', a, join(dir, 'nope.json')]);
    expect([missing.code, missing.stdout, missing.stderr]).toEqual([2, '', `waybill load compare: cannot read ${join(dir, 'nope.json')} (ENOENT: no such file or directory)\n`]);
    const other = await waybill(['load', 'compare', notReport, a]);
    expect([other.code, other.stdout, other.stderr]).toEqual([2, '', `waybill load compare: ${notReport} is not a waybill load report (it has no summary.requests and summary.byOutcome)\n`]);
  });
});
