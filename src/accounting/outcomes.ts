/**
 * The closed label sets of the metrics contract. Every label value Waybill exports comes from one of these
 * lists or from configuration; docs/metrics.md lists the same values and test/metrics-contract.test.ts checks it.
 */
import { ANONYMOUS_TENANT } from '../telemetry/labels.js';

/** Routes whose answers are generated, streamed or not, and checked choice by choice. */
export const GENERATION_ROUTES = ['chat_completions', 'completions'] as const;
export type GenerationRoute = (typeof GENERATION_ROUTES)[number];
/**
 * vLLM's non-generation routes: one JSON answer (or raw bytes) after all the work is done, so a failure is a real
 * HTTP status, never an error inside a 200 (docs/routes.md).
 */
export const POOLING_ROUTES = ['embeddings', 'pooling', 'classify', 'score', 'rerank', 'tokenize', 'detokenize'] as const;
export type PoolingRoute = (typeof POOLING_ROUTES)[number];

/** Routes with protocols of their own, answered and checked like a one-choice generation (docs/routes.md). */
export const EVENT_ROUTES = ['responses', 'messages'] as const;

/**
 * vLLM's speech-to-text routes: a multipart request, answered as one JSON body or streamed like a one-choice chat
 * completion (delta chunks, an error event, `[DONE]`). Non-stream usage is seconds of audio, never tokens.
 */
export const AUDIO_ROUTES = ['transcriptions', 'translations'] as const;
export type AudioRoute = (typeof AUDIO_ROUTES)[number];

/**
 * Routes that read or act on what an upstream already holds, or that the operator let through: answered as one
 * JSON body (a stored response's replay streams like /v1/responses), never counting usage — the tokens were counted
 * on the request that generated them, or are not tokens spent at all.
 * - `responses_retrieve`: `GET /v1/responses/{id}` (and `?stream=true`); `responses_cancel`: its `/cancel`;
 * - `count_tokens`: `POST /v1/messages/count_tokens`;
 * - `passthrough`: a path in `passthrough.paths`, proxied as it is.
 */
export const STORE_ROUTES = ['responses_retrieve', 'responses_cancel', 'count_tokens', 'passthrough'] as const;

export const ROUTES = [...GENERATION_ROUTES, ...EVENT_ROUTES, ...AUDIO_ROUTES, ...POOLING_ROUTES, ...STORE_ROUTES, '_other'] as const;
export type Route = (typeof ROUTES)[number];
/** The routes Waybill proxies; `_other` counts what the gateway answered without a route (404, HTTP-level errors). */
export type ProxiedRoute = Exclude<Route, '_other'>;
export const PROXIED_ROUTES: readonly ProxiedRoute[] = [...GENERATION_ROUTES, ...EVENT_ROUTES, ...AUDIO_ROUTES, ...POOLING_ROUTES, ...STORE_ROUTES];

const POOLING = new Set<string>(POOLING_ROUTES);
/** Answered as one JSON body (or raw bytes) whose only facts are the status, an error, an id and maybe usage. */
const WHOLE_BODY = new Set<string>([...POOLING_ROUTES, 'responses_cancel', 'count_tokens', 'passthrough']);

export function isPoolingRoute(route: Route): route is PoolingRoute {
  return POOLING.has(route);
}

/** Routes answered as one opaque JSON body (pooling and the store routes but the retrieval, which may stream). */
export function isWholeBodyRoute(route: Route): boolean {
  return WHOLE_BODY.has(route);
}

export function isAudioRoute(route: Route): route is AudioRoute {
  return route === 'transcriptions' || route === 'translations';
}

export function isGenerationRoute(route: Route): route is GenerationRoute {
  return route === 'chat_completions' || route === 'completions';
}

const NO_USAGE = new Set<string>(['tokenize', 'detokenize', ...AUDIO_ROUTES, ...STORE_ROUTES, '_other']);

/**
 * Routes whose delivered answers always report token usage, so its absence is counted as missing: not tokenize and
 * detokenize (they never touch the engine), not speech-to-text (seconds, or tokens only when the client asked), not
 * the store routes and pass-through.
 */
export function reportsUsage(route: Route): boolean {
  return !NO_USAGE.has(route);
}

export const OUTCOMES = ['delivered', 'rejected', 'failed', 'timeout', 'stream_error', 'incomplete', 'client_cancelled'] as const;
export type Outcome = (typeof OUTCOMES)[number];

export const ATTEMPT_RESULTS = [
  'ok',
  'http_3xx',
  'http_4xx',
  'http_5xx',
  'error_payload',
  'connect_error',
  'reset',
  'timeout',
  'incomplete',
  'cancelled',
] as const;
export type AttemptResult = (typeof ATTEMPT_RESULTS)[number];

