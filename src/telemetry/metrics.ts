/**
 * The recorder of the metrics contract (metric-table.ts, re-exported here): GatewayMetrics, one per gateway, turns
 * each settlement and each event of the shell into the declared series, and serves them as Prometheus text or
 * OpenMetrics.
 *
 * Longer than 400 lines on purpose: GatewayMetrics is one class whose fields are the table's series and whose
 * methods are their one way in; split, a series' field and its recording would live in different files.
 */
import { Gauge, Histogram, Registry, collectDefaultMetrics, type Metric } from 'prom-client';
import { EventHistogram, type EventObserver } from './event-histogram.js';
import { SharedCounter, SharedGauge, SharedHistogram, histogram, openMetricsRegistry, scrapeGauge, type Registries, type WorkerAggregator } from './metric-kinds.js';
import { METRICS } from './metric-table.js';
import type { Settlement } from '../accounting/ledger.js';
import {
  CONFIG_RELOAD_RESULTS,
  INTERNAL_ERROR_COMPONENTS,
  PICK_REASONS,
  SESSION_GAP_LABELS,
  type BackgroundHoldEnd,
  type ConfigReloadResult,
  type InternalErrorComponent,
  type LimitStoreOp,
  type PickReason,
  type RestartCause,
  type RouteShareResult,
} from './labels.js';
import { GAP_BUCKETS_SECONDS } from '../routing/sessions.js';
import { ANONYMOUS, GENERATION_ROUTES, LOOKUP, NO_REVISION, OUTPUT_CHECKS, UNKNOWN_REVISION, reportsUsage, type AttemptResult, type EjectionReason, type OwnRead, type ReadStopReason, type RetryReason } from '../accounting/outcomes.js';

export { METRICS } from './metric-table.js';

// The closed sets of label values live in labels.ts; these are read from here by tests and the gateway.
export { CONFIG_RELOAD_RESULTS, ENGINE_RESTART_CAUSES, EVALUATOR_TOKEN_KINDS, SESSION_GAP_LABELS } from './labels.js';

/** Live state read at scrape time, so gauges cost nothing per request. */
export interface GaugeSources {
  upstreams(): Iterable<{ name: string; up: boolean; inflight: number }>;
  /** Admission queues: depth and, read at the same scrape, the oldest waiter's wait (ms) and queued prompt tokens. */
  queues(): Iterable<{ model: string; depth: number; oldestWaitMs?: number; promptTokens?: number }>;
  /** Each upstream's engine signals: fresh or not, and the age of its last valid one (undefined: none yet). */
  engineSignals?(): Iterable<{ name: string; fresh: boolean; ageSeconds: number | undefined }>;
  /** Each upstream's pool and revision label. */
  revisions?(): Iterable<{ pool: string; upstream: string; revision: string }>;
  /** Each cache_aware pool's prefix-index entries. */
  routingIndexes?(): Iterable<{ pool: string; entries: number }>;
}

export const REQUEST_ATTEMPTS_BUCKETS = [1, 2, 3, 4, 5, 8];

/** The `upstream` of an SLO count whose request made no attempt (answered by the gateway itself); no upstream name has `_`. */
export const NO_UPSTREAM = '_none';

/** What the routing series are declared from: the served models and, for each, its pool's name and routing. */
export interface RoutedModels {
  models(): readonly string[];
  poolFor(model: string): { readonly config: { readonly name: string; readonly routing: { readonly policy: 'cache_aware' | 'least_request'; readonly sessionHeader?: string | undefined } } } | undefined;
}

/**
 * The reasons a pool's policy can give: least_request picks by load among two or more, or takes the single one;
 * cache_aware gives `session` only when the pool names sessions (a rendezvous placement without one reads `load`).
 */
export function pickReasonsOf(policy: 'cache_aware' | 'least_request', sessions: boolean): readonly PickReason[] {
  if (policy === 'least_request') return ['load', 'single'];
  return PICK_REASONS.filter((reason) => reason !== 'session' || sessions);
}

export interface MetricBuckets {
  readonly queueWait: readonly number[];
  readonly ttft: readonly number[];
  readonly itl: readonly number[];
  readonly tpot: readonly number[];
  readonly duration: readonly number[];
}

