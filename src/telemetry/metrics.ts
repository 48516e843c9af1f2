/**
 * The metrics contract: every metric Waybill exports, with its labels and, for each histogram, where its clock
 * starts and stops. Names and label sets are a contract with users' dashboards and alerts; docs/metrics.md says
 * the same and test/metrics-contract.test.ts holds the two together.
 */
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics, type Metric, type OpenMetricsContentType } from 'prom-client';
import { EventHistogram, type EventObserver } from './event-histogram.js';
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
    labels: ['model', 'tenant', 'route', 'stream', 'code', 'outcome'],
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
    labels: ['model', 'finish_reason', 'revision'],
    help: 'Choices of committed responses, by finish_reason (none: the choice never got one).',
  },
  cancellations: {
    name: 'waybill_client_cancellations_total',
    type: 'counter',
    labels: ['model', 'tenant', 'phase'],
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
    labels: ['model', 'revision'],
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
    labels: ['model', 'tenant', 'prompt_len', 'result', 'upstream', 'revision'],
    help: 'Logical requests by joint SLO result (TTFT and TPOT for streams, end-to-end for non-streams), by the upstream of their last attempt (_none: no attempt) and its revision.',
  },
  promptTokens: {
    name: 'waybill_prompt_tokens_total',
    type: 'counter',
    labels: ['model', 'tenant'],
    help: 'Prompt tokens, from upstream usage.',
  },
  cachedPromptTokens: {
    name: 'waybill_cached_prompt_tokens_total',
    type: 'counter',
    labels: ['model', 'tenant'],
    help: 'Prompt tokens served from the prefix cache, from upstream usage (prompt_tokens_details.cached_tokens).',
  },
  completionTokens: {
    name: 'waybill_completion_tokens_total',
    type: 'counter',
    labels: ['model', 'tenant'],
    help: 'Completion tokens, from upstream usage.',
  },
  estimatedCompletionTokens: {
    name: 'waybill_estimated_completion_tokens_total',
    type: 'counter',
    labels: ['model', 'tenant'],
    help: 'Completion tokens of requests whose upstream reported none, estimated from the output relayed (metrics.chars_per_token).',
  },
  usageMissing: {
    name: 'waybill_usage_missing_total',
    type: 'counter',
    labels: ['model', 'tenant'],
    help: 'Delivered responses that carried no usage.',
  },
  workerLostRequests: {
    name: 'waybill_worker_lost_requests_total',
    type: 'counter',
    labels: [],
    help: 'Requests in flight on a worker process that died (server.workers), counted by the primary; each also in waybill_requests_total with outcome incomplete.',
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
    help: 'Retry attempts made (before commit only), by what the failed attempt said.',
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
  queueOldestWait: {
    name: 'waybill_queue_oldest_wait_seconds',
    type: 'gauge',
    labels: ['model'],
    help: 'How long the oldest request waiting in the model\'s admission queue has waited so far (0 when none waits).',
  },
  queuePromptTokens: {
    name: 'waybill_queue_prompt_tokens',
    type: 'gauge',
    labels: ['model'],
    help: 'Prompt tokens of the requests waiting in the model\'s admission queue, as estimated before dispatch (metrics.chars_per_token).',
  },
  upstreamFirstOutput: {
    name: 'waybill_upstream_first_output_seconds',
    type: 'histogram',
    labels: ['model', 'upstream', 'prompt_len'],
    help: 'Streamed attempts that produced output: attempt sent to its first output-bearing event, per upstream and prompt-length class.',
  },
  buildInfo: {
    name: 'waybill_build_info',
    type: 'gauge',
    labels: ['version', 'revision'],
    help: 'Always 1: the running version (package.json) and source revision (WAYBILL_REVISION, else unknown).',
  },
  internalErrors: {
    name: 'waybill_internal_errors_total',
    type: 'counter',
    labels: ['component'],
    help: 'Errors inside Waybill that were caught so the request could still be answered and counted, by component.',
  },
  turnYields: {
    name: 'waybill_turn_yields_total',
    type: 'counter',
    labels: [],
    help: 'Reads of answering streams that ended past their event-loop turn\'s budget (streaming.turn_budget) and paused their upstream until a later turn; steady growth: the process is behind.',
  },
  probeFailures: {
    name: 'waybill_upstream_probe_failures_total',
    type: 'counter',
    labels: ['upstream', 'probe'],
    help: 'Failed active health checks (probe="health") and model discoveries (probe="discovery") per upstream.',
  },
  readsStopped: {
    name: 'waybill_upstream_reads_stopped_total',
    type: 'counter',
    labels: ['upstream', 'read', 'reason'],
    help: 'Bodies Waybill reads from an upstream for itself (read: health, discovery, lookup, background, signals) that it stopped reading, the request aborted: over health.max_body_bytes (reason="too_large") or past their deadline (reason="deadline").',
  },
  discoveredModelsRefused: {
    name: 'waybill_discovered_models_refused_total',
    type: 'counter',
    labels: ['pool'],
    help: 'Newly discovered model names that got no model label of their own because the pool already has discovery.max_models_per_pool: served, but counted under model="_other".',
  },
  outputChecks: {
    name: 'waybill_output_checks_total',
    type: 'counter',
    labels: ['model', 'check', 'result', 'revision'],
    help: 'Output-contract checks of the choices of delivered responses (answer_present, not_truncated, format_valid), by result (pass, fail, unevaluated).',
  },
  accepted: {
    name: 'waybill_requests_accepted_total',
    type: 'counter',
    labels: ['model', 'tenant', 'route', 'stream'],
    help: 'Logical requests delivered with every applicable output check passed: a subset of waybill_requests_total{outcome="delivered"}.',
  },
  clientRetries: {
    name: 'waybill_client_retries_total',
    type: 'counter',
    labels: ['model', 'route'],
    help: 'Logical requests that were a client SDK\'s retry (x-stainless-retry-count of 1 or more): user calls are waybill_requests_total minus these.',
  },
  evaluationSamples: {
    name: 'waybill_evaluation_samples_total',
    type: 'counter',
    labels: ['model'],
    help: 'Delivered responses sampled for external evaluation (evaluation.sample_rate).',
  },
  rateLimited: {
    name: 'waybill_rate_limited_total',
    type: 'counter',
    labels: ['tenant', 'limit'],
    help: 'Requests refused with 429 rate_limited because their tenant was over a limit (requests, tokens, concurrent): the first limit the request would have passed.',
  },
  limitStoreErrors: {
    name: 'waybill_limit_store_errors_total',
    type: 'counter',
    labels: ['op'],
    help: 'Operations on the shared store of the limits per tenant (limits.redis_url) that failed or missed limits.redis_timeout, by op (reserve, settle, release).',
  },
  backgroundHolds: {
    name: 'waybill_background_holds',
    type: 'gauge',
    labels: [],
    help: 'Background responses of limited tenants holding their slot and reservation until they end (limits.background_*).',
  },
  backgroundHoldsEnded: {
    name: 'waybill_background_holds_ended_total',
    type: 'counter',
    labels: ['how'],
    help: 'Background responses whose hold on their limits ended, by how: ended (seen completed, failed, incomplete or cancelled), lost (its home no longer has it), deadline (limits.background_max_hold), overflow (limits.background_max_watched), shutdown.',
  },
  limitStoreUp: {
    name: 'waybill_limit_store_up',
    type: 'gauge',
    labels: ['store'],
    help: 'Whether the shared store of the limits per tenant answers (1) or not (0, the failure rule limits.redis_fail_open applies); only with limits.redis_url.',
  },
  configReloads: {
    name: 'waybill_config_reloads_total',
    type: 'counter',
    labels: ['result'],
    help: 'Configuration reloads (SIGHUP), by result: ok (applied), invalid (rejected, the old configuration kept), restart_required (a key that only a restart applies changed; nothing applied).',
  },
  configHash: {
    name: 'waybill_config_hash',
    type: 'gauge',
    labels: ['hash'],
    help: 'The configuration in force: always 1, labelled with the first 12 hex digits of the SHA-256 of its canonical JSON.',
  },
  routingDecisions: {
    name: 'waybill_routing_decisions_total',
    type: 'counter',
    labels: ['model', 'pool', 'policy', 'reason'],
    help: 'Upstream picks (one per attempt), by the pool\'s policy and why the upstream was chosen: prefix, load, bounded_load, stale_signals, session or single.',
  },
  routingPromptTokens: {
    name: 'waybill_routing_prompt_tokens_total',
    type: 'counter',
    labels: ['model', 'pool'],
    help: 'Prompt tokens of the requests whose cached tokens are known (usage reported them, or the pool declares its upstreams do): the denominator of the predicted and actual cached ratios.',
  },
  routingPredictedCachedTokens: {
    name: 'waybill_routing_predicted_cached_tokens_total',
    type: 'counter',
    labels: ['model', 'pool'],
    help: 'Prompt tokens the picker predicted the chosen upstream held in its prefix cache, over the same requests.',
  },
  routingCachedTokens: {
    name: 'waybill_routing_cached_tokens_total',
    type: 'counter',
    labels: ['model', 'pool'],
    help: 'Prompt tokens the upstream said it found cached (usage cached_tokens), over the same requests: compare with the prediction.',
  },
  sessionIdleGap: {
    name: 'waybill_routing_session_idle_gap_seconds',
    type: 'histogram',
    labels: ['model', 'pool'],
    help: 'Requests with a session (pools[].routing.session_header) after an earlier one: the session\'s previous completion to this request\'s start.',
  },
  sessionPromptTokens: {
    name: 'waybill_routing_session_prompt_tokens_total',
    type: 'counter',
    labels: ['model', 'pool', 'gap'],
    help: 'Prompt tokens of session requests whose cached tokens are known, by idle-gap class (first: no earlier completion in the session).',
  },
  sessionCachedTokens: {
    name: 'waybill_routing_session_cached_tokens_total',
    type: 'counter',
    labels: ['model', 'pool', 'gap'],
    help: 'Cached prompt tokens (usage cached_tokens) of the same requests, by idle-gap class: effective KV residency.',
  },
  engineSignalsUp: {
    name: 'waybill_upstream_engine_signals_up',
    type: 'gauge',
    labels: ['upstream'],
    help: '1 while the upstream\'s engine signals (its /metrics: queue, KV use) are fresh; 0 when stale or never read, and picking then falls back to the gateway\'s own in-flight count for it.',
  },
  engineSignalAge: {
    name: 'waybill_upstream_engine_signal_age_seconds',
    type: 'gauge',
    labels: ['upstream'],
    help: 'Age of the upstream\'s last valid engine signals; absent before the first.',
  },
  engineScrapes: {
    name: 'waybill_upstream_engine_scrapes_total',
    type: 'counter',
    labels: ['upstream', 'result'],
    help: 'Scrapes of the upstream\'s /metrics for engine signals, by result: ok, or why the signals were not taken (missing, invalid, malformed, too_large, http_status, deadline, unreachable, busy).',
  },
  engineRestarts: {
    name: 'waybill_upstream_engine_restarts_total',
    type: 'counter',
    labels: ['upstream', 'cause'],
    help: 'Engine restarts seen in the upstream\'s signals (start_time: process_start_time_seconds changed; counter_reset: its prefix-cache counters went down); its prefix index entries are dropped.',
  },
  routingShared: {
    name: 'waybill_routing_shared_messages_total',
    type: 'counter',
    labels: ['result'],
    help: 'Messages of route records shared with other replicas through Redis (route_sharing), by result: sent, send_failed (Redis away: dropped, the local index serves alone), received (from another replica), invalid (dropped whole).',
  },
  routingIndexEntries: {
    name: 'waybill_routing_index_entries',
    type: 'gauge',
    labels: ['pool'],
    help: 'Entries (prefix block, upstream) in each cache_aware pool\'s prefix index, read at scrape; with workers, summed over them (each holds its own copy, kept in step through the primary).',
  },
  upstreamRevision: {
    name: 'waybill_upstream_revision_info',
    type: 'gauge',
    labels: ['pool', 'upstream', 'revision'],
    help: 'Always 1: the revision label of each configured upstream\'s requests (pools[].upstreams[].revision, else its GET /version; _unknown before one is read, _other past discovery.max_revisions_per_pool). A change is a deploy marker.',
  },
  queueWait: {
    name: 'waybill_queue_wait_seconds',
    type: 'histogram',
    labels: ['model'],
    help: 'Requests that passed an admission gate: arrival at the gate to admission or rejection (0 when admitted at once).',
  },
  requestsChecked: {
    name: 'waybill_requests_checked_total',
    type: 'counter',
    labels: ['model', 'tenant', 'route', 'stream', 'verdict'],
    help: 'Delivered users\' requests with at least one checked choice (evaluator traffic apart), by the evaluation cohort\'s verdict: accepted or not_accepted when every applicable output check was evaluated, unevaluated when one could not be.',
  },
  cachedTokensMissing: {
    name: 'waybill_cached_tokens_missing_total',
    type: 'counter',
    labels: ['model', 'tenant'],
    help: 'Delivered responses whose usage reported prompt tokens but no cached tokens, from a pool that does not declare its upstreams report them (pools[].routing.usage_reports_cached_tokens): cache hits unknown, not 0.',
  },
  evaluatorRequests: {
    name: 'waybill_evaluator_requests_total',
    type: 'counter',
    labels: ['model', 'tenant', 'outcome'],
    help: 'Logical requests carrying the evaluator header (evaluation.evaluator_header), by delivery outcome; each also in waybill_requests_total, none in the accepted, output-check or evaluation-sample counters.',
  },
  evaluatorTokens: {
    name: 'waybill_evaluator_tokens_total',
    type: 'counter',
    labels: ['model', 'kind'],
    help: 'Tokens of evaluator requests from upstream usage, by kind (prompt, completion); also in the token counters per tenant.',
  },
  evaluatorDuration: {
    name: 'waybill_evaluator_request_duration_seconds',
    type: 'histogram',
    labels: ['model'],
    help: 'Evaluator requests: arrival to the end of the response to the evaluator (or to it leaving), as waybill_request_duration_seconds.',
  },
  evaluationLastSample: {
    name: 'waybill_evaluation_last_sample_timestamp_seconds',
    type: 'gauge',
    labels: ['model'],
    help: 'Wall-clock time (Unix seconds) of the last evaluation sample this process emitted for the model; absent before the first.',
  },
} as const satisfies Record<string, MetricSpec>;

