/**
 * The closed sets of metric label values, in one place: each set here is a contract with dashboards and alerts
 * (docs/metrics.md lists every value; test/metrics-contract.test.ts holds the two together). The modules that
 * produce a value (proxy/, routing/, the guard) import its type from here and re-export it under their own name;
 * telemetry/metrics.ts reads the sets to start every series at zero.
 *
 * A leaf: it imports nothing, so every layer may read it — config/ (the anonymous tenant, the prompt-length classes
 * it validates and resolves) and the pure cores included (eslint.config.js allows this one file of telemetry/).
 * The outcome, route and reason vocabularies the ledger decides stay in accounting/outcomes.ts, with the core.
 */

// ---------------------------------------------------------------------------------------------------------------
// Values the configuration resolves (config/load.ts) and the ledger records.

/**
 * The `tenant` of a request that came without a client key (no configured tenant name may start with `_`); the core
 * reads it as accounting/outcomes.ts `ANONYMOUS`.
 */
export const ANONYMOUS_TENANT = '_anonymous';

/** The `prompt_len` class of a request whose prompt length is not known. */
export const UNKNOWN_PROMPT_LEN = 'unknown';

function formatTokens(value: number): string {
  return value !== 0 && value % 1024 === 0 ? `${value / 1024}k` : String(value);
}

/**
 * The `prompt_len` label values for the given boundaries, shortest class first, `unknown` last: [1024, 4096] gives
 * `0-1k`, `1k-4k`, `4k+`, `unknown` (k = 1024 tokens); accounting/prompt-len.ts classifies into them.
 */
export function promptLenClassNames(boundaries: readonly number[]): string[] {
  const classes: string[] = [];
  let lower = 0;
  for (const upper of boundaries) {
    classes.push(`${formatTokens(lower)}-${formatTokens(upper)}`);
    lower = upper;
  }
  classes.push(`${formatTokens(lower)}+`);
  classes.push(UNKNOWN_PROMPT_LEN);
  return classes;
}

// ---------------------------------------------------------------------------------------------------------------
// The gateway's own operations.

/** Where an internal error happened (`waybill_internal_errors_total{component}`). */
export const INTERNAL_ERROR_COMPONENTS = ['metrics', 'tracing', 'logging', 'hook', 'exchange', 'http'] as const;
export type InternalErrorComponent = (typeof INTERNAL_ERROR_COMPONENTS)[number];

/** The results of a configuration reload (`waybill_config_reloads_total{result}`). */
export const CONFIG_RELOAD_RESULTS = ['ok', 'invalid', 'restart_required'] as const;
export type ConfigReloadResult = (typeof CONFIG_RELOAD_RESULTS)[number];

/** The `kind` label of `waybill_evaluator_tokens_total`. */
export const EVALUATOR_TOKEN_KINDS = ['prompt', 'completion'] as const;

// ---------------------------------------------------------------------------------------------------------------
// The tenants' limits and background holds (proxy/).

/** What a refusal is counted under (`waybill_rate_limited_total{limit}`). */
export const LIMIT_NAMES = ['requests', 'tokens', 'concurrent'] as const;
export type LimitName = (typeof LIMIT_NAMES)[number];

/** The shared limit store's operations, as `waybill_limit_store_errors_total{op}` counts their failures. */
export const LIMIT_STORE_OPS = ['reserve', 'settle', 'release'] as const;
export type LimitStoreOp = (typeof LIMIT_STORE_OPS)[number];

/** How a background hold ended (`waybill_background_holds_ended_total{how}`). */
export const BACKGROUND_HOLD_ENDS = ['ended', 'lost', 'deadline', 'overflow', 'shutdown'] as const;
export type BackgroundHoldEnd = (typeof BACKGROUND_HOLD_ENDS)[number];

// ---------------------------------------------------------------------------------------------------------------
// Routing (routing/).

/** Why a pick chose its upstream (`waybill_routing_decisions_total{reason}`). */
export const PICK_REASONS = ['prefix', 'load', 'bounded_load', 'stale_signals', 'session', 'single'] as const;
export type PickReason = (typeof PICK_REASONS)[number];

/**
 * The idle gap before a session's request, by class (routing/sessions.ts, which says what each class means for an
 * engine's prefix cache, and holds their bounds).
 */
export const GAP_CLASSES = ['0-10s', '10s-1m', '1m-5m', '5m-30m', '30m+'] as const;
export type GapClass = (typeof GAP_CLASSES)[number];

/** The `gap` label of the session token counters: no earlier completion known, or the idle gap's class. */
export const SESSION_GAP_LABELS = ['first', ...GAP_CLASSES] as const;

/** What happened to a route-sharing message (`waybill_routing_shared_messages_total{result}`). */
export const ROUTE_SHARE_RESULTS = ['sent', 'send_failed', 'received', 'invalid'] as const;
export type RouteShareResult = (typeof ROUTE_SHARE_RESULTS)[number];

/** Why an engine's `/metrics` body gave no signals (routing/engine-metrics.ts). */
export const PARSE_FAILURES = [
  /** No `vllm:num_requests_waiting`, `vllm:num_requests_running` or KV usage series (not vLLM, a renamed metric). */
  'missing',
  /** One of them is NaN, ±Inf, negative, or a KV usage above 1. */
  'invalid',
  /** A line of one of them that does not parse (unterminated labels, a value that is not a number). */
  'malformed',
  /** The body is longer than `maxBodyChars`. */
  'too_large',
] as const;
export type ParseFailure = (typeof PARSE_FAILURES)[number];

/**
 * How an engine scrape ended (`waybill_upstream_engine_scrapes_total{result}`). Besides the parse failures:
 * - `http_status`: `/metrics` answered something other than 200 (an auth proxy, vLLM without metrics);
 * - `deadline`: no whole answer within `timeoutMs`;
 * - `unreachable`: the connection failed (refused while the model loads, reset, a connect that timed out);
 * - `busy`: the previous scrape of this upstream was still running, so this round skipped it.
 * `too_large` is also the reader's own byte limit (health.max_body_bytes through `Upstream.get`).
 */
export const SCRAPE_RESULTS = ['ok', ...PARSE_FAILURES, 'http_status', 'deadline', 'unreachable', 'busy'] as const;
export type ScrapeResultKind = (typeof SCRAPE_RESULTS)[number];

/** Why an engine is taken to have restarted: its process start time changed, or a prefix-cache counter went down. */
export const ENGINE_RESTART_CAUSES = ['start_time', 'counter_reset'] as const;
export type RestartCause = (typeof ENGINE_RESTART_CAUSES)[number];