/**
 * Waybill's metrics, one set per gateway instance, with prom-client's process metrics. Served as Prometheus text, or
 * as OpenMetrics when the scraper asks for it: only OpenMetrics carries the trace-id exemplars of the requests
 * counter and the latency histograms, so a dashboard can jump from a slow bucket to a trace.
 */
export class GatewayMetrics {
  readonly registry = new Registry();
  readonly openMetrics = openMetricsRegistry();
  private readonly registries: Registries = { text: this.registry, open: this.openMetrics };
  private readonly requests = new SharedCounter(this.registries, METRICS.requests, true);
  private readonly attempts = new SharedCounter(this.registries, METRICS.attempts);
  private readonly requestAttempts = new SharedHistogram(this.registries, METRICS.requestAttempts, REQUEST_ATTEMPTS_BUCKETS);
  private readonly anomalies = new SharedCounter(this.registries, METRICS.anomalies);
  private readonly finishReasons = new SharedCounter(this.registries, METRICS.finishReasons);
  private readonly cancellations = new SharedCounter(this.registries, METRICS.cancellations);
  private readonly clientRetries = new SharedCounter(this.registries, METRICS.clientRetries);
  private readonly ttft: SharedHistogram<typeof METRICS.ttft>;
  private readonly itl: EventHistogram;
  private readonly tpot: SharedHistogram<typeof METRICS.tpot>;
  private readonly duration: SharedHistogram<typeof METRICS.duration>;
  private readonly slo = new SharedCounter(this.registries, METRICS.slo);
  private readonly promptTokens = new SharedCounter(this.registries, METRICS.promptTokens);
  private readonly cachedPromptTokens = new SharedCounter(this.registries, METRICS.cachedPromptTokens);
  private readonly completionTokens = new SharedCounter(this.registries, METRICS.completionTokens);
  private readonly usageMissing = new SharedCounter(this.registries, METRICS.usageMissing);
  private readonly estimatedCompletionTokens = new SharedCounter(this.registries, METRICS.estimatedCompletionTokens);
  private readonly inflight = new SharedGauge(this.registries, METRICS.inflight);
  private readonly retries = new SharedCounter(this.registries, METRICS.retries);
  private readonly workerLostRequests = new SharedCounter(this.registries, METRICS.workerLostRequests);
  private readonly retryBudgetExhausted = new SharedCounter(this.registries, METRICS.retryBudgetExhausted);
  private readonly upstreamEjections = new SharedCounter(this.registries, METRICS.upstreamEjections);
  private readonly internalErrors = new SharedCounter(this.registries, METRICS.internalErrors);
  private readonly turnYields = new SharedCounter(this.registries, METRICS.turnYields);
  private readonly logDrops = new SharedCounter(this.registries, METRICS.logLinesDropped);
  private readonly probeFailures = new SharedCounter(this.registries, METRICS.probeFailures);
  private readonly readsStopped = new SharedCounter(this.registries, METRICS.readsStopped);
  private readonly discoveredModelsRefused = new SharedCounter(this.registries, METRICS.discoveredModelsRefused);
  /** A served model's label value (proxy/model-labels.ts): its name, or `_other` past discovery.max_models_per_pool. */
  private modelLabel: (model: string) => string = (model) => model;
  /** An upstream's revision label (proxy/revision-labels.ts, through the configuration in force). */
  private revisionLabel: (upstream: string) => string = () => UNKNOWN_REVISION;
  private readonly outputChecks = new SharedCounter(this.registries, METRICS.outputChecks);
  private readonly accepted = new SharedCounter(this.registries, METRICS.accepted);
  private readonly evaluationSamples = new SharedCounter(this.registries, METRICS.evaluationSamples);
  private readonly requestsChecked = new SharedCounter(this.registries, METRICS.requestsChecked);
  private readonly cachedTokensMissing = new SharedCounter(this.registries, METRICS.cachedTokensMissing);
  private readonly evaluatorRequests = new SharedCounter(this.registries, METRICS.evaluatorRequests);
  private readonly evaluatorTokens = new SharedCounter(this.registries, METRICS.evaluatorTokens);
  private readonly evaluatorDuration: Histogram<'model'>;
  private readonly evaluationLastSampleGauge = new Gauge({
    name: METRICS.evaluationLastSample.name,
    help: METRICS.evaluationLastSample.help,
    labelNames: METRICS.evaluationLastSample.labels,
    // The newest sample of any worker is the last one the gateway emitted.
    aggregator: 'max' satisfies WorkerAggregator,
    registers: [this.registry, this.openMetrics],
  });
  private readonly rateLimitedRequests = new SharedCounter(this.registries, METRICS.rateLimited);
  private readonly limitStoreErrors = new SharedCounter(this.registries, METRICS.limitStoreErrors);
  private readonly backgroundHoldsGauge = new Gauge({
    name: METRICS.backgroundHolds.name,
    help: METRICS.backgroundHolds.help,
    labelNames: METRICS.backgroundHolds.labels,
    aggregator: 'sum' satisfies WorkerAggregator,
    registers: [this.registry, this.openMetrics],
  });
  private readonly backgroundHoldsEnded = new SharedCounter(this.registries, METRICS.backgroundHoldsEnded);
  private readonly limitStoreUpGauge = new Gauge({
    name: METRICS.limitStoreUp.name,
    help: METRICS.limitStoreUp.help,
    labelNames: METRICS.limitStoreUp.labels,
    aggregator: 'min' satisfies WorkerAggregator,
    registers: [this.registry, this.openMetrics],
  });
  private readonly configReloads = new SharedCounter(this.registries, METRICS.configReloads);
  private readonly configHashGauge = new Gauge({
    name: METRICS.configHash.name,
    help: METRICS.configHash.help,
    labelNames: METRICS.configHash.labels,
    // Every worker's hash shows (workers that disagree after a reload show two series).
    aggregator: 'max' satisfies WorkerAggregator,
    registers: [this.registry, this.openMetrics],
  });
  private readonly queueWait: Histogram<'model'>;
  private readonly upstreamFirstOutput: SharedHistogram<typeof METRICS.upstreamFirstOutput>;
  private readonly routingDecisions = new SharedCounter(this.registries, METRICS.routingDecisions);
  private readonly routingShared = new SharedCounter(this.registries, METRICS.routingShared);
  private readonly routingPromptTokens = new SharedCounter(this.registries, METRICS.routingPromptTokens);
  private readonly routingPredictedCachedTokens = new SharedCounter(this.registries, METRICS.routingPredictedCachedTokens);
  private readonly routingCachedTokens = new SharedCounter(this.registries, METRICS.routingCachedTokens);
  private readonly sessionIdleGap: Histogram<'model' | 'pool'>;
  private readonly sessionPromptTokens = new SharedCounter(this.registries, METRICS.sessionPromptTokens);
  private readonly sessionCachedTokens = new SharedCounter(this.registries, METRICS.sessionCachedTokens);
  private readonly engineScrapes = new SharedCounter(this.registries, METRICS.engineScrapes);
  private readonly engineRestarts = new SharedCounter(this.registries, METRICS.engineRestarts);
  private sources: GaugeSources | undefined;