// The closed sets of label values live in labels.ts; these are read from here by tests and the gateway.
export { CONFIG_RELOAD_RESULTS, ENGINE_RESTART_CAUSES, EVALUATOR_TOKEN_KINDS, SESSION_GAP_LABELS, type ConfigReloadResult } from './labels.js';

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

type Labels<S extends MetricSpec> = S['labels'][number];
type LabelSet<S extends MetricSpec> = Partial<Record<Labels<S>, string>>;

/**
 * A counter in both expositions. prom-client names a counter differently by the registry it is created in (an
 * OpenMetrics counter drops `_total` from its family name, and prints it only on samples), so one object cannot
 * serve both formats: each registry gets its own, and every increment goes to both (two hash lookups, per request,
 * not per event).
 */
class CounterPair<S extends MetricSpec> {
  private readonly text: Counter<Labels<S>>;
  private readonly open: Counter<Labels<S>>;

  constructor(
    registries: Registries,
    spec: S,
    private readonly exemplars = false,
  ) {
    const config = { name: spec.name, help: spec.help, labelNames: spec.labels };
    this.text = new Counter({ ...config, registers: [registries.text] });
    this.open = new Counter({ ...config, registers: [registries.open], enableExemplars: exemplars });
  }

  inc(labels: LabelSet<S>, value = 1, exemplarLabels?: Record<string, string>): void {
    this.text.inc(labels, value);
    if (!this.exemplars) this.open.inc(labels, value);
    // Without a trace, no exemplar label set at all: prom-client's counter skips only its own default empty set,
    // and would record any other `{}` as an exemplar, replacing a real one. prom-client types exemplar labels as
    // the metric's own label names; trace_id is not one of them.
    else if (exemplarLabels === undefined) this.open.inc({ labels, value });
    else this.open.inc({ labels, value, exemplarLabels: exemplarLabels as LabelSet<S> });
  }
}

