/**
 * Reconciliation: Waybill's ledger must be exact. Compares, count by count, what the clients saw and what the
 * simulators counted and injected with what Waybill's /metrics says changed over the run. The load tool must be
 * the only traffic. Every mismatch is reported; any makes the run fail.
 */
import { request } from 'undici';
import type { RequestResult } from './client.js';
import { promptLenOf, sloOf, type SloThresholds } from './stats.js';

export interface Sample {
  readonly name: string;
  readonly labels: Readonly<Record<string, string>>;
  readonly value: number;
}

/** Parses Prometheus text exposition (the subset prom-client writes). */
export function parseMetrics(text: string): Sample[] {
  const samples: Sample[] = [];
  for (const line of text.split('\n')) {
    if (line === '' || line.startsWith('#')) continue;
    const brace = line.indexOf('{');
    const space = line.lastIndexOf(' ');
    const name = brace === -1 ? line.slice(0, line.indexOf(' ')) : line.slice(0, brace);
    const labels: Record<string, string> = {};
    if (brace !== -1) {
      const body = line.slice(brace + 1, line.lastIndexOf('}'));
      for (const match of body.matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[match[1] ?? ''] = (match[2] ?? '').replace(/\\(.)/g, '$1');
    }
    samples.push({ name, labels, value: Number(line.slice(space + 1)) });
  }
  return samples;
}

/** Sum of `name` over the samples matching `where`, grouped by the `by` labels (joined with '|'). */
export function sumBy(samples: readonly Sample[], name: string, by: readonly string[], where: Record<string, string> = {}): Map<string, number> {
  const out = new Map<string, number>();
  for (const s of samples) {
    if (s.name !== name) continue;
    if (!Object.entries(where).every(([k, v]) => s.labels[k] === v)) continue;
    const key = by.map((l) => s.labels[l] ?? '').join('|');
    out.set(key, (out.get(key) ?? 0) + s.value);
  }
  return out;
}

function delta(after: Map<string, number>, before: Map<string, number>): Map<string, number> {
  const out = new Map<string, number>();
  for (const [key, value] of after) {
    const d = value - (before.get(key) ?? 0);
    if (d !== 0) out.set(key, d);
  }
  return out;
}

export interface SimStatsSnapshot {
  readonly byRoute: Record<string, number>;
  readonly faultsInjected: Record<string, number>;
}

export interface Snapshot {
  readonly metrics: Sample[];
  readonly sims: SimStatsSnapshot[];
}

export async function snapshot(gatewayUrl: string, simUrls: readonly string[]): Promise<Snapshot> {
  const metrics = parseMetrics(await (await request(`${gatewayUrl}/metrics`)).body.text());
  const sims = await Promise.all(
    simUrls.map(async (url) => (await (await request(`${url}/sim/stats`)).body.json()) as SimStatsSnapshot),
  );
  return { metrics, sims };
}

/**
 * Waits (bounded) until Waybill has settled every request of the run: its in-flight gauge is back to zero and its
 * request counter grew by the number of requests sent. A request settles after its response (the drain grace).
 */
export async function settledSnapshot(gatewayUrl: string, simUrls: readonly string[], before: Snapshot, expected: number, timeoutMs = 30_000): Promise<Snapshot> {
  const deadline = performance.now() + timeoutMs;
  const startCount = [...sumBy(before.metrics, 'waybill_requests_total', []).values()][0] ?? 0;
  for (;;) {
    const now = await snapshot(gatewayUrl, simUrls);
    const count = ([...sumBy(now.metrics, 'waybill_requests_total', []).values()][0] ?? 0) - startCount;
    const inflight = [...sumBy(now.metrics, 'waybill_inflight_requests', []).values()][0] ?? 0;
    if ((count >= expected && inflight === 0) || performance.now() > deadline) return now;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

export interface Mismatch {
  readonly what: string;
  readonly key: string;
  readonly clients: number;
  readonly waybill: number;
}

/** A one-series total keyed like an unlabelled delta (absent when zero, as a delta would be). */
function single(value: number): Map<string, number> {
  return new Map(value === 0 ? [] : [['', value]]);
}

function compare(what: string, expected: Map<string, number>, actual: Map<string, number>, into: Mismatch[]): void {
  for (const key of new Set([...expected.keys(), ...actual.keys()])) {
    const e = expected.get(key) ?? 0;
    const a = actual.get(key) ?? 0;
    if (e !== a) into.push({ what, key, clients: e, waybill: a });
  }
}

function count<T>(items: readonly T[], keyOf: (item: T) => string | readonly string[] | undefined, weight: (item: T) => number = () => 1): Map<string, number> {
  const out = new Map<string, number>();
  for (const item of items) {
    const keys = keyOf(item);
    if (keys === undefined) continue;
    for (const key of typeof keys === 'string' ? [keys] : keys) out.set(key, (out.get(key) ?? 0) + weight(item));
  }
  return out;
}

/** Anomalies Waybill must count for each fault the simulators injected (one per attempt that carried it). */
const ANOMALIES_OF_FAULT: Record<string, readonly string[]> = {
  error_before_output: ['error_payload', 'done_after_error'],
  error_after: ['error_payload', 'done_after_error'],
  end_after: ['missing_done', 'missing_finish_reason'],
  no_done: ['missing_done'],
  drop_finish: ['missing_finish_reason'],
  malformed_after: ['malformed_event'],
  oversized_after: ['oversized_event'],
  data_after_done: ['data_after_done'],
};

export interface Reconciliation {
  readonly mismatches: Mismatch[];
  readonly checked: Record<string, number>;
}

export function reconcile(results: readonly RequestResult[], before: Snapshot, after: Snapshot, slo: SloThresholds): Reconciliation {
  const mismatches: Mismatch[] = [];
  const d = (name: string, by: readonly string[]) => delta(sumBy(after.metrics, name, by), sumBy(before.metrics, name, by));

  compare(
    'requests by route, stream, code, outcome',
    count(results, (r) => `${r.plan.route}|${String(r.plan.stream)}|${r.code}|${r.outcome}`),
    d('waybill_requests_total', ['route', 'stream', 'code', 'outcome']),
    mismatches,
  );
  compare('finish reasons', count(results, (r) => r.finishReasons), d('waybill_choice_finish_reasons_total', ['finish_reason']), mismatches);
  compare('client cancellations by phase', count(results, (r) => r.cancelPhase), d('waybill_client_cancellations_total', ['phase']), mismatches);
  compare(
    'SLO results by prompt_len',
    count(results, (r) => `${promptLenOf(r)}|${sloOf(r, slo)}`),
    d('waybill_slo_requests_total', ['prompt_len', 'result']),
    mismatches,
  );
  const one = (name: string) => d(name, []);
  const total = (pick: (r: RequestResult) => number | undefined) => single(results.reduce((sum, r) => sum + (pick(r) ?? 0), 0));
  compare('prompt tokens', total((r) => r.usage?.promptTokens), one('waybill_prompt_tokens_total'), mismatches);
  compare('completion tokens', total((r) => r.usage?.completionTokens), one('waybill_completion_tokens_total'), mismatches);
  compare('cached prompt tokens', total((r) => r.usage?.cachedTokens), one('waybill_cached_prompt_tokens_total'), mismatches);

  // The simulators' side: every attempt reached one of them, and every fault they injected shows as its anomalies.
  const simDelta = (pick: (s: SimStatsSnapshot) => Record<string, number>) => {
    const out = new Map<string, number>();
    after.sims.forEach((stats, i) => {
      const previous = before.sims[i];
      for (const [key, value] of Object.entries(pick(stats))) {
        const change = value - (previous === undefined ? 0 : (pick(previous)[key] ?? 0));
        if (change !== 0) out.set(key, (out.get(key) ?? 0) + change);
      }
    });
    return out;
  };
  const simRequests = simDelta((s) => s.byRoute);
  const attemptsSeen = (simRequests.get('chat_completions') ?? 0) + (simRequests.get('completions') ?? 0);
  compare('attempts (simulators counted, Waybill counted)', single(attemptsSeen), one('waybill_upstream_attempts_total'), mismatches);
  compare('attempts per request (histogram sum vs counter)', one('waybill_upstream_attempts_total'), one('waybill_request_attempts_sum'), mismatches);
  const expectedAnomalies = new Map<string, number>();
  for (const [fault, injected] of simDelta((s) => s.faultsInjected)) {
    for (const kind of ANOMALIES_OF_FAULT[fault] ?? []) expectedAnomalies.set(kind, (expectedAnomalies.get(kind) ?? 0) + injected);
  }
  compare('anomalies (simulators injected, Waybill counted)', expectedAnomalies, d('waybill_stream_anomalies_total', ['kind']), mismatches);
  compare('client-side anomalies (should be none)', count(results, (r) => r.anomaly), new Map(), mismatches);

  return {
    mismatches,
    checked: {
      requests: results.length,
      attempts: attemptsSeen,
      faultsInjected: [...simDelta((s) => s.faultsInjected).values()].reduce((a, b) => a + b, 0),
      cancellations: results.filter((r) => r.cancelPhase !== undefined).length,
    },
  };
}
