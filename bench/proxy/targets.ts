/**
 * The bench's targets as data: per issue, what a scenario measures on the `waybill` row (the default configuration)
 * and its bound. checkTargets() reads a table against the run's comparisons; the report prints the verdicts.
 */
import { f1, f2, signed } from './format.js';
import type { Comparison } from './compare.js';

/** What a target measures, on `waybill` at its scenario (and, for some, another row beside it). */
export type Measure =
  | 'addedTtftP50Ms'
  | 'addedTtftP99Ms'
  | 'cpuPerEventVsNginx'
  | 'rssPerStreamKiB'
  | 'throughputVsDirect'
  /** Added TTFT p50 at saturation, with the waybill-turns-off row's added p50 / p99 beside it. */
  | 'saturatedTtftP50Ms'
  /** CPU per event of the waybill-2w row ÷ waybill's. */
  | 'cpuPerEventTwoWorkers'
  /** CPU per event ÷ the bare Node relay's (node-floor) in the same run; per request at `req`. */
  | 'cpuVsRelay'
  /** ITL p99 less the relay's, ms. */
  | 'itlP99VsRelayMs';

export interface TargetSpec {
  /** As the report states it. */
  readonly target: string;
  readonly scenario: string;
  readonly measure: Measure;
  /** Met when the figure is at most this… */
  readonly atMost?: number;
  /** …or at least this. */
  readonly atLeast?: number;
  /** Also show the waybill+otel row's figure (for information; the verdict is waybill's). */
  readonly withOtel?: boolean;
  /** A figure that cannot be computed (NaN) misses the target instead of being n/a. */
  readonly undefinedMisses?: boolean;
}

export interface IssueTargets {
  readonly issue: number;
  /** A target whose scenario did not run: left out (`omit`) or reported n/a (`na`). */
  readonly notRun: 'omit' | 'na';
  readonly targets: readonly TargetSpec[];
}

/** Issue 5's targets (CPU per event vs nginx at c64 and max, RSS per stream), now with the default configuration. */
export const ISSUE_5: IssueTargets = {
  issue: 5,
  notRun: 'omit',
  targets: [
    { target: 'added TTFT p50 <= 1 ms at c64', scenario: 'c64', measure: 'addedTtftP50Ms', atMost: 1, undefinedMisses: true },
    { target: 'added TTFT p99 <= 5 ms at c64', scenario: 'c64', measure: 'addedTtftP99Ms', atMost: 5, undefinedMisses: true },
    { target: 'CPU/event <= 1.5x nginx at c64', scenario: 'c64', measure: 'cpuPerEventVsNginx', atMost: 1.5 },
    { target: 'CPU/event <= 1.5x nginx at max', scenario: 'max', measure: 'cpuPerEventVsNginx', atMost: 1.5 },
    { target: 'RSS <= 100 KiB per in-flight stream at c256s', scenario: 'c256s', measure: 'rssPerStreamKiB', atMost: 100 },
    { target: 'RSS <= 100 KiB per in-flight stream at c256', scenario: 'c256', measure: 'rssPerStreamKiB', atMost: 100 },
  ],
};

/**
 * Issue 15's targets. "Throughput 1.00× direct" is met when the ratio rounds to 1.00 (>= 0.995). Fair under
 * saturation: a new stream's first token does not wait behind the established streams' events — the bound chosen (the
 * issue names none) is 10 ms added at the median; the turns-off row shows what the read turns buy. Workers add no
 * cost: two workers (and their primary) on one core, CPU per event against one worker's.
 */