  constructor(buckets: MetricBuckets, options: { defaultMetrics?: boolean; build?: { version: string; revision: string } } = {}) {
    const registries = this.registries;
    // At zero from the start, so an alert on any increase sees the first one.
    for (const component of INTERNAL_ERROR_COMPONENTS) this.internalErrors.inc({ component }, 0);
    for (const result of CONFIG_RELOAD_RESULTS) this.configReloads.inc({ result }, 0);
    this.turnYields.inc({}, 0);
    this.logDrops.inc({}, 0);
    // Counted by a workers' primary (app/primary.ts), never by the process itself: at zero, so the series exists.
    this.workerLostRequests.inc({}, 0);
    this.ttft = new SharedHistogram(registries, METRICS.ttft, buckets.ttft, true);
    // Observed per event, on the hot path: a histogram of its own (no label hashing, no exemplars).
    this.itl = new EventHistogram(METRICS.itl.name, METRICS.itl.help, buckets.itl);
    // prom-client serialises any object with its metric interface (name, help, type, get()).
    this.registry.registerMetric(this.itl as unknown as Metric);
    this.openMetrics.registerMetric(this.itl as unknown as Metric);
    this.tpot = new SharedHistogram(registries, METRICS.tpot, buckets.tpot, true);
    this.duration = new SharedHistogram(registries, METRICS.duration, buckets.duration, true);
    this.evaluatorDuration = histogram(registries, METRICS.evaluatorDuration, buckets.duration);
    this.queueWait = histogram(registries, METRICS.queueWait, buckets.queueWait);
    this.upstreamFirstOutput = new SharedHistogram(registries, METRICS.upstreamFirstOutput, buckets.ttft);
    this.sessionIdleGap = histogram(registries, METRICS.sessionIdleGap, GAP_BUCKETS_SECONDS);
    const build = options.build ?? { version: 'unknown', revision: 'unknown' };
    new Gauge({ name: METRICS.buildInfo.name, help: METRICS.buildInfo.help, labelNames: METRICS.buildInfo.labels, aggregator: 'first', registers: [registries.text, registries.open] }).set(
      { version: build.version, revision: build.revision },
      1,
    );
    scrapeGauge(
      registries,
      METRICS.upstreamUp,
      (gauge) => {
        for (const upstream of this.sources?.upstreams() ?? []) gauge.set({ upstream: upstream.name }, upstream.up ? 1 : 0);
      },
      'min',
    );
    scrapeGauge(registries, METRICS.upstreamInflight, (gauge) => {
      for (const upstream of this.sources?.upstreams() ?? []) gauge.set({ upstream: upstream.name }, upstream.inflight);
    });
    scrapeGauge(registries, METRICS.queueDepth, (gauge) => {
      for (const queue of this.sources?.queues() ?? []) gauge.set({ model: queue.model }, queue.depth);
    });
    // Leading signals of a queue that does not drain, read from the gates at scrape time (nothing per request). Workers
    // each hold their own queue: the oldest wait is the max of theirs, queued tokens add up.
    scrapeGauge(
      registries,
      METRICS.queueOldestWait,
      (gauge) => {
        for (const queue of this.sources?.queues() ?? []) gauge.set({ model: queue.model }, (queue.oldestWaitMs ?? 0) / 1000);
      },
      'max',
    );
    scrapeGauge(registries, METRICS.queuePromptTokens, (gauge) => {
      for (const queue of this.sources?.queues() ?? []) gauge.set({ model: queue.model }, queue.promptTokens ?? 0);
    });
    scrapeGauge(
      registries,
      METRICS.engineSignalsUp,
      (gauge) => {
        for (const upstream of this.sources?.engineSignals?.() ?? []) gauge.set({ upstream: upstream.name }, upstream.fresh ? 1 : 0);
      },
      'min',
    );
    scrapeGauge(
      registries,
      METRICS.engineSignalAge,
      (gauge) => {
        gauge.reset();
        for (const upstream of this.sources?.engineSignals?.() ?? []) {
          if (upstream.ageSeconds !== undefined) gauge.set({ upstream: upstream.name }, upstream.ageSeconds);
        }
      },
      'max',
    );
    scrapeGauge(
      registries,
      METRICS.routingIndexEntries,
      (gauge) => {
        gauge.reset();
        for (const { pool, entries } of this.sources?.routingIndexes?.() ?? []) gauge.set({ pool }, entries);
      },
      'sum',
    );
    scrapeGauge(
      registries,
      METRICS.upstreamRevision,
      (gauge) => {
        // Reset: a revision that changed leaves no series behind (a deploy marker is the old one ending).
        gauge.reset();
        for (const { pool, upstream, revision } of this.sources?.revisions?.() ?? []) gauge.set({ pool, upstream, revision }, 1);
      },
      'max',
    );
    if (options.defaultMetrics !== false) {
      // One set per registry: the event-loop lag gauges read a delay histogram and reset it at each scrape, so a
      // shared set would give one format's scrape an empty window after the other's.
      collectDefaultMetrics({ register: this.registry, eventLoopMonitoringPrecision: 10 });
      collectDefaultMetrics({ register: this.openMetrics, eventLoopMonitoringPrecision: 10 });
    }
  }