interface Registries {
  readonly text: Registry;
  readonly open: Registry<OpenMetricsContentType>;
}

/**
 * A histogram or gauge is one object in both registries (their names do not change between formats). One with
 * exemplars must be created in the OpenMetrics registry (prom-client refuses it in a Prometheus one) and is then
 * added to the Prometheus registry, whose text simply leaves the exemplars out.
 */
function histogram<S extends MetricSpec>(registries: Registries, spec: S, buckets: readonly number[], enableExemplars = false): Histogram<Labels<S>> {
  const metric = new Histogram({
    name: spec.name,
    help: spec.help,
    labelNames: spec.labels,
    buckets: [...buckets],
    registers: [registries.open],
    enableExemplars,
  });
  registries.text.registerMetric(metric);
  return metric;
}

/**
 * How a gauge's values from several worker processes combine into the one /metrics (app/metrics-collector.ts; counters and
 * histograms add up): `sum` for what each worker holds a part of (requests in flight), `min` for a state every
 * worker must see (an upstream up, the limit store reachable), `first`/`max` for what is the same everywhere.
 */
type WorkerAggregator = 'sum' | 'min' | 'max' | 'first';

function scrapeGauge<S extends MetricSpec>(registries: Registries, spec: S, collect: (gauge: Gauge<Labels<S>>) => void, aggregator: WorkerAggregator = 'sum'): Gauge<Labels<S>> {
  return new Gauge({
    name: spec.name,
    help: spec.help,
    labelNames: spec.labels,
    aggregator,
    registers: [registries.text, registries.open],
    collect() {
      collect(this);
    },
  });
}

