/**
 * The live status page's numbers (docs/status-page.md), read from the gateway's own ledger rather than from
 * Prometheus: every settled request is folded into a sliding window of fixed time buckets, and the last failed
 * requests are kept in a short list. Pure apart from its injected clock, and bounded whatever the traffic:
 *
 * - the window is a ring of {@link STATUS_WINDOW.buckets} buckets; a bucket is cleared when its slot is reused, so
 *   expiry costs nothing per request and a quiet gateway holds nothing old;
 * - each bucket keys its rows by label values from the closed sets of the metrics contract (model, tenant,
 *   prompt_len, upstream), capped at {@link MAX_ROWS} keys per table, past which rows fold into `_other`;
 * - latency is kept as counts per histogram bucket (the configured `metrics.buckets`, SLO thresholds included), and
 *   percentiles are interpolated within the bucket as PromQL's `histogram_quantile` does, so the page agrees with
 *   a dashboard built on the same buckets;
 * - the failure list keeps the last {@link STATUS_WINDOW.failures} requests that were not accepted (and not excluded
 *   from the SLO), with ids and closed-set values only: never a prompt, a completion, a header or a key.
 *
 * @example
 * const window = createStatusWindow({ now: Date.now, ttftBuckets: [0.1, 0.5, 1], tpotBuckets: [0.01, 0.05], firstOutputBuckets: [0.1, 0.5, 1] });
 * window.record(settlement, requestId, traceId); // from the settlement hook
 * const view = window.view();                    // on each tick of the page's event stream
 */
import type { Settlement } from '../accounting/ledger.js';
import { OTHER, OUTCOMES, type Outcome } from '../accounting/outcomes.js';
import { healthVerdict } from '../delivery/retry-policy.js';
import { addCounts, addInto, addSettlement, causeOf, observe, percentiles, zeroCounts, type Counts } from './status-counts.js';

export { causeOf, quantile } from './status-counts.js';

/** The window's shape: the page says it in words. */
export const STATUS_WINDOW = {
  /** Length of one bucket. */
  bucketMs: 10_000,
  /** Buckets in the window: 30 × 10 s = the last 5 minutes (the newest bucket still filling). */
  buckets: 30,
  /** Failed requests kept, newest first. */
  failures: 50,
} as const;

/** Distinct keys per table and bucket; more fold into `_other` (a reload can add names, the window forgets them). */
export const MAX_ROWS = 256;

/** Request counts along the funnel, and the SLO's. */
export interface Funnel {
  /** Logical requests that ended (the denominator of every ratio). */
  requests: number;
  /** Of those, answered with a 2xx status. */
  http_2xx: number;
  /** Of those, delivered whole (outcome `delivered`). */
  delivered: number;
  /** Of those, users' answers accepted: no applicable output check failed (evaluator traffic is never accepted). */
  accepted: number;
  /** Requests the SLO judges (result other than `excluded`). */
  slo_eligible: number;
  /** Of those, delivered within every threshold (result `met`). */
  slo_met: number;
}

/**
 * The evaluation cohort (seed 000 §7.3), as waybill_requests_checked_total counts it: coverage is evaluated / checked,
 * accepted among evaluated is evaluated_accepted / evaluated — two ratios over two denominators.
 */
export interface Cohort {
  /** Users' delivered requests with at least one checked choice. */
  checked: number;
  /** Of those, every applicable check evaluated (verdict accepted or not_accepted). */
  evaluated: number;
  /** Of those, accepted (verdict accepted). */
  evaluated_accepted: number;
  /** Requests carrying the evaluator header: in `requests`, never accepted or checked. */
  evaluator: number;
}

export interface TokenCounts {
  prompt_tokens: number;
  cached_prompt_tokens: number;
  completion_tokens: number;
}

export interface Percentiles {
  /** Observations in the window. */
  count: number;
  /** Milliseconds; null without observations. */
  p50: number | null;
  p95: number | null;
  p99: number | null;
}