  /** The exposition for a scrape: OpenMetrics (with exemplars) when the scraper accepts it, else Prometheus text. */
  async scrape(accept: string | undefined): Promise<{ contentType: string; body: string }> {
    const registry = accept?.includes('application/openmetrics-text') === true ? this.openMetrics : this.registry;
    return { contentType: registry.contentType, body: await registry.metrics() };
  }

  /** Pre-creates zero-valued series for the served models so dashboards and `rate()` see them from the start. */
  declareModels(
    models: readonly string[],
    promptLenClasses: readonly string[],
    tenants: readonly string[] = [ANONYMOUS],
    upstreamsOf: (model: string) => readonly string[] = () => [],
  ): void {
    for (const model of models) {
      // A model without a label of its own is counted under _other, which is declared by its first request.
      if (this.modelLabel(model) !== model) continue;
      // Declared, never reset: a reload declares its models again while their requests are in flight, and a gauge
      // of work in flight set back to 0 would read below zero once they end.
      this.inflight.inc({ model }, 0);
      // The series the SLO rules divide by exist from the start: rate() then sees the first request, and an idle
      // gateway is not mistaken for an absent one. Per tenant that may be served (configured, or anonymous).
      for (const tenant of tenants) {
        for (const route of GENERATION_ROUTES) {
          for (const stream of ['true', 'false']) {
            this.requests.inc({ model, tenant, route, stream, code: '200', outcome: 'delivered' }, 0);
            this.accepted.inc({ model, tenant, route, stream }, 0);
            // The cohort's denominators exist from the start too (accepted alone suffices: both ratios sum verdicts).
            this.requestsChecked.inc({ model, tenant, route, stream, verdict: 'accepted' }, 0);
          }
        }
        // Per upstream of the model's pool, under the revision it has now, so the per-replica attainment sees each
        // replica's first request too. One whose revision is not read yet gets its series from the first request it
        // answers (a zero series under _unknown would stay for the process's life).
        for (const upstream of upstreamsOf(model)) {
          const revision = this.revisionLabel(upstream);
          if (revision === UNKNOWN_REVISION) continue;
          for (const promptLen of promptLenClasses) this.slo.inc({ model, tenant, prompt_len: promptLen, result: 'met', upstream, revision }, 0);
        }
      }
      for (const route of GENERATION_ROUTES) this.clientRetries.inc({ model, route }, 0);
    }
  }