function openMetricsRegistry(): Registry<OpenMetricsContentType> {
  const registry = new Registry<OpenMetricsContentType>();
  registry.setContentType(Registry.OPENMETRICS_CONTENT_TYPE);
  return registry;
}

/** No exemplar, for histograms: prom-client's histogram skips any empty label set (its counter does not). */
const NO_EXEMPLAR = {};

/**
 * Waybill's metrics, one set per gateway instance, with prom-client's process metrics. Served as Prometheus text, or
 * as OpenMetrics when the scraper asks for it: only OpenMetrics carries the trace-id exemplars of the requests
 * counter and the latency histograms, so a dashboard can jump from a slow bucket to a trace.
 */
export class GatewayMetrics {
  readonly registry = new Registry();
  readonly openMetrics = openMetricsRegistry();
  private readonly registries: Registries = { text: this.registry, open: this.openMetrics };
  private readonly requests = new CounterPair(this.registries, METRICS.requests, true);
  private readonly attempts = new CounterPair(this.registries, METRICS.attempts);
  private readonly requestAttempts = histogram(this.registries, METRICS.requestAttempts, REQUEST_ATTEMPTS_BUCKETS);
  private readonly anomalies = new CounterPair(this.registries, METRICS.anomalies);
  private readonly finishReasons = new CounterPair(this.registries, METRICS.finishReasons);
  private readonly cancellations = new CounterPair(this.registries, METRICS.cancellations);
  private readonly clientRetries = new CounterPair(this.registries, METRICS.clientRetries);
  private readonly ttft: Histogram<'model' | 'prompt_len'>;
  private readonly itl: EventHistogram;
  private readonly tpot: Histogram<'model' | 'revision'>;
  private readonly duration: Histogram<'model' | 'route' | 'outcome'>;
  private readonly slo = new CounterPair(this.registries, METRICS.slo);
  private readonly promptTokens = new CounterPair(this.registries, METRICS.promptTokens);
  private readonly cachedPromptTokens = new CounterPair(this.registries, METRICS.cachedPromptTokens);
  private readonly completionTokens = new CounterPair(this.registries, METRICS.completionTokens);
  private readonly usageMissing = new CounterPair(this.registries, METRICS.usageMissing);
  private readonly estimatedCompletionTokens = new CounterPair(this.registries, METRICS.estimatedCompletionTokens);
  private readonly inflight = new Gauge({
    name: METRICS.inflight.name,
    help: METRICS.inflight.help,
    labelNames: METRICS.inflight.labels,
    registers: [this.registry, this.openMetrics],
  });
  private readonly retries = new CounterPair(this.registries, METRICS.retries);
  private readonly workerLostRequests = new CounterPair(this.registries, METRICS.workerLostRequests);
  private readonly retryBudgetExhausted = new CounterPair(this.registries, METRICS.retryBudgetExhausted);
  private readonly upstreamEjections = new CounterPair(this.registries, METRICS.upstreamEjections);
  private readonly internalErrors = new CounterPair(this.registries, METRICS.internalErrors);
  private readonly turnYields = new CounterPair(this.registries, METRICS.turnYields);
  private readonly probeFailures = new CounterPair(this.registries, METRICS.probeFailures);
  private readonly readsStopped = new CounterPair(this.registries, METRICS.readsStopped);
  private readonly discoveredModelsRefused = new CounterPair(this.registries, METRICS.discoveredModelsRefused);
  /** A served model's label value (proxy/model-labels.ts): its name, or `_other` past discovery.max_models_per_pool. */
  private modelLabel: (model: string) => string = (model) => model;
  /** An upstream's revision label (proxy/revision-labels.ts, through the configuration in force). */
  private revisionLabel: (upstream: string) => string = () => UNKNOWN_REVISION;
  private readonly outputChecks = new CounterPair(this.registries, METRICS.outputChecks);
  private readonly accepted = new CounterPair(this.registries, METRICS.accepted);
  private readonly evaluationSamples = new CounterPair(this.registries, METRICS.evaluationSamples);
  private readonly requestsChecked = new CounterPair(this.registries, METRICS.requestsChecked);
  private readonly cachedTokensMissing = new CounterPair(this.registries, METRICS.cachedTokensMissing);
  private readonly evaluatorRequests = new CounterPair(this.registries, METRICS.evaluatorRequests);
  private readonly evaluatorTokens = new CounterPair(this.registries, METRICS.evaluatorTokens);
  private readonly evaluatorDuration: Histogram<'model'>;
  private readonly evaluationLastSampleGauge = new Gauge({
    name: METRICS.evaluationLastSample.name,
    help: METRICS.evaluationLastSample.help,
    labelNames: METRICS.evaluationLastSample.labels,
    // The newest sample of any worker is the last one the gateway emitted.
    aggregator: 'max' satisfies WorkerAggregator,
    registers: [this.registry, this.openMetrics],
  });
  private readonly rateLimitedRequests = new CounterPair(this.registries, METRICS.rateLimited);
  private readonly limitStoreErrors = new CounterPair(this.registries, METRICS.limitStoreErrors);
  private readonly backgroundHoldsGauge = new Gauge({
    name: METRICS.backgroundHolds.name,
    help: METRICS.backgroundHolds.help,
    labelNames: METRICS.backgroundHolds.labels,
    aggregator: 'sum' satisfies WorkerAggregator,
    registers: [this.registry, this.openMetrics],
  });
  private readonly backgroundHoldsEnded = new CounterPair(this.registries, METRICS.backgroundHoldsEnded);
  private readonly limitStoreUpGauge = new Gauge({
    name: METRICS.limitStoreUp.name,
    help: METRICS.limitStoreUp.help,
    labelNames: METRICS.limitStoreUp.labels,
    aggregator: 'min' satisfies WorkerAggregator,
    registers: [this.registry, this.openMetrics],
  });
  private readonly configReloads = new CounterPair(this.registries, METRICS.configReloads);
  private readonly configHashGauge = new Gauge({
    name: METRICS.configHash.name,
    help: METRICS.configHash.help,
    labelNames: METRICS.configHash.labels,
    // Every worker's hash shows (workers that disagree after a reload show two series).
    aggregator: 'max' satisfies WorkerAggregator,
    registers: [this.registry, this.openMetrics],
  });
  private readonly queueWait: Histogram<'model'>;
  private readonly upstreamFirstOutput: Histogram<'model' | 'upstream' | 'prompt_len'>;
  private readonly routingDecisions = new CounterPair(this.registries, METRICS.routingDecisions);
  private readonly routingShared = new CounterPair(this.registries, METRICS.routingShared);
  private readonly routingPromptTokens = new CounterPair(this.registries, METRICS.routingPromptTokens);
  private readonly routingPredictedCachedTokens = new CounterPair(this.registries, METRICS.routingPredictedCachedTokens);
  private readonly routingCachedTokens = new CounterPair(this.registries, METRICS.routingCachedTokens);
  private readonly sessionIdleGap: Histogram<'model' | 'pool'>;
  private readonly sessionPromptTokens = new CounterPair(this.registries, METRICS.sessionPromptTokens);
  private readonly sessionCachedTokens = new CounterPair(this.registries, METRICS.sessionCachedTokens);
  private readonly engineScrapes = new CounterPair(this.registries, METRICS.engineScrapes);
  private readonly engineRestarts = new CounterPair(this.registries, METRICS.engineRestarts);
  private sources: GaugeSources | undefined;