export interface FailedRequest {
  request_id: string;
  trace_id: string | null;
  /** When it ended (ISO 8601, from the injected clock). */
  at: string;
  model: string;
  tenant: string;
  route: string;
  stream: boolean;
  code: number;
  outcome: Outcome;
  /** Why, from a closed set: see {@link causeOf}. */
  cause: string;
  /** The upstream of the last attempt; null when the gateway answered without one. */
  upstream: string | null;
  attempts: number;
}

export interface Row extends Funnel, Cohort, TokenCounts {
  name: string;
  /** slo_met / slo_eligible; null when nothing was judged. */
  slo_attainment: number | null;
  /** SLO-met requests per second over the window. */
  goodput_per_second: number;
}

export interface UpstreamActivity {
  name: string;
  /** Attempts that ended in the window. */
  attempts: number;
  /** Of those, failures by passive health's rules (what counts toward an ejection). */
  failed_attempts: number;
  /** Attempt sent → its first output-bearing event (streamed attempts that produced output). */
  first_output: Percentiles;
  /** The latest failed attempt ever seen (not only in the window): when, and its result. */
  last_failure: { at: string; result: string } | null;
}

export interface LatencyRow {
  prompt_len: string;
  ttft: Percentiles;
  tpot: Percentiles;
}

export interface SeriesPoint extends Funnel {
  /** The bucket's start (ISO 8601). */
  start: string;
}

export interface WindowView {
  window: { seconds: number; bucket_seconds: number; covered_seconds: number };
  funnel: Funnel &
    Cohort & {
      slo_attainment: number | null;
      /** evaluated / checked; null when nothing was checked. */
      evaluation_coverage: number | null;
      /** evaluated_accepted / evaluated; null when nothing was evaluated. */
      accepted_among_evaluated: number | null;
      goodput_per_second: number;
      outcomes: Record<Outcome, number>;
    };
  /** One point per bucket, oldest first; the last one is still filling. */
  series: SeriesPoint[];
  latency: LatencyRow[];
  models: Row[];
  tenants: Row[];
  upstreams: UpstreamActivity[];
  failures: FailedRequest[];
}

/** Names that always get a row (zero when idle): the configured models, tenants, classes and upstreams. */
export interface KnownNames {
  readonly models?: readonly string[];
  readonly tenants?: readonly string[];
  readonly promptLenClasses?: readonly string[];
  readonly upstreams?: readonly string[];
}

export interface StatusWindowOptions {
  /** Wall-clock milliseconds (Date.now in production; tests inject their own). */
  readonly now: () => number;
  /** Histogram bucket bounds in seconds (config `metrics.buckets`), ascending. */
  readonly ttftBuckets: readonly number[];
  readonly tpotBuckets: readonly number[];
  readonly firstOutputBuckets: readonly number[];
}

export interface StatusWindow {
  /** Folds one settled request in. Never throws on odd input; the settlement hook guards it anyway. */
  record(settlement: Settlement, requestId: string, traceId: string | undefined): void;
  /** The window as of now. */
  view(known?: KnownNames): WindowView;
}

interface UpstreamCounts {
  attempts: number;
  failed: number;
  firstOutput: Float64Array;
}

interface LatencyCounts {
  ttft: Float64Array;
  tpot: Float64Array;
}

interface Bucket {
  /** floor(time / bucketMs) of the requests it holds; -1 while unused. */
  epoch: number;
  readonly totals: Counts;
  readonly outcomes: Map<Outcome, number>;
  readonly models: Map<string, Counts>;
  readonly tenants: Map<string, Counts>;
  readonly latency: Map<string, LatencyCounts>;
  readonly upstreams: Map<string, UpstreamCounts>;
}

/** The table's entry for `key`, made on first use; past MAX_ROWS keys, the `_other` entry. */
function entry<T>(table: Map<string, T>, key: string, make: () => T): T {
  let value = table.get(key);
  if (value !== undefined) return value;
  const name = table.size < MAX_ROWS ? key : OTHER;
  value = table.get(name);
  if (value === undefined) {
    value = make();
    table.set(name, value);
  }
  return value;
}

