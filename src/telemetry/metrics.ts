/**
 * The metrics contract: every metric Waybill exports, with its labels and, for each histogram, where its clock
 * starts and stops. Names and label sets are a contract with users' dashboards and alerts; docs/metrics.md says
 * the same and test/metrics-contract.test.ts holds the two together.
 */
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import type { Settlement } from '../accounting/ledger.js';
import type { EjectionReason, RetryReason } from '../accounting/outcomes.js';

export interface MetricSpec {
  readonly name: string;
  readonly type: 'counter' | 'histogram' | 'gauge';
  readonly labels: readonly string[];
  readonly help: string;
}

export const METRICS = {
  requests: {
    name: 'waybill_requests_total',
    type: 'counter',
    labels: ['model', 'route', 'stream', 'code', 'outcome'],
    help: 'Logical requests, counted once when each ends, by the status the client received and the delivery outcome.',
  },
  attempts: {
    name: 'waybill_upstream_attempts_total',
    type: 'counter',
    labels: ['model', 'upstream', 'result'],
    help: 'Attempts made to upstreams, by result.',
  },
  requestAttempts: {
    name: 'waybill_request_attempts',
    type: 'histogram',
    labels: ['model'],
    help: 'Attempts per logical request that made at least one.',
  },
  anomalies: {
    name: 'waybill_stream_anomalies_total',
    type: 'counter',
    labels: ['model', 'upstream', 'kind'],
    help: 'Protocol anomalies seen on upstream attempts.',
  },
  finishReasons: {
    name: 'waybill_choice_finish_reasons_total',
    type: 'counter',
    labels: ['model', 'finish_reason'],
    help: 'Choices of committed responses, by finish_reason (none: the choice never got one).',
  },
  cancellations: {
    name: 'waybill_client_cancellations_total',
    type: 'counter',
    labels: ['model', 'phase'],
    help: 'Logical requests the client abandoned, by phase.',
  },
  ttft: {
    name: 'waybill_time_to_first_token_seconds',
    type: 'histogram',
    labels: ['model', 'prompt_len'],
    help: 'Streamed requests that delivered output: request arrival to the first output-bearing event written to the client (role-only chunks do not count).',
  },
  itl: {
    name: 'waybill_inter_token_latency_seconds',
    type: 'histogram',
    labels: ['model'],
    help: 'Gap between consecutive output-bearing events written to the client, one observation per gap (one event may carry several tokens).',
  },
  tpot: {
    name: 'waybill_time_per_output_token_seconds',
    type: 'histogram',
    labels: ['model'],
    help: 'Delivered streamed requests with at least 2 output tokens per choice: (last output event - first output event) / (completion tokens per choice - 1).',
  },
  duration: {
    name: 'waybill_request_duration_seconds',
    type: 'histogram',
    labels: ['model', 'route', 'outcome'],
    help: 'Logical requests: arrival to the end of the response to the client (or to the client leaving).',
  },
  slo: {
    name: 'waybill_slo_requests_total',
    type: 'counter',
    labels: ['model', 'prompt_len', 'result'],
    help: 'Logical requests by joint SLO result (TTFT and TPOT for streams, end-to-end for non-streams).',
  },
  promptTokens: {
    name: 'waybill_prompt_tokens_total',
    type: 'counter',
    labels: ['model'],
    help: 'Prompt tokens, from upstream usage.',
  },
  cachedPromptTokens: {
    name: 'waybill_cached_prompt_tokens_total',
    type: 'counter',
    labels: ['model'],
    help: 'Prompt tokens served from the prefix cache, from upstream usage (prompt_tokens_details.cached_tokens).',
  },
  completionTokens: {
    name: 'waybill_completion_tokens_total',
    type: 'counter',
    labels: ['model'],
    help: 'Completion tokens, from upstream usage.',
  },
  usageMissing: {
    name: 'waybill_usage_missing_total',
    type: 'counter',
    labels: ['model'],
    help: 'Delivered responses that carried no usage.',
  },
  inflight: {
    name: 'waybill_inflight_requests',
    type: 'gauge',
    labels: ['model'],
    help: 'Logical requests in progress.',
  },
  retries: {
    name: 'waybill_retries_total',
    type: 'counter',
    labels: ['model', 'reason'],
    help: 'Retries scheduled (before commit only), by what the failed attempt said.',
  },
  retryBudgetExhausted: {
    name: 'waybill_retry_budget_exhausted_total',
    type: 'counter',
    labels: ['model'],
    help: 'Retries refused because the retry budget was spent; the request failed with what its last attempt said.',
  },
  upstreamUp: {
    name: 'waybill_upstream_up',
    type: 'gauge',
    labels: ['upstream'],
    help: '1 when the upstream passes its health check and is not ejected, else 0.',
  },
  upstreamInflight: {
    name: 'waybill_upstream_inflight',
    type: 'gauge',
    labels: ['upstream'],
    help: 'Attempts in flight to the upstream.',
  },
  upstreamEjections: {
    name: 'waybill_upstream_ejections_total',
    type: 'counter',
    labels: ['upstream', 'reason'],
    help: 'Times passive health checking ejected the upstream.',
  },
  queueDepth: {
    name: 'waybill_queue_depth',
    type: 'gauge',
    labels: ['model'],
    help: 'Requests waiting in the model\'s admission queue.',
  },
  queueWait: {
    name: 'waybill_queue_wait_seconds',
    type: 'histogram',
    labels: ['model'],
    help: 'Requests that passed an admission gate: arrival at the gate to admission or rejection (0 when admitted at once).',
  },
} as const satisfies Record<string, MetricSpec>;

