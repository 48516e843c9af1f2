/**
 * Reconciliation: Waybill's ledger must be exact. Compares, count by count, what the clients saw and what the
 * simulators counted and injected with what Waybill's /metrics says changed over the run, on every route the load
 * tool sends (chat and legacy completions, Responses, Messages, embeddings, rerank, tokenize). The load tool must
 * be the only traffic. Every mismatch is reported; any makes the run fail.
 *
 * Most counts are exact. A few things a client cannot observe exactly are compared as bounded intervals instead
 * (docs/load.md, "Borderline requests and races"): SLO results whose client-side timing lies within the margin of
 * a threshold, a cancellation that raced the end of its answer, events Waybill reads after a response ended
 * (within its drain grace), and the attempts of a request Waybill may have retried. Each such request may add to one of a few known alternatives; Waybill's count must lie
 * between the fewest and the most the alternatives allow, and every other request counts exactly.
 */
import { request } from 'undici';
import type { RequestResult } from './client.js';
import { PROMPT_LENS, promptLenOf, sloCandidates, type SloThresholds } from './stats.js';

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

/**
 * A target `--reconcile` cannot compare against: `--url` is not a Waybill gateway (its /metrics has no Waybill
 * metrics: a simulator, vLLM, or a gateway whose /metrics is on its admin port), or a `--sim` is not a simulator.
 * Its message is one line, for the operator to fix the command.
 */
export class TargetError extends Error {
  override readonly name = 'TargetError';
}

/** The metric whose presence says a /metrics is Waybill's (its HELP line is written even before any request). */
const WAYBILL_MARKER = '# TYPE waybill_requests_total counter';

async function gatewayMetrics(gatewayUrl: string, apiKey: string | undefined): Promise<Sample[]> {
  // With client keys and no admin port, /metrics needs a key with admin: true: --api-key, when it is one.
  const response = await request(`${gatewayUrl}/metrics`, { headers: apiKey === undefined ? {} : { authorization: `Bearer ${apiKey}` } });
  const text = await response.body.text();
  if (response.statusCode === 401 || response.statusCode === 403) {
    throw new TargetError(`--reconcile: ${gatewayUrl}/metrics answered ${response.statusCode}: the gateway has client keys; give --api-key a key with admin: true, or --url a gateway whose /metrics is open`);
  }
  if (response.statusCode !== 200 || !text.includes(WAYBILL_MARKER)) {
    const why = response.statusCode !== 200 ? `GET /metrics answered ${response.statusCode}` : 'its /metrics has no waybill_* metrics';
    throw new TargetError(`--reconcile: ${gatewayUrl} is not a Waybill gateway (${why}); give --url the gateway's API port (with server.admin_port set, /metrics is on the admin listener)`);
  }
  return parseMetrics(text);
}

async function simStats(url: string): Promise<SimStatsSnapshot> {
  let response: Awaited<ReturnType<typeof request>>;
  try {
    response = await request(`${url}/sim/stats`);
  } catch (error) {
    // Named here: the operator must learn which of the URLs failed, not only --url.
    const code = (error as NodeJS.ErrnoException).code;
    throw new TargetError(`--sim: cannot reach ${url}: ${error instanceof Error && error.message !== '' ? error.message : String(code ?? error)}`);
  }
  const body = await response.body.text();
  let stats: Partial<SimStatsSnapshot> | undefined;
  try {
    stats = response.statusCode === 200 ? (JSON.parse(body) as Partial<SimStatsSnapshot>) : undefined;
  } catch {
    stats = undefined;
  }
  if (typeof stats?.byRoute !== 'object' || typeof stats.faultsInjected !== 'object') {
    throw new TargetError(`--sim: ${url} is not a Waybill simulator (GET /sim/stats answered ${response.statusCode}${response.statusCode === 200 ? ' without its counters' : ''})`);
  }
  return stats as SimStatsSnapshot;
}

export async function snapshot(gatewayUrl: string, simUrls: readonly string[], apiKey?: string): Promise<Snapshot> {
  const [metrics, sims] = await Promise.all([gatewayMetrics(gatewayUrl, apiKey), Promise.all(simUrls.map(simStats))]);
  return { metrics, sims };
}