  /**
   * Pre-creates zero-valued routing series for the served models (their own labels only, as declareModels): the
   * decisions for each reason the pool's policy can give, the prompt, predicted and actual cached token counters the
   * ratios divide, and — only for a pool with a session_header — the session series, per gap class.
   */
  declareRouting(routed: RoutedModels): void {
    for (const model of routed.models()) {
      if (this.modelLabel(model) !== model) continue;
      const pool = routed.poolFor(model)?.config;
      if (pool === undefined) continue;
      const { policy, sessionHeader } = pool.routing;
      const sessions = sessionHeader !== undefined;
      for (const reason of pickReasonsOf(policy, sessions)) this.routingDecisions.inc({ model, pool: pool.name, policy, reason }, 0);
      this.routingPromptTokens.inc({ model, pool: pool.name }, 0);
      this.routingPredictedCachedTokens.inc({ model, pool: pool.name }, 0);
      this.routingCachedTokens.inc({ model, pool: pool.name }, 0);
      // Sessions are measured only under cache_aware (a least_request pool's requests carry no routing key).
      if (sessions && policy === 'cache_aware') {
        this.sessionIdleGap.zero({ model, pool: pool.name });
        for (const gap of SESSION_GAP_LABELS) {
          this.sessionPromptTokens.inc({ model, pool: pool.name, gap }, 0);
          this.sessionCachedTokens.inc({ model, pool: pool.name, gap }, 0);
        }
      }
    }
  }

  /** Where the scrape-time gauges read their values. */
  observe(sources: GaugeSources): void {
    this.sources = sources;
  }