/** Live state read at scrape time, so gauges cost nothing per request. */
export interface GaugeSources {
  upstreams(): Iterable<{ name: string; up: boolean; inflight: number }>;
  queues(): Iterable<{ model: string; depth: number }>;
}

export const REQUEST_ATTEMPTS_BUCKETS = [1, 2, 3, 4, 5, 8];

export interface MetricBuckets {
  readonly queueWait: readonly number[];
  readonly ttft: readonly number[];
  readonly itl: readonly number[];
  readonly tpot: readonly number[];
  readonly duration: readonly number[];
}

type Labels<S extends MetricSpec> = S['labels'][number];

function counter<S extends MetricSpec>(registry: Registry, spec: S): Counter<Labels<S>> {
  return new Counter({ name: spec.name, help: spec.help, labelNames: spec.labels, registers: [registry] });
}

function histogram<S extends MetricSpec>(registry: Registry, spec: S, buckets: readonly number[]): Histogram<Labels<S>> {
  return new Histogram({ name: spec.name, help: spec.help, labelNames: spec.labels, buckets: [...buckets], registers: [registry] });
}

/** Waybill's metrics on their own registry (one per gateway instance), with prom-client's process metrics. */
export class GatewayMetrics {
  readonly registry = new Registry();
  private readonly requests = counter(this.registry, METRICS.requests);
  private readonly attempts = counter(this.registry, METRICS.attempts);
  private readonly requestAttempts = histogram(this.registry, METRICS.requestAttempts, REQUEST_ATTEMPTS_BUCKETS);
  private readonly anomalies = counter(this.registry, METRICS.anomalies);
  private readonly finishReasons = counter(this.registry, METRICS.finishReasons);
  private readonly cancellations = counter(this.registry, METRICS.cancellations);
  private readonly ttft: Histogram<'model' | 'prompt_len'>;
  private readonly itl: Histogram<'model'>;
  private readonly tpot: Histogram<'model'>;
  private readonly duration: Histogram<'model' | 'route' | 'outcome'>;
  private readonly slo = counter(this.registry, METRICS.slo);
  private readonly promptTokens = counter(this.registry, METRICS.promptTokens);
  private readonly cachedPromptTokens = counter(this.registry, METRICS.cachedPromptTokens);
  private readonly completionTokens = counter(this.registry, METRICS.completionTokens);
  private readonly usageMissing = counter(this.registry, METRICS.usageMissing);
  private readonly inflight = new Gauge({
    name: METRICS.inflight.name,
    help: METRICS.inflight.help,
    labelNames: METRICS.inflight.labels,
    registers: [this.registry],
  });
  private readonly retries = counter(this.registry, METRICS.retries);
  private readonly retryBudgetExhausted = counter(this.registry, METRICS.retryBudgetExhausted);
  private readonly upstreamEjections = counter(this.registry, METRICS.upstreamEjections);
  private readonly queueWait: Histogram<'model'>;
  private sources: GaugeSources | undefined;
  /** ITL is observed per event on the hot path: bind the label once per model instead of hashing it each time. */
  private readonly itlByModel = new Map<string, Histogram.Internal<'model'>>();