/**
 * Waits (bounded) until Waybill has settled every request of the run: its in-flight gauge is back to zero and its
 * request counter grew by the number of requests sent. A request settles after its response (the drain grace).
 */
export async function settledSnapshot(gatewayUrl: string, simUrls: readonly string[], before: Snapshot, expected: number, timeoutMs = 30_000, apiKey?: string): Promise<Snapshot> {
  const deadline = performance.now() + timeoutMs;
  const startCount = [...sumBy(before.metrics, 'waybill_requests_total', []).values()][0] ?? 0;
  for (;;) {
    const now = await snapshot(gatewayUrl, simUrls, apiKey);
    const count = ([...sumBy(now.metrics, 'waybill_requests_total', []).values()][0] ?? 0) - startCount;
    const inflight = [...sumBy(now.metrics, 'waybill_inflight_requests', []).values()][0] ?? 0;
    if ((count >= expected && inflight === 0) || performance.now() > deadline) return now;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

export interface Mismatch {
  readonly what: string;
  readonly key: string;
  /** What the clients (and simulators) allow: exactly `min` when min = max. */
  readonly min: number;
  readonly max: number;
  readonly waybill: number;
}

/** What one request adds to a compared count: amounts by key. */
type Contribution = ReadonlyMap<string, number>;

/**
 * What one request may add: one contribution when the client knows it, or the alternatives it cannot tell apart
 * (a borderline SLO result, a race).
 */
type Alternatives = readonly Contribution[];

const NOTHING: Contribution = new Map();

function one(key: string | undefined, amount = 1): Contribution {
  return key === undefined || amount === 0 ? NOTHING : new Map([[key, amount]]);
}

function each(keys: readonly string[]): Contribution {
  const out = new Map<string, number>();
  for (const key of keys) out.set(key, (out.get(key) ?? 0) + 1);
  return out;
}

interface Bounds {
  readonly min: Map<string, number>;
  readonly max: Map<string, number>;
  readonly totalMin: number;
  readonly totalMax: number;
  /** Requests with more than one alternative. */
  readonly uncertain: number;
}

/**
 * Per key, the least and the most the requests can add: a request with one alternative adds it to both; one with
 * several adds, per key, the smallest and the largest amount its alternatives give it.
 */
function bounds<T>(items: readonly T[], alternativesOf: (item: T) => Alternatives): Bounds {
  const min = new Map<string, number>();
  const max = new Map<string, number>();
  let totalMin = 0;
  let totalMax = 0;
  let uncertain = 0;
  const add = (map: Map<string, number>, key: string, amount: number) => {
    if (amount !== 0) map.set(key, (map.get(key) ?? 0) + amount);
  };
  const sum = (c: Contribution) => [...c.values()].reduce((a, b) => a + b, 0);
  for (const item of items) {
    const alternatives = alternativesOf(item);
    if (alternatives.length === 0) continue;
    if (alternatives.length > 1) uncertain++;
    const keys = new Set(alternatives.flatMap((c) => [...c.keys()]));
    for (const key of keys) {
      const amounts = alternatives.map((c) => c.get(key) ?? 0);
      add(min, key, Math.min(...amounts));
      add(max, key, Math.max(...amounts));
    }
    totalMin += Math.min(...alternatives.map(sum));
    totalMax += Math.max(...alternatives.map(sum));
  }
  return { min, max, totalMin, totalMax, uncertain };
}

function plus(a: Bounds, b: Bounds): Bounds {
  const add = (x: Map<string, number>, y: Map<string, number>) => {
    const out = new Map(x);
    for (const [key, value] of y) out.set(key, (out.get(key) ?? 0) + value);
    return out;
  };
  return {
    min: add(a.min, b.min),
    max: add(a.max, b.max),
    totalMin: a.totalMin + b.totalMin,
    totalMax: a.totalMax + b.totalMax,
    uncertain: a.uncertain + b.uncertain,
  };
}

/** An exact expectation as bounds. */
function exactly(expected: Map<string, number>): Bounds {
  const total = [...expected.values()].reduce((a, b) => a + b, 0);
  return { min: expected, max: expected, totalMin: total, totalMax: total, uncertain: 0 };
}

/**
 * Every key must lie within its bounds; with uncertain requests the total must too (each request adds to one
 * alternative, not to all).
 */
function compare(what: string, expected: Bounds, actual: Map<string, number>, into: Mismatch[], bounded?: Mismatch[]): void {
  const before = into.length;
  for (const key of new Set([...expected.min.keys(), ...expected.max.keys(), ...actual.keys()])) {
    const min = expected.min.get(key) ?? 0;
    const max = expected.max.get(key) ?? 0;
    const a = actual.get(key) ?? 0;
    if (a < min || a > max) into.push({ what, key, min, max, waybill: a });
    else if (min !== max) bounded?.push({ what, key, min, max, waybill: a });
  }
  if (into.length > before || expected.uncertain === 0) return;
  const total = [...actual.values()].reduce((a, b) => a + b, 0);
  if (total < expected.totalMin || total > expected.totalMax) into.push({ what, key: 'total', min: expected.totalMin, max: expected.totalMax, waybill: total });
}

/** A one-series total keyed like an unlabelled delta (absent when zero, as a delta would be). */
function single(value: number): Map<string, number> {
  return new Map(value === 0 ? [] : [['', value]]);
}

/** How a fault shows on a route: the anomalies Waybill counts for it, and the outcome it causes (the client sees). */
interface FaultEffect {
  readonly anomalies: readonly string[];
  readonly outcome: string;
}

/**
 * Per route family, the faults that make Waybill count anomalies (docs/simulator.md for what the simulator sends on
 * each route, docs/metrics.md for what each anomaly means). Every one rides on one attempt: after commit, or not
 * retried. Faults not listed cause none: statuses, resets and stalls, and on Responses an engine error (a cut
 * connection) and `drop_finish` (its `response.completed` still comes).
 */
const FAULT_EFFECTS: Readonly<Record<'chat' | 'responses' | 'messages', Readonly<Record<string, FaultEffect>>>> = {
  chat: {
    // vLLM's error event, then its `[DONE]`.
    error_before_output: { anomalies: ['error_payload', 'done_after_error'], outcome: 'rejected' },
    error_after: { anomalies: ['error_payload', 'done_after_error'], outcome: 'stream_error' },
    end_after: { anomalies: ['missing_done', 'missing_finish_reason'], outcome: 'incomplete' },
    no_done: { anomalies: ['missing_done'], outcome: 'incomplete' },
    drop_finish: { anomalies: ['missing_finish_reason'], outcome: 'incomplete' },
    malformed_after: { anomalies: ['malformed_event'], outcome: 'delivered' },
    oversized_after: { anomalies: ['oversized_event'], outcome: 'incomplete' },
    data_after_done: { anomalies: ['data_after_done'], outcome: 'delivered' },
  },
  responses: {
    // The finish reason comes only with `response.completed`: a clean end without it leaves the answer unfinished.
    end_after: { anomalies: ['missing_done', 'missing_finish_reason'], outcome: 'incomplete' },
    no_done: { anomalies: ['missing_done', 'missing_finish_reason'], outcome: 'incomplete' },
    malformed_after: { anomalies: ['malformed_event'], outcome: 'delivered' },
    oversized_after: { anomalies: ['oversized_event'], outcome: 'incomplete' },
    data_after_done: { anomalies: ['data_after_done'], outcome: 'delivered' },
  },
  messages: {
    // `event: error` and a clean end, no `message_stop`: before output the status of the code vLLM's converter
    // keeps in its message (docs/errors.md) — the simulator's lazy validation, a 400, not retried.
    error_before_output: { anomalies: ['error_payload'], outcome: 'rejected' },
    error_after: { anomalies: ['error_payload'], outcome: 'stream_error' },
    end_after: { anomalies: ['missing_done', 'missing_finish_reason'], outcome: 'incomplete' },
    no_done: { anomalies: ['missing_done'], outcome: 'incomplete' },
    // No `message_delta` (no stop reason), `message_stop` still comes.
    drop_finish: { anomalies: ['missing_finish_reason'], outcome: 'incomplete' },
    malformed_after: { anomalies: ['malformed_event'], outcome: 'delivered' },
    oversized_after: { anomalies: ['oversized_event'], outcome: 'incomplete' },
    data_after_done: { anomalies: ['data_after_done'], outcome: 'delivered' },
  },
};

function faultEffect(r: RequestResult): FaultEffect | undefined {
  const fault = r.plan.fault;
  if (fault === undefined || !r.plan.stream) return undefined;
  switch (r.plan.route) {
    case 'chat_completions':
    case 'completions':
      return FAULT_EFFECTS.chat[fault];
    case 'responses':
      return FAULT_EFFECTS.responses[fault];
    case 'messages':
      return FAULT_EFFECTS.messages[fault];
    case 'embeddings':
    case 'rerank':
    case 'tokenize':
      return undefined;
  }
}

/**
 * Anomalies Waybill counts from what an upstream sends after the response ended: the `[DONE]` after an error event
 * and data after the end. Waybill reads them only within its drain grace after the end; whether they arrived in
 * time is invisible to a client, so each may or may not be counted.
 */
const AFTER_THE_END: ReadonlySet<string> = new Set(['done_after_error', 'data_after_done']);

/**
 * The anomalies this request's fault makes Waybill count. A fault takes effect at a point of the answer, and the
 * client sees whether it did: the outcome it causes. Another outcome (a gateway deadline that ended the answer
 * first) means Waybill never read it: no anomaly. A malformed event is dropped by Waybill and the answer goes on,
 * so for an answer ended otherwise the client tells by position: it follows the k-th output event; only an answer
 * cut right after that event leaves it unknown.
 */
function anomalyAlternatives(r: RequestResult): Alternatives {
  const fault = r.plan.fault;
  const effect = faultEffect(r);
  if (fault === undefined || effect === undefined) return [NOTHING];
  const kinds = effect.anomalies;
  let reached: boolean | undefined = r.outcome === effect.outcome;
  if (!reached && fault === 'malformed_after') {
    // The malformed event follows the k-th output event, before the (k+1)-th.
    const k = Number(/malformed_after=(\d+)/.exec(r.plan.simHeader ?? '')?.[1] ?? Number.NaN);
    reached = r.outputEvents > k ? true : r.outputEvents < k ? false : undefined;
  }
  const sure = reached === true ? kinds.filter((k) => !AFTER_THE_END.has(k)) : [];
  const maybe = reached === false ? [] : reached === true ? kinds.filter((k) => AFTER_THE_END.has(k)) : kinds;
  if (maybe.length === 0) return [each(sure)];
  // The unsure kinds independently (each counted at most once per attempt).
  let alternatives: string[][] = [sure];
  for (const kind of maybe) alternatives = alternatives.flatMap((a) => [a, [...a, kind]]);
  return alternatives.map(each);
}

/**
 * How many attempts (requests to a simulator) a request made, as far as the client can tell (docs/metrics.md,
 * "Retries"): one, except that a request answered with a failure status before any output (5xx, 429, 408) may have
 * been retried any number of times, and one the client left before its first token may have left before Waybill
 * sent it upstream. An upper bound of Infinity: any number.
 */
function attemptRange(r: RequestResult): readonly [number, number] {
  if (r.cancelPhase === 'before_first_token') return [0, 1];
  if (r.status === undefined && r.outcome !== 'client_cancelled') return [0, Number.POSITIVE_INFINITY];
  if (r.status !== 200 && (r.code >= 500 || r.code === 429 || r.code === 408)) return [1, Number.POSITIVE_INFINITY];
  return [1, 1];
}

/** The request's attempts, added to `key`. */
function attemptsAs(r: RequestResult, key: string | undefined): Alternatives {
  const [lo, hi] = attemptRange(r);
  if (key === undefined) return [NOTHING];
  return lo === hi ? [one(key, lo)] : [one(key, lo), one(key, hi)];
}

/** Routes that report usage (docs/metrics.md `waybill_usage_missing_total`: not tokenize, detokenize). */
const WITHOUT_USAGE: ReadonlySet<string> = new Set(['tokenize']);

export interface Reconciliation {
  readonly mismatches: Mismatch[];
  readonly checked: Record<string, number>;
  /** The margin client and Waybill clocks are taken to agree within. */
  readonly marginMs: number;
  /** Requests compared as bounded intervals, per comparison (docs/load.md): SLO borderline, races. */
  readonly uncertain: Record<string, number>;
  /** The counts compared as intervals that held, and where Waybill's value fell. */
  readonly bounded: Mismatch[];
}

/**
 * `emptyConnections`: connections the clients opened to Waybill and sent no whole request on (load/client.ts); one
 * that sent part of a request may have been answered with a 408 `_other`, counted like a request (one that sent no
 * byte is closed uncounted).
 */
export function reconcile(
  results: readonly RequestResult[],
  before: Snapshot,
  after: Snapshot,
  slo: SloThresholds,
  marginMs: number,
  emptyConnections = 0,
): Reconciliation {
  const mismatches: Mismatch[] = [];
  const bounded: Mismatch[] = [];
  const uncertain: Record<string, number> = {};
  if (emptyConnections > 0) uncertain['empty_connections'] = emptyConnections;
  const d = (name: string, by: readonly string[]) => delta(sumBy(after.metrics, name, by), sumBy(before.metrics, name, by));
  const check = (
    what: string,
    short: string,
    alternativesOf: (r: RequestResult) => Alternatives,
    actual: Map<string, number>,
    /** What an empty connection may add, if anything. */
    ofEmptyConnection?: Contribution,
  ) => {
    const expected = bounds(results, alternativesOf);
    if (expected.uncertain > 0) uncertain[short] = expected.uncertain;
    const empty = ofEmptyConnection === undefined ? undefined : bounds(Array.from({ length: emptyConnections }, () => [NOTHING, ofEmptyConnection]), (a) => a);
    compare(what, empty === undefined ? expected : plus(expected, empty), actual, mismatches, bounded);
  };
  // A cancellation that raced the end of its answer (every choice finished, the end not yet seen) is counted by
  // Waybill as either; any other outcome the client saw is Waybill's.
  const outcomesOf = (r: RequestResult) => (r.cancelRacedEnd ? (['client_cancelled', 'delivered'] as const) : [r.outcome]);
  const racedUsageUnseen = (r: RequestResult) => r.cancelRacedEnd && r.usage === undefined;

  check(
    'requests by route, stream, code, outcome',
    'requests',
    (r) => outcomesOf(r).map((o) => one(`${r.plan.route}|${String(r.plan.stream)}|${r.code}|${o}`)),
    d('waybill_requests_total', ['route', 'stream', 'code', 'outcome']),
    one('_other|false|408|rejected'),
  );
  check('finish reasons', 'finish_reasons', (r) => [each(r.finishReasons)], d('waybill_choice_finish_reasons_total', ['finish_reason']));
  check(
    'client cancellations by phase',
    'cancellations',
    (r) => (r.cancelRacedEnd ? [one(r.cancelPhase), NOTHING] : [one(r.cancelPhase)]),
    d('waybill_client_cancellations_total', ['phase']),
  );
  check(
    'SLO results by prompt_len',
    'slo',
    (r) => {
      // Without the usage it raced, the class Waybill gave the request is unknown to the client.
      const lens = racedUsageUnseen(r) ? PROMPT_LENS : [promptLenOf(r)];
      const results = new Set(outcomesOf(r).flatMap((o) => sloCandidates(r, slo, marginMs, o)));
      return lens.flatMap((len) => [...results].map((result) => one(`${len}|${result}`)));
    },
    d('waybill_slo_requests_total', ['prompt_len', 'result']),
    one('unknown|excluded'),
  );
  const one0 = (name: string) => d(name, []);
  const tokens = (pick: (r: RequestResult) => number | undefined) => (r: RequestResult) =>
    // Usage Waybill may have read after the client left: any amount.
    racedUsageUnseen(r) ? [NOTHING, one('', Number.POSITIVE_INFINITY)] : [one('', pick(r) ?? 0)];
  check('prompt tokens', 'prompt_tokens', tokens((r) => r.usage?.promptTokens), one0('waybill_prompt_tokens_total'));
  check('completion tokens', 'completion_tokens', tokens((r) => r.usage?.completionTokens), one0('waybill_completion_tokens_total'));
  check('cached prompt tokens', 'cached_tokens', tokens((r) => r.usage?.cachedTokens), one0('waybill_cached_prompt_tokens_total'));
  check(
    'delivered without usage',
    'usage_missing',
    (r) =>
      WITHOUT_USAGE.has(r.plan.route)
        ? [NOTHING]
        : outcomesOf(r).map((o) => (o === 'delivered' && (r.usage === undefined || racedUsageUnseen(r)) ? one('') : NOTHING)),
    one0('waybill_usage_missing_total'),
  );
  // The histograms' counts: one duration per request (by route and outcome), one TTFT per stream whose first output
  // reached the client (by prompt_len; none on the routes without a stream), one TPOT per delivered stream with
  // usage and at least 2 tokens per choice.
  check(
    'request durations by route, outcome',
    'durations',
    (r) => outcomesOf(r).map((o) => one(`${r.plan.route}|${o}`)),
    d('waybill_request_duration_seconds_count', ['route', 'outcome']),
    one('_other|rejected'),
  );
  check(
    'TTFT observations by prompt_len',
    'ttft',
    (r) => (r.ttftMs === undefined ? [NOTHING] : (racedUsageUnseen(r) ? PROMPT_LENS : [promptLenOf(r)]).map((len) => one(len))),
    d('waybill_time_to_first_token_seconds_count', ['prompt_len']),
  );
  check(
    'TPOT observations',
    'tpot',
    (r) => (r.cancelRacedEnd ? [NOTHING, one('')] : [one(r.tpotMs === undefined ? undefined : '')]),
    one0('waybill_time_per_output_token_seconds_count'),
  );

  // The simulators' side: every attempt reached one of them, on its request's route, and every fault they injected
  // rode on an attempt of a request the clients planned it for.
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
  const attemptsSeen = [...simRequests.values()].reduce((a, b) => a + b, 0);
  const injected = simDelta((s) => s.faultsInjected);
  if (after.sims.length > 0) {
    compare('attempts (simulators counted, Waybill counted)', exactly(single(attemptsSeen)), one0('waybill_upstream_attempts_total'), mismatches);
    // Per route: what each request's attempts add to the simulators' byRoute (no other route, no `other`).
    check('attempts by route (clients allow, simulators counted)', 'attempts_by_route', (r) => attemptsAs(r, r.plan.route), simRequests);
    // Every attempt of a request carrying a fault makes the simulator inject it once.
    check('faults injected (clients planned, simulators injected)', 'faults_injected', (r) => attemptsAs(r, r.plan.fault), injected);
  }
  compare('attempts per request (histogram sum vs counter)', exactly(one0('waybill_upstream_attempts_total')), one0('waybill_request_attempts_sum'), mismatches);
  check(
    'requests with attempts',
    'requests_with_attempts',
    (r) => (attemptRange(r)[0] === 0 ? [NOTHING, one('')] : [one('')]),
    one0('waybill_request_attempts_count'),
  );
  check('anomalies (faults the clients saw take effect, Waybill counted)', 'anomalies', anomalyAlternatives, d('waybill_stream_anomalies_total', ['kind']));
  check('client-side anomalies (should be none)', 'client_anomalies', (r) => [one(r.anomaly)], new Map());

  return {
    mismatches,
    marginMs,
    uncertain,
    bounded,
    checked: {
      requests: results.length,
      attempts: attemptsSeen,
      faultsInjected: [...injected.values()].reduce((a, b) => a + b, 0),
      cancellations: results.filter((r) => r.cancelPhase !== undefined).length,
    },
  };
}