export const ANOMALY_KINDS = [
  'error_payload',
  'done_after_error',
  'missing_done',
  'missing_finish_reason',
  'malformed_event',
  'oversized_event',
  'data_after_done',
  'invalid_usage',
  'unexpected_choice',
] as const;
export type AnomalyKind = (typeof ANOMALY_KINDS)[number];

export const FINISH_REASONS = [
  'stop',
  'length',
  'tool_calls',
  'content_filter',
  'function_call',
  'abort',
  'repetition',
  /** `/v1/messages` with `stop_reason: null`: vLLM maps both abort and repetition to null. */
  'abort_or_repetition',
  'other',
  'none',
] as const;
export type FinishReason = (typeof FINISH_REASONS)[number];

export const CANCEL_PHASES = ['queued', 'before_first_token', 'streaming'] as const;
export type CancelPhase = (typeof CANCEL_PHASES)[number];

export const SLO_RESULTS = ['met', 'missed_ttft', 'missed_tpot', 'missed_ttft_tpot', 'missed_e2e', 'failed', 'excluded'] as const;
export type SloResult = (typeof SLO_RESULTS)[number];

/** Why an attempt was retried (before commit only). */
export const RETRY_REASONS = ['connect_error', 'reset', 'incomplete', 'http_5xx', 'http_429', 'http_408', 'error_payload', 'timeout'] as const;
export type RetryReason = (typeof RETRY_REASONS)[number];

/** Why an upstream was ejected by passive health checking. */
export const EJECTION_REASONS = ['consecutive_failures', 'trial_failed'] as const;
export type EjectionReason = (typeof EJECTION_REASONS)[number];

/**
 * The bodies Waybill reads from an upstream for its own use (waybill_upstream_reads_stopped_total{read}); `signals` is
 * the engine's `/metrics`, scraped for its load (routing/engine-signals.ts).
 */
export const OWN_READS = ['health', 'discovery', 'lookup', 'background', 'signals'] as const;
export type OwnRead = (typeof OWN_READS)[number];
/** Why such a read was stopped: over health.max_body_bytes, or past its deadline while its body was read. */
export const READ_STOP_REASONS = ['too_large', 'deadline'] as const;
export type ReadStopReason = (typeof READ_STOP_REASONS)[number];

/** Label value for a model (or upstream) name outside the configured and discovered set. */
export const OTHER = '_other';

/**
 * `revision` of a settled request that reached no upstream (refused, rate-limited, no upstream picked): closed. A
 * revision read from an upstream or configured starts with a letter or digit, so it never reads as one of these.
 */
export const NO_REVISION = '_none';
/** `revision` of an upstream with none configured whose `GET /version` has not answered a valid one (yet). */
export const UNKNOWN_REVISION = '_unknown';

/** `model` of a stored-response lookup's attempts (response-homes.ts): sent before the response's model is known. */
export const LOOKUP = '_lookup';

/** `tenant` of a request served without a client key (no keys configured, or keys optional and none given). */
export const ANONYMOUS = ANONYMOUS_TENANT;
/** `tenant` of a request refused for a missing or wrong client key (or answered before any key was read). */
export const UNAUTHENTICATED = '_unauthenticated';

const KNOWN_FINISH = new Set<string>(FINISH_REASONS);

/** Maps an upstream finish_reason to the closed set; `none` is for a choice that never got one. */
export function finishReasonLabel(reason: string | undefined): FinishReason {
  if (reason === undefined) return 'none';
  return KNOWN_FINISH.has(reason) && reason !== 'none' && reason !== 'other' ? (reason as FinishReason) : 'other';
}

/** The output-contract checks run on each choice of a delivered response (docs/output-contract.md). */
export const OUTPUT_CHECKS = ['answer_present', 'not_truncated', 'format_valid'] as const;
export type OutputCheck = (typeof OUTPUT_CHECKS)[number];

/** `unevaluated` is kept apart from `fail`: no contract requested, over the size cap, or a schema that cannot be compiled. */
export const CHECK_RESULTS = ['pass', 'fail', 'unevaluated'] as const;
export type CheckResult = (typeof CHECK_RESULTS)[number];

/**
 * A delivered response's verdict over its evaluation cohort (seed 000 §7.3, docs/output-contract.md): `accepted` and
 * `not_accepted` when every check that applies to it was evaluated (pass or fail), `unevaluated` when one that
 * applies could not be (an answer over the size cap, a schema that does not compile) — whatever the others said, so
 * the cohort is not biased toward certain failures. A check that does not apply (no contract asked for) is not
 * missing. Closed: the `verdict` label of waybill_requests_checked_total.
 */
export const CHECK_VERDICTS = ['accepted', 'not_accepted', 'unevaluated'] as const;
export type CheckVerdict = (typeof CHECK_VERDICTS)[number];