  constructor(buckets: MetricBuckets, options: { defaultMetrics?: boolean } = {}) {
    this.ttft = histogram(this.registry, METRICS.ttft, buckets.ttft);
    this.itl = histogram(this.registry, METRICS.itl, buckets.itl);
    this.tpot = histogram(this.registry, METRICS.tpot, buckets.tpot);
    this.duration = histogram(this.registry, METRICS.duration, buckets.duration);
    this.queueWait = histogram(this.registry, METRICS.queueWait, buckets.queueWait);
    const sources = () => this.sources;
    new Gauge({
      name: METRICS.upstreamUp.name,
      help: METRICS.upstreamUp.help,
      labelNames: METRICS.upstreamUp.labels,
      registers: [this.registry],
      collect() {
        for (const upstream of sources()?.upstreams() ?? []) this.set({ upstream: upstream.name }, upstream.up ? 1 : 0);
      },
    });
    new Gauge({
      name: METRICS.upstreamInflight.name,
      help: METRICS.upstreamInflight.help,
      labelNames: METRICS.upstreamInflight.labels,
      registers: [this.registry],
      collect() {
        for (const upstream of sources()?.upstreams() ?? []) this.set({ upstream: upstream.name }, upstream.inflight);
      },
    });
    new Gauge({
      name: METRICS.queueDepth.name,
      help: METRICS.queueDepth.help,
      labelNames: METRICS.queueDepth.labels,
      registers: [this.registry],
      collect() {
        for (const queue of sources()?.queues() ?? []) this.set({ model: queue.model }, queue.depth);
      },
    });
    if (options.defaultMetrics !== false) collectDefaultMetrics({ register: this.registry, eventLoopMonitoringPrecision: 10 });
  }

  /** Pre-creates zero-valued series for the served models so dashboards and `rate()` see them from the start. */
  declareModels(models: readonly string[]): void {
    for (const model of models) this.inflight.set({ model }, 0);
  }

  /** Where the scrape-time gauges read their values. */
  observe(sources: GaugeSources): void {
    this.sources = sources;
  }

  retryScheduled(model: string, reason: RetryReason): void {
    this.retries.inc({ model, reason });
  }

  retryBudgetSpent(model: string): void {
    this.retryBudgetExhausted.inc({ model });
  }

  upstreamEjected(upstream: string, reason: EjectionReason): void {
    this.upstreamEjections.inc({ upstream, reason });
  }

  queueWaited(model: string, ms: number): void {
    this.queueWait.observe({ model }, ms / 1000);
  }

  requestStarted(model: string): void {
    this.inflight.inc({ model });
  }

  interTokenGap(model: string, ms: number): void {
    let child = this.itlByModel.get(model);
    if (child === undefined) {
      child = this.itl.labels({ model });
      this.itlByModel.set(model, child);
    }
    child.observe(ms / 1000);
  }

  /** Records one settled logical request. `started` says whether requestStarted() was called for it. */
  record(s: Settlement, started: boolean): void {
    const model = s.model;
    if (started) this.inflight.dec({ model });
    this.requests.inc({ model, route: s.route, stream: String(s.stream), code: String(s.code), outcome: s.outcome });
    for (const attempt of s.attempts) {
      this.attempts.inc({ model, upstream: attempt.upstream, result: attempt.result ?? 'cancelled' });
    }
    if (s.attempts.length > 0) this.requestAttempts.observe({ model }, s.attempts.length);
    for (const anomaly of s.anomalies) this.anomalies.inc({ model, upstream: anomaly.upstream, kind: anomaly.kind });
    for (const reason of s.finishReasons) this.finishReasons.inc({ model, finish_reason: reason });
    if (s.cancelPhase !== undefined) this.cancellations.inc({ model, phase: s.cancelPhase });
    if (s.ttftMs !== undefined) this.ttft.observe({ model, prompt_len: s.promptLen }, s.ttftMs / 1000);
    if (s.tpotMs !== undefined) this.tpot.observe({ model }, s.tpotMs / 1000);
    this.duration.observe({ model, route: s.route, outcome: s.outcome }, s.durationMs / 1000);
    this.slo.inc({ model, prompt_len: s.promptLen, result: s.slo });
    const usage = s.usage;
    if (usage !== undefined) {
      if (usage.promptTokens !== undefined) this.promptTokens.inc({ model }, usage.promptTokens);
      if (usage.cachedTokens !== undefined) this.cachedPromptTokens.inc({ model }, usage.cachedTokens);
      if (usage.completionTokens !== undefined) this.completionTokens.inc({ model }, usage.completionTokens);
    } else if (s.outcome === 'delivered') {
      this.usageMissing.inc({ model });
    }
  }
}