export const ISSUE_15: IssueTargets = {
  issue: 15,
  notRun: 'na',
  targets: [
    { target: 'CPU/event at c64s (64 streams × 64 tokens, 10 ms) <= 1.5x nginx', scenario: 'c64s', measure: 'cpuPerEventVsNginx', atMost: 1.5, withOtel: true },
    { target: 'throughput at c256s (256 streams × 64 tokens, 20 ms) = 1.00x direct', scenario: 'c256s', measure: 'throughputVsDirect', atLeast: 0.995, withOtel: true },
    { target: 'added TTFT p99 at c256s <= 10 ms', scenario: 'c256s', measure: 'addedTtftP99Ms', atMost: 10, withOtel: true },
    { target: 'added TTFT p50 at c64s <= 1 ms', scenario: 'c64s', measure: 'addedTtftP50Ms', atMost: 1, withOtel: true },
    { target: 'added TTFT p99 at c64s <= 5 ms', scenario: 'c64s', measure: 'addedTtftP99Ms', atMost: 5, withOtel: true },
    { target: 'added TTFT p50 at c64 <= 1 ms', scenario: 'c64', measure: 'addedTtftP50Ms', atMost: 1, withOtel: true },
    { target: 'added TTFT p99 at c64 <= 5 ms', scenario: 'c64', measure: 'addedTtftP99Ms', atMost: 5, withOtel: true },
    { target: 'new streams at saturation (max): added TTFT p50 <= 10 ms', scenario: 'max', measure: 'saturatedTtftP50Ms', atMost: 10 },
    { target: "CPU/event with 2 workers at c64s within 10% of 1 worker's", scenario: 'c64s', measure: 'cpuPerEventTwoWorkers', atMost: 1.1 },
    { target: "CPU/event with 2 workers at max within 10% of 1 worker's", scenario: 'max', measure: 'cpuPerEventTwoWorkers', atMost: 1.1 },
  ],
};

/**
 * Issue 27's targets: Waybill's own cost near the bare Node relay's (node-floor, bench/proxy/floor.ts), measured in
 * the same run. "ITL p99 at saturation" is the max scenario's, beside new streams' added TTFT p50 there.
 */
export const ISSUE_27: IssueTargets = {
  issue: 27,
  notRun: 'na',
  targets: [
    { target: 'CPU/event at c64s <= 1.2x the bare Node relay', scenario: 'c64s', measure: 'cpuVsRelay', atMost: 1.2 },
    { target: 'CPU/event at c256s <= 1.2x the bare Node relay', scenario: 'c256s', measure: 'cpuVsRelay', atMost: 1.2 },
    { target: 'added TTFT p99 at c64s <= 2 ms', scenario: 'c64s', measure: 'addedTtftP99Ms', atMost: 2, undefinedMisses: true },
    { target: 'added TTFT p99 at c256s <= 5 ms', scenario: 'c256s', measure: 'addedTtftP99Ms', atMost: 5, undefinedMisses: true },
    { target: "ITL p99 at saturation (max) <= the relay's + 3 ms", scenario: 'max', measure: 'itlP99VsRelayMs', atMost: 3 },
    { target: 'new streams at saturation (max): added TTFT p50 <= 10 ms', scenario: 'max', measure: 'saturatedTtftP50Ms', atMost: 10 },
    { target: "CPU per request (req, non-streaming) <= 2x the relay's", scenario: 'req', measure: 'cpuVsRelay', atMost: 2 },
    { target: 'RSS <= 100 KiB per in-flight stream at c256s', scenario: 'c256s', measure: 'rssPerStreamKiB', atMost: 100 },
  ],
};

export interface TargetCheck {
  target: string;
  measured: string;
  met: boolean | undefined;
}

type Find = (scenario: string, proxy: string) => Comparison | undefined;

interface Reading {
  readonly value: number;
  readonly shown: string;
}

/** What a relay-relative figure reads when the run had no node-floor row. */
const NO_RELAY = 'no node-floor row (--no-floor)';

const vsNginx = (c: Comparison): string => `${f1(c.usPerEvent)} vs nginx ${f1(c.nginxUsPerEvent)} µs/ev (${c.nginxSource}) = ${f2(c.vsNginx)}x`;

