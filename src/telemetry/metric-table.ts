/**
 * The metrics contract: every metric Waybill exports, with its labels and, for each histogram, where its clock
 * starts and stops. Names and label sets are a contract with users' dashboards and alerts; docs/metrics.md says
 * the same and test/metrics-contract.test.ts holds the two together. The label values' closed sets are in
 * labels.ts; the recording is GatewayMetrics (metrics.ts), which re-exports this table.
 *
 * Longer than 400 lines on purpose: it is one declared table, read beside docs/metrics.md entry by entry; split, a
 * family's neighbours (the routing series, the limits') would be in different files.
 */

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
  logLinesDropped: {
    name: 'waybill_log_lines_dropped_total',
    type: 'counter',
    labels: [],
    help: 'JSON log lines dropped instead of held: stdout did not take them within logging.buffer_bytes (its reader stalled), or stdout was gone.',
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