  /** How a served model's name becomes its label value (the upstream registry's ModelLabels, for the process's life). */
  labelModels(label: (model: string) => string): void {
    this.modelLabel = label;
  }

  /** How an upstream's name becomes the revision label of the requests it answered (the configuration in force). */
  labelRevisions(label: (upstream: string) => string): void {
    this.revisionLabel = label;
  }

  retryMade(model: string, reason: RetryReason): void {
    this.retries.inc({ model: this.modelLabel(model), reason });
  }

  retryBudgetSpent(model: string): void {
    this.retryBudgetExhausted.inc({ model: this.modelLabel(model) });
  }

  upstreamEjected(upstream: string, reason: EjectionReason): void {
    this.upstreamEjections.inc({ upstream, reason });
  }

  internalError(component: InternalErrorComponent): void {
    this.internalErrors.inc({ component });
  }

  /** An answering stream's read yielded the rest of the turn (proxy/read-turns.ts). */
  turnYielded(): void {
    this.turnYields.inc({});
  }

  /** JSON log lines stdout did not take (telemetry/log-destination.ts). */
  logLinesDropped(lines: number): void {
    this.logDrops.inc({}, lines);
  }

  probeFailed(upstream: string, probe: 'health' | 'discovery'): void {
    this.probeFailures.inc({ upstream, probe });
  }

  /** A body read from an upstream for the gateway's own use was stopped; `count` 0 declares the series. */
  readStopped(upstream: string, read: OwnRead, reason: ReadStopReason, count = 1): void {
    this.readsStopped.inc({ upstream, read, reason }, count);
  }

  /** `count` newly discovered names of `pool` got no label of their own; 0 declares the series. */
  discoveredModelsRefusedBy(pool: string, count: number): void {
    this.discoveredModelsRefused.inc({ pool }, count);
  }

  /** One evaluation sample emitted, at wall-clock `atMs` (Unix milliseconds): Waybill's own "last processed" time. */
  evaluationSampled(model: string, atMs?: number): void {
    const label = this.modelLabel(model);
    this.evaluationSamples.inc({ model: label });
    if (atMs !== undefined) this.evaluationLastSampleGauge.set({ model: label }, atMs / 1000);
  }

  /** One stored-response lookup GET to `upstream` (response-homes.ts), counted as an attempt of model `_lookup`. */
  lookupAttempt(upstream: string, result: AttemptResult): void {
    this.attempts.inc({ model: LOOKUP, upstream, result });
  }

  /** One upstream pick of `pool` (an attempt's), by its policy and reason. */
  routingDecision(model: string, pool: string, policy: string, reason: string): void {
    this.routingDecisions.inc({ model: this.modelLabel(model), pool, policy, reason });
  }

  /** A session request started `gapMs` after its session's previous completion. */
  sessionGap(model: string, pool: string, gapMs: number): void {
    this.sessionIdleGap.observe({ model: this.modelLabel(model), pool }, gapMs / 1000);
  }

  /** One scrape of an upstream's /metrics for engine signals; `count` 0 declares the series. */
  engineScraped(upstream: string, result: string, count = 1): void {
    this.engineScrapes.inc({ upstream, result }, count);
  }

  /** A message of route records shared through Redis (route_sharing); `count` 0 declares the series. */
  routeShared(result: RouteShareResult, count = 1): void {
    this.routingShared.inc({ result }, count);
  }

  /** An engine restart seen in the upstream's signals; `count` 0 declares the series. */
  engineRestarted(upstream: string, cause: RestartCause, count = 1): void {
    this.engineRestarts.inc({ upstream, cause }, count);
  }

  /** A request refused for its tenant's `limit`; `count` 0 declares the series (at start-up, for each limit configured). */
  rateLimited(tenant: string, limit: 'requests' | 'tokens' | 'concurrent', count = 1): void {
    this.rateLimitedRequests.inc({ tenant, limit }, count);
  }

  /** A failed operation on the shared limit store; `count` 0 declares the series (at start-up, with limits.redis_url). */
  limitStoreError(op: LimitStoreOp, count = 1): void {
    this.limitStoreErrors.inc({ op }, count);
  }