export function createStatusWindow(options: StatusWindowOptions): StatusWindow {
  const { now } = options;
  const { bucketMs, buckets: size, failures: maxFailures } = STATUS_WINDOW;
  const ttftBounds = Float64Array.from(options.ttftBuckets, (s) => s * 1000);
  const tpotBounds = Float64Array.from(options.tpotBuckets, (s) => s * 1000);
  const firstOutputBounds = Float64Array.from(options.firstOutputBuckets, (s) => s * 1000);
  const startedAt = now();
  const ring: Bucket[] = Array.from({ length: size }, () => ({
    epoch: -1,
    totals: zeroCounts(),
    outcomes: new Map(),
    models: new Map(),
    tenants: new Map(),
    latency: new Map(),
    upstreams: new Map(),
  }));
  /** Newest last; at most maxFailures (a shift on a 50-element array is cheaper than the bookkeeping of a ring). */
  const failures: FailedRequest[] = [];
  const lastFailure = new Map<string, { at: string; result: string }>();

  const bucketFor = (epoch: number): Bucket => {
    const bucket = ring[epoch % size] as Bucket;
    if (bucket.epoch !== epoch) {
      bucket.epoch = epoch;
      Object.assign(bucket.totals, zeroCounts());
      bucket.outcomes.clear();
      bucket.models.clear();
      bucket.tenants.clear();
      bucket.latency.clear();
      bucket.upstreams.clear();
    }
    return bucket;
  };

  const latencyCounts = (): LatencyCounts => ({ ttft: new Float64Array(ttftBounds.length + 1), tpot: new Float64Array(tpotBounds.length + 1) });
  const upstreamCounts = (): UpstreamCounts => ({ attempts: 0, failed: 0, firstOutput: new Float64Array(firstOutputBounds.length + 1) });

  function record(s: Settlement, requestId: string, traceId: string | undefined): void {
    const at = now();
    const bucket = bucketFor(Math.floor(at / bucketMs));
    addSettlement(bucket.totals, s);
    bucket.outcomes.set(s.outcome, (bucket.outcomes.get(s.outcome) ?? 0) + 1);
    addSettlement(entry(bucket.models, s.model, zeroCounts), s);
    addSettlement(entry(bucket.tenants, s.tenant, zeroCounts), s);
    if (s.ttftMs !== undefined || s.tpotMs !== undefined) {
      const latency = entry(bucket.latency, s.promptLen, latencyCounts);
      if (s.ttftMs !== undefined) observe(latency.ttft, ttftBounds, s.ttftMs);
      if (s.tpotMs !== undefined) observe(latency.tpot, tpotBounds, s.tpotMs);
    }
    // Only a failure keeps the time as text (building it for every request was ~1% of a request's CPU).
    let iso: string | undefined;
    for (const attempt of s.attempts) {
      const counts = entry(bucket.upstreams, attempt.upstream, upstreamCounts);
      counts.attempts++;
      if (healthVerdict(attempt) === 'failure') {
        counts.failed++;
        if (lastFailure.has(attempt.upstream) || lastFailure.size < MAX_ROWS) lastFailure.set(attempt.upstream, { at: (iso ??= new Date(at).toISOString()), result: attempt.result ?? 'cancelled' });
      }
      if (s.stream && attempt.firstOutputAt !== undefined) observe(counts.firstOutput, firstOutputBounds, attempt.firstOutputAt - attempt.startedAt);
    }
    // Listed: what counts against the service. The client's own errors, early cancellations and evaluator traffic
    // (SLO `excluded`) are in the funnel but not here, so a scanner's 404s cannot push real failures off the list.
    if (!s.accepted && s.slo !== 'excluded') {
      failures.push({
        request_id: requestId,
        trace_id: traceId ?? null,
        at: iso ?? new Date(at).toISOString(),
        model: s.model,
        tenant: s.tenant,
        route: s.route,
        stream: s.stream,
        code: s.code,
        outcome: s.outcome,
        cause: causeOf(s),
        upstream: s.attempts.at(-1)?.upstream ?? null,
        attempts: s.attempts.length,
      });
      if (failures.length > maxFailures) failures.shift();
    }
  }

  function view(known: KnownNames = {}): WindowView {
    const at = now();
    const current = Math.floor(at / bucketMs);
    const oldest = current - size + 1;
    const coveredMs = Math.max(0, at - Math.max(startedAt, oldest * bucketMs));
    const perSecond = (n: number) => (coveredMs > 0 ? Math.round((n / (coveredMs / 1000)) * 1000) / 1000 : 0);
    const totals = zeroCounts();
    const outcomes = Object.fromEntries(OUTCOMES.map((o) => [o, 0])) as Record<Outcome, number>;
    const models = new Map<string, Counts>((known.models ?? []).map((name) => [name, zeroCounts()]));
    const tenants = new Map<string, Counts>((known.tenants ?? []).map((name) => [name, zeroCounts()]));
    const latency = new Map<string, LatencyCounts>((known.promptLenClasses ?? []).map((name) => [name, latencyCounts()]));
    const upstreams = new Map<string, UpstreamCounts>((known.upstreams ?? []).map((name) => [name, upstreamCounts()]));
    const series: SeriesPoint[] = [];
    for (let epoch = oldest; epoch <= current; epoch++) {
      const bucket = ring[epoch % size] as Bucket;
      const point: SeriesPoint = { start: new Date(epoch * bucketMs).toISOString(), requests: 0, http_2xx: 0, delivered: 0, accepted: 0, slo_eligible: 0, slo_met: 0 };
      series.push(point);
      if (bucket.epoch !== epoch) continue;
      const t = bucket.totals;
      Object.assign(point, { requests: t.requests, http_2xx: t.http_2xx, delivered: t.delivered, accepted: t.accepted, slo_eligible: t.slo_eligible, slo_met: t.slo_met });
      addCounts(totals, t);
      for (const [outcome, n] of bucket.outcomes) outcomes[outcome] += n;
      for (const [name, counts] of bucket.models) addCounts(entry(models, name, zeroCounts), counts);
      for (const [name, counts] of bucket.tenants) addCounts(entry(tenants, name, zeroCounts), counts);
      for (const [name, counts] of bucket.latency) {
        const into = entry(latency, name, latencyCounts);
        addInto(into.ttft, counts.ttft);
        addInto(into.tpot, counts.tpot);
      }
      for (const [name, counts] of bucket.upstreams) {
        const into = entry(upstreams, name, upstreamCounts);
        into.attempts += counts.attempts;
        into.failed += counts.failed;
        addInto(into.firstOutput, counts.firstOutput);
      }
    }
    const fraction = (n: number, d: number) => (d > 0 ? Math.round((n / d) * 10_000) / 10_000 : null);
    const attainment = (c: Funnel) => fraction(c.slo_met, c.slo_eligible);
    const rows = (table: Map<string, Counts>): Row[] =>
      [...table].map(([name, c]) => ({ name, ...c, slo_attainment: attainment(c), goodput_per_second: perSecond(c.slo_met) }));
    return {
      window: { seconds: (size * bucketMs) / 1000, bucket_seconds: bucketMs / 1000, covered_seconds: Math.round(coveredMs) / 1000 },
      funnel: {
        requests: totals.requests,
        http_2xx: totals.http_2xx,
        delivered: totals.delivered,
        accepted: totals.accepted,
        slo_eligible: totals.slo_eligible,
        slo_met: totals.slo_met,
        checked: totals.checked,
        evaluated: totals.evaluated,
        evaluated_accepted: totals.evaluated_accepted,
        evaluator: totals.evaluator,
        slo_attainment: attainment(totals),
        evaluation_coverage: fraction(totals.evaluated, totals.checked),
        accepted_among_evaluated: fraction(totals.evaluated_accepted, totals.evaluated),
        goodput_per_second: perSecond(totals.slo_met),
        outcomes,
      },
      series,
      latency: [...latency].map(([name, c]) => ({ prompt_len: name, ttft: percentiles(ttftBounds, c.ttft), tpot: percentiles(tpotBounds, c.tpot) })),
      models: rows(models),
      tenants: rows(tenants),
      upstreams: [...upstreams].map(([name, c]) => ({
        name,
        attempts: c.attempts,
        failed_attempts: c.failed,
        first_output: percentiles(firstOutputBounds, c.firstOutput),
        last_failure: lastFailure.get(name) ?? null,
      })),
      failures: failures.slice().reverse(),
    };
  }

  return { record, view };
}