  constructor(buckets: MetricBuckets, options: { defaultMetrics?: boolean; build?: { version: string; revision: string } } = {}) {
    const registries = this.registries;
    // At zero from the start, so an alert on any increase sees the first one.
    for (const component of INTERNAL_ERROR_COMPONENTS) this.internalErrors.inc({ component }, 0);
    for (const result of CONFIG_RELOAD_RESULTS) this.configReloads.inc({ result }, 0);
    this.turnYields.inc({}, 0);
    // Counted by a workers' primary (app/primary.ts), never by the process itself: at zero, so the series exists.
    this.workerLostRequests.inc({}, 0);
    this.ttft = histogram(registries, METRICS.ttft, buckets.ttft, true);
    // Observed per event, on the hot path: a histogram of its own (no label hashing, no exemplars).
    this.itl = new EventHistogram(METRICS.itl.name, METRICS.itl.help, buckets.itl);
    // prom-client serialises any object with its metric interface (name, help, type, get()).
    this.registry.registerMetric(this.itl as unknown as Metric);
    this.openMetrics.registerMetric(this.itl as unknown as Metric);
    this.tpot = histogram(registries, METRICS.tpot, buckets.tpot, true);
    this.duration = histogram(registries, METRICS.duration, buckets.duration, true);
    this.evaluatorDuration = histogram(registries, METRICS.evaluatorDuration, buckets.duration);
    this.queueWait = histogram(registries, METRICS.queueWait, buckets.queueWait);
    this.upstreamFirstOutput = histogram(registries, METRICS.upstreamFirstOutput, buckets.ttft);
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
      // Its counters have the same naming problem as ours: one set per registry.
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
    const exemplarLabels = exemplar ?? NO_EXEMPLAR;
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
    if (s.ttftMs !== undefined) this.ttft.observe({ labels: { model, prompt_len: s.promptLen }, value: s.ttftMs / 1000, exemplarLabels });
    if (s.tpotMs !== undefined) this.tpot.observe({ labels: { model, revision }, value: s.tpotMs / 1000, exemplarLabels });
    this.duration.observe({ labels: { model, route: s.route, outcome: s.outcome }, value: s.durationMs / 1000, exemplarLabels });
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