  /** Background responses holding their limits now (proxy/background-holds.ts). */
  backgroundHolding(count: number): void {
    this.backgroundHoldsGauge.set(count);
  }

  /** A background response's hold ended `how`; `count` 0 declares the series. */
  backgroundHoldEnded(how: BackgroundHoldEnd, count = 1): void {
    this.backgroundHoldsEnded.inc({ how }, count);
  }

  /** The shared limit store answers again (true) or stopped answering (false). */
  limitStoreUp(store: 'redis', up: boolean): void {
    this.limitStoreUpGauge.set({ store }, up ? 1 : 0);
  }

  /** A configuration reload ended with `result`. */
  configReloaded(result: ConfigReloadResult): void {
    this.configReloads.inc({ result });
  }

  /** The configuration in force: its hash is the one series of waybill_config_hash. */
  configInForce(hash: string): void {
    this.configHashGauge.reset();
    this.configHashGauge.set({ hash }, 1);
  }

  queueWaited(model: string, ms: number): void {
    this.queueWait.observe({ model: this.modelLabel(model) }, ms / 1000);
  }

  /**
   * A request started: counted in flight under its model's label now, which it returns. Pass it to record() at
   * settlement, so the decrement is of the same series even if the label changed meanwhile (a name admitted since by
   * another pool's discovery, or by a reload).
   */
  requestStarted(model: string): string {
    const label = this.modelLabel(model);
    this.inflight.inc({ model: label });
    return label;
  }

  /** The inter-token-latency observer for a model's requests: take it once per request, observe per event. */
  interTokenLatency(model: string): EventObserver {
    return this.itl.for(this.modelLabel(model));
  }