/** A figure of one comparison row: the ones waybill+otel can be shown beside. */
const ROW_MEASURES: Partial<Record<Measure, (c: Comparison) => Reading>> = {
  addedTtftP50Ms: (c) => ({ value: c.addedTtftP50Ms, shown: `${signed(c.addedTtftP50Ms)} ms` }),
  addedTtftP99Ms: (c) => ({ value: c.addedTtftP99Ms, shown: `${signed(c.addedTtftP99Ms)} ms` }),
  cpuPerEventVsNginx: (c) => ({ value: c.vsNginx, shown: vsNginx(c) }),
  rssPerStreamKiB: (c) => ({
    value: c.rssPerStreamKiB,
    shown: `${f1(c.rssPerStreamKiB)} KiB (after full GCs; without forcing GC: ${f1(c.rssWindowPerStreamKiB)} KiB)`,
  }),
  throughputVsDirect: (c) => ({ value: c.throughputRatio, shown: `${f2(c.throughputRatio)}x (${c.throughputRatio.toFixed(4)})` }),
  saturatedTtftP50Ms: (c) => ({ value: c.addedTtftP50Ms, shown: `${signed(c.addedTtftP50Ms)} ms (p99 ${signed(c.addedTtftP99Ms)} ms)` }),
  cpuVsRelay: (c) => ({
    value: c.vsRelay,
    shown: !Number.isFinite(c.vsRelay)
      ? NO_RELAY
      : c.scenario === 'req'
        ? `${f2(c.vsRelay)}x the relay's µs/req`
        : `${f1(c.usPerEvent)} vs relay ${f1(c.relayUsPerEvent)} µs/ev = ${f2(c.vsRelay)}x`,
  }),
  itlP99VsRelayMs: (c) => ({ value: c.itlP99VsRelayMs, shown: Number.isFinite(c.itlP99VsRelayMs) ? `${signed(c.itlP99VsRelayMs)} ms` : NO_RELAY }),
};

/** The reading of `measure` on `waybill` at `scenario`, or what did not run. */
function read(measure: Measure, scenario: string, c: Comparison | undefined, find: Find): Reading | string {
  if (measure === 'cpuPerEventTwoWorkers') {
    const two = find(scenario, 'waybill-2w');
    if (c === undefined || two === undefined) return `${scenario} or its waybill-2w row not run`;
    const ratio = two.usPerEvent / c.usPerEvent;
    return { value: ratio, shown: `${f1(two.usPerEvent)} vs ${f1(c.usPerEvent)} µs/ev = ${f2(ratio)}x` };
  }
  if (c === undefined) return `${scenario} not run`;
  const reading = (ROW_MEASURES[measure] as (c: Comparison) => Reading)(c);
  if (measure !== 'saturatedTtftP50Ms') return reading;
  // Beside it, what the read turns buy: the same saturation without them.
  const off = find(scenario, 'waybill-turns-off');
  return off === undefined ? reading : { ...reading, shown: `${reading.shown}; waybill-turns-off ${signed(off.addedTtftP50Ms)} / ${signed(off.addedTtftP99Ms)} ms` };
}

/** The verdicts of `issue`'s targets over the run's comparisons, in the table's order. */
export function checkTargets(issue: IssueTargets, comparisons: readonly Comparison[]): TargetCheck[] {
  const find: Find = (scenario, proxy) => comparisons.find((c) => c.scenario === scenario && c.proxy === proxy);
  const checks: TargetCheck[] = [];
  for (const t of issue.targets) {
    const reading = read(t.measure, t.scenario, find(t.scenario, 'waybill'), find);
    if (typeof reading === 'string') {
      if (issue.notRun === 'na') checks.push({ target: t.target, measured: reading, met: undefined });
      continue;
    }
    const otel = t.withOtel === true ? find(t.scenario, 'waybill+otel') : undefined;
    const otelRow = ROW_MEASURES[t.measure];
    const measured = otel === undefined || otelRow === undefined ? reading.shown : `${reading.shown}; waybill+otel ${otelRow(otel).shown}`;
    const x = reading.value;
    const within = (t.atMost === undefined || x <= t.atMost) && (t.atLeast === undefined || x >= t.atLeast);
    checks.push({ target: t.target, measured, met: Number.isFinite(x) || t.undefinedMisses === true ? within : undefined });
  }
  return checks;
}