  /**
   * Records one settled logical request. `inflightLabel` is what requestStarted() returned for it (undefined: it was
   * never counted in flight); `traceId`, when the request was traced, becomes the exemplar of its observations.
   */
  record(s: Settlement, inflightLabel: string | undefined, traceId?: string): void {
    const model = this.modelLabel(s.model);
    const exemplar = traceId === undefined ? undefined : { trace_id: traceId };
    if (inflightLabel !== undefined) this.inflight.dec({ model: inflightLabel });
    const tenant = s.tenant;
    this.requests.inc({ model, tenant, route: s.route, stream: String(s.stream), code: String(s.code), outcome: s.outcome }, 1, exemplar);
    if (s.clientRetry !== undefined && s.clientRetry > 0) this.clientRetries.inc({ model, route: s.route });
    for (const attempt of s.attempts) {
      this.attempts.inc({ model, upstream: attempt.upstream, result: attempt.result ?? 'cancelled' });
      // Per upstream, so one slow or overloaded replica stands out of the pool's TTFT.
      if (s.stream && attempt.firstOutputAt !== undefined) {
        this.upstreamFirstOutput.observe({ model, upstream: attempt.upstream, prompt_len: s.promptLen }, (attempt.firstOutputAt - attempt.startedAt) / 1000);
      }
    }
    if (s.attempts.length > 0) this.requestAttempts.observe({ model }, s.attempts.length);
    for (const anomaly of s.anomalies) this.anomalies.inc({ model, upstream: anomaly.upstream, kind: anomaly.kind });
    // The revision of the attempt that answered: the committed one (the last: none follows a commit), else the last
    // tried, whose failure the client was told; `_none` when no attempt was made.
    const answering = s.attempts.at(-1);
    const revision = answering === undefined ? NO_REVISION : this.revisionLabel(answering.upstream);
    // Users' answers only: a judge's short max_tokens would read as truncation (the finish-reason and revision alerts).
    if (!s.evaluator) for (const reason of s.finishReasons) this.finishReasons.inc({ model, finish_reason: reason, revision });
    if (s.cancelPhase !== undefined) this.cancellations.inc({ model, tenant, phase: s.cancelPhase });
    if (s.ttftMs !== undefined) this.ttft.observe({ model, prompt_len: s.promptLen }, s.ttftMs / 1000, exemplar);
    if (s.tpotMs !== undefined) this.tpot.observe({ model, revision }, s.tpotMs / 1000, exemplar);
    this.duration.observe({ model, route: s.route, outcome: s.outcome }, s.durationMs / 1000, exemplar);
    // The replica that answered, or the one the last try failed on: a slow replica's misses show under its name.
    this.slo.inc({ model, tenant, prompt_len: s.promptLen, result: s.slo, upstream: s.attempts.at(-1)?.upstream ?? NO_UPSTREAM, revision });
    if (s.evaluator) {
      // Evaluator traffic is counted apart: its answers are not users' (seed 000 §7.2), so the accepted, output-check
      // and cohort counters never see it, and its own calls, outcomes, tokens and latency are here.
      this.evaluatorRequests.inc({ model, tenant, outcome: s.outcome });
      this.evaluatorDuration.observe({ model }, s.durationMs / 1000);
      if (s.usage?.promptTokens !== undefined) this.evaluatorTokens.inc({ model, kind: 'prompt' }, s.usage.promptTokens);
      if (s.usage?.completionTokens !== undefined) this.evaluatorTokens.inc({ model, kind: 'completion' }, s.usage.completionTokens);
    } else {
      for (const choice of s.checks) for (const check of OUTPUT_CHECKS) this.outputChecks.inc({ model, check, result: choice[check], revision });
      if (s.accepted) this.accepted.inc({ model, tenant, route: s.route, stream: String(s.stream) });
      if (s.verdict !== undefined) this.requestsChecked.inc({ model, tenant, route: s.route, stream: String(s.stream), verdict: s.verdict });
    }
    const usage = s.usage;
    if (usage !== undefined) {
      if (usage.promptTokens !== undefined) this.promptTokens.inc({ model, tenant }, usage.promptTokens);
      // vLLM omits prompt_tokens_details when cached tokens are 0 (with --enable-prompt-tokens-details) and always
      // (without it): absent is 0 only where the pool declares its upstreams report them, else unknown and counted so.
      const cached = usage.cachedTokens ?? (s.routing?.usageReportsCachedTokens === true && usage.promptTokens !== undefined ? 0 : undefined);
      if (cached !== undefined) this.cachedPromptTokens.inc({ model, tenant }, cached);
      else if (usage.promptTokens !== undefined && s.outcome === 'delivered') this.cachedTokensMissing.inc({ model, tenant });
      if (usage.completionTokens !== undefined) this.completionTokens.inc({ model, tenant }, usage.completionTokens);
    } else if (s.outcome === 'delivered' && reportsUsage(s.route) && !(s.route === 'responses' && s.finishReasons.length === 0)) {
      // (A background request's acknowledgement — Responses without a choice — has no usage yet: not missing.)
      this.usageMissing.inc({ model, tenant });
    }
    if (s.estimatedCompletionTokens !== undefined) this.estimatedCompletionTokens.inc({ model, tenant }, s.estimatedCompletionTokens);
    if (s.routing !== undefined) this.recordRouting(model, s.routing, s.usage);
  }

  /**
   * Was the guess right: the prediction and what vLLM said it cached, over the requests whose cached tokens are known —
   * usage carried them, or the pool declares its upstreams report them (then absent is 0: vLLM omits a 0).
   */
  private recordRouting(model: string, routing: NonNullable<Settlement['routing']>, usage: Settlement['usage']): void {
    const prompt = usage?.promptTokens;
    if (prompt === undefined) return;
    const cached = usage?.cachedTokens ?? (routing.usageReportsCachedTokens ? 0 : undefined);
    if (cached === undefined) return;
    const { pool } = routing;
    this.routingPromptTokens.inc({ model, pool }, prompt);
    // A prediction never exceeds the prompt (a block rounding past a short prompt's end), so the two ratios compare.
    this.routingPredictedCachedTokens.inc({ model, pool }, Math.min(routing.predictedCachedTokens, prompt));
    this.routingCachedTokens.inc({ model, pool }, cached);
    const gap = routing.sessionGap;
    if (gap !== undefined) {
      this.sessionPromptTokens.inc({ model, pool, gap: gap.gapClass }, prompt);
      this.sessionCachedTokens.inc({ model, pool, gap: gap.gapClass }, cached);
    }
  }
}
